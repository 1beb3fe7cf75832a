//! Leases: a worker owns a RUNNING run only while its lease is valid. Renewal, fencing, and the
//! sweeper that takes over runs whose worker stopped renewing.

use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{Metadata, RunError};
use sea_orm::sea_query::{Condition, Expr, ExprTrait};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use super::{Ending, end_by_service, promote_next_queued};
use crate::engine::{Engine, StopCause};
use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::runs;
use crate::store::now_ms;
use crate::stream::{Writer, append};

/// The result of one renewal.
#[derive(Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Still ours; carries a durable cancel request to act on, if any.
    Renewed { cancel_action: Option<String> },
    /// Someone else owns the run now, or it ended: stop and write nothing.
    Lost,
}

/// Extends our lease on `run_id` by `runs.lease_secs`.
pub async fn renew(engine: &Engine, run_id: &str) -> Result<Renewal, RunsError> {
    let now = now_ms();
    let changed = engine
        .store()
        .retry_busy(|| async {
            let tx = engine.store().control_tx().await?;
            let changed = runs::Entity::update_many()
                .col_expr(runs::Column::LeaseExpiresAt, Expr::value(now + engine.config().lease().as_millis() as i64))
                .filter(runs::Column::RunId.eq(run_id))
                .filter(runs::Column::OwnerWorkerId.eq(engine.worker_id()))
                .filter(runs::Column::Status.is_in([Status::Running, Status::Finalizing]))
                .exec(&*tx)
                .await?
                .rows_affected;
            tx.commit().await?;
            Ok::<_, crate::store::StoreError>(changed)
        })
        .await?;
    if changed == 0 {
        return Ok(Renewal::Lost);
    }
    metrics::counter!("antler_lease_renewals_total").increment(1);
    let cancel_action: Option<Option<String>> = runs::Entity::find_by_id(run_id.to_owned())
        .select_only()
        .column(runs::Column::CancelAction)
        .into_tuple()
        .one(engine.store().control_db())
        .await?;
    Ok(Renewal::Renewed { cancel_action: cancel_action.flatten() })
}

/// Keeps a local run's lease alive every third of the lease; fences the run when renewal fails past
/// the lease's expiry, and passes durable cancel requests to the agent.
pub async fn keep_alive(engine: std::sync::Arc<Engine>, run_id: String, local: crate::engine::LocalRun) {
    let period = engine.config().lease() / 3;
    let mut deadline = tokio::time::Instant::now() + engine.config().lease();
    loop {
        tokio::select! {
            () = local.token.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        match tokio::time::timeout_at(deadline, renew(&engine, &run_id)).await {
            Ok(Ok(Renewal::Renewed { cancel_action })) => {
                deadline = tokio::time::Instant::now() + engine.config().lease();
                if cancel_action.is_some() {
                    local.stop(StopCause::Cancel);
                }
            }
            Ok(Ok(Renewal::Lost)) => {
                tracing::warn!(run_id, "lease lost: another worker owns the run; stopping without further writes");
                metrics::counter!("antler_runs_fenced_total", "cause" => "lease_lost").increment(1);
                local.stop(StopCause::Fenced);
                return;
            }
            Ok(Err(error)) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(run_id, %error, "lease renewal failed; retrying before the lease expires");
            }
            Ok(Err(_)) | Err(_) => {
                tracing::warn!(run_id, "lease expired without renewal; stopping without further writes");
                metrics::counter!("antler_runs_fenced_total", "cause" => "lease_expired").increment(1);
                local.stop(StopCause::Fenced);
                return;
            }
        }
    }
}

/// What a sweep found to resume locally.
#[derive(Debug, Default)]
pub struct Swept {
    /// Runs taken over from a dead worker (attempt already incremented), to execute here.
    pub claimed: Vec<runs::Model>,
}

