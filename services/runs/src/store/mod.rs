//! The runs database: connection set-up for SQLite (embedded default) and PostgreSQL (several
//! replicas), migrations, and write transactions.
//!
//! SQLite allows one writer at a time; a deferred transaction that reads and then writes can fail
//! with SQLITE_BUSY instead of waiting. So on SQLite every write transaction in this process takes one
//! async mutex first (writes queue in memory, readers are not blocked thanks to WAL), and
//! [`Store::retry_busy`] retries the rare cross-process `database is locked`. The hot write
//! transactions ([`Store::write`]) run on a thread of their own with a connection of their own
//! ([`writer`], [`direct`]).

pub mod direct;
pub mod entity;
pub mod group;
pub mod migration;
pub mod slot;
pub mod writer;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use direct::Direct;
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, TransactionTrait};
pub use slot::Priority;
use slot::{SlotGuard, WriteSlot};
use writer::WriterThread;

use crate::config::DatabaseConfig;

// The error type, its classification and stored time are the kit's store toolkit, shared with memory.
pub use antler_kit::store::{Busy, StoreError, now_ms};

/// A write transaction; on SQLite it also holds the process's write slot until commit or drop.
pub struct WriteTx {
    pub txn: DatabaseTransaction,
    _slot: Option<SlotGuard>,
}

impl std::ops::Deref for WriteTx {
    type Target = DatabaseTransaction;
    fn deref(&self) -> &DatabaseTransaction {
        &self.txn
    }
}

impl WriteTx {
    pub async fn commit(self) -> Result<(), StoreError> {
        self.txn.commit().await.map_err(StoreError::from)
    }
}

/// Most rows per multi-row INSERT (SQLite bounds the parameters of one statement).
pub const MAX_INSERT_ROWS: usize = 256;

/// Inserts `rows` in multi-row statements of power-of-two sizes (256, 128, …, 1). The drivers cache
/// prepared statements per SQL text (100 per connection): batches of every size from 1 to 128 would
/// make hundreds of distinct statements, evicting each other and costing a fresh prepare almost every
/// time (PostgreSQL admissions fell from 5,300/s to 1,200/s when batches grew past 16); nine sizes
/// per table stay cached, for at most nine statements per batch.
pub async fn insert_chunked<A>(db: &impl ConnectionTrait, rows: Vec<A>) -> Result<(), DbErr>
where
    A: sea_orm::ActiveModelTrait + Send,
{
    let mut rows = rows.into_iter();
    let mut left = rows.len();
    while left > 0 {
        let size = MAX_INSERT_ROWS.min(1 << left.ilog2());
        let chunk: Vec<A> = rows.by_ref().take(size).collect();
        left -= chunk.len();
        <A::Entity as sea_orm::EntityTrait>::insert_many(chunk).exec_without_returning(db).await?;
    }
    Ok(())
}

/// A statement written with `?` placeholders, numbered `$1…` for PostgreSQL.
pub fn statement(backend: DbBackend, sql: &str, values: Vec<sea_orm::Value>) -> sea_orm::Statement {
    let sql = if backend == DbBackend::Postgres {
        let mut numbered = String::with_capacity(sql.len() + 8);
        let mut n = 0;
        for c in sql.chars() {
            if c == '?' {
                n += 1;
                numbered.push_str(&format!("${n}"));
            } else {
                numbered.push(c);
            }
        }
        numbered
    } else {
        sql.to_owned()
    };
    sea_orm::Statement::from_sql_and_values(backend, sql, values)
}

