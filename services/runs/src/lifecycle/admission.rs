//! Admission: `start_run` (authenticate, ownership, validate and sanitise, model allowlist, clamp)
//! then `create_or_reject` — one transaction that applies the idempotency key and the thread's
//! multitask policy and inserts the run PENDING, or refuses and writes nothing.

use antler_kit::CallContext;
use antler_kit::input_keys::{self, Reserved};
use antler_proto::common::Role;
use antler_proto::models::ListModelsRequest;
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{CreateRunRequest, EventKind, Metadata, MultitaskStrategy, OnDisconnect, RunEvent, RunUsage};
use prost::Message;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use sha2::{Digest, Sha256};

use super::{Ending, end_by_service};

/// Largest request kept whole in the `runs` row; a larger one's input goes to `run_inputs`.
pub const INLINE_REQUEST_BYTES: usize = 4096;

use crate::config::CONTEXT_OWNED_KEYS;
use crate::engine::{Engine, StopCause};
use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::{run_inputs, runs, threads};
use crate::store::now_ms;
use crate::stream::{first_event, insert_rows};
use crate::threads::valid_thread_id;

/// The LangGraph stream modes a run may record (`CreateRunRequest.langgraph_stream_modes`): the ones
/// the LangGraph edge (`crate::langgraph`) can translate Antler's events into.
pub const LANGGRAPH_STREAM_MODES: [&str; 5] = ["values", "updates", "messages-tuple", "events", "custom"];

/// The result of admission.
#[derive(Debug)]
pub struct Admitted {
    pub run: runs::Model,
    /// The idempotency key named an existing run, returned as it is.
    pub reused: bool,
}

