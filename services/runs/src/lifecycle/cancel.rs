//! CancelRun: the first cancel request wins (durable `cancel_action` and `cancel_cause`), beats a
//! completion that races it (finalize only enters FINALIZING while no cancel was requested), and a
//! cancelled run ends INTERRUPTED without passing through FINALIZING.

use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{CancelAction, RunEvent};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

use super::{Ending, end_by_service, promote_next_queued};
use crate::engine::{Engine, StopCause};
use crate::error::RunsError;
use crate::hub::{Live, Wake};
use crate::status::Status;
use crate::store::entity::runs;
use crate::store::now_ms;

/// The action that won, as a string.
pub fn action_str(action: CancelAction) -> &'static str {
    if action == CancelAction::Rollback { "rollback" } else { "interrupt" }
}

pub fn action_from_str(action: Option<&str>) -> CancelAction {
    match action {
        Some("rollback") => CancelAction::Rollback,
        Some("interrupt") => CancelAction::Interrupt,
        _ => CancelAction::Unspecified,
    }
}

/// Why a cancel was requested. Decided, with the action, by the first request; it becomes the run's
/// stop_reason, so an operator can tell an explicit cancel from a client that went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelCause {
    /// CancelRun (or DeleteThread of a thread with an active run).
    Requested,
    /// The StreamRun / WaitRun / JoinRun client went away with on_disconnect CANCEL.
    ClientDisconnected,
    /// A newer run on the thread with multitask_strategy INTERRUPT or ROLLBACK.
    Superseded,
}

impl CancelCause {
    /// The stored form (`runs.cancel_cause`).
    pub fn as_str(self) -> &'static str {
        match self {
            CancelCause::Requested => "requested",
            CancelCause::ClientDisconnected => "client_disconnected",
            CancelCause::Superseded => "superseded",
        }
    }

    /// The stored form back; a run cancelled before causes were recorded counts as requested.
    pub fn parse(stored: Option<&str>) -> Self {
        match stored {
            Some("client_disconnected") => CancelCause::ClientDisconnected,
            Some("superseded") => CancelCause::Superseded,
            _ => CancelCause::Requested,
        }
    }
}

/// How a run whose cancel request won ends: INTERRUPTED, with the stop_reason its cause and action
/// give ("cancelled", "rolled_back", "client_disconnected", "superseded"). Every path that closes a
/// cancelled run (this module, the worker's finalization, the sweeper) ends it with this.
pub fn ending_of(run: &runs::Model) -> Ending {
    let rollback = run.cancel_action.as_deref() == Some("rollback");
    let stop_reason = match CancelCause::parse(run.cancel_cause.as_deref()) {
        CancelCause::Superseded => "superseded",
        CancelCause::ClientDisconnected => "client_disconnected",
        CancelCause::Requested if rollback => "rolled_back",
        CancelCause::Requested => "cancelled",
    };
    Ending { status: Status::Interrupted, stop_reason: stop_reason.to_owned(), error: None, rollback }
}