/// `stmt` with every `LIMIT ?` and `OFFSET ?` (SQLite) written as the number it binds.
///
/// SQLite marks a statement whose LIMIT or OFFSET is a bound parameter as one whose plan depends on
/// that value, and binding it again expires the statement: every execution of such a cached statement
/// parses and plans it anew (`sqlite3Reprepare`, 6 % of the server's CPU in #32's profile, for the
/// `.one()` and paged reads of every run). sea-query always binds them, so the hot reads and the
/// writer's connection ([`direct`]) pass their statements through here: the few distinct limits
/// each get a cached statement of their own. Only integers are inlined; anything else is left bound.
pub fn inline_limits(stmt: sea_orm::Statement) -> sea_orm::Statement {
    if stmt.db_backend != DbBackend::Sqlite || !(stmt.sql.contains("LIMIT ?") || stmt.sql.contains("OFFSET ?")) {
        return stmt;
    }
    let Some(values) = stmt.values.as_ref() else { return stmt };
    let mut sql = String::with_capacity(stmt.sql.len() + 8);
    let mut kept = Vec::with_capacity(values.0.len());
    let (mut index, mut quoted) = (0, None::<char>);
    for c in stmt.sql.chars() {
        match (quoted, c) {
            (Some(q), c) if c == q => quoted = None,
            (Some(_), _) => {}
            (None, '\'' | '"' | '`') => quoted = Some(c),
            (None, '?') => {
                let value = values.0.get(index).cloned();
                index += 1;
                let after_keyword = sql.ends_with("LIMIT ") || sql.ends_with("OFFSET ");
                if let (true, Some(n)) = (after_keyword, value.as_ref().and_then(integer)) {
                    sql.push_str(&n.to_string());
                } else {
                    sql.push('?');
                    kept.extend(value);
                }
                continue;
            }
            _ => {}
        }
        sql.push(c);
    }
    if index != values.0.len() {
        // Placeholders and values disagree (a `?` inside something this scan does not know): as it was.
        return stmt;
    }
    sea_orm::Statement::from_sql_and_values(DbBackend::Sqlite, sql, kept)
}

/// The first row of `select`, its LIMIT inlined ([`inline_limits`]): for the reads every run makes.
pub async fn first<E: sea_orm::EntityTrait>(db: &impl ConnectionTrait, select: sea_orm::Select<E>) -> Result<Option<E::Model>, DbErr> {
    use sea_orm::{QuerySelect, QueryTrait};
    let stmt = inline_limits(select.limit(1).build(db.get_database_backend()));
    E::find().from_raw_sql(stmt).one(db).await
}

/// Every row of `select`, its LIMIT inlined ([`inline_limits`]): for the reads every run makes.
pub async fn rows<E: sea_orm::EntityTrait>(db: &impl ConnectionTrait, select: sea_orm::Select<E>) -> Result<Vec<E::Model>, DbErr> {
    use sea_orm::QueryTrait;
    let stmt = inline_limits(select.build(db.get_database_backend()));
    E::find().from_raw_sql(stmt).all(db).await
}

fn integer(value: &sea_orm::Value) -> Option<i128> {
    use sea_orm::Value as V;
    match value {
        V::TinyInt(Some(n)) => Some(i128::from(*n)),
        V::SmallInt(Some(n)) => Some(i128::from(*n)),
        V::Int(Some(n)) => Some(i128::from(*n)),
        V::BigInt(Some(n)) => Some(i128::from(*n)),
        V::TinyUnsigned(Some(n)) => Some(i128::from(*n)),
        V::SmallUnsigned(Some(n)) => Some(i128::from(*n)),
        V::Unsigned(Some(n)) => Some(i128::from(*n)),
        V::BigUnsigned(Some(n)) => Some(i128::from(*n)),
        _ => None,
    }
}

/// Counts every statement `db` executes in `antler_runs_db_statements_total`: what the database is
/// asked, seen from this replica (the wake-ups are judged by it: idle subscribers must add nothing).
/// With `RUST_LOG=antler_runs::sql=trace` each statement is also logged with its round trip (the
/// statements of one run are how #32's profile counts the writer's work).
fn count_statements(db: &mut DatabaseConnection) {
    let counter = metrics::counter!("antler_runs_db_statements_total");
    db.set_metric_callback(move |info| {
        counter.increment(1);
        tracing::trace!(target: "antler_runs::sql", micros = info.elapsed.as_micros() as u64, failed = info.failed, sql = %info.statement.sql);
    });
}