/// Validates and sanitises a request in place (no I/O). Errors name the field and the limit.
pub fn sanitise(engine: &Engine, req: &mut CreateRunRequest) -> Result<(), RunsError> {
    let cfg = &engine.config;
    let size = req.encoded_len();
    if size > cfg.max_request_bytes as usize {
        return Err(RunsError::ResourceExhausted(format!(
            "the CreateRunRequest is {size} bytes; the limit is {} (runs.max_request_bytes)\nhint: put large files in the thread's sandbox (SandboxService.UploadFiles) and refer to their paths",
            cfg.max_request_bytes
        )));
    }
    if !req.thread_id.is_empty() && !valid_thread_id(&req.thread_id) {
        return Err(RunsError::invalid("thread_id", format!("`{}` must match ^[A-Za-z0-9_-]{{1,64}}$", req.thread_id)));
    }
    if req.input.len() > cfg.max_input_messages as usize {
        return Err(RunsError::invalid(
            "input",
            format!("{} messages; the limit is {} (runs.max_input_messages)", req.input.len(), cfg.max_input_messages),
        ));
    }
    if req.input.is_empty() && req.resume.is_none() {
        return Err(RunsError::invalid("input", "is empty: send at least one ROLE_USER message (or `resume` to answer a clarification)"));
    }
    if !req.input.is_empty() && req.resume.is_some() {
        return Err(RunsError::invalid("resume", "must not be combined with input"));
    }
    for (i, message) in req.input.iter_mut().enumerate() {
        match Role::try_from(message.role) {
            Ok(Role::User | Role::Assistant | Role::Tool) => {}
            Ok(Role::System) => {
                return Err(RunsError::invalid(
                    format!("input[{i}].role"),
                    "ROLE_SYSTEM is not accepted: the system prompt comes from the agent",
                ));
            }
            _ => return Err(RunsError::invalid(format!("input[{i}].role"), "must be ROLE_USER, ROLE_ASSISTANT or ROLE_TOOL")),
        }
        if message.content.is_empty() && message.tool_calls.is_empty() {
            return Err(RunsError::invalid(format!("input[{i}].content"), "is empty"));
        }
        if let Some(meta) = message.metadata.as_mut() {
            // Reserved keys are stripped here (a client may echo back messages it read).
            input_keys::check(&format!("input[{i}].metadata"), meta, Reserved::Strip, &[])?;
        }
    }
    for (i, kind) in req.stream_kinds.iter().enumerate() {
        if !matches!(EventKind::try_from(*kind), Ok(k) if k != EventKind::Unspecified) {
            return Err(RunsError::invalid(format!("stream_kinds[{i}]"), format!("{kind} is not an EventKind")));
        }
    }
    if req.langgraph_stream_modes.len() > 8 {
        return Err(RunsError::invalid("langgraph_stream_modes", format!("{} entries; the limit is 8", req.langgraph_stream_modes.len())));
    }
    for (i, mode) in req.langgraph_stream_modes.iter().enumerate() {
        if !LANGGRAPH_STREAM_MODES.contains(&mode.as_str()) {
            return Err(RunsError::invalid(
                format!("langgraph_stream_modes[{i}]"),
                format!("`{mode}` is not one of {}", LANGGRAPH_STREAM_MODES.join(", ")),
            ));
        }
    }
    if let Some(meta) = req.metadata.as_mut() {
        input_keys::check("metadata", meta, Reserved::Refuse, &[])?;
        let size = meta.encoded_len();
        if size > cfg.max_metadata_bytes as usize {
            return Err(RunsError::invalid(
                "metadata",
                format!("{size} bytes; the limit is {} (runs.max_metadata_bytes)", cfg.max_metadata_bytes),
            ));
        }
    }
    if !req.idempotency_key.is_empty()
        && (req.idempotency_key.len() > 255 || !req.idempotency_key.bytes().all(|b| (0x21..0x7f).contains(&b)))
    {
        return Err(RunsError::invalid("idempotency_key", "must be 1-255 printable ASCII characters without spaces"));
    }
    if req.expected_outputs.len() > 100 {
        return Err(RunsError::invalid("expected_outputs", format!("{} paths; the limit is 100", req.expected_outputs.len())));
    }
    for (i, path) in req.expected_outputs.iter().enumerate() {
        let inside = path
            .strip_prefix("/mnt/user-data/outputs/")
            .is_some_and(|rest| !rest.is_empty() && !rest.split('/').any(|seg| seg.is_empty() || seg == "." || seg == ".."));
        if !inside {
            return Err(RunsError::invalid(
                format!("expected_outputs[{i}]"),
                format!("`{path}` must be a file path under /mnt/user-data/outputs/"),
            ));
        }
    }
    if req.secrets.len() > 16 {
        return Err(RunsError::invalid("secrets", format!("{} entries; the limit is 16", req.secrets.len())));
    }
    // Names become environment variables of sandbox commands (upper-cased), so no leading digit.
    if let Some(key) = req.secrets.keys().find(|k| {
        k.is_empty()
            || k.len() > 64
            || k.starts_with(|c: char| c.is_ascii_digit())
            || !k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    }) {
        return Err(RunsError::invalid(format!("secrets.{key}"), "keys must match ^[a-z_][a-z0-9_]{0,63}$"));
    }
    let config = req.config.get_or_insert_with(Default::default);
    if config.recursion_limit == 0 {
        config.recursion_limit = cfg.recursion_limit_default;
    }
    config.recursion_limit = config.recursion_limit.min(cfg.recursion_limit_max);
    let limit = cfg.max_run_duration_secs as i64;
    config.max_duration = match config.max_duration {
        Some(d) if d.seconds < 0 || d.nanos < 0 => {
            return Err(RunsError::invalid("config.max_duration", "must not be negative"));
        }
        // Absent or zero: the server default; longer than the setting: clamped to it.
        Some(d) if (d.seconds, d.nanos) != (0, 0) && d.seconds < limit => Some(d),
        _ => Some(prost_types::Duration { seconds: limit, nanos: 0 }),
    };
    if let Some(context) = config.context.as_mut() {
        input_keys::check("config.context", context, Reserved::Refuse, &CONTEXT_OWNED_KEYS)?;
        if let Some(key) = context.fields.keys().find(|k| !cfg.context_keys.contains(k)) {
            return Err(RunsError::invalid(
                format!("config.context.{key}"),
                format!("is not an allowed context key; allowed: {} (runs.context_keys)", cfg.context_keys.join(", ")),
            ));
        }
        let size = context.encoded_len();
        if size > cfg.max_metadata_bytes as usize {
            return Err(RunsError::invalid(
                "config.context",
                format!("{size} bytes; the limit is {} (runs.max_metadata_bytes)", cfg.max_metadata_bytes),
            ));
        }
    }
    if MultitaskStrategy::try_from(req.multitask_strategy).is_err() {
        return Err(RunsError::invalid("multitask_strategy", format!("{} is not a MultitaskStrategy", req.multitask_strategy)));
    }
    if OnDisconnect::try_from(req.on_disconnect).is_err() {
        return Err(RunsError::invalid("on_disconnect", format!("{} is not an OnDisconnect", req.on_disconnect)));
    }
    Ok(())
}