/// One sweep: take over RUNNING runs whose lease expired past the grace period, close FINALIZING
/// runs whose finalizer died, promote queued runs stranded behind nothing, and forget expired
/// idempotency keys. `capacity` bounds how many runs this replica claims to execute.
pub async fn sweep(engine: &Engine, capacity: usize) -> Result<Swept, RunsError> {
    let now = now_ms();
    let swept = Swept { claimed: take_over(engine, capacity).await? };

    // Queued runs whose thread has no active run (their predecessor's finalizer died before promoting),
    // found in SQL and read a batch at a time.
    let batch = u64::from(engine.config().sweep_batch);
    let mut after: Option<(String, String)> = None;
    loop {
        let mut query = runs::Entity::find()
            .select_only()
            .column(runs::Column::UserId)
            .column(runs::Column::ThreadId)
            .filter(runs::Column::Status.eq(Status::Pending))
            .filter(runs::Column::Queued.eq(true))
            .filter(Expr::cust(format!(
                "NOT EXISTS (SELECT 1 FROM runs a WHERE a.user_id = runs.user_id AND a.thread_id = runs.thread_id \
                 AND a.status IN ({}) AND a.queued = FALSE)",
                Status::ACTIVE.map(|s| format!("'{s}'")).join(", ")
            )))
            .distinct()
            .order_by_asc(runs::Column::UserId)
            .order_by_asc(runs::Column::ThreadId)
            .limit(batch);
        if let Some((user_id, thread_id)) = &after {
            query =
                query.filter(Condition::any().add(runs::Column::UserId.gt(user_id.as_str())).add(
                    Condition::all().add(runs::Column::UserId.eq(user_id.as_str())).add(runs::Column::ThreadId.gt(thread_id.as_str())),
                ));
        }
        let stranded: Vec<(String, String)> = query.into_tuple().all(engine.store().db()).await?;
        let exhausted = (stranded.len() as u64) < batch;
        after = stranded.last().cloned();
        for (user_id, thread_id) in stranded {
            let tx = engine.store().tx().await?;
            let promoted = promote_next_queued(&*tx, &user_id, &thread_id).await?;
            tx.commit().await?;
            if promoted {
                engine.wake_dispatcher();
            }
        }
        if exhausted {
            break;
        }
    }

    // Idempotency keys are retained for runs.idempotency_retention_secs, then free for reuse.
    let tx = engine.store().tx().await?;
    runs::Entity::update_many()
        .col_expr(runs::Column::IdempotencyKey, Expr::value(Option::<String>::None))
        .filter(runs::Column::IdempotencyKey.is_not_null())
        .filter(runs::Column::CreatedAt.lt(now - (engine.config().idempotency_retention_secs * 1000) as i64))
        .filter(runs::Column::Status.is_not_in(Status::ACTIVE))
        .exec(&*tx)
        .await?;
    tx.commit().await?;

    Ok(swept)
}

/// Takes over RUNNING runs whose lease expired past the grace period (at most `capacity` of them, to
/// execute here) and closes the FINALIZING ones whose finalizer died. When expired runs are left for
/// lack of capacity, `Engine::takeovers_waiting` is set and the dispatcher offers them the next free
/// slots before any PENDING run: a run already under way, whose clients are waiting on it, goes
/// first (on saturated replicas it otherwise waited until a sweep happened to find a slot free).
pub async fn take_over(engine: &Engine, capacity: usize) -> Result<Vec<runs::Model>, RunsError> {
    let expired_before = now_ms() - engine.config().grace().as_millis() as i64;
    let mut claimed = Vec::new();
    let mut waiting = false;
    let batch = u64::from(engine.config().sweep_batch);
    let mut after = String::new();
    loop {
        let mut query = runs::Entity::find()
            .filter(runs::Column::Status.is_in([Status::Running, Status::Finalizing]))
            .filter(Condition::any().add(runs::Column::LeaseExpiresAt.is_null()).add(runs::Column::LeaseExpiresAt.lt(expired_before)))
            .filter(runs::Column::RunId.gt(after.as_str()))
            .order_by_asc(runs::Column::RunId)
            .limit(batch);
        if waiting {
            // No capacity left to claim: only the runs this pass can close still matter.
            query = query.filter(
                Condition::any()
                    .add(runs::Column::Status.eq(Status::Finalizing))
                    .add(runs::Column::CancelAction.is_not_null())
                    .add(runs::Column::Attempt.gte(engine.config().max_attempts as i32)),
            );
        }
        let orphans = query.all(engine.store().control_db()).await?;
        let exhausted = (orphans.len() as u64) < batch;
        if let Some(last) = orphans.last() {
            after = last.run_id.clone();
        }
        let events = take_over_batch(engine, orphans, capacity, expired_before, &mut claimed, &mut waiting).await?;
        engine.hub().publish(&events);
        if exhausted {
            break;
        }
    }
    engine.set_takeovers_waiting(waiting);
    Ok(claimed)
}