/// The file of a `sqlite:` URL.
fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next()?;
    (!path.is_empty() && path != ":memory:").then(|| std::path::PathBuf::from(path))
}

/// The connection pool and how to write through it.
#[derive(Clone)]
pub struct Store {
    db: DatabaseConnection,
    /// PostgreSQL: the small pool of lease renewals, heartbeats and takeovers (see
    /// [`Store::control_tx`]).
    control: Option<DatabaseConnection>,
    /// SQLite: one connection for every write, so its page cache and prepared statements stay warm
    /// (a write on another pooled connection re-reads the pages the previous writer changed).
    writer: Option<DatabaseConnection>,
    write_slot: Option<Arc<WriteSlot>>,
    /// SQLite: the thread [`Store::write`] runs its transactions on (see [`writer`]).
    writer_thread: Option<Arc<WriterThread>>,
    /// SQLite in a file: the writer thread's own connection, on which those transactions execute
    /// their statements synchronously (see [`direct`]).
    direct: Option<Direct>,
    /// With `direct`: the lifecycle's writes committed in groups (see [`group`]); None when
    /// `sqlite_group_commit_max` is 1.
    group: Option<Arc<group::GroupCommit>>,
    /// SQLite: the connection of the WAL checkpointer (and of the last checkpoint at shutdown).
    checkpoints: Option<DatabaseConnection>,
    /// Stops the background task (SQLite: the WAL checkpointer; PostgreSQL: the statistics refresh)
    /// when the last clone of the store goes.
    _checkpointer: Option<Arc<tokio_util::sync::DropGuard>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("backend", &self.backend()).finish_non_exhaustive()
    }
}

/// How often the background task looks at the SQLite WAL.
const WAL_CHECKPOINT_EVERY: Duration = Duration::from_millis(500);
/// Most write-slot grants in one checkpoint round for the writer to count as quiet.
const QUIET_GRANTS: u64 = 4;
/// How long a TRUNCATE checkpoint waits for readers before giving up until the next round.
const TRUNCATE_WAIT: Duration = Duration::from_millis(20);