/// What makes two requests "the same" for an idempotency key: everything but request-scoped
/// delivery settings (secrets, stream selection, disconnect handling). A `resume` answer counts as
/// itself, not as the input admission writes from it (which depends on the pending clarification).
pub fn fingerprint(req: &CreateRunRequest) -> String {
    let mut canonical = req.clone();
    if canonical.resume.is_some() {
        canonical.input.clear();
    }
    canonical.secrets.clear();
    canonical.stream_kinds.clear();
    canonical.langgraph_stream_modes.clear();
    canonical.on_disconnect = 0;
    hex::encode(Sha256::digest(canonical.encode_to_vec()))
}

/// Checks `model_name` against the models service. Empty means the default model.
pub async fn check_model(engine: &Engine, ctx: &CallContext, model_name: &str) -> Result<(), RunsError> {
    if model_name.is_empty() {
        return Ok(());
    }
    let Some(client) = engine.clients.get("models") else {
        return Err(RunsError::Unavailable("no models client configured".to_owned()));
    };
    let listed = client
        .with_retry(|| {
            let request = client.request(ctx, ListModelsRequest::default());
            let mut grpc = ModelServiceClient::new(client.channel());
            async move { grpc.list_models(request).await }
        })
        .await
        .map_err(|status| {
            RunsError::Unavailable(format!(
                "cannot check model `{model_name}`: the models service answered {:?}: {}",
                status.code(),
                status.message()
            ))
        })?
        .into_inner();
    let names: Vec<String> = listed.models.into_iter().map(|m| m.name).collect();
    if names.iter().any(|n| n == model_name) {
        Ok(())
    } else {
        Err(RunsError::invalid("config.model_name", format!("unknown model `{model_name}`; valid names: {}", names.join(", "))))
    }
}

/// Events to publish after the admission transaction commits, and runs to stop locally.
#[derive(Debug, Default)]
pub struct Effects {
    pub events: Vec<RunEvent>,
    pub superseded: Vec<String>,
}

/// One admission in one transaction (retried on a lost unique-index race as its strategy allows).
pub(crate) async fn create_or_reject_one(
    engine: &Engine,
    user_id: &str,
    req: &CreateRunRequest,
    fp: &str,
) -> Result<(Admitted, Effects), RunsError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match engine.store.retry_busy(|| try_admit(engine, user_id, req, fp)).await {
            Ok(Attempt::Admitted(admitted, effects)) => return Ok((*admitted, effects)),
            // A state update (a rename) moved the thread's head while this admission read it: the
            // transaction was rolled back; the next attempt starts from the new head.
            Ok(Attempt::HeadMoved) if attempts < HEAD_MOVED_ATTEMPTS => continue,
            Ok(Attempt::HeadMoved) => {
                return Err(RunsError::Aborted(format!(
                    "thread {}'s state changed {attempts} times while this run was being admitted\nhint: retry the request",
                    req.thread_id
                )));
            }
            Err(RunsError::Store(e)) if e.is_unique_violation() => {
                // A concurrent admission won a unique index: the same idempotency key (return its
                // run), or the thread's active-run slot.
                if let Some(existing) = find_by_key(engine, user_id, &req.idempotency_key).await? {
                    return reuse(existing, fp).map(|a| (a, Effects::default()));
                }
                let strategy = MultitaskStrategy::try_from(req.multitask_strategy).unwrap_or(MultitaskStrategy::Reject);
                // With create_thread the race may have been over the thread's id: the next attempt
                // finds the thread (and then applies the strategy to its active run, if any).
                if attempts < 3 && (req.create_thread || !matches!(strategy, MultitaskStrategy::Reject | MultitaskStrategy::Unspecified)) {
                    continue;
                }
                return Err(active_run_conflict(&req.thread_id, None));
            }
            Err(other) => return Err(other),
        }
    }
}