/// One batch of [`take_over`]: closes, ends or claims each run; returns the events to publish.
async fn take_over_batch(
    engine: &Engine,
    orphans: Vec<runs::Model>,
    capacity: usize,
    expired_before: i64,
    claimed: &mut Vec<runs::Model>,
    waiting: &mut bool,
) -> Result<Vec<antler_proto::runs::RunEvent>, RunsError> {
    let mut events = Vec::new();
    for run in orphans {
        if engine.local_run(&run.run_id).is_some() {
            continue;
        }
        // A run this pass cannot claim for lack of capacity costs no transaction: on a saturated
        // replica the dispatcher runs this pass for every slot that frees, and a transaction per
        // waiting orphan each time (one slot, dozens of orphans) delayed the takeovers themselves.
        let needs_slot = run.status != Status::Finalizing
            && run.cancel_action.is_none()
            && run.attempt < engine.config().max_attempts as i32
            && run.parent_run_id.is_none();
        if needs_slot && claimed.len() >= capacity {
            *waiting = true;
            continue;
        }
        let tx = engine.store().control_tx().await?;
        let ended = if run.status == Status::Finalizing {
            // The finalizer wrote the receipt and its intended status, then died: add only the closing.
            let status = run.final_status.filter(|s| s.is_terminal()).unwrap_or(Status::Error);
            let ending = Ending {
                status,
                stop_reason: run.stop_reason.clone().unwrap_or_default(),
                error: stored_error(&run),
                rollback: run.cancel_action.as_deref() == Some("rollback"),
            };
            end_by_service(&*tx, &run, &[Status::Finalizing], &ending).await?
        } else if run.cancel_action.is_some() {
            end_by_service(&*tx, &run, &[Status::Running], &super::cancel::ending_of(&run)).await?
        } else if run.attempt >= engine.config().max_attempts as i32 {
            let error = RunError {
                code: "max_attempts_exceeded".to_owned(),
                message: format!(
                    "the run was taken over {} times without finishing (runs.max_attempts = {})",
                    run.attempt,
                    engine.config().max_attempts
                ),
                retryable: false,
                details: None,
            };
            let ending =
                Ending { status: Status::Error, stop_reason: "max_attempts_exceeded".to_owned(), error: Some(error), rollback: false };
            end_by_service(&*tx, &run, &[Status::Running], &ending).await?
        } else if let Some(parent_id) = &run.parent_run_id {
            // A subagent run is taken over by its parent (which resumes first and waits on it) —
            // unless the parent already ended: then nobody will, and it ends INTERRUPTED here.
            let parent: Option<Status> =
                runs::Entity::find_by_id(parent_id.clone()).select_only().column(runs::Column::Status).into_tuple().one(&*tx).await?;
            if parent.is_none_or(Status::is_terminal) {
                let ending = Ending { status: Status::Interrupted, stop_reason: "parent_ended".to_owned(), error: None, rollback: false };
                end_by_service(&*tx, &run, &[Status::Running], &ending).await?
            } else {
                None
            }
        } else if claimed.len() < capacity {
            if let Some((model, event)) = claim(&*tx, engine, &run, expired_before).await? {
                events.push(event);
                claimed.push(model);
            }
            tx.commit().await?;
            continue;
        } else {
            *waiting = true;
            None
        };
        let promoted = if let Some(end) = ended {
            events.push(end);
            promote_next_queued(&*tx, &run.user_id, &run.thread_id).await?
        } else {
            false
        };
        tx.commit().await?;
        if promoted {
            engine.wake_dispatcher();
        }
    }

    Ok(events)
}

