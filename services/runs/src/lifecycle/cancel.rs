//! CancelRun: the first cancel request wins (durable `cancel_action`), and beats a completion that
//! races it (finalize only enters FINALIZING while no cancel was requested).

use antler_proto::runs::{CancelAction, RunEvent};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use super::{Ending, FINALIZING, INTERRUPTED, PENDING, RUNNING, end_by_service, is_terminal, promote_next_queued, status_from_str};
use crate::engine::{Engine, StopCause};
use crate::error::RunsError;
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

/// Requests cancellation of `run_id` (owned by `user_id`). Returns the winning action.
pub async fn cancel(
    engine: &Engine,
    user_id: &str,
    thread_id: &str,
    run_id: &str,
    action: CancelAction,
) -> Result<CancelAction, RunsError> {
    let action = if action == CancelAction::Unspecified { CancelAction::Interrupt } else { action };
    let mut events: Vec<RunEvent> = Vec::new();
    let tx = engine.store.tx().await?;
    let run = runs::Entity::find_by_id(run_id.to_owned())
        .filter(runs::Column::UserId.eq(user_id))
        .one(&*tx)
        .await?
        .filter(|r| thread_id.is_empty() || r.thread_id == thread_id)
        .ok_or_else(|| RunsError::NotFound(format!("run {run_id}")))?;
    if run.status == INTERRUPTED {
        return Ok(action_from_str(run.cancel_action.as_deref().or(Some("interrupt"))));
    }
    if is_terminal(&run.status) || run.status == FINALIZING {
        return Err(RunsError::FailedPrecondition(format!(
            "run {run_id} is not cancellable (status: {})",
            status_from_str(&run.status).as_str_name().trim_start_matches("RUN_STATUS_")
        )));
    }
    // Record the request durably; the first one wins.
    runs::Entity::update_many()
        .col_expr(runs::Column::CancelAction, Expr::value(action_str(action)))
        .col_expr(runs::Column::UpdatedAt, Expr::value(now_ms()))
        .filter(runs::Column::RunId.eq(run_id))
        .filter(runs::Column::CancelAction.is_null())
        .exec(&*tx)
        .await?;
    let winner = runs::Entity::find_by_id(run_id.to_owned())
        .one(&*tx)
        .await?
        .and_then(|r| r.cancel_action)
        .unwrap_or_else(|| action_str(action).to_owned());
    let rollback = winner == "rollback";
    let ending =
        Ending { status: INTERRUPTED, stop_reason: if rollback { "rolled_back" } else { "cancelled" }.to_owned(), error: None, rollback };
    let mut promoted = false;
    let lease_dead = run.lease_expires_at.is_none_or(|l| l < now_ms() - engine.config.grace().as_millis() as i64);
    if run.status == PENDING {
        // Not started: end it here; try_start's compare-and-set now fails, so no agent is built.
        if let Some(end) = end_by_service(&*tx, &run, &[PENDING], &ending).await? {
            events.push(end);
            promoted = promote_next_queued(&*tx, &run.user_id, &run.thread_id).await?;
        }
    } else if run.status == RUNNING && lease_dead && engine.local_run(run_id).is_none() {
        // Its worker is gone: nobody else will close it.
        if let Some(end) = end_by_service(&*tx, &run, &[RUNNING], &ending).await? {
            events.push(end);
            promoted = promote_next_queued(&*tx, &run.user_id, &run.thread_id).await?;
        }
    }
    tx.commit().await?;
    engine.hub.publish(&events);
    if run.status == RUNNING
        && let Some(local) = engine.local_run(run_id)
    {
        // Running here: stop the agent now. A run on another live replica sees the request at its
        // next lease renewal.
        local.stop(StopCause::Cancel);
    }
    if promoted {
        engine.wake.notify_one();
    }
    tracing::info!(run_id, action = %winner, "cancel requested");
    Ok(action_from_str(Some(&winner)))
}

/// Waits until `run_id` is terminal (polling the store; bounded by the caller's deadline).
pub async fn wait_terminal(engine: &Engine, run_id: &str) -> Result<runs::Model, RunsError> {
    loop {
        let run = runs::Entity::find_by_id(run_id.to_owned())
            .one(engine.store.db())
            .await?
            .ok_or_else(|| RunsError::NotFound(format!("run {run_id}")))?;
        if is_terminal(&run.status) {
            return Ok(run);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
