//! One admission in one transaction: the idempotency key, the backlog and per-user caps, the thread
//! (found or made), the multitask policy against its active run, then the run's rows — or a refusal
//! that writes nothing. Retried on a lost unique-index race as the strategy allows.

use antler_proto::runs::{CreateRunRequest, MultitaskStrategy, RunEvent};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter};

use super::rows::{NewRun, new_run, new_thread_row};
use super::{Admitted, Effects};
use crate::engine::Engine;
use crate::error::RunsError;
use crate::lifecycle::cancel::CancelCause;
use crate::lifecycle::{Ending, end_by_service, user_caps};
use crate::status::Status;
use crate::store::entity::{checkpoints, run_inputs, runs, threads};
use crate::store::{WriteTx, now_ms};
use crate::stream::insert_rows;

/// One admission in one transaction (retried on a lost unique-index race as its strategy allows).
pub(crate) async fn create_or_reject_one(
    engine: &Engine,
    user_id: &str,
    req: &CreateRunRequest,
    fp: &str,
    run_id: &str,
) -> Result<(Admitted, Effects), RunsError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        // Every attempt inserts the same run id: a failed one was rolled back, its id is free.
        match engine.store().retry_busy(|| try_admit(engine, user_id, req, fp, run_id)).await {
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
        .one(engine.store().db())
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

/// One admission transaction, step by step; each step reads or writes inside `tx`, and a refusal
/// returns before the commit (so it writes nothing).
async fn try_admit(engine: &Engine, user_id: &str, req: &CreateRunRequest, fp: &str, run_id: &str) -> Result<Attempt, RunsError> {
    let tx = engine.store().tx_for(crate::store::Priority::Admission).await?;
    let now = now_ms();
    let mut effects = Effects::default();
    if let Some(existing) = reused_by_key(&*tx, user_id, req, fp).await? {
        return Ok(Attempt::Admitted(Box::new(existing), effects));
    }
    check_capacity(engine, &*tx, user_id).await?;
    let run_id = run_id.to_owned();
    let (thread, new_thread) = thread_of(&*tx, user_id, req, &run_id, now).await?;
    let strategy = strategy_of(req);
    let placement = if new_thread { Placement::default() } else { apply_policy(&*tx, user_id, &thread, strategy, &mut effects).await? };
    let base_checkpoint = base_checkpoint(&*tx, user_id, req, &thread, &placement).await?;
    if placement.queued {
        check_queue(engine, &*tx, user_id, &thread.thread_id).await?;
    }
    let NewRun { run, input, first } =
        new_run(engine, user_id, req, fp, run_id.clone(), &thread.thread_id, base_checkpoint, placement.queued, strategy, now);
    write_run(&*tx, &run, input, &first, now).await?;
    effects.events.push(first);
    if !new_thread {
        name_latest_run(&*tx, user_id, &thread.thread_id, &run_id, now).await?;
        // The run starts from the head read above, which on PostgreSQL was read without a lock: a
        // state update (threads.updateState's rename) may have committed a new head since, having
        // seen no active run (this one is not committed yet). The update just above holds the
        // thread's row now — it waited for such an update to commit — so the head read again here is
        // final: when it moved, start over from it rather than run from a head that is no longer the
        // thread's (the rename would be lost under the run's first checkpoint). A ROLLBACK moved the
        // head itself (to the superseded run's base); a queued run waits for the active one anyway.
        if req.checkpoint_id.is_empty() && !placement.queued && placement.restored.is_none() && head_moved(&*tx, &thread).await? {
            tracing::debug!(thread_id = %thread.thread_id, "the thread's head moved during admission; admitting again");
            return Ok(Attempt::HeadMoved);
        }
    }
    commit(engine, tx, user_id, &run_id, req).await?;
    metrics::counter!("antler_runs_admitted_total", "strategy" => strategy.as_str_name()).increment(1);
    Ok(Attempt::Admitted(Box::new(Admitted { run, reused: false }), effects))
}

/// The run this user already admitted under the request's idempotency key, if any (read in the
/// admission's transaction; a different body under the same key is FAILED_PRECONDITION).
async fn reused_by_key(tx: &impl ConnectionTrait, user_id: &str, req: &CreateRunRequest, fp: &str) -> Result<Option<Admitted>, RunsError> {
    if req.idempotency_key.is_empty() {
        return Ok(None);
    }
    let existing = runs::Entity::find()
        .filter(runs::Column::UserId.eq(user_id))
        .filter(runs::Column::IdempotencyKey.eq(req.idempotency_key.as_str()))
        .one(tx)
        .await?;
    existing.map(|existing| reuse(existing, fp)).transpose()
}

/// `runs.max_pending_runs` and the per-user caps: RESOURCE_EXHAUSTED when one is reached.
async fn check_capacity(engine: &Engine, tx: &impl ConnectionTrait, user_id: &str) -> Result<(), RunsError> {
    let limit = engine.config().max_pending_runs;
    if limit > 0 {
        let pending = engine.backlog().pending(tx).await?;
        if pending >= limit {
            return Err(backlog_full(pending, limit));
        }
    }
    user_caps::check(engine.config(), engine.user_runs().counts(engine.config(), tx, user_id).await?)
}

/// The run's thread: an existing one of this user, or a new one when no id was given (which can have
/// no active run, and starts out naming this run as its latest: fewer statements in the writer slot).
/// Returns it and whether it was made here.
async fn thread_of(
    tx: &impl ConnectionTrait,
    user_id: &str,
    req: &CreateRunRequest,
    run_id: &str,
    now: i64,
) -> Result<(threads::Model, bool), RunsError> {
    if req.thread_id.is_empty() {
        let thread = new_thread_row(user_id, run_id, now);
        threads::Entity::insert(threads::ActiveModel::from(thread.clone())).exec_without_returning(tx).await?;
        return Ok((thread, true));
    }
    match threads::Entity::find_by_id((user_id.to_owned(), req.thread_id.clone())).one(tx).await? {
        Some(thread) => Ok((thread, false)),
        // create_thread: the named thread is made in this transaction, so a refusal below (or a
        // failed commit) leaves no thread behind. A concurrent create of the same id loses the
        // primary key race and is retried by the caller like any unique violation.
        None if req.create_thread => {
            let thread = threads::Model { thread_id: req.thread_id.clone(), ..new_thread_row(user_id, run_id, now) };
            threads::Entity::insert(threads::ActiveModel::from(thread.clone())).exec_without_returning(tx).await?;
            Ok((thread, true))
        }
        None => Err(RunsError::NotFound(format!("thread {}", req.thread_id))),
    }
}

/// The checkpoint the run starts from: the one the request names (which must be the thread's), or
/// the thread's head — after the policy: a ROLLBACK put it back to the superseded run's base, and
/// a queued run starts from the head its predecessors leave (None here: its promotion sets it, see
/// `lifecycle::promote_next_queued`).
async fn base_checkpoint(
    tx: &impl ConnectionTrait,
    user_id: &str,
    req: &CreateRunRequest,
    thread: &threads::Model,
    placement: &Placement,
) -> Result<Option<String>, RunsError> {
    if req.checkpoint_id.is_empty() {
        return Ok(match (&placement.restored, placement.queued) {
            (_, true) => None,
            (Some(restored), false) => restored.clone(),
            (None, false) => thread.head_checkpoint_id.clone(),
        });
    }
    let found = checkpoints::Entity::find_by_id(req.checkpoint_id.clone())
        .filter(checkpoints::Column::UserId.eq(user_id))
        .filter(checkpoints::Column::ThreadId.eq(thread.thread_id.as_str()))
        .one(tx)
        .await?;
    if found.is_none() {
        return Err(RunsError::NotFound(format!("checkpoint {} of thread {}", req.checkpoint_id, thread.thread_id)));
    }
    Ok(Some(req.checkpoint_id.clone()))
}

/// The request's multitask strategy (REJECT when unset).
fn strategy_of(req: &CreateRunRequest) -> MultitaskStrategy {
    match MultitaskStrategy::try_from(req.multitask_strategy) {
        Ok(MultitaskStrategy::Unspecified) | Err(_) => MultitaskStrategy::Reject,
        Ok(s) => s,
    }
}

/// Where the multitask policy puts the new run.
#[derive(Debug, Default)]
struct Placement {
    /// Behind the thread's active run (ENQUEUE, or an active run already finalizing).
    queued: bool,
    /// The active run was superseded with ROLLBACK: the thread's head moved back to this (its base).
    restored: Option<Option<String>>,
}

/// The multitask policy against the thread's active run: REJECT refuses, ENQUEUE queues, INTERRUPT /
/// ROLLBACK end the active run INTERRUPTED `superseded` (its END event and the run to stop locally go
/// into `effects`) — unless it is finalizing, past the point of interruption: then the new run waits.
async fn apply_policy(
    tx: &impl ConnectionTrait,
    user_id: &str,
    thread: &threads::Model,
    strategy: MultitaskStrategy,
    effects: &mut Effects,
) -> Result<Placement, RunsError> {
    let active = runs::Entity::find()
        .filter(runs::Column::UserId.eq(user_id))
        .filter(runs::Column::ThreadId.eq(thread.thread_id.as_str()))
        .filter(runs::Column::Status.is_in(Status::ACTIVE))
        .filter(runs::Column::Queued.eq(false))
        .one(tx)
        .await?;
    let Some(active) = active else { return Ok(Placement::default()) };
    match strategy {
        MultitaskStrategy::Reject | MultitaskStrategy::Unspecified => Err(active_run_conflict(&thread.thread_id, Some(&active.run_id))),
        MultitaskStrategy::Enqueue => Ok(Placement { queued: true, restored: None }),
        MultitaskStrategy::Interrupt | MultitaskStrategy::Rollback if active.status == Status::Finalizing => {
            Ok(Placement { queued: true, restored: None })
        }
        MultitaskStrategy::Interrupt | MultitaskStrategy::Rollback => {
            let rollback = strategy == MultitaskStrategy::Rollback;
            let action = if rollback { "rollback" } else { "interrupt" };
            let ending = Ending { status: Status::Interrupted, stop_reason: "superseded".to_owned(), error: None, rollback };
            runs::Entity::update_many()
                .col_expr(runs::Column::CancelAction, Expr::value(action))
                .col_expr(runs::Column::CancelCause, Expr::value(CancelCause::Superseded.as_str()))
                .filter(runs::Column::RunId.eq(active.run_id.as_str()))
                .filter(runs::Column::CancelAction.is_null())
                .exec(tx)
                .await?;
            let mut restored = None;
            if let Some(end) = end_by_service(tx, &active, &[Status::Pending, Status::Running], &ending).await? {
                effects.events.push(end);
                if rollback {
                    restored = Some(active.base_checkpoint_id.clone());
                }
            }
            effects.superseded.push(active.run_id.clone());
            Ok(Placement { queued: false, restored })
        }
    }
}

/// `runs.max_queued_per_thread`: RESOURCE_EXHAUSTED when the thread's queue is full.
async fn check_queue(engine: &Engine, tx: &impl ConnectionTrait, user_id: &str, thread_id: &str) -> Result<(), RunsError> {
    let waiting = runs::Entity::find()
        .filter(runs::Column::UserId.eq(user_id))
        .filter(runs::Column::ThreadId.eq(thread_id))
        .filter(runs::Column::Status.eq(Status::Pending))
        .filter(runs::Column::Queued.eq(true))
        .count(tx)
        .await?;
    if waiting >= u64::from(engine.config().max_queued_per_thread) {
        return Err(RunsError::ResourceExhausted(format!(
            "thread {thread_id} already has {waiting} queued runs; the limit is {} (runs.max_queued_per_thread)",
            engine.config().max_queued_per_thread
        )));
    }
    Ok(())
}

/// Writes the run's row, its large input (if any) and its first event.
async fn write_run(
    tx: &impl ConnectionTrait,
    run: &runs::Model,
    input: Option<run_inputs::Model>,
    first: &RunEvent,
    now: i64,
) -> Result<(), RunsError> {
    runs::Entity::insert(runs::ActiveModel::from(run.clone())).exec_without_returning(tx).await?;
    if let Some(input) = input {
        run_inputs::Entity::insert(run_inputs::ActiveModel::from(input)).exec_without_returning(tx).await?;
    }
    insert_rows(tx, std::slice::from_ref(first), now).await?;
    Ok(())
}

/// Names the run as its (existing) thread's latest; the update holds the thread's row until commit.
async fn name_latest_run(tx: &impl ConnectionTrait, user_id: &str, thread_id: &str, run_id: &str, now: i64) -> Result<(), RunsError> {
    threads::Entity::update_many()
        .col_expr(threads::Column::LatestRunId, Expr::value(run_id))
        .col_expr(threads::Column::UpdatedAt, Expr::value(now))
        .filter(threads::Column::UserId.eq(user_id))
        .filter(threads::Column::ThreadId.eq(thread_id))
        .exec(tx)
        .await?;
    Ok(())
}

/// Whether the thread's head is no longer the one `thread` was read with.
async fn head_moved(tx: &impl ConnectionTrait, thread: &threads::Model) -> Result<bool, RunsError> {
    let now_head =
        threads::Entity::find_by_id((thread.user_id.clone(), thread.thread_id.clone())).one(tx).await?.and_then(|t| t.head_checkpoint_id);
    Ok(now_head != thread.head_checkpoint_id)
}

/// Keeps the run's request secrets (before the commit: once committed, the dispatcher may start the
/// run at any moment), commits, and counts the run in the backlog and its user's caps.
async fn commit(engine: &Engine, tx: WriteTx, user_id: &str, run_id: &str, req: &CreateRunRequest) -> Result<(), RunsError> {
    engine.secrets().keep(run_id, req.secrets.clone().into_iter().collect());
    if let Err(error) = tx.commit().await {
        engine.secrets().forget(run_id);
        return Err(error.into());
    }
    engine.backlog().admitted(1);
    engine.user_runs().admitted(user_id, 1);
    Ok(())
}