/// Keeps the SQLite WAL small, with commits paying as little as possible for it.
///
/// SQLite rewinds the WAL only when a writer finds it fully copied into the database with no reader
/// still using it, which steady writes and a busy pool of readers prevent for ever (3,000 runs once
/// left a 498 MB WAL beside a 14 MB database). Every checkpoint also ends with an fsync of the WAL and
/// of the database file, and commits stall on the file system's journal meanwhile; truncating the WAL
/// to zero made that worse, since every commit after it extends the file again (a subagent spawn's
/// p99 went from 2.2 ms without checkpoints to 12–13 ms with a truncation every 16 MiB). So each round:
/// - when the writer was quiet (the write slot granted at most [`QUIET_GRANTS`] times since the last
///   round: heartbeats, lease renewals and sweeps, no run traffic), a TRUNCATE checkpoint copies the
///   WAL and shrinks the file to zero bytes, with the write slot held: it costs a trickle of writes
///   one short wait, and an idle service leaves no WAL on disk. (Requiring no grant at all made an
///   idle replica keep its WAL for ever whenever its once-a-second heartbeat and sweep fell in
///   alternate half-seconds: every round saw one of them.)
/// - when there were writes, a PASSIVE checkpoint copies the WAL while writers go on, then the
///   checkpointer takes the write slot like any writer (so no frame is appended meanwhile) for a
///   RESTART checkpoint, which copies what was appended in between (waiting at most
///   [`TRUNCATE_WAIT`] for readers) and makes the next commit write from the start of the file. The
///   file keeps its size and its blocks, so the commits after it only overwrite;
/// - past `truncate_at` (a quarter of `sqlite_wal_max_mib`: a RESTART was refused by busy readers
///   round after round), the same with TRUNCATE.
///
/// `journal_size_limit` caps what a rewind leaves on disk in any case.
async fn checkpoint_wal(
    conn: DatabaseConnection,
    wal: std::path::PathBuf,
    truncate_at: u64,
    slot: Arc<WriteSlot>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut every = tokio::time::interval(WAL_CHECKPOINT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_grants = slot.grants();
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        let grants = slot.grants();
        let quiet = grants - last_grants <= QUIET_GRANTS;
        last_grants = grants;
        let size = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
        if size == 0 {
            continue;
        }
        let (mode, _guard) = if quiet && size < truncate_at {
            ("TRUNCATE", slot.acquire(Priority::Lifecycle).await)
        } else {
            match wal_checkpoint(&conn, "PASSIVE").await {
                // Nothing appended since the last rewind.
                Ok((0, _)) if size < truncate_at => continue,
                Ok(_) => {}
                Err(error) => tracing::debug!(%error, "WAL checkpoint skipped"),
            }
            (if size >= truncate_at { "TRUNCATE" } else { "RESTART" }, slot.acquire(Priority::Lifecycle).await)
        };
        match wal_checkpoint(&conn, mode).await {
            Ok(_) if mode == "TRUNCATE" => metrics::counter!("antler_runs_wal_truncations_total").increment(1),
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, mode, "WAL checkpoint skipped (readers busy)"),
        }
        // The checkpointer's own turn is not a write.
        last_grants = slot.grants();
    }
}

/// PostgreSQL: refreshes the planner's statistics of the busiest tables once they have more than
/// doubled since the last ANALYZE, checked every second. Autovacuum would do it within a minute or
/// so, but a cached plan made while a table was small keeps scanning it whole meanwhile: on a fresh
/// database under an admission burst the idempotency-key lookup went from 0.03 ms to 2.5 ms that way,
/// and the workers started runs at a seventh of their rate. The check is one read of
/// `pg_stat_user_tables`.
async fn refresh_statistics_every_second(db: DatabaseConnection, stop: tokio_util::sync::CancellationToken) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        if let Err(error) = refresh_statistics(&db).await {
            tracing::debug!(%error, "statistics not refreshed");
        }
    }
}

async fn refresh_statistics(db: &DatabaseConnection) -> Result<(), DbErr> {
    let stale = db
        .query_all_raw(sea_orm::Statement::from_string(
            DbBackend::Postgres,
            "SELECT relname FROM pg_stat_user_tables WHERE relname IN ('runs', 'run_events', 'threads') \
             AND n_mod_since_analyze > GREATEST(1000, n_live_tup - n_mod_since_analyze)",
        ))
        .await?;
    for row in stale {
        let table: String = row.try_get_by_index(0)?;
        db.execute_unprepared(&format!("ANALYZE {table}")).await?;
        tracing::debug!(table, "statistics refreshed");
    }
    Ok(())
}

/// Runs `PRAGMA wal_checkpoint(mode)`: (frames in the WAL, frames copied into the database).
async fn wal_checkpoint(conn: &DatabaseConnection, mode: &str) -> Result<(i64, i64), DbErr> {
    let row = conn
        .query_one_raw(sea_orm::Statement::from_string(DbBackend::Sqlite, format!("PRAGMA wal_checkpoint({mode})")))
        .await?
        .ok_or_else(|| DbErr::Custom("wal_checkpoint returned no row".to_owned()))?;
    let busy: i64 = row.try_get_by_index(0)?;
    if busy != 0 {
        return Err(DbErr::Custom(format!("wal_checkpoint({mode}) was blocked by a reader or writer")));
    }
    Ok((row.try_get_by_index(1)?, row.try_get_by_index(2)?))
}

