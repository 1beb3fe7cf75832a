//! Group commit of QueueUpdate: every update that arrives while the previous batch is being committed
//! goes into the next one — one transaction, one lookup of the batch's keys, one count of the queue and
//! one multi-row upsert, however many updates the batch holds. On SQLite all writes of a process go
//! through one connection, so statements per update, not their size, bounded QueueUpdate/s.
//!
//! Each request keeps its own outcome, exactly as if the batch's updates had been stored one after the
//! other in arrival order: a new key beyond `memory.queue_max_depth` is refused alone
//! (RESOURCE_EXHAUSTED), a replacement is always accepted, and each answer carries its own position and
//! depth. The plan is made from what the transaction read; if the upsert does not find the rows the plan
//! expects (another replica queued or claimed one of the keys in between, PostgreSQL only) or the
//! transaction fails, it is rolled back and every update of the batch is stored on its own through
//! [`queue::enqueue`], which settles each under the unique index of the pending key.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DbBackend, Statement};
use tokio::sync::{mpsc, oneshot};

use crate::error::MemoryError;
use crate::queue::{self, Enqueue, Queued};
use crate::store::{Store, StoreError, now_ms};

/// Most updates in one transaction (11 bound values each: far below either backend's limit).
pub const MAX_BATCH: usize = 128;

/// Updates waiting for the batcher; a full channel makes QueueUpdate handlers wait (they are bounded by
/// the server's concurrency limit anyway).
const CHANNEL: usize = 4096;

type Outcome = Result<Queued, MemoryError>;

struct Job {
    item: Enqueue,
    reply: oneshot::Sender<Outcome>,
}

/// The handle QueueUpdate uses; see the module documentation.
#[derive(Debug, Clone)]
pub struct QueueWriter {
    jobs: mpsc::Sender<Job>,
}

impl QueueWriter {
    /// Starts the batcher on the current runtime; it ends when the last handle is dropped.
    pub fn start(store: Store, max_depth: u64) -> Self {
        let (jobs, rx) = mpsc::channel(CHANNEL);
        tokio::spawn(run(store, max_depth, rx));
        Self { jobs }
    }

    /// Stores `item` with the next batch; answers once that batch is committed.
    pub async fn enqueue(&self, item: Enqueue) -> Outcome {
        let (reply, answer) = oneshot::channel();
        let closed = || MemoryError::Unavailable("the memory service is shutting down".to_owned());
        self.jobs.send(Job { item, reply }).await.map_err(|_| closed())?;
        answer.await.unwrap_or_else(|_| Err(closed()))
    }
}

async fn run(store: Store, max_depth: u64, mut jobs: mpsc::Receiver<Job>) {
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        metrics::histogram!("antler_memory_queue_batch_size").record(batch.len() as f64);
        let items: Vec<&Enqueue> = batch.iter().map(|j| &j.item).collect();
        match store_batch(&store, &items, max_depth).await {
            Ok(outcomes) => {
                for (job, outcome) in batch.into_iter().zip(outcomes) {
                    let _ = job.reply.send(outcome);
                }
            }
            Err(error) => {
                tracing::debug!(%error, size = batch.len(), "memory queue batch failed; storing its updates one by one");
                for job in batch {
                    let outcome = queue::enqueue(&store, &job.item, max_depth).await;
                    let _ = job.reply.send(outcome);
                }
            }
        }
    }
}

/// Why a batch was not committed as a whole (its updates are then stored one by one).
#[derive(Debug, thiserror::Error)]
enum BatchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the queue changed between the batch's reads and its upsert")]
    Raced,
}

impl From<sea_orm::DbErr> for BatchError {
    fn from(error: sea_orm::DbErr) -> Self {
        Self::Store(error.into())
    }
}

type Key = (String, String, String);

fn key(item: &Enqueue) -> Key {
    (item.scope.user.clone(), item.scope.agent.clone(), item.thread_id.clone())
}

/// The waiting row of a key, as the plan goes through the batch.
struct Waiting {
    update_id: String,
    scheduled_at: i64,
}

/// One row of the upsert: the last update of its key in the batch.
struct Row<'a> {
    update_id: String,
    item: &'a Enqueue,
    conversation: String,
    refusals: String,
}

