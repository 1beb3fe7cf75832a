//! The rows admitting one run writes (built here, written by the caller's transaction): the run,
//! its large input, its first event, and the thread a run without a `thread_id` makes.

use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{CreateRunRequest, Metadata, MultitaskStrategy, OnDisconnect, RunEvent, RunUsage};
use prost::Message;

use crate::engine::Engine;
use crate::status::Status;
use crate::store::entity::{run_inputs, runs, threads};
use crate::stream::first_event;

/// Largest request kept whole in the `runs` row; a larger one's input goes to `run_inputs`.
pub const INLINE_REQUEST_BYTES: usize = 4096;

/// The thread a CreateRun with an empty `thread_id` makes, naming `run_id` as its latest run.
pub(crate) fn new_thread_row(user_id: &str, run_id: &str, now: i64) -> threads::Model {
    threads::Model {
        user_id: user_id.to_owned(),
        thread_id: uuid::Uuid::now_v7().to_string(),
        title: String::new(),
        metadata: "{}".to_owned(),
        head_checkpoint_id: None,
        latest_run_id: Some(run_id.to_owned()),
        created_at: now,
        updated_at: now,
        parent_thread_id: None,
    }
}

/// What admitting one run writes: its row, its large input (if any) and its first event.
pub(crate) struct NewRun {
    pub run: runs::Model,
    pub input: Option<run_inputs::Model>,
    pub first: RunEvent,
}

/// Builds the rows of a run admitted on `thread_id` (nothing is written here).
#[allow(clippy::too_many_arguments)]
pub(crate) fn new_run(
    engine: &Engine,
    user_id: &str,
    req: &CreateRunRequest,
    fp: &str,
    run_id: String,
    thread_id: &str,
    base_checkpoint: Option<String>,
    queued: bool,
    strategy: MultitaskStrategy,
    now: i64,
) -> NewRun {
    let mut stored = req.clone();
    // Secret values are never stored; their names are, so an attempt elsewhere knows what it lacks.
    stored.secrets.values_mut().for_each(String::clear);
    // Nor is any other registered secret the client put in its input or metadata.
    antler_kit::redact::redact_message_in_place(&mut stored);
    stored.thread_id = thread_id.to_owned();
    let model_name = stored.config.as_ref().map(|c| c.model_name.clone()).unwrap_or_default();
    let metadata = stored.metadata.as_ref().map(antler_kit::json::struct_to_json_text).unwrap_or_else(|| "{}".to_owned());
    // A large input goes to its own table: the runs row is rewritten by every event append.
    let input = (stored.encoded_len() > INLINE_REQUEST_BYTES && !stored.input.is_empty()).then(|| run_inputs::Model {
        run_id: run_id.clone(),
        input: CreateRunRequest { input: std::mem::take(&mut stored.input), ..CreateRunRequest::default() }.encode_to_vec(),
    });
    let first = first_event(
        &run_id,
        thread_id,
        Kind::Metadata(Metadata {
            run_id: run_id.clone(),
            thread_id: thread_id.to_owned(),
            attempt: 1,
            model_name: model_name.clone(),
            checkpoint_id: base_checkpoint.clone().unwrap_or_default(),
        }),
        now,
    );
    let run = runs::Model {
        run_id,
        user_id: user_id.to_owned(),
        thread_id: thread_id.to_owned(),
        status: Status::Pending,
        queued,
        attempt: 0,
        owner_worker_id: Some(engine.worker_id().to_owned()),
        lease_expires_at: Some(now + engine.config().lease().as_millis() as i64),
        cancel_action: None,
        cancel_cause: None,
        idempotency_key: (!req.idempotency_key.is_empty()).then(|| req.idempotency_key.clone()),
        fingerprint: fp.to_owned(),
        multitask_strategy: format!("{strategy:?}").to_ascii_lowercase(),
        on_disconnect: if req.on_disconnect == OnDisconnect::Continue as i32 { "continue" } else { "cancel" }.to_owned(),
        model_name,
        request: stored.encode_to_vec(),
        metadata,
        base_checkpoint_id: base_checkpoint,
        stop_reason: None,
        error_code: None,
        error_message: None,
        final_status: None,
        usage: RunUsage::default().encode_to_vec(),
        delivery: None,
        // The METADATA event is seq 1, written with the run.
        last_seq: 1,
        created_at: now,
        started_at: None,
        finished_at: None,
        updated_at: now,
        parent_run_id: req.subagent.as_ref().map(|s| s.parent_run_id.clone()),
        parent_task_id: req.subagent.as_ref().map(|s| s.task_id.clone()),
        // No model call yet: every usage total is zero.
        usage_input_tokens: 0,
        usage_output_tokens: 0,
        usage_total_tokens: 0,
        usage_cache_read_tokens: 0,
        usage_reasoning_tokens: 0,
        usage_llm_calls: 0,
        usage_lead_agent_tokens: 0,
        usage_subagent_tokens: 0,
        usage_middleware_tokens: 0,
        usage_by_model: "{}".to_owned(),
    };
    NewRun { run, input, first }
}