/// Requests cancellation of `run_id` (owned by `user_id`) for `cause`. Returns the winning action.
///
/// Idempotent: once a cancel has won, every further request — while the run stops and after it is
/// INTERRUPTED — answers OK with the same action and changes nothing, so a client may retry a cancel
/// that timed out. A run whose agent already completed (FINALIZING, or a terminal status other than
/// INTERRUPTED) is not cancellable: FAILED_PRECONDITION.
pub async fn cancel(
    engine: &Engine,
    user_id: &str,
    thread_id: &str,
    run_id: &str,
    action: CancelAction,
    cause: CancelCause,
) -> Result<CancelAction, RunsError> {
    let action = if action == CancelAction::Unspecified { CancelAction::Interrupt } else { action };
    let mut events: Vec<RunEvent> = Vec::new();
    let tx = engine.store().tx().await?;
    let find = || runs::Entity::find_by_id(run_id.to_owned()).filter(runs::Column::UserId.eq(user_id)).one(&*tx);
    let run = find()
        .await?
        .filter(|r| thread_id.is_empty() || r.thread_id == thread_id)
        .ok_or_else(|| RunsError::NotFound(format!("run {run_id}")))?;
    if run.status == Status::Interrupted {
        return Ok(action_from_str(run.cancel_action.as_deref().or(Some("interrupt"))));
    }
    not_cancellable(&run)?;
    if run.cancel_action.is_none() {
        // The first request wins; only a run that has not completed can be cancelled.
        runs::Entity::update_many()
            .col_expr(runs::Column::CancelAction, Expr::value(action_str(action)))
            .col_expr(runs::Column::CancelCause, Expr::value(cause.as_str()))
            .col_expr(runs::Column::UpdatedAt, Expr::value(now_ms()))
            .filter(runs::Column::RunId.eq(run_id))
            .filter(runs::Column::CancelAction.is_null())
            .filter(runs::Column::Status.is_in([Status::Pending, Status::Running]))
            .exec(&*tx)
            .await?;
    }
    let run = find().await?.ok_or_else(|| RunsError::NotFound(format!("run {run_id}")))?;
    let Some(winner) = run.cancel_action.clone() else {
        // A completion entered FINALIZING between our read and our write.
        not_cancellable(&run)?;
        return Err(RunsError::FailedPrecondition(format!("run {run_id} could not be cancelled\nhint: read its outcome with GetRun")));
    };
    let ending = ending_of(&run);
    let mut promoted = false;
    let lease_dead = run.lease_expires_at.is_none_or(|l| l < now_ms() - engine.config().grace().as_millis() as i64);
    if run.status == Status::Pending {
        // Not started: end it here; try_start's compare-and-set now fails, so no agent is built.
        if let Some(end) = end_by_service(&*tx, &run, &[Status::Pending], &ending).await? {
            events.push(end);
            promoted = promote_next_queued(&*tx, &run.user_id, &run.thread_id).await?;
        }
    } else if run.status == Status::Running && lease_dead && engine.local_run(run_id).is_none() {
        // Its worker is gone: nobody else will close it.
        if let Some(end) = end_by_service(&*tx, &run, &[Status::Running], &ending).await? {
            events.push(end);
            promoted = promote_next_queued(&*tx, &run.user_id, &run.thread_id).await?;
        }
    }
    tx.commit().await?;
    engine.hub().publish(&events);
    if run.status == Status::Running
        && let Some(local) = engine.local_run(run_id)
    {
        // Running here: stop the agent now; the worker ends the run INTERRUPTED. A run on another
        // live replica is stopped by that replica when the request's notification reaches it
        // (`crate::notify`; its lease renewal, which reads the request too, is the fallback).
        local.stop(StopCause::Cancel);
    }
    if promoted {
        engine.wake_dispatcher();
    }
    tracing::info!(run_id, action = %winner, cause = cause.as_str(), "cancel requested");
    cancel_children(engine, user_id, run_id, cause).await;
    Ok(action_from_str(Some(&winner)))
}

/// A cancel of a run reaches its subagent runs: each active child is interrupted for the same cause
/// (a rollback of the parent does not roll the children's own threads back). Best effort: a child
/// that cannot be cancelled now ends when its parent stops waiting on it.
async fn cancel_children(engine: &Engine, user_id: &str, run_id: &str, cause: CancelCause) {
    let children: Result<Vec<String>, _> = runs::Entity::find()
        .select_only()
        .column(runs::Column::RunId)
        .filter(runs::Column::ParentRunId.eq(run_id))
        .filter(runs::Column::Status.is_in(Status::ACTIVE))
        .into_tuple()
        .all(engine.store().db())
        .await;
    match children {
        Ok(children) => {
            for child in children {
                if let Err(error) = Box::pin(cancel(engine, user_id, "", &child, CancelAction::Interrupt, cause)).await {
                    tracing::debug!(run_id = %child, %error, "subagent run not cancelled with its parent");
                }
            }
        }
        Err(error) => tracing::warn!(run_id, %error, "cannot list the run's subagent runs to cancel them"),
    }
}

/// FAILED_PRECONDITION for a run past the point where a cancel can win.
fn not_cancellable(run: &runs::Model) -> Result<(), RunsError> {
    let status = run.status.to_proto().as_str_name().trim_start_matches("RUN_STATUS_");
    if run.status == Status::Finalizing {
        return Err(RunsError::FailedPrecondition(format!(
            "run {} is not cancellable (status: {status}): its agent already completed and its outcome is being written\nhint: read the outcome with GetRun in a moment",
            run.run_id
        )));
    }
    if run.status.is_terminal() && run.status != Status::Interrupted {
        return Err(RunsError::FailedPrecondition(format!(
            "run {} is not cancellable (status: {status}): it already ended\nhint: read the outcome with GetRun",
            run.run_id
        )));
    }
    Ok(())
}

/// Waits until `run_id` is terminal (bounded by the caller's deadline). Woken by the run's END —
/// published here, notified by another replica, or found by the safety poll — never by a timer of
/// its own: the store is read once at the start and once per wake-up that may mean the end.
pub async fn wait_terminal(engine: &Engine, run_id: &str) -> Result<runs::Model, RunsError> {
    let mut watch = engine.hub().watch(run_id);
    loop {
        let run = runs::Entity::find_by_id(run_id.to_owned())
            .one(engine.store().db())
            .await?
            .ok_or_else(|| RunsError::NotFound(format!("run {run_id}")))?;
        if run.status.is_terminal() {
            return Ok(run);
        }
        loop {
            match watch.next().await {
                Wake::Live(Live::Event(event)) if matches!(event.kind, Some(Kind::End(_))) => break,
                Wake::Live(Live::Stored { end: true, .. } | Live::Resync) | Wake::Lagged | Wake::Closed => break,
                Wake::Live(_) => {}
            }
        }
    }
}
