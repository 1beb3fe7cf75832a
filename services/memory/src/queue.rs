//! The durable extraction queue: enqueue with debounce and replacement, the bound, the claim under a
//! lease, renewal, the fenced finish, and FlushUpdates.
//!
//! Exactly-once processing rests on two conditional UPDATEs. The claim moves a row to `running` only if
//! it is still due (`pending` past its debounce, or `running` with an expired lease), so of two replicas
//! racing for a row one changes it and the other changes nothing. The finish writes `done` only while
//! the row is still `running` under the same owner and attempt, in the same transaction as the facts it
//! produced: a worker whose lease was taken over rolls its facts back.

use antler_proto::memory::UpdateOutcome;
use prost::Message as _;
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, QueryFilter};

use crate::error::MemoryError;
use crate::facts::Scope;
use crate::filter::Filtered;
use crate::store::entity::updates;
use crate::store::{Store, StoreError, execute, now_ms, statement};

pub const PENDING: &str = "pending";
pub const RUNNING: &str = "running";
pub const DONE: &str = "done";
pub const FAILED: &str = "failed";

/// What QueueUpdate answers.
#[derive(Debug, Clone, Copy)]
pub struct Queued {
    pub position: u64,
    pub depth: u64,
    pub replaced: bool,
    pub scheduled_at: i64,
}

/// One update to enqueue.
#[derive(Debug)]
pub struct Enqueue<'a> {
    pub scope: &'a Scope,
    pub thread_id: &'a str,
    pub run_id: &'a str,
    pub model_name: &'a str,
    pub filtered: Filtered,
    pub delay_ms: i64,
}

async fn count(db: &impl ConnectionTrait, sql: &str, values: Vec<sea_orm::Value>) -> Result<u64, StoreError> {
    let row = db.query_one_raw(statement(db.get_database_backend(), sql, values)).await?;
    let n: i64 = match row {
        Some(row) => row.try_get_by_index(0)?,
        None => 0,
    };
    Ok(n.max(0) as u64)
}

/// Stores an update: replaces the waiting one of the same key, or adds one if the queue has room.
pub async fn enqueue(store: &Store, item: Enqueue<'_>, max_depth: u64) -> Result<Queued, MemoryError> {
    let conversation = serde_json::to_string(&item.filtered.turns).map_err(|e| MemoryError::Internal(e.to_string()))?;
    let refusals = serde_json::to_string(&item.filtered.refusals).map_err(|e| MemoryError::Internal(e.to_string()))?;
    // Two replicas inserting the same key: the unique index refuses the second, which then replaces.
    for _ in 0..3 {
        let now = now_ms();
        let scheduled_at = now + item.delay_ms;
        let tx = store.tx().await?;
        let replaced = execute(
            &*tx,
            statement(
                tx.get_database_backend(),
                "UPDATE memory_updates SET conversation = $1, refusals = $2, message_id = $3, run_id = $4, model_name = $5, \
                 scheduled_at = $6, updated_at = $7 WHERE user_id = $8 AND agent_name = $9 AND thread_id = $10 AND status = 'pending'",
                vec![
                    conversation.clone().into(),
                    refusals.clone().into(),
                    item.filtered.message_id.clone().into(),
                    item.run_id.into(),
                    item.model_name.into(),
                    scheduled_at.into(),
                    now.into(),
                    item.scope.user.clone().into(),
                    item.scope.agent.clone().into(),
                    item.thread_id.into(),
                ],
            ),
        )
        .await?
            > 0;
        let depth = count(&*tx, "SELECT COUNT(*) FROM memory_updates WHERE status = 'pending'", vec![]).await?;
        if !replaced {
            if max_depth > 0 && depth >= max_depth {
                metrics::counter!("antler_memory_queue_rejected_total").increment(1);
                return Err(MemoryError::ResourceExhausted(format!(
                    "the memory queue is full: {depth} updates are waiting (limit memory.queue_max_depth = {max_depth})\nhint: retry later"
                )));
            }
            let row = updates::ActiveModel {
                update_id: Set(format!("upd_{}", uuid::Uuid::new_v4().simple())),
                user_id: Set(item.scope.user.clone()),
                agent_name: Set(item.scope.agent.clone()),
                thread_id: Set(item.thread_id.to_owned()),
                run_id: Set(item.run_id.to_owned()),
                model_name: Set(item.model_name.to_owned()),
                conversation: Set(conversation.clone()),
                refusals: Set(refusals.clone()),
                message_id: Set(item.filtered.message_id.clone()),
                status: Set(PENDING.to_owned()),
                scheduled_at: Set(scheduled_at),
                created_at: Set(now),
                updated_at: Set(now),
                owner: Set(None),
                lease_expires_at: Set(None),
                attempts: Set(0),
                outcome: Set(None),
            };
            match updates::Entity::insert(row).exec_without_returning(&*tx).await {
                Ok(_) => {}
                Err(e) => {
                    let e = StoreError::from(e);
                    if e.is_unique_violation() {
                        continue;
                    }
                    return Err(e.into());
                }
            }
        }
        let position =
            count(&*tx, "SELECT COUNT(*) FROM memory_updates WHERE status = 'pending' AND scheduled_at <= $1", vec![scheduled_at.into()])
                .await?;
        let depth = if replaced { depth } else { depth + 1 };
        tx.commit().await?;
        metrics::counter!("antler_memory_updates_queued_total", "replaced" => if replaced { "true" } else { "false" }).increment(1);
        return Ok(Queued { position: position.max(1), depth, replaced, scheduled_at });
    }
    Err(MemoryError::Unavailable("the update kept racing another replica's for the same thread; retry".to_owned()))
}

