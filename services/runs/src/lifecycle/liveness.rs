//! Replica liveness: which runs replicas are alive, so the PENDING runs a dead replica admitted start
//! elsewhere within the takeover bound.
//!
//! Admission names the admitting replica as a PENDING run's owner, with a lease of `runs.lease_secs`
//! that is never renewed: the admitting replica keeps the request's secrets in memory and should
//! start the run itself. Another replica may start it once that lease is past (the replica may be
//! saturated), but only in its turn among all PENDING runs, oldest first — so when a replica died,
//! its clients waited for its backlog to drain behind everyone else's. Here each replica renews a
//! heartbeat row (`workers`) every third of the lease; a replica whose heartbeat is past by more
//! than `runs.lease_grace_secs` is dead, and the others start its PENDING runs in the next free
//! slots, after the runs they take over and before their own PENDING work (`start::startable`).
//! The bound is the same as a RUNNING takeover's: lease + grace + sweep interval + a free slot.
//!
//! try_start stays the only gate: a replica wrongly judged dead (a heartbeat late by more than the
//! lease) only loses the race for its runs; each run is still started once. The run's request-scoped
//! secrets stay with the replica that admitted it, as with any run started elsewhere.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QuerySelect};

use crate::engine::Engine;
use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::{runs, workers};
use crate::store::now_ms;

/// How long the row of a dead replica is kept. Its PENDING runs have been startable by their
/// expired admission lease long before; the row only made them go first.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// Renews this replica's heartbeat: alive until now + `runs.lease_secs`.
pub async fn beat(engine: &Engine) -> Result<(), RunsError> {
    let now = now_ms();
    let row = workers::Model {
        worker_id: engine.worker_id().to_owned(),
        started_at: now,
        expires_at: now + engine.config().lease().as_millis() as i64,
    };
    engine
        .store()
        .retry_busy(|| async {
            let tx = engine.store().control_tx().await?;
            workers::Entity::insert(workers::ActiveModel::from(row.clone()))
                .on_conflict(OnConflict::column(workers::Column::WorkerId).update_column(workers::Column::ExpiresAt).to_owned())
                .exec_without_returning(&*tx)
                .await?;
            tx.commit().await?;
            Ok::<_, crate::store::StoreError>(())
        })
        .await?;
    Ok(())
}

/// Renews the heartbeat every third of the lease until shutdown (then [`retire`] ends it).
pub async fn keep_beating(engine: Arc<Engine>) {
    let period = engine.config().lease() / 3;
    loop {
        tokio::select! {
            () = engine.until_shutdown() => return,
            () = tokio::time::sleep(period) => {}
        }
        if let Err(error) = beat(&engine).await {
            // Another replica may judge us dead after a lease without a heartbeat and start the
            // PENDING runs we admitted; try_start still lets only one of us start each.
            tracing::warn!(%error, "heartbeat not written; retrying in a third of the lease");
        }
    }
}

/// At shutdown (after the local runs' leases were released): this replica answers for nothing any
/// more, so the others start the PENDING runs it admitted at their next sweep.
pub async fn retire(engine: &Engine) {
    // Dead at once for the others (past the grace), and kept for an hour like any dead replica's row.
    let expired = now_ms() - engine.config().grace().as_millis() as i64 - 1;
    let result = async {
        let tx = engine.store().tx().await?;
        workers::Entity::update_many()
            .col_expr(workers::Column::ExpiresAt, Expr::value(expired))
            .filter(workers::Column::WorkerId.eq(engine.worker_id()))
            .exec(&*tx)
            .await?;
        tx.commit().await?;
        Ok::<_, RunsError>(())
    }
    .await;
    match result {
        Ok(()) => tracing::info!(worker_id = %engine.worker_id(), "heartbeat ended; other replicas start the PENDING runs admitted here"),
        Err(error) => tracing::warn!(%error, "cannot end the heartbeat; other replicas start our PENDING runs when it expires"),
    }
}

/// Dead replicas (heartbeat past by more than the grace) that still own PENDING runs; kept in
/// `Engine::dead_owners` for the dispatcher. Also forgets rows dead for an hour.
pub async fn find_dead(engine: &Engine) -> Result<Vec<String>, RunsError> {
    let now = now_ms();
    let cut = now - engine.config().grace().as_millis() as i64;
    // A handful of rows: the replicas that stopped within the last hour.
    let dead_workers: Vec<String> = workers::Entity::find()
        .select_only()
        .column(workers::Column::WorkerId)
        .filter(workers::Column::ExpiresAt.lt(cut))
        .filter(workers::Column::WorkerId.ne(engine.worker_id()))
        .into_tuple()
        .all(engine.store().control_db())
        .await?;
    let dead: Vec<String> = if dead_workers.is_empty() {
        Vec::new()
    } else {
        runs::Entity::find()
            .select_only()
            .column(runs::Column::OwnerWorkerId)
            .distinct()
            .filter(runs::Column::Status.eq(Status::Pending))
            .filter(runs::Column::OwnerWorkerId.is_in(dead_workers))
            .into_tuple::<Option<String>>()
            .all(engine.store().control_db())
            .await?
            .into_iter()
            .flatten()
            .collect()
    };
    if !dead.is_empty() {
        tracing::info!(dead_replicas = ?dead, "replicas without a heartbeat own PENDING runs; starting them before our own");
    }
    engine.set_dead_owners(dead.clone());

    let forget_before = now - FORGET_AFTER.as_millis() as i64;
    let tx = engine.store().control_tx().await?;
    workers::Entity::delete_many().filter(workers::Column::ExpiresAt.lt(forget_before)).exec(&*tx).await?;
    tx.commit().await?;
    Ok(dead)
}
