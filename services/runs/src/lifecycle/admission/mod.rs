//! Admission: accepting a run order. Callers enter through one function each and sequence nothing:
//!
//! - [`admit`]: a client's CreateRun (the RunService handlers; the LangGraph edge reaches it through
//!   those handlers) — `request.rs` (fields and limits, `sanitise`), `resume.rs` (a clarification's
//!   answer becomes the input), `request.rs` again (the model allowlist), then one transaction that
//!   applies the idempotency key and the thread's multitask policy and inserts the run PENDING, or
//!   refuses and writes nothing: `batch.rs` (group commit, runs on new threads) or `one.rs` (a
//!   transaction of its own); last, what the commit made visible is published.
//! - [`admit_child`] (`child.rs`): a subagent's child run, admitted and started in the transaction that
//!   also journals the parent's `task` call.
//!
//! `rows.rs` builds the rows both write.

mod batch;
mod child;
mod one;
mod request;
mod resume;
mod rows;

use antler_kit::CallContext;
use antler_proto::runs::{CreateRunRequest, RunEvent};

pub use batch::{Batcher, Job, run as run_batcher};
pub use child::{ChildOrder, admit_child};
pub use request::{LANGGRAPH_STREAM_MODES, fingerprint, sanitise};
pub use rows::INLINE_REQUEST_BYTES;

use crate::engine::{Engine, StopCause};
use crate::error::RunsError;
use crate::store::entity::runs;

/// The result of admission.
#[derive(Debug)]
pub struct Admitted {
    pub run: runs::Model,
    /// The idempotency key named an existing run, returned as it is.
    pub reused: bool,
}

/// Events to publish after the admission transaction commits, and runs to stop locally.
#[derive(Debug, Default)]
pub struct Effects {
    pub events: Vec<RunEvent>,
    pub superseded: Vec<String>,
}

/// A new run's id (time-ordered: UUIDv7).
pub fn new_run_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Admits a client's CreateRunRequest (CreateRun, StreamRun, WaitRun) as run `run_id` (from
/// [`new_run_id`], chosen by the caller so that it can watch the run before it exists) or refuses it,
/// writing nothing; counts the outcome in `antler_run_admissions_total`. An idempotency key that names
/// an existing run returns that run instead.
pub async fn admit(
    engine: &Engine,
    batcher: &Batcher,
    ctx: &CallContext,
    req: CreateRunRequest,
    run_id: String,
) -> Result<Admitted, RunsError> {
    let result = admit_request(engine, batcher, ctx, req, run_id).await;
    metrics::counter!("antler_run_admissions_total", "outcome" => outcome(&result)).increment(1);
    result
}

async fn admit_request(
    engine: &Engine,
    batcher: &Batcher,
    ctx: &CallContext,
    mut req: CreateRunRequest,
    run_id: String,
) -> Result<Admitted, RunsError> {
    let user_id = ctx.identity.user_id.as_str();
    if req.subagent.is_some() {
        return Err(RunsError::invalid(
            "subagent",
            "is set by the runs service on the child runs of a `task` call; a client cannot create one\nhint: enable config.subagents_enabled and let the lead agent delegate",
        ));
    }
    sanitise(engine, &mut req)?;
    resume::apply(engine, user_id, &mut req).await?;
    let model = req.config.as_ref().map(|c| c.model_name.clone()).unwrap_or_default();
    request::check_model(engine, ctx, &model).await?;
    let (admitted, effects) = create_or_reject(engine, batcher, user_id, &req, run_id).await?;
    apply(engine, effects);
    Ok(admitted)
}

/// Admits `req` (which passed `sanitise`) or refuses it, writing nothing: a run on a new thread goes
/// with the next group commit, any other in a transaction of its own.
async fn create_or_reject(
    engine: &Engine,
    batcher: &Batcher,
    user_id: &str,
    req: &CreateRunRequest,
    run_id: String,
) -> Result<(Admitted, Effects), RunsError> {
    let fp = fingerprint(req);
    if Batcher::batchable(req) {
        return batcher.admit(user_id, req, fp, run_id).await;
    }
    one::create_or_reject_one(engine, user_id, req, &fp, &run_id).await
}

/// Publishes what admission committed, stops superseded local runs and wakes the dispatcher.
fn apply(engine: &Engine, effects: Effects) {
    engine.hub().publish(&effects.events);
    for run_id in effects.superseded {
        if let Some(local) = engine.local_run(&run_id) {
            local.stop(StopCause::Cancel);
        }
    }
    engine.wake_dispatcher();
}

/// The `outcome` label of `antler_run_admissions_total`: a fixed word per way an admission can end
/// (by the gRPC code the error becomes).
fn outcome(result: &Result<Admitted, RunsError>) -> &'static str {
    match result {
        Ok(Admitted { reused: false, .. }) => "admitted",
        Ok(Admitted { reused: true, .. }) => "reused",
        // FAILED_PRECONDITION, ABORTED.
        Err(RunsError::FailedPrecondition(_) | RunsError::Aborted(_)) => "rejected",
        // INVALID_ARGUMENT, NOT_FOUND.
        Err(RunsError::InvalidArgument { .. } | RunsError::NotFound(_)) => "invalid",
        // RESOURCE_EXHAUSTED, UNAVAILABLE (a database a retry can reach again included).
        Err(RunsError::ResourceExhausted(_) | RunsError::Unavailable(_)) => "shed",
        Err(RunsError::Store(error)) if error.is_transient() => "shed",
        Err(RunsError::Store(_)) => "error",
    }
}
