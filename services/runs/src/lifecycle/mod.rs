//! The run state machine. Accepting an order (admission) and starting work (start) are separate
//! commitments; every transition is a compare-and-set in the database, so concurrent clients,
//! workers and replicas agree on one outcome.
//!
//! ```text
//! PENDING ─try_start─▶ RUNNING ─▶ FINALIZING ─▶ SUCCESS | ERROR | INTERRUPTED | TIMEOUT
//!    └─cancel─▶ INTERRUPTED        └─cancel/takeover/fencing─▶ INTERRUPTED | ERROR
//! ```
//! A terminal status is never overwritten by another.

pub mod admission;
pub mod backlog;
pub mod cancel;
pub mod finalize;
pub mod lease;
pub mod liveness;
pub mod start;
pub mod user_caps;

use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{EndEvent, RunError, RunUsage};
use prost::Message;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use antler_kit::redact::redact;

use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::{runs, threads};
use crate::store::{now_ms, statement};
use crate::stream::{Writer, append};
use antler_proto::runs::RunEvent;

/// How the service ends a run it does not execute (cancel before start, supersession, takeover of a
/// dead worker's run, too many attempts).
#[derive(Debug, Clone)]
pub struct Ending {
    pub status: Status,
    pub stop_reason: String,
    pub error: Option<RunError>,
    /// Restore the thread to the run's base checkpoint.
    pub rollback: bool,
}

/// Ends `run` (currently in `from`) inside `db` and appends its END event. Returns None if the run
/// had already moved on (someone else decided first).
pub async fn end_by_service(
    db: &impl ConnectionTrait,
    run: &runs::Model,
    from: &[Status],
    ending: &Ending,
) -> Result<Option<RunEvent>, RunsError> {
    end_run(db, run, from, None, ending).await
}

/// [`end_by_service`], but when `owner` is given only while that worker still owns the run (a worker
/// closing its own run must not close one that was taken over).
pub async fn end_run(
    db: &impl ConnectionTrait,
    run: &runs::Model,
    from: &[Status],
    owner: Option<&str>,
    ending: &Ending,
) -> Result<Option<RunEvent>, RunsError> {
    let now = now_ms();
    let mut update = runs::Entity::update_many();
    if let Some(owner) = owner {
        update = update.filter(runs::Column::OwnerWorkerId.eq(owner));
    }
    let changed = update
        .col_expr(runs::Column::Status, Expr::value(ending.status))
        .col_expr(runs::Column::StopReason, Expr::value(ending.stop_reason.clone()))
        .col_expr(runs::Column::ErrorCode, Expr::value(ending.error.as_ref().map(|e| e.code.clone())))
        .col_expr(runs::Column::ErrorMessage, Expr::value(ending.error.as_ref().map(|e| redact(&e.message).into_owned())))
        .col_expr(runs::Column::FinishedAt, Expr::value(now))
        .col_expr(runs::Column::LeaseExpiresAt, Expr::value(Option::<i64>::None))
        .col_expr(runs::Column::Queued, Expr::value(false))
        .col_expr(runs::Column::UpdatedAt, Expr::value(now))
        .filter(runs::Column::RunId.eq(run.run_id.as_str()))
        .filter(runs::Column::Status.is_in(from.iter().copied()))
        .exec(db)
        .await?
        .rows_affected;
    if changed == 0 {
        return Ok(None);
    }
    metrics::counter!("antler_run_transitions_total", "to" => ending.status.as_str()).increment(1);
    // A run still queued never moved the head (and its base is not set before its turn): nothing to
    // put back.
    if ending.rollback && !run.queued {
        restore_head(db, run).await?;
    }
    let usage = RunUsage::decode(run.usage.as_slice()).unwrap_or_default();
    let end = Kind::End(EndEvent {
        status: ending.status.to_proto() as i32,
        stop_reason: ending.stop_reason.clone(),
        error: ending.error.clone(),
        usage: Some(usage),
    });
    append(db, &run.run_id, &run.thread_id, Writer::Service, end).await
}

/// Puts the thread back at the checkpoint it had when `run` was admitted (ROLLBACK).
pub async fn restore_head(db: &impl ConnectionTrait, run: &runs::Model) -> Result<(), RunsError> {
    threads::Entity::update_many()
        .col_expr(threads::Column::HeadCheckpointId, Expr::value(run.base_checkpoint_id.clone()))
        .col_expr(threads::Column::UpdatedAt, Expr::value(now_ms()))
        .filter(threads::Column::UserId.eq(run.user_id.as_str()))
        .filter(threads::Column::ThreadId.eq(run.thread_id.as_str()))
        .exec(db)
        .await?;
    Ok(())
}

/// Lets the oldest ENQUEUE run of a thread become its active run, if the thread has none. Returns
/// whether one was promoted (the dispatcher should look for work). One statement (the choice and the
/// check are subqueries of the UPDATE): it runs inside closing transactions that hold the writer.
/// A queued run that names no checkpoint starts from the thread's head as it is now (its
/// predecessors' work), not as it was when the run was admitted.
///
/// Written as SQL text, not built with sea-query: every closing runs it, almost always to promote
/// nothing, and building it (three subqueries) was one of the largest sources of allocations on the
/// SQLite writer thread (heaptrack, #32: 689,896 while 1,737 runs ended). The text is the same every
/// time, so SQLite's statement cache keeps it prepared.
pub async fn promote_next_queued(db: &impl ConnectionTrait, user_id: &str, thread_id: &str) -> Result<bool, RunsError> {
    const PROMOTE: &str = "UPDATE runs SET queued = FALSE, \
         base_checkpoint_id = COALESCE(base_checkpoint_id, (SELECT head_checkpoint_id FROM threads WHERE user_id = ? AND thread_id = ?)), \
         updated_at = ? \
         WHERE run_id = (SELECT run_id FROM runs WHERE user_id = ? AND thread_id = ? AND status = 'pending' AND queued = TRUE \
                         ORDER BY created_at, run_id LIMIT 1) \
         AND NOT EXISTS (SELECT 1 FROM runs WHERE user_id = ? AND thread_id = ? \
                         AND status IN ('pending', 'running', 'finalizing') AND queued = FALSE)";
    let (user, thread) = (sea_orm::Value::from(user_id), sea_orm::Value::from(thread_id));
    let values = vec![user.clone(), thread.clone(), now_ms().into(), user.clone(), thread.clone(), user, thread];
    let promoted = db.execute_raw(statement(db.get_database_backend(), PROMOTE, values)).await?.rows_affected();
    Ok(promoted > 0)
}