/// Takes over `run` from its dead owner: attempt + 1, our lease, a new METADATA event.
pub(crate) async fn claim(
    db: &impl sea_orm::ConnectionTrait,
    engine: &Engine,
    run: &runs::Model,
    expired_before: i64,
) -> Result<Option<(runs::Model, antler_proto::runs::RunEvent)>, RunsError> {
    let now = now_ms();
    let mut update = runs::Entity::update_many()
        .col_expr(runs::Column::OwnerWorkerId, Expr::value(engine.worker_id()))
        .col_expr(runs::Column::LeaseExpiresAt, Expr::value(now + engine.config().lease().as_millis() as i64))
        .col_expr(runs::Column::Attempt, Expr::col(runs::Column::Attempt).add(1))
        .col_expr(runs::Column::UpdatedAt, Expr::value(now))
        .filter(runs::Column::RunId.eq(run.run_id.as_str()))
        .filter(runs::Column::Status.eq(Status::Running))
        .filter(runs::Column::CancelAction.is_null())
        .filter(
            sea_orm::sea_query::Condition::any()
                .add(runs::Column::LeaseExpiresAt.is_null())
                .add(runs::Column::LeaseExpiresAt.lt(expired_before)),
        );
    update = match &run.owner_worker_id {
        Some(owner) => update.filter(runs::Column::OwnerWorkerId.eq(owner.as_str())),
        None => update.filter(runs::Column::OwnerWorkerId.is_null()),
    };
    if update.exec(db).await?.rows_affected == 0 {
        return Ok(None);
    }
    let attempt = run.attempt + 1;
    tracing::info!(run_id = %run.run_id, attempt, previous_owner = ?run.owner_worker_id, "took over a run whose lease expired");
    metrics::counter!("antler_run_takeovers_total").increment(1);
    let meta = Kind::Metadata(Metadata {
        run_id: run.run_id.clone(),
        thread_id: run.thread_id.clone(),
        attempt: attempt as u32,
        model_name: run.model_name.clone(),
        checkpoint_id: String::new(),
    });
    let Some(event) = append(db, &run.run_id, &run.thread_id, Writer::Owner(engine.worker_id()), meta).await? else { return Ok(None) };
    let model = runs::Entity::find_by_id(run.run_id.clone()).one(db).await?;
    Ok(model.map(|m| (m, event)))
}

/// Marks a local run's lease as expired so any worker (another replica, or this one after a restart)
/// may resume it at once; used when shutting down.
pub async fn release(engine: &Engine, run_id: &str) -> Result<(), RunsError> {
    let tx = engine.store().tx().await?;
    runs::Entity::update_many()
        .col_expr(runs::Column::LeaseExpiresAt, Expr::value(0i64))
        .filter(runs::Column::RunId.eq(run_id))
        .filter(runs::Column::OwnerWorkerId.eq(engine.worker_id()))
        .exec(&*tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

pub fn stored_error(run: &runs::Model) -> Option<RunError> {
    run.error_code.as_ref().map(|code| RunError {
        code: code.clone(),
        message: run.error_message.clone().unwrap_or_default(),
        retryable: false,
        details: None,
    })
}
