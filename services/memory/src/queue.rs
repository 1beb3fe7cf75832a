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
use sea_orm::{ColumnTrait, ConnectionTrait, DbBackend, EntityTrait, QueryFilter};

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
pub struct Enqueue {
    pub scope: Scope,
    pub thread_id: String,
    pub run_id: String,
    pub model_name: String,
    pub filtered: Filtered,
    pub delay_ms: i64,
}

impl Enqueue {
    /// The stored forms of the conversation slice and the refusals (JSON).
    pub fn encoded(&self) -> Result<(String, String), MemoryError> {
        let conversation = serde_json::to_string(&self.filtered.turns).map_err(|e| MemoryError::Internal(e.to_string()))?;
        let refusals = serde_json::to_string(&self.filtered.refusals).map_err(|e| MemoryError::Internal(e.to_string()))?;
        Ok((conversation, refusals))
    }
}

/// The refusal of a new key when `depth` updates wait and the limit is `max_depth` (counted by the
/// caller once the refusal is final: [`count_rejected`]).
pub fn queue_full(depth: u64, max_depth: u64) -> MemoryError {
    MemoryError::ResourceExhausted(format!(
        "the memory queue is full: {depth} updates are waiting (limit memory.queue_max_depth = {max_depth})\nhint: retry later"
    ))
}

/// Counts a refused update.
pub fn count_rejected() {
    metrics::counter!("antler_memory_queue_rejected_total").increment(1);
}

/// Counts an accepted update.
pub fn count_queued(replaced: bool) {
    metrics::counter!("antler_memory_updates_queued_total", "replaced" => if replaced { "true" } else { "false" }).increment(1);
}

async fn count(db: &impl ConnectionTrait, sql: &str, values: Vec<sea_orm::Value>) -> Result<u64, StoreError> {
    let row = db.query_one_raw(statement(db.get_database_backend(), sql, values)).await?;
    let n: i64 = match row {
        Some(row) => row.try_get_by_index(0)?,
        None => 0,
    };
    Ok(n.max(0) as u64)
}

/// Stores one update in a transaction of its own: replaces the waiting one of the same key, or adds
/// one if the queue has room. QueueUpdate goes through the group commit of [`crate::queue_batch`];
/// this is its path for a batch that could not be committed as a whole.
///
/// One count and one upsert (the unique index on the pending key makes a concurrent insert of the same
/// key, from any replica, an update of the waiting row).
pub async fn enqueue(store: &Store, item: &Enqueue, max_depth: u64) -> Result<Queued, MemoryError> {
    let (conversation, refusals) = item.encoded()?;
    let now = now_ms();
    let scheduled_at = now + item.delay_ms;
    let tx = store.tx().await?;
    let backend = tx.get_database_backend();
    // Before the upsert: how many wait, and how many of them are due no later than this one.
    let row = tx
        .query_one_raw(statement(
            backend,
            "SELECT COUNT(*) AS depth, COALESCE(SUM(CASE WHEN scheduled_at <= $1 THEN 1 ELSE 0 END), 0) AS ahead \
             FROM memory_updates WHERE status = 'pending'",
            vec![scheduled_at.into()],
        ))
        .await
        .map_err(StoreError::from)?;
    let (depth, ahead): (i64, i64) = match row {
        Some(row) => (row.try_get("", "depth").map_err(StoreError::from)?, row.try_get("", "ahead").map_err(StoreError::from)?),
        None => (0, 0),
    };
    let (depth, ahead) = (depth.max(0) as u64, ahead.max(0) as u64);
    let update_id = format!("upd_{}", uuid::Uuid::new_v4().simple());
    let row = tx
        .query_one_raw(statement(
            backend,
            "INSERT INTO memory_updates (update_id, user_id, agent_name, thread_id, run_id, model_name, conversation, refusals, \
             message_id, status, scheduled_at, created_at, updated_at, attempts) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', $10, $11, $11, 0) \
             ON CONFLICT (user_id, agent_name, thread_id) WHERE status = 'pending' DO UPDATE SET \
             conversation = excluded.conversation, refusals = excluded.refusals, message_id = excluded.message_id, \
             run_id = excluded.run_id, model_name = excluded.model_name, scheduled_at = excluded.scheduled_at, \
             updated_at = excluded.updated_at \
             RETURNING update_id",
            vec![
                update_id.clone().into(),
                item.scope.user.clone().into(),
                item.scope.agent.clone().into(),
                item.thread_id.clone().into(),
                item.run_id.clone().into(),
                item.model_name.clone().into(),
                conversation.into(),
                refusals.into(),
                item.filtered.message_id.clone().into(),
                scheduled_at.into(),
                now.into(),
            ],
        ))
        .await
        .map_err(StoreError::from)?;
    let stored: String = match row {
        Some(row) => row.try_get("", "update_id").map_err(StoreError::from)?,
        None => return Err(StoreError::Corrupt("the queue upsert returned no row".to_owned()).into()),
    };
    let replaced = stored != update_id;
    let (depth, position) = if replaced {
        // The waiting row moved to this update's time: count again (replacements are the rare path).
        let position =
            count(&*tx, "SELECT COUNT(*) FROM memory_updates WHERE status = 'pending' AND scheduled_at <= $1", vec![scheduled_at.into()])
                .await?;
        (depth, position)
    } else {
        if max_depth > 0 && depth >= max_depth {
            // Dropping the transaction undoes the insert.
            count_rejected();
            return Err(queue_full(depth, max_depth));
        }
        (depth + 1, ahead + 1)
    };
    tx.commit().await?;
    count_queued(replaced);
    Ok(Queued { position: position.max(1), depth, replaced, scheduled_at })
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
