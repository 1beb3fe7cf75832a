//! The runs database: connection set-up for SQLite (embedded default) and PostgreSQL (several
//! replicas), migrations, and write transactions.
//!
//! SQLite allows one writer at a time; a deferred transaction that reads and then writes can fail
//! with SQLITE_BUSY instead of waiting. So on SQLite every write transaction in this process takes one
//! async mutex first (writes queue in memory, readers are not blocked thanks to WAL), and
//! [`Store::retry_busy`] retries the rare cross-process `database is locked`.

pub mod entity;
pub mod migration;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, SqlErr, TransactionTrait,
};
use sea_orm_migration::MigratorTrait;
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::config::DatabaseConfig;

/// Database failures, classified for the callers that care.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] DbErr),
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// A unique index said no (an idempotency key or the one-active-run rule).
    pub fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Db(e) if matches!(e.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))))
    }
}

/// Errors that can say "SQLite is locked by another process; try again".
pub trait Busy {
    fn is_busy(&self) -> bool;
}

impl Busy for StoreError {
    fn is_busy(&self) -> bool {
        let StoreError::Db(e) = self else { return false };
        let text = e.to_string();
        text.contains("database is locked") || text.contains("SQLITE_BUSY") || text.contains("database table is locked")
    }
}

impl From<prost::DecodeError> for StoreError {
    fn from(e: prost::DecodeError) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

/// Milliseconds since the Unix epoch: how every timestamp is stored.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A write transaction; on SQLite it also holds the process's write slot until commit or drop.
pub struct WriteTx {
    pub txn: DatabaseTransaction,
    _slot: Option<OwnedMutexGuard<()>>,
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

/// The connection pool and how to write through it.
#[derive(Clone)]
pub struct Store {
    db: DatabaseConnection,
    /// SQLite: one connection for every write, so its page cache and prepared statements stay warm
    /// (a write on another pooled connection re-reads the pages the previous writer changed).
    writer: Option<DatabaseConnection>,
    write_slot: Option<Arc<Mutex<()>>>,
    /// Stops the SQLite WAL checkpointer when the last clone of the store goes.
    _checkpointer: Option<Arc<tokio_util::sync::DropGuard>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("backend", &self.backend()).finish_non_exhaustive()
    }
}

/// How often the background task copies the SQLite WAL into the database file.
const WAL_CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// Checkpoints the SQLite WAL off the write path. PASSIVE never waits for readers or the writer: it
/// copies what it can and the next round takes the rest, so the WAL stays bounded without a commit
/// ever paying for it.
async fn checkpoint_wal(db: DatabaseConnection, stop: tokio_util::sync::CancellationToken) {
    let mut every = tokio::time::interval(WAL_CHECKPOINT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            () = stop.cancelled() => return,
        }
        if let Err(error) = db.execute_unprepared("PRAGMA wal_checkpoint(PASSIVE)").await {
            tracing::debug!(%error, "WAL checkpoint skipped");
        }
    }
}

impl Store {
    /// Connects (creating the SQLite file if needed) and applies pending migrations.
    pub async fn open(config: &DatabaseConfig, data_dir: &Path) -> Result<Self, StoreError> {
        let url =
            if config.url.is_empty() { format!("sqlite://{}?mode=rwc", data_dir.join("runs.db").display()) } else { config.url.clone() };
        let mut options = ConnectOptions::new(url.clone());
        options
            .max_connections(config.max_connections)
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .sqlx_logging(false);
        let busy = Duration::from_millis(config.sqlite_busy_timeout_ms);
        options.map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(sea_orm::sqlx::sqlite::SqliteSynchronous::Normal)
                .busy_timeout(busy)
                .foreign_keys(true)
                // No checkpoint inside a commit: copying the WAL back into the database file (and its
                // fsync) stalled the write that crossed the threshold by several milliseconds. A
                // background task checkpoints instead (see `checkpoint_wal`).
                .pragma("wal_autocheckpoint", "0")
        });
        let writer_options = {
            let mut writer = options.clone();
            writer.max_connections(1).min_connections(1);
            writer
        };
        let db = Database::connect(options).await?;
        let sqlite = db.get_database_backend() == DbBackend::Sqlite;
        let writer = if sqlite { Some(Database::connect(writer_options).await?) } else { None };
        let write_slot = sqlite.then(|| Arc::new(Mutex::new(())));
        let checkpointer = sqlite.then(|| {
            let stop = tokio_util::sync::CancellationToken::new();
            tokio::spawn(checkpoint_wal(db.clone(), stop.clone()));
            Arc::new(stop.drop_guard())
        });
        let store = Self { db, writer, write_slot, _checkpointer: checkpointer };
        // Replicas starting together race to migrate; the loser sees the winner's tables on a retry.
        let mut attempt = 0;
        loop {
            match migration::Migrator::up(&store.db, None).await {
                Ok(()) => break,
                Err(error) if attempt < 5 => {
                    attempt += 1;
                    tracing::warn!(%error, attempt, "migration failed; retrying (another replica may be migrating)");
                    tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                }
                Err(error) => return Err(error.into()),
            }
        }
        tracing::info!(backend = ?store.backend(), "runs database ready");
        Ok(store)
    }

    pub fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    /// The pool, for reads.
    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Begins a write transaction.
    pub async fn tx(&self) -> Result<WriteTx, StoreError> {
        let slot = match &self.write_slot {
            Some(slot) => Some(slot.clone().lock_owned().await),
            None => None,
        };
        Ok(WriteTx { txn: self.writer.as_ref().unwrap_or(&self.db).begin().await?, _slot: slot })
    }

    /// Runs `op` again (up to 5 times, 50 ms doubling to 1 s) when SQLite reports a lock held by
    /// another process.
    pub async fn retry_busy<T, E, F, Fut>(&self, mut op: F) -> Result<T, E>
    where
        E: Busy + std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut delay = Duration::from_millis(50);
        let mut attempt = 1;
        loop {
            match op().await {
                Err(e) if e.is_busy() && attempt < 5 => {
                    tracing::warn!(attempt, error = %e, "database busy; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}