/// Claims the next due update for `owner`, or None.
pub async fn claim(store: &Store, owner: &str, lease_ms: i64) -> Result<Option<updates::Model>, StoreError> {
    let now = now_ms();
    let backend = store.backend();
    let lock = if backend == DbBackend::Postgres { " FOR UPDATE SKIP LOCKED" } else { "" };
    let due = "((status = 'pending' AND scheduled_at <= $3) OR (status = 'running' AND lease_expires_at < $3))";
    let sql = format!(
        "UPDATE memory_updates SET status = 'running', owner = $1, lease_expires_at = $2, attempts = attempts + 1, updated_at = $3 \
         WHERE update_id = (SELECT update_id FROM memory_updates WHERE {due} ORDER BY scheduled_at LIMIT 1{lock}) AND {due} \
         RETURNING update_id"
    );
    let tx = store.tx().await?;
    let row = tx.query_one_raw(statement(backend, &sql, vec![owner.into(), (now + lease_ms).into(), now.into()])).await?;
    let Some(row) = row else {
        tx.commit().await?;
        return Ok(None);
    };
    let id: String = row.try_get("", "update_id")?;
    let claimed = updates::Entity::find_by_id(id).one(&*tx).await?;
    tx.commit().await?;
    Ok(claimed)
}

/// Extends the lease of a claimed update; false when it is no longer ours.
pub async fn renew(store: &Store, update: &updates::Model, lease_ms: i64) -> Result<bool, StoreError> {
    let tx = store.tx().await?;
    let changed = execute(
        &*tx,
        statement(
            tx.get_database_backend(),
            "UPDATE memory_updates SET lease_expires_at = $1 WHERE update_id = $2 AND owner = $3 AND attempts = $4 AND status = 'running'",
            vec![(now_ms() + lease_ms).into(), update.update_id.clone().into(), update.owner.clone().into(), update.attempts.into()],
        ),
    )
    .await?;
    tx.commit().await?;
    Ok(changed == 1)
}

/// Marks a claimed update done or failed with its outcome, in the caller's transaction; false (and
/// the caller must roll back) when the update is no longer ours.
pub async fn finish(db: &impl ConnectionTrait, update: &updates::Model, status: &str, outcome: &UpdateOutcome) -> Result<bool, StoreError> {
    let changed = execute(
        db,
        statement(
            db.get_database_backend(),
            "UPDATE memory_updates SET status = $1, outcome = $2, lease_expires_at = NULL, updated_at = $3 \
             WHERE update_id = $4 AND owner = $5 AND attempts = $6 AND status = 'running'",
            vec![
                status.into(),
                outcome.encode_to_vec().into(),
                now_ms().into(),
                update.update_id.clone().into(),
                update.owner.clone().into(),
                update.attempts.into(),
            ],
        ),
    )
    .await?;
    Ok(changed == 1)
}

/// Puts a claimed update back to wait `delay_ms` (a transient failure); false when no longer ours.
pub async fn retry_later(store: &Store, update: &updates::Model, delay_ms: i64) -> Result<bool, StoreError> {
    let tx = store.tx().await?;
    let now = now_ms();
    // A newer update for the same key may be waiting already: then this one is superseded by it.
    let newer = count(
        &*tx,
        "SELECT COUNT(*) FROM memory_updates WHERE user_id = $1 AND agent_name = $2 AND thread_id = $3 AND status = 'pending'",
        vec![update.user_id.clone().into(), update.agent_name.clone().into(), update.thread_id.clone().into()],
    )
    .await?;
    let (status, outcome) = if newer > 0 {
        let outcome = UpdateOutcome {
            thread_id: update.thread_id.clone(),
            agent_name: update.agent_name.clone(),
            error: "replaced by a newer update of the same thread while retrying".to_owned(),
            ..UpdateOutcome::default()
        };
        (DONE, Some(outcome.encode_to_vec()))
    } else {
        (PENDING, None)
    };
    let changed = execute(
        &*tx,
        statement(
            tx.get_database_backend(),
            "UPDATE memory_updates SET status = $1, outcome = $2, scheduled_at = $3, lease_expires_at = NULL, updated_at = $4 \
             WHERE update_id = $5 AND owner = $6 AND attempts = $7 AND status = 'running'",
            vec![
                status.into(),
                outcome.into(),
                (now + delay_ms).into(),
                now.into(),
                update.update_id.clone().into(),
                update.owner.clone().into(),
                update.attempts.into(),
            ],
        ),
    )
    .await?;
    tx.commit().await?;
    Ok(changed == 1)
}