/// Attempts of one admission that may find the head moved under them (a state update is a single
/// short transaction, so a second attempt almost always finds the head still).
const HEAD_MOVED_ATTEMPTS: u32 = 5;

/// How one admission transaction ended.
enum Attempt {
    Admitted(Box<Admitted>, Effects),
    /// The thread's head changed between this transaction's read of it and its write of the thread's
    /// row (rolled back; see [`try_admit`]).
    HeadMoved,
}

fn active_run_conflict(thread_id: &str, run_id: Option<&str>) -> RunsError {
    let run = run_id.map(|r| format!(" {r}")).unwrap_or_default();
    let cancel = run_id.map(|r| format!(" or cancel {r}")).unwrap_or_default();
    RunsError::Aborted(format!(
        "thread {thread_id} has an active run{run}\nhint: retry with multitask_strategy=MULTITASK_STRATEGY_ENQUEUE (or INTERRUPT){cancel}"
    ))
}

/// The run `user_id` admitted under idempotency `key`, if any (none for an empty key).
pub(crate) async fn find_by_key(engine: &Engine, user_id: &str, key: &str) -> Result<Option<runs::Model>, RunsError> {
    if key.is_empty() {
        return Ok(None);
    }
    Ok(runs::Entity::find()
        .filter(runs::Column::UserId.eq(user_id))
        .filter(runs::Column::IdempotencyKey.eq(key))
        .one(engine.store.db())
        .await?)
}

/// RESOURCE_EXHAUSTED (with retry-after) when `pending` runs already wait for a worker.
pub(crate) fn backlog_full(pending: u64, limit: u64) -> RunsError {
    RunsError::ResourceExhausted(format!(
        "{pending} runs are already waiting for a worker; the limit is {limit} (runs.max_pending_runs)\nhint: retry after the retry-after delay, or add workers (runs.max_concurrent_runs, more replicas)"
    ))
}

pub(crate) fn reuse(existing: runs::Model, fp: &str) -> Result<Admitted, RunsError> {
    if existing.fingerprint == fp {
        Ok(Admitted { run: existing, reused: true })
    } else {
        Err(RunsError::FailedPrecondition(format!(
            "idempotency_key was already used for run {} with a different request\nhint: use a new key for a new request, or resend the original request unchanged",
            existing.run_id
        )))
    }
}