impl Store {
    /// Connects (creating the SQLite file if needed) and applies pending migrations.
    pub async fn open(config: &DatabaseConfig, data_dir: &Path) -> Result<Self, StoreError> {
        let url =
            if config.url.is_empty() { format!("sqlite://{}?mode=rwc", data_dir.join("runs.db").display()) } else { config.url.clone() };
        let mut options = ConnectOptions::new(url.clone());
        options.max_connections(config.pool_size()).connect_timeout(Duration::from_millis(config.connect_timeout_ms)).sqlx_logging(false);
        let busy = Duration::from_millis(config.sqlite_busy_timeout_ms);
        let wal_limit = config.sqlite_wal_max_mib * 1024 * 1024;
        options.map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(sea_orm::sqlx::sqlite::SqliteSynchronous::Normal)
                .busy_timeout(busy)
                .foreign_keys(true)
                // No checkpoint inside a commit: copying the WAL back into the database file (and its
                // fsync) stalled the write that crossed the threshold by several milliseconds. A
                // background task checkpoints instead (see `checkpoint_wal`).
                .pragma("wal_autocheckpoint", "0")
                .pragma("journal_size_limit", wal_limit.to_string())
        });
        let idle_in_transaction = config.postgres_idle_in_transaction_timeout_ms;
        // Sent in the startup packet, so it holds for every session of every pool (main and control).
        options.map_sqlx_postgres_opts(move |o| o.options([("idle_in_transaction_session_timeout", idle_in_transaction)]));
        let writer_options = {
            let mut writer = options.clone();
            writer.max_connections(1).min_connections(1);
            writer
        };
        let checkpoint_options = {
            let mut conn = writer_options.clone();
            conn.map_sqlx_sqlite_opts(|o| o.busy_timeout(TRUNCATE_WAIT));
            conn
        };
        let control_options = {
            let mut control = options.clone();
            control.max_connections(config.control_connections).min_connections(1);
            control
        };
        let mut db = Database::connect(options).await?;
        count_statements(&mut db);
        let sqlite = db.get_database_backend() == DbBackend::Sqlite;
        let control = if sqlite {
            None
        } else {
            let mut control = Database::connect(control_options).await?;
            count_statements(&mut control);
            Some(control)
        };
        let writer = if sqlite {
            let mut writer = Database::connect(writer_options).await?;
            count_statements(&mut writer);
            Some(writer)
        } else {
            None
        };
        let write_slot = sqlite.then(|| Arc::new(WriteSlot::new(config.sqlite_admission_share_percent as f64 / 100.0)));
        let checkpoints = if sqlite { Some(Database::connect(checkpoint_options).await?) } else { None };
        let checkpointer = match (&checkpoints, &write_slot, sqlite_file(&url)) {
            (Some(conn), Some(slot), Some(file)) => {
                let stop = tokio_util::sync::CancellationToken::new();
                let wal = std::path::PathBuf::from(format!("{}-wal", file.display()));
                tokio::spawn(checkpoint_wal(conn.clone(), wal, wal_limit / 4, slot.clone(), stop.clone()));
                Some(Arc::new(stop.drop_guard()))
            }
            _ => None,
        };
        let statistics = (!sqlite).then(|| {
            let stop = tokio_util::sync::CancellationToken::new();
            tokio::spawn(refresh_statistics_every_second(db.clone(), stop.clone()));
            Arc::new(stop.drop_guard())
        });
        let writer_thread = if sqlite {
            Some(Arc::new(
                WriterThread::start().map_err(|e| StoreError::Db(DbErr::Custom(format!("the runs writer thread did not start: {e}"))))?,
            ))
        } else {
            None
        };
        let mut store = Self {
            db,
            control,
            writer,
            write_slot,
            writer_thread,
            direct: None,
            group: None,
            checkpoints,
            _checkpointer: checkpointer.or(statistics),
        };
        // Replicas starting together race to migrate; the loser sees the winner's tables on a retry.
        antler_kit::store::migrate::<migration::Migrator>(&store.db, "migration").await?;
        // After the migration: the connection finds the file and its tables in place. (An in-memory
        // database has no file a second connection could open; its writes stay on the pool, as they
        // do, with a warning, when the file cannot be opened a second time.)
        let in_memory = url.contains("mode=memory");
        if let Some(file) = sqlite_file(&url).filter(|_| sqlite && !in_memory) {
            match Direct::open(&file, busy, wal_limit) {
                Ok(direct) => {
                    store.direct = Some(direct);
                    store.group =
                        (config.sqlite_group_commit_max > 1).then(|| Arc::new(group::GroupCommit::new(config.sqlite_group_commit_max)));
                }
                Err(error) => tracing::warn!(
                    %error,
                    file = %file.display(),
                    "the runs writer could not open the database file itself; its writes go through the pool (slower)"
                ),
            }
        }
        tracing::info!(backend = ?store.backend(), "runs database ready");
        Ok(store)
    }

    /// SQLite: copies the whole WAL into the database file and truncates it to zero bytes, waiting
    /// for the write slot (call it once the workers have stopped, at shutdown).
    pub async fn checkpoint_on_shutdown(&self) {
        let (Some(conn), Some(slot)) = (&self.checkpoints, &self.write_slot) else { return };
        let _guard = slot.acquire(Priority::Lifecycle).await;
        for _ in 0..200 {
            match wal_checkpoint(conn, "TRUNCATE").await {
                Ok(_) => {
                    tracing::info!("SQLite WAL checkpointed and truncated");
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        tracing::warn!("the SQLite WAL could not be truncated at shutdown (readers kept it busy); the next start will");
    }

    pub fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    /// The pool, for reads.
    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Begins a write transaction for the lifecycle of admitted runs (see [`slot`]).
    pub async fn tx(&self) -> Result<WriteTx, StoreError> {
        self.tx_for(Priority::Lifecycle).await
    }

    /// What keeps leases and replicas alive (lease renewals, heartbeats, takeovers): on PostgreSQL
    /// its own small pool (`database.control_connections`), so these writes never queue behind run
    /// traffic that fills the main pool — under load a renewal waiting there past the lease fenced a
    /// healthy run, and a takeover waited behind the work it should go before. SQLite: the main pool
    /// (its single writer already serves the lifecycle first).
    pub fn control_db(&self) -> &DatabaseConnection {
        self.control.as_ref().unwrap_or(&self.db)
    }

    /// A write transaction on [`Store::control_db`].
    pub async fn control_tx(&self) -> Result<WriteTx, StoreError> {
        match &self.control {
            Some(control) => Ok(WriteTx { txn: control.begin().await?, _slot: None }),
            None => self.tx().await,
        }
    }

    /// Begins a write transaction; on SQLite, waits for the write slot with `priority`.
    pub async fn tx_for(&self, priority: Priority) -> Result<WriteTx, StoreError> {
        let slot = match &self.write_slot {
            Some(slot) => Some(slot.acquire(priority).await),
            None => None,
        };
        Ok(WriteTx { txn: self.writer.as_ref().unwrap_or(&self.db).begin().await?, _slot: slot })
    }

    /// Runs `op` in a write transaction with `priority` and commits it when `op` returns Ok (an Err
    /// rolls it back), again when SQLite reports a lock held by another process (as
    /// [`Store::retry_busy`]). On SQLite the transaction runs on the writer thread ([`writer`]), so
    /// the write slot is held for the statements and not for the main runtime's scheduling, and on a
    /// database file its statements execute there synchronously ([`direct`]); `op` owns what it needs
    /// (it is called on another thread) and reads rows as models or named columns (`direct` cannot
    /// serve `into_tuple`). On PostgreSQL it runs here.
    ///
    /// The hot writes of the run lifecycle use this; the others keep [`Store::tx`] (same slot, the
    /// pool's writer connection).
    pub async fn write<T, E, F>(&self, priority: Priority, op: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Busy + std::fmt::Display + Send + 'static,
        F: for<'t> Fn(&'t DatabaseTransaction) -> futures::future::BoxFuture<'t, Result<T, E>> + Send + Sync + 'static,
    {
        if let (Priority::Lifecycle, Some(thread), Some(direct), Some(slot), Some(group)) =
            (priority, &self.writer_thread, &self.direct, &self.write_slot, &self.group)
        {
            return self.write_grouped(thread, direct, slot, group, Arc::new(op)).await;
        }
        match &self.writer_thread {
            Some(thread) => {
                let store = self.clone();
                thread.run(async move { store.write_here(priority, &op).await }).await.map_err(|e| {
                    E::from(StoreError::Db(DbErr::Custom(format!("the runs writer thread stopped before the write finished: {e}"))))
                })?
            }
            None => self.write_here(priority, &op).await,
        }
    }

    /// [`Store::write`] of a lifecycle write on the writer's connection: in the next group's
    /// transaction (see [`group`]), retried on a busy database as a write of its own is. The write
    /// is queued from the caller's thread, so writes that arrive while a group runs on the writer
    /// thread (which does not yield meanwhile) are in the next one.
    async fn write_grouped<T, E, F>(
        &self,
        thread: &WriterThread,
        direct: &Direct,
        slot: &Arc<WriteSlot>,
        group: &Arc<group::GroupCommit>,
        op: Arc<F>,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Busy + std::fmt::Display + Send + 'static,
        F: for<'t> Fn(&'t DatabaseTransaction) -> futures::future::BoxFuture<'t, Result<T, E>> + Send + Sync + 'static,
    {
        self.retry_busy(|| async {
            let result: Arc<std::sync::Mutex<Option<Result<T, E>>>> = Arc::default();
            let (member, committed) = {
                let (op, result) = (op.clone(), result.clone());
                group::Member::new(move |tx| {
                    Box::pin(async move {
                        let outcome = op(tx).await;
                        let ok = outcome.is_ok();
                        *result.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome);
                        ok
                    })
                })
            };
            if group.join(member) {
                let (group, direct, slot) = (group.clone(), direct.clone(), slot.clone());
                thread.spawn(async move { group.lead(&direct, &slot).await });
            }
            let committed = committed.await.unwrap_or_else(|_| {
                Err("the runs writer stopped before the write's group committed (the service is stopping); nothing of it is known to be written".to_owned())
            });
            let outcome = result.lock().unwrap_or_else(|p| p.into_inner()).take();
            match (outcome, committed) {
                (Some(Err(error)), _) => Err(error),
                (Some(Ok(value)), Ok(())) => Ok(value),
                (_, Err(error)) => Err(E::from(StoreError::Db(DbErr::Custom(format!("SQLite (runs writer): {error}"))))),
                (None, Ok(())) => Err(E::from(StoreError::Db(DbErr::Custom(
"SQLite (runs writer): the write did not complete in its group, and nothing of it was written (it panicked, or sea-orm could not open its transaction)\nhint: a panic is a bug: the log has its message and place".to_owned(),
                )))),
            }
        })
        .await
    }

    async fn write_here<T, E, F>(&self, priority: Priority, op: &F) -> Result<T, E>
    where
        E: From<StoreError> + Busy + std::fmt::Display,
        F: for<'t> Fn(&'t DatabaseTransaction) -> futures::future::BoxFuture<'t, Result<T, E>>,
    {
        if let (Some(direct), Some(slot)) = (&self.direct, &self.write_slot) {
            return self
                .retry_busy(|| async {
                    let _slot = slot.acquire(priority).await;
                    let open = OpenDirect::begin(direct)?;
                    let tx = direct.db().begin().await.map_err(StoreError::from)?;
                    let value = op(&tx).await?;
                    tx.commit().await.map_err(StoreError::from)?;
                    open.commit()?;
                    Ok(value)
                })
                .await;
        }
        self.retry_busy(|| async {
            let tx = self.tx_for(priority).await?;
            let value = op(&tx.txn).await?;
            tx.commit().await?;
            Ok(value)
        })
        .await
    }

    /// Runs `op` again (up to 5 times, 50 ms doubling to 1 s) when SQLite reports a lock held by
    /// another process.
    pub async fn retry_busy<T, E, F, Fut>(&self, op: F) -> Result<T, E>
    where
        E: Busy + std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        antler_kit::store::retry_busy(op).await
    }
}