async fn store_batch(store: &Store, items: &[&Enqueue], max_depth: u64) -> Result<Vec<Outcome>, BatchError> {
    let now = now_ms();
    let tx = store.tx().await?;
    let backend = tx.get_database_backend();

    let mut keys: Vec<Key> = items.iter().map(|i| key(i)).collect();
    keys.sort();
    keys.dedup();
    let mut waiting = pending_of(&*tx, backend, &keys).await?;

    // The scheduled times of the batch (one `now` for all: at most one per configured delay).
    let mut times: Vec<i64> = items.iter().map(|i| now + i.delay_ms).collect();
    times.sort_unstable();
    times.dedup();
    let (mut depth, mut ahead) = depth_and_ahead(&*tx, backend, &times).await?;

    // The plan: each update in arrival order, as `queue::enqueue` would have stored it alone.
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(items.len());
    let mut rows: Vec<Row<'_>> = Vec::new();
    let mut row_of: HashMap<Key, usize> = HashMap::new();
    for item in items {
        let scheduled_at = now + item.delay_ms;
        let (conversation, refusals) = match item.encoded() {
            Ok(encoded) => encoded,
            Err(error) => {
                outcomes.push(Err(error));
                continue;
            }
        };
        let k = key(item);
        let replaced = match waiting.get_mut(&k) {
            Some(row) => {
                // The waiting row moves from its time to this update's.
                for (t, n) in times.iter().zip(ahead.iter_mut()) {
                    *n = *n - u64::from(row.scheduled_at <= *t) + u64::from(scheduled_at <= *t);
                }
                row.scheduled_at = scheduled_at;
                true
            }
            None => {
                if max_depth > 0 && depth >= max_depth {
                    outcomes.push(Err(queue::queue_full(depth, max_depth)));
                    continue;
                }
                depth += 1;
                for (t, n) in times.iter().zip(ahead.iter_mut()) {
                    *n += u64::from(scheduled_at <= *t);
                }
                let update_id = format!("upd_{}", uuid::Uuid::new_v4().simple());
                waiting.insert(k.clone(), Waiting { update_id, scheduled_at });
                false
            }
        };
        let position = times.iter().position(|t| *t == scheduled_at).map_or(1, |i| ahead[i]);
        outcomes.push(Ok(Queued { position: position.max(1), depth, replaced, scheduled_at }));
        let update_id = waiting.get(&k).map(|w| w.update_id.clone()).unwrap_or_default();
        let row = Row { update_id, item, conversation, refusals };
        match row_of.get(&k) {
            // A later update of the same key in this batch: its text is what the row ends with.
            Some(&i) => rows[i] = row,
            None => {
                row_of.insert(k, rows.len());
                rows.push(row);
            }
        }
    }

    if !rows.is_empty() && !upsert(&*tx, backend, &rows, now).await? {
        // Dropping the transaction rolls the upsert back.
        return Err(BatchError::Raced);
    }
    tx.commit().await?;
    for outcome in &outcomes {
        match outcome {
            Ok(queued) => queue::count_queued(queued.replaced),
            Err(MemoryError::ResourceExhausted(_)) => queue::count_rejected(),
            Err(_) => {}
        }
    }
    Ok(outcomes)
}

/// The pending rows of `keys`, in one statement whatever their number (arrays on PostgreSQL, one JSON
/// text on SQLite, so the statement text stays the same for every batch size).
async fn pending_of(db: &impl ConnectionTrait, backend: DbBackend, keys: &[Key]) -> Result<HashMap<Key, Waiting>, BatchError> {
    let mut out = HashMap::new();
    for row in db.query_all_raw(pending_statement(backend, keys)).await? {
        let k: Key = (row.try_get("", "user_id")?, row.try_get("", "agent_name")?, row.try_get("", "thread_id")?);
        out.insert(k, Waiting { update_id: row.try_get("", "update_id")?, scheduled_at: row.try_get("", "scheduled_at")? });
    }
    Ok(out)
}

fn pending_statement(backend: DbBackend, keys: &[Key]) -> Statement {
    match backend {
        DbBackend::Postgres => {
            let column = |f: fn(&Key) -> &String| keys.iter().map(|k| f(k).clone()).collect::<Vec<String>>();
            Statement::from_sql_and_values(
                backend,
                "SELECT u.update_id, u.user_id, u.agent_name, u.thread_id, u.scheduled_at FROM memory_updates u \
                 JOIN UNNEST($1::text[], $2::text[], $3::text[]) AS k(user_id, agent_name, thread_id) \
                 ON u.user_id = k.user_id AND u.agent_name = k.agent_name AND u.thread_id = k.thread_id WHERE u.status = 'pending'",
                [column(|k| &k.0).into(), column(|k| &k.1).into(), column(|k| &k.2).into()],
            )
        }
        _ => {
            let list = serde_json::Value::Array(keys.iter().map(|(u, a, t)| serde_json::json!([u, a, t])).collect());
            // CROSS JOIN fixes the order: each key looked up in the pending index. With a plain JOIN
            // and no statistics SQLite scanned every pending row and parsed the whole JSON list for
            // each (39 ms per batch with 5,000 updates waiting, and growing with the queue): the
            // JSON parser was the first thing in QueueUpdate's profile.
            Statement::from_sql_and_values(
                backend,
                "SELECT u.update_id, u.user_id, u.agent_name, u.thread_id, u.scheduled_at FROM json_each(?) AS k \
                 CROSS JOIN memory_updates u ON u.user_id = json_extract(k.value, '$[0]') AND u.agent_name = json_extract(k.value, '$[1]') \
                 AND u.thread_id = json_extract(k.value, '$[2]') WHERE u.status = 'pending'",
                [list.to_string().into()],
            )
        }
    }
}