async fn try_admit(engine: &Engine, user_id: &str, req: &CreateRunRequest, fp: &str) -> Result<Attempt, RunsError> {
    let tx = engine.store.tx_for(crate::store::Priority::Admission).await?;
    let now = now_ms();
    let mut effects = Effects::default();

    if !req.idempotency_key.is_empty() {
        let existing = runs::Entity::find()
            .filter(runs::Column::UserId.eq(user_id))
            .filter(runs::Column::IdempotencyKey.eq(req.idempotency_key.as_str()))
            .one(&*tx)
            .await?;
        if let Some(existing) = existing {
            return reuse(existing, fp).map(|a| Attempt::Admitted(Box::new(a), effects));
        }
    }

    let limit = engine.config.max_pending_runs;
    if limit > 0 {
        let pending = engine.backlog.pending(&*tx).await?;
        if pending >= limit {
            return Err(backlog_full(pending, limit));
        }
    }
    super::user_caps::check(&engine.config, engine.user_runs.counts(&engine.config, &*tx, user_id).await?)?;
    let run_id = uuid::Uuid::now_v7().to_string();
    // The thread: an existing one of this user, or a new one when no id was given (which can have no
    // active run, and starts out naming this run as its latest: fewer statements in the writer slot).
    let mut new_thread = req.thread_id.is_empty();
    let thread = if new_thread {
        let thread = new_thread_row(user_id, &run_id, now);
        threads::Entity::insert(threads::ActiveModel::from(thread.clone())).exec_without_returning(&*tx).await?;
        thread
    } else {
        let found = threads::Entity::find_by_id((user_id.to_owned(), req.thread_id.clone())).one(&*tx).await?;
        match found {
            Some(thread) => thread,
            // create_thread: the named thread is made in this transaction, so a refusal below (or a
            // failed commit) leaves no thread behind. A concurrent create of the same id loses the
            // primary key race and is retried by the caller like any unique violation.
            None if req.create_thread => {
                new_thread = true;
                let thread = threads::Model { thread_id: req.thread_id.clone(), ..new_thread_row(user_id, &run_id, now) };
                threads::Entity::insert(threads::ActiveModel::from(thread.clone())).exec_without_returning(&*tx).await?;
                thread
            }
            None => return Err(RunsError::NotFound(format!("thread {}", req.thread_id))),
        }
    };

    let base_checkpoint = if req.checkpoint_id.is_empty() {
        thread.head_checkpoint_id.clone()
    } else {
        let found = crate::store::entity::checkpoints::Entity::find_by_id(req.checkpoint_id.clone())
            .filter(crate::store::entity::checkpoints::Column::UserId.eq(user_id))
            .filter(crate::store::entity::checkpoints::Column::ThreadId.eq(thread.thread_id.as_str()))
            .one(&*tx)
            .await?;
        if found.is_none() {
            return Err(RunsError::NotFound(format!("checkpoint {} of thread {}", req.checkpoint_id, thread.thread_id)));
        }
        Some(req.checkpoint_id.clone())
    };

    // The multitask policy against the thread's active run.
    let strategy = match MultitaskStrategy::try_from(req.multitask_strategy) {
        Ok(MultitaskStrategy::Unspecified) | Err(_) => MultitaskStrategy::Reject,
        Ok(s) => s,
    };
    let active = if new_thread {
        None
    } else {
        runs::Entity::find()
            .filter(runs::Column::UserId.eq(user_id))
            .filter(runs::Column::ThreadId.eq(thread.thread_id.as_str()))
            .filter(runs::Column::Status.is_in(Status::ACTIVE))
            .filter(runs::Column::Queued.eq(false))
            .one(&*tx)
            .await?
    };
    let mut queued = false;
    let mut rolled_back = false;
    if let Some(active) = active {
        match strategy {
            MultitaskStrategy::Reject | MultitaskStrategy::Unspecified => {
                return Err(active_run_conflict(&thread.thread_id, Some(&active.run_id)));
            }
            MultitaskStrategy::Enqueue => queued = true,
            // A run that is finalizing is past the point of interruption: the new one waits for it.
            MultitaskStrategy::Interrupt | MultitaskStrategy::Rollback if active.status == Status::Finalizing => queued = true,
            MultitaskStrategy::Interrupt | MultitaskStrategy::Rollback => {
                let rollback = strategy == MultitaskStrategy::Rollback;
                rolled_back = rollback;
                let action = if rollback { "rollback" } else { "interrupt" };
                let ending = Ending { status: Status::Interrupted, stop_reason: "superseded".to_owned(), error: None, rollback };
                runs::Entity::update_many()
                    .col_expr(runs::Column::CancelAction, sea_orm::sea_query::Expr::value(action))
                    .col_expr(runs::Column::CancelCause, sea_orm::sea_query::Expr::value(super::cancel::CancelCause::Superseded.as_str()))
                    .filter(runs::Column::RunId.eq(active.run_id.as_str()))
                    .filter(runs::Column::CancelAction.is_null())
                    .exec(&*tx)
                    .await?;
                if let Some(end) = end_by_service(&*tx, &active, &[Status::Pending, Status::Running], &ending).await? {
                    effects.events.push(end);
                }
                effects.superseded.push(active.run_id.clone());
            }
        }
    }
    if queued {
        let waiting = runs::Entity::find()
            .filter(runs::Column::UserId.eq(user_id))
            .filter(runs::Column::ThreadId.eq(thread.thread_id.as_str()))
            .filter(runs::Column::Status.eq(Status::Pending))
            .filter(runs::Column::Queued.eq(true))
            .count(&*tx)
            .await?;
        if waiting >= u64::from(engine.config.max_queued_per_thread) {
            return Err(RunsError::ResourceExhausted(format!(
                "thread {} already has {waiting} queued runs; the limit is {} (runs.max_queued_per_thread)",
                thread.thread_id, engine.config.max_queued_per_thread
            )));
        }
    }

    let NewRun { run, input, first } =
        new_run(engine, user_id, req, fp, run_id.clone(), &thread.thread_id, base_checkpoint, queued, strategy, now);
    runs::Entity::insert(runs::ActiveModel::from(run.clone())).exec_without_returning(&*tx).await?;
    if let Some(input) = input {
        run_inputs::Entity::insert(run_inputs::ActiveModel::from(input)).exec_without_returning(&*tx).await?;
    }
    insert_rows(&*tx, std::slice::from_ref(&first), now).await?;
    effects.events.push(first);
    if !new_thread {
        threads::Entity::update_many()
            .col_expr(threads::Column::LatestRunId, sea_orm::sea_query::Expr::value(run_id.as_str()))
            .col_expr(threads::Column::UpdatedAt, sea_orm::sea_query::Expr::value(now))
            .filter(threads::Column::UserId.eq(user_id))
            .filter(threads::Column::ThreadId.eq(thread.thread_id.as_str()))
            .exec(&*tx)
            .await?;
        // The run starts from the head read above, which on PostgreSQL was read without a lock: a
        // state update (threads.updateState's rename) may have committed a new head since, having
        // seen no active run (this one is not committed yet). The update just above holds the
        // thread's row now — it waited for such an update to commit — so the head read again here is
        // final: when it moved, start over from it rather than run from a head that is no longer the
        // thread's (the rename would be lost under the run's first checkpoint). A ROLLBACK moved the
        // head itself (to the superseded run's base); a queued run waits for the active one anyway.
        if req.checkpoint_id.is_empty() && !queued && !rolled_back {
            let now_head = threads::Entity::find_by_id((user_id.to_owned(), thread.thread_id.clone()))
                .one(&*tx)
                .await?
                .and_then(|t| t.head_checkpoint_id);
            if now_head != thread.head_checkpoint_id {
                tracing::debug!(thread_id = %thread.thread_id, "the thread's head moved during admission; admitting again");
                return Ok(Attempt::HeadMoved);
            }
        }
    }
    // Before the commit: once committed, the dispatcher may start the run at any moment.
    engine.secrets.keep(&run_id, req.secrets.clone().into_iter().collect());
    if let Err(error) = tx.commit().await {
        engine.secrets.forget(&run_id);
        return Err(error.into());
    }
    engine.backlog.admitted(1);
    engine.user_runs.admitted(user_id, 1);
    metrics::counter!("antler_runs_admitted_total", "strategy" => strategy.as_str_name()).increment(1);
    Ok(Attempt::Admitted(Box::new(Admitted { run, reused: false }), effects))
}

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
        owner_worker_id: Some(engine.worker_id.clone()),
        lease_expires_at: Some(now + engine.config.lease().as_millis() as i64),
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

/// Publishes what admission committed and stops superseded local runs.
pub fn apply(engine: &Engine, effects: Effects) {
    engine.hub.publish(&effects.events);
    for run_id in effects.superseded {
        if let Some(local) = engine.local_run(&run_id) {
            local.stop(StopCause::Cancel);
        }
    }
    engine.wake.notify_one();
}