/// A transaction open on the writer's [`Direct`] connection: rolled back unless committed, also when
/// the write is dropped half-way (its caller went away, the writer thread stopped), so SQLite's write
/// lock is never left held for the pool's writer to run into.
pub(super) struct OpenDirect<'d> {
    direct: &'d Direct,
    done: bool,
}

impl<'d> OpenDirect<'d> {
    pub(super) fn begin(direct: &'d Direct) -> Result<Self, StoreError> {
        direct.begin()?;
        Ok(Self { direct, done: false })
    }

    pub(super) fn commit(mut self) -> Result<(), StoreError> {
        self.done = true;
        Ok(self.direct.commit()?)
    }
}

impl Drop for OpenDirect<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.direct.rollback();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sqlite(sql: &str, values: Vec<sea_orm::Value>) -> sea_orm::Statement {
        sea_orm::Statement::from_sql_and_values(DbBackend::Sqlite, sql, values)
    }

    #[test]
    fn limits_and_offsets_are_written_into_the_text_and_the_rest_stays_bound() {
        let stmt = inline_limits(sqlite(
            r#"SELECT "a" FROM "t" WHERE "b" = ? AND "c" = 'LIMIT ?' LIMIT ? OFFSET ?"#,
            vec!["x".into(), 10u64.into(), 20i64.into()],
        ));
        assert_eq!(stmt.sql, r#"SELECT "a" FROM "t" WHERE "b" = ? AND "c" = 'LIMIT ?' LIMIT 10 OFFSET 20"#);
        assert_eq!(stmt.values.map(|v| v.0), Some(vec![sea_orm::Value::from("x")]));
        // A subquery's LIMIT, with placeholders after it.
        let stmt = inline_limits(sqlite(
            r#"UPDATE "runs" SET "s" = ? WHERE "id" = (SELECT "id" FROM "runs" LIMIT ?) AND "o" = ?"#,
            vec!["s".into(), 1u64.into(), "o".into()],
        ));
        assert_eq!(stmt.sql, r#"UPDATE "runs" SET "s" = ? WHERE "id" = (SELECT "id" FROM "runs" LIMIT 1) AND "o" = ?"#);
        assert_eq!(stmt.values.map(|v| v.0.len()), Some(2));
    }

    #[test]
    fn what_is_not_an_integer_limit_on_sqlite_is_left_as_it_was() {
        let text = sqlite(r#"SELECT "a" FROM "t" LIMIT ?"#, vec!["ten".into()]);
        assert_eq!(inline_limits(text.clone()).sql, text.sql);
        let postgres = sea_orm::Statement::from_sql_and_values(DbBackend::Postgres, r#"SELECT "a" FROM "t" LIMIT $1"#, vec![1u64.into()]);
        assert_eq!(inline_limits(postgres).sql, r#"SELECT "a" FROM "t" LIMIT $1"#);
        let short = sqlite(r#"SELECT "a" FROM "t" WHERE "b" = ? LIMIT ?"#, vec![1u64.into()]);
        assert_eq!(inline_limits(short.clone()).sql, short.sql, "placeholders and values disagree: untouched");
    }
}
