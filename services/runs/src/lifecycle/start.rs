//! `try_start`: the only way a run becomes RUNNING. Its variants (several runs at once, inside a
//! caller's transaction, the oldest startable run at a hand-over) are the same compare-and-set
//! (`start_update`) with another choice of runs.

use sea_orm::sea_query::{Condition, Expr, ExprTrait, LockBehavior, LockType};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, QueryTrait};

use crate::engine::Engine;
use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::runs;
use crate::store::{Priority, now_ms};

/// Compare-and-set PENDING → RUNNING, only while the run is still PENDING, is its thread's active run
/// (not queued), has no cancel request, and is ours to take: admitted by us, or by a replica whose
/// lease on it has expired or that is dead (see `liveness`). Returns the started run, or None if
/// someone else decided first.
pub async fn try_start(engine: &Engine, run_id: &str) -> Result<Option<runs::Model>, RunsError> {
    Ok(try_start_many(engine, &[run_id.to_owned()]).await?.pop())
}

/// [`try_start`] for several runs in one statement (`UPDATE … RETURNING`): the dispatcher starts a
/// whole round of free slots with one write, so starting runs costs the writer little even while an
/// admission flood competes for it. Returns the runs that started; the others were decided by
/// someone else.
pub async fn try_start_many(engine: &Engine, run_ids: &[String]) -> Result<Vec<runs::Model>, RunsError> {
    if run_ids.is_empty() {
        return Ok(Vec::new());
    }
    let claimant = std::sync::Arc::new(Claimant::of(engine));
    let run_ids: std::sync::Arc<[String]> = run_ids.into();
    let started = engine
        .store()
        .write(Priority::Lifecycle, move |tx| {
            let (claimant, run_ids) = (claimant.clone(), run_ids.clone());
            Box::pin(async move { Ok::<_, RunsError>(start_in(tx, &claimant, &run_ids).await?) })
        })
        .await?;
    count_started(started.len());
    Ok(started)
}

/// Who starts runs and which PENDING runs it may take, read from the engine before a write (which
/// may run on the store's writer thread, away from the engine).
#[derive(Debug, Clone)]
pub struct Claimant {
    worker_id: String,
    lease_ms: i64,
    grace_ms: i64,
    /// Dead replicas whose PENDING runs anyone may take (see `liveness`).
    dead: Vec<String>,
}

impl Claimant {
    pub fn of(engine: &Engine) -> Self {
        Self {
            worker_id: engine.worker_id().to_owned(),
            lease_ms: engine.config().lease().as_millis() as i64,
            grace_ms: engine.config().grace().as_millis() as i64,
            dead: engine.dead_owners(),
        }
    }
}

/// Counts runs that became RUNNING (call it once their transaction committed).
pub fn count_started(runs: usize) {
    metrics::counter!("antler_run_transitions_total", "to" => Status::Running.as_str()).increment(runs as u64);
}

/// The compare-and-set of [`try_start_many`] inside `db` (a transaction the caller commits, then
/// [`count_started`]), for a write that starts a run it has just admitted in the same transaction (a
/// subagent's child run: one commit instead of two before it is under way).
pub async fn start_in(
    db: &impl sea_orm::ConnectionTrait,
    claimant: &Claimant,
    run_ids: &[String],
) -> Result<Vec<runs::Model>, sea_orm::DbErr> {
    let now = now_ms();
    start_update(claimant, now).filter(runs::Column::RunId.is_in(run_ids.iter().map(String::as_str))).exec_with_returning(db).await
}

/// Starts the oldest PENDING run this replica may take, inside `db`: the transaction that closes a
/// run of this worker, whose slot goes straight to the next run in the same commit (see
/// `finalize::finalize` and `worker::launch`). Without it, a finished run's slot stayed empty until
/// the dispatcher's next round — a read and a start transaction of its own, behind every other
/// writer — and under an admission flood 11–15 of 32 slots were between runs at any time.
///
/// The choice is a subquery of the same statement, so on SQLite (one writer) two closing workers
/// never pick the same run; on PostgreSQL the subquery skips rows another transaction is starting
/// (`FOR UPDATE SKIP LOCKED`). The caller leaves runs of dead replicas to the dispatcher, which takes
/// them first. None when nothing is startable.
pub async fn start_next_in(db: &impl sea_orm::ConnectionTrait, claimant: &Claimant) -> Result<Option<runs::Model>, sea_orm::DbErr> {
    let now = now_ms();
    let mut next = pending_select(claimable(claimant, now), 1).into_query();
    if db.get_database_backend() == sea_orm::DbBackend::Postgres {
        next.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked);
    }
    // `=` a scalar subquery, not `IN`: PostgreSQL evaluates a scalar one once, while it may run an
    // `IN (… LIMIT 1 … SKIP LOCKED)` again for each row it looks at and start a run per evaluation
    // (measured: thousands started, one executed, the rest waiting for their lease to lapse).
    let chosen = Expr::col(runs::Column::RunId).eq(Expr::SubQuery(None, Box::new(next.into())));
    let mut started = start_update(claimant, now).filter(chosen).exec_with_returning(db).await?;
    debug_assert!(started.len() <= 1, "a hand-over started {} runs", started.len());
    Ok(started.pop())
}