/// How many updates wait, and for each of `times` how many of them are due no later than it.
async fn depth_and_ahead(db: &impl ConnectionTrait, backend: DbBackend, times: &[i64]) -> Result<(u64, Vec<u64>), BatchError> {
    let mut sql = "SELECT COUNT(*) AS depth".to_owned();
    for i in 0..times.len() {
        sql.push_str(&format!(", COALESCE(SUM(CASE WHEN scheduled_at <= ${} THEN 1 ELSE 0 END), 0) AS a{i}", i + 1));
    }
    sql.push_str(" FROM memory_updates WHERE status = 'pending'");
    let values = times.iter().map(|t| (*t).into()).collect();
    let row = db.query_one_raw(crate::store::statement(backend, &sql, values)).await?;
    let Some(row) = row else { return Ok((0, vec![0; times.len()])) };
    let depth: i64 = row.try_get("", "depth")?;
    let mut ahead = Vec::with_capacity(times.len());
    for i in 0..times.len() {
        ahead.push(row.try_get::<i64>("", &format!("a{i}"))?.max(0) as u64);
    }
    Ok((depth.max(0) as u64, ahead))
}

/// Writes `rows` in one statement; false when the stored rows are not the ones the plan expects.
///
/// PostgreSQL: RETURNING names the stored id of each key: the row's own when it was inserted, the
/// waiting row's when it replaced one; another replica may have queued or claimed a key since the plan
/// read it. SQLite: the process's one writer holds the write lock from the plan's reads to the commit
/// (the claim takes it too), so nothing can change in between; every row inserts or updates exactly
/// one row, and the count is the check. (RETURNING would hand each row from sqlx's SQLite worker thread
/// through a channel: the per-row cost this module exists to avoid.)
async fn upsert(db: &impl ConnectionTrait, backend: DbBackend, rows: &[Row<'_>], now: i64) -> Result<bool, BatchError> {
    const COLUMNS: usize = 11;
    let mut sql = String::from(
        "INSERT INTO memory_updates (update_id, user_id, agent_name, thread_id, run_id, model_name, conversation, refusals, \
         message_id, status, scheduled_at, created_at, updated_at, attempts) VALUES ",
    );
    let mut values: Vec<sea_orm::Value> = Vec::with_capacity(rows.len() * COLUMNS);
    for (i, row) in rows.iter().enumerate() {
        let b = i * COLUMNS;
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, 'pending', ${}, ${}, ${}, 0)",
            b + 1,
            b + 2,
            b + 3,
            b + 4,
            b + 5,
            b + 6,
            b + 7,
            b + 8,
            b + 9,
            b + 10,
            b + 11,
            b + 11
        ));
        let item = row.item;
        values.extend([
            row.update_id.clone().into(),
            item.scope.user.clone().into(),
            item.scope.agent.clone().into(),
            item.thread_id.clone().into(),
            item.run_id.clone().into(),
            item.model_name.clone().into(),
            row.conversation.clone().into(),
            row.refusals.clone().into(),
            item.filtered.message_id.clone().into(),
            (now + item.delay_ms).into(),
            now.into(),
        ]);
    }
    sql.push_str(
        " ON CONFLICT (user_id, agent_name, thread_id) WHERE status = 'pending' DO UPDATE SET \
         conversation = excluded.conversation, refusals = excluded.refusals, message_id = excluded.message_id, \
         run_id = excluded.run_id, model_name = excluded.model_name, scheduled_at = excluded.scheduled_at, \
         updated_at = excluded.updated_at",
    );
    if backend != DbBackend::Postgres {
        let changed = db.execute_raw(crate::store::statement(backend, &sql, values)).await?.rows_affected();
        return Ok(changed == rows.len() as u64);
    }
    sql.push_str(" RETURNING update_id, user_id, agent_name, thread_id");
    let expected: HashMap<Key, &str> = rows.iter().map(|r| (key(r.item), r.update_id.as_str())).collect();
    let stored = db.query_all_raw(crate::store::statement(backend, &sql, values)).await?;
    if stored.len() != expected.len() {
        return Ok(false);
    }
    for row in stored {
        let k: Key = (row.try_get("", "user_id")?, row.try_get("", "agent_name")?, row.try_get("", "thread_id")?);
        let id: String = row.try_get("", "update_id")?;
        if expected.get(&k) != Some(&id.as_str()) {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch's pending rows are found key by key through the pending index, never by scanning the
    /// queue (what made QueueUpdate slow down as the queue grew).
    #[tokio::test]
    async fn the_pending_lookup_searches_the_index_key_by_key() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(&crate::config::DatabaseConfig::default(), dir.path()).await?;
        let keys = vec![("alice".to_owned(), String::new(), "t1".to_owned()), ("bob".to_owned(), "coder".to_owned(), "t2".to_owned())];
        let statement = pending_statement(DbBackend::Sqlite, &keys);
        let explain = Statement { sql: format!("EXPLAIN QUERY PLAN {}", statement.sql), ..statement };
        let plan: Vec<String> =
            store.db().query_all_raw(explain).await?.iter().map(|row| row.try_get::<String>("", "detail")).collect::<Result<_, _>>()?;
        assert!(plan.iter().any(|step| step.contains("USING INDEX memory_updates_one_pending")), "{plan:?}");
        assert!(!plan.iter().any(|step| step.starts_with("SCAN u") || step.contains("memory_updates_due")), "{plan:?}");
        Ok(())
    }
}