/// The updates a FlushUpdates call concerns: the caller's pending and running items matching the filter.
pub struct FlushFilter<'a> {
    pub user: &'a str,
    pub thread_id: &'a str,
    /// None = every agent.
    pub agent: Option<&'a str>,
}

fn filter_sql(filter: &FlushFilter<'_>, first: usize) -> (String, Vec<sea_orm::Value>) {
    let mut sql = format!("user_id = ${first}");
    let mut values: Vec<sea_orm::Value> = vec![filter.user.into()];
    if !filter.thread_id.is_empty() {
        values.push(filter.thread_id.into());
        sql.push_str(&format!(" AND thread_id = ${}", first + values.len() - 1));
    }
    if let Some(agent) = filter.agent {
        values.push(agent.into());
        sql.push_str(&format!(" AND agent_name = ${}", first + values.len() - 1));
    }
    (sql, values)
}

/// Makes the matching pending items due now; returns (flushed, ids of the items to wait for).
pub async fn flush(store: &Store, filter: &FlushFilter<'_>) -> Result<(u64, Vec<String>), StoreError> {
    let tx = store.tx().await?;
    let backend = tx.get_database_backend();
    let (clause, values) = filter_sql(filter, 1);
    let rows = tx
        .query_all_raw(statement(
            backend,
            &format!("SELECT update_id FROM memory_updates WHERE {clause} AND status IN ('pending', 'running')"),
            values,
        ))
        .await?;
    let mut ids = Vec::with_capacity(rows.len());
    for row in rows {
        ids.push(row.try_get::<String>("", "update_id")?);
    }
    let (clause, mut values) = filter_sql(filter, 2);
    let now = now_ms();
    values.insert(0, now.into());
    let flushed = execute(
        &*tx,
        statement(
            backend,
            &format!("UPDATE memory_updates SET scheduled_at = $1 WHERE {clause} AND status = 'pending' AND scheduled_at > $1"),
            values,
        ),
    )
    .await?;
    let already_due = {
        let (clause, mut values) = filter_sql(filter, 2);
        values.insert(0, now.into());
        count(&*tx, &format!("SELECT COUNT(*) FROM memory_updates WHERE {clause} AND status = 'pending' AND scheduled_at <= $1"), values)
            .await?
    };
    tx.commit().await?;
    Ok((flushed.max(already_due), ids))
}

/// (finished outcomes, still pending or running) of `ids`.
pub async fn progress(store: &Store, ids: &[String]) -> Result<(Vec<UpdateOutcome>, u64), StoreError> {
    if ids.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let rows = updates::Entity::find().filter(updates::Column::UpdateId.is_in(ids.iter().cloned())).all(store.db()).await?;
    let mut outcomes = Vec::new();
    let mut open = 0;
    for row in rows {
        match row.status.as_str() {
            DONE | FAILED => {
                let outcome =
                    row.outcome.as_deref().map(UpdateOutcome::decode).transpose().map_err(|e| StoreError::Corrupt(e.to_string()))?;
                outcomes.push(outcome.unwrap_or_default());
            }
            _ => open += 1,
        }
    }
    Ok((outcomes, open))
}

/// The caller's items still pending or running.
pub async fn open_count(store: &Store, filter: &FlushFilter<'_>) -> Result<u64, StoreError> {
    let (clause, values) = filter_sql(filter, 1);
    count(store.db(), &format!("SELECT COUNT(*) FROM memory_updates WHERE {clause} AND status IN ('pending', 'running')"), values).await
}

/// When the next pending update falls due (for the worker's sleep).
pub async fn next_due(store: &Store) -> Result<Option<i64>, StoreError> {
    let row = store
        .db()
        .query_one_raw(statement(store.backend(), "SELECT MIN(scheduled_at) FROM memory_updates WHERE status = 'pending'", vec![]))
        .await?;
    Ok(match row {
        Some(row) => row.try_get_by_index::<Option<i64>>(0)?,
        None => None,
    })
}

/// Deletes finished updates older than `retain_ms`.
pub async fn prune(store: &Store, retain_ms: i64) -> Result<u64, StoreError> {
    let tx = store.tx().await?;
    let deleted = execute(
        &*tx,
        statement(
            tx.get_database_backend(),
            "DELETE FROM memory_updates WHERE status IN ('done', 'failed') AND updated_at < $1",
            vec![(now_ms() - retain_ms).into()],
        ),
    )
    .await?;
    tx.commit().await?;
    Ok(deleted)
}