/// The compare-and-set PENDING → RUNNING for this worker, for the runs a caller's filter adds.
fn start_update(claimant: &Claimant, now: i64) -> sea_orm::UpdateMany<runs::Entity> {
    runs::Entity::update_many()
        .col_expr(runs::Column::Status, Expr::value(Status::Running))
        .col_expr(runs::Column::OwnerWorkerId, Expr::value(claimant.worker_id.as_str()))
        .col_expr(runs::Column::LeaseExpiresAt, Expr::value(now + claimant.lease_ms))
        .col_expr(runs::Column::Attempt, Expr::col(runs::Column::Attempt).add(1))
        .col_expr(runs::Column::StartedAt, Expr::value(now))
        .col_expr(runs::Column::UpdatedAt, Expr::value(now))
        .filter(runs::Column::Status.eq(Status::Pending))
        .filter(runs::Column::Queued.eq(false))
        .filter(runs::Column::CancelAction.is_null())
        .filter(claimable(claimant, now))
}

/// PENDING runs this replica could start now: those admitted by a dead replica first (its clients
/// already waited through its death), then the rest, oldest first.
pub async fn startable(engine: &Engine, limit: u64) -> Result<Vec<String>, RunsError> {
    let dead = engine.dead_owners();
    let mut found = if dead.is_empty() {
        Vec::new()
    } else {
        pending(engine, Condition::all().add(runs::Column::OwnerWorkerId.is_in(dead.iter().map(String::as_str))), limit).await?
    };
    let left = limit.saturating_sub(found.len() as u64);
    if left > 0 {
        for run_id in pending(engine, claimable(&Claimant::of(engine), now_ms()), left + found.len() as u64).await? {
            if found.len() as u64 == limit {
                break;
            }
            if !found.contains(&run_id) {
                found.push(run_id);
            }
        }
    }
    Ok(found)
}

/// Up to `limit` startable PENDING runs that match `which`, oldest first.
async fn pending(engine: &Engine, which: Condition, limit: u64) -> Result<Vec<String>, RunsError> {
    let db = engine.store().db();
    let stmt = crate::store::inline_limits(pending_select(which, limit).build(db.get_database_backend()));
    let rows = sea_orm::ConnectionTrait::query_all_raw(db, stmt).await?;
    Ok(rows.iter().map(|row| row.try_get::<String>("", "run_id")).collect::<Result<_, _>>()?)
}

/// The ids of up to `limit` startable PENDING runs that match `which`, oldest first.
fn pending_select(which: Condition, limit: u64) -> sea_orm::Select<runs::Entity> {
    runs::Entity::find()
        .select_only()
        .column(runs::Column::RunId)
        .filter(runs::Column::Status.eq(Status::Pending))
        .filter(runs::Column::Queued.eq(false))
        .filter(runs::Column::CancelAction.is_null())
        // A subagent run is started by its parent's `task` call, under the parent's slot.
        .filter(runs::Column::ParentRunId.is_null())
        .filter(which)
        .order_by_asc(runs::Column::CreatedAt)
        .limit(limit)
}

/// The PENDING runs this replica may take: admitted here, unowned, whose admission lease is past
/// the grace period, or admitted by a replica that is dead (no heartbeat, see `liveness`).
fn claimable(claimant: &Claimant, now: i64) -> Condition {
    let mut claimable = Condition::any()
        .add(runs::Column::OwnerWorkerId.eq(claimant.worker_id.as_str()))
        .add(runs::Column::OwnerWorkerId.is_null())
        .add(runs::Column::LeaseExpiresAt.lt(now - claimant.grace_ms));
    if !claimant.dead.is_empty() {
        claimable = claimable.add(runs::Column::OwnerWorkerId.is_in(claimant.dead.iter().map(String::as_str)));
    }
    claimable
}
