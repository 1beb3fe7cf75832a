//! The memory database: connection set-up for SQLite (embedded default) and PostgreSQL (several
//! replicas), migrations, and write transactions.
//!
//! SQLite allows one writer at a time and a deferred transaction that reads then writes can fail with
//! SQLITE_BUSY instead of waiting, so on SQLite every write goes through one connection behind an async
//! mutex (writes queue in memory; readers are not blocked, thanks to WAL), as in the runs store.

pub mod entity;
pub mod migration;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend, Statement, TransactionTrait};
use serde::Deserialize as _;

use crate::config::DatabaseConfig;

// The error type and stored time are the kit's store toolkit, shared with runs.
pub use antler_kit::store::{StoreError, now_ms};

/// A write transaction; on SQLite it also holds the process's write lock until commit or drop.
pub struct WriteTx {
    pub txn: DatabaseTransaction,
    _lock: Option<tokio::sync::OwnedMutexGuard<()>>,
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
    /// SQLite: the one connection every write uses (its page cache stays warm).
    writer: Option<DatabaseConnection>,
    write_lock: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("backend", &self.backend()).finish_non_exhaustive()
    }
}

impl Store {
    /// Connects (creating the SQLite file if needed) and applies pending migrations.
    pub async fn open(config: &DatabaseConfig, data_dir: &Path) -> Result<Self, StoreError> {
        let url =
            if config.url.is_empty() { format!("sqlite://{}?mode=rwc", data_dir.join("memory.db").display()) } else { config.url.clone() };
        let mut options = ConnectOptions::new(url);
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
        });
        let writer_options = {
            let mut writer = options.clone();
            writer.max_connections(1).min_connections(1);
            writer
        };
        let db = Database::connect(options).await?;
        let sqlite = db.get_database_backend() == DbBackend::Sqlite;
        let writer = if sqlite { Some(Database::connect(writer_options).await?) } else { None };
        let store = Self { db, writer, write_lock: sqlite.then(Default::default) };
        // Replicas starting together race to migrate; the loser sees the winner's tables on a retry.
        antler_kit::store::migrate::<migration::Migrator>(store.writer.as_ref().unwrap_or(&store.db), "memory migration").await?;
        tracing::info!(backend = ?store.backend(), "memory database ready");
        Ok(store)
    }

    pub fn backend(&self) -> DbBackend {
        self.db.get_database_backend()
    }

    /// The pool, for reads.
    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Begins a write transaction (on SQLite, after the previous one of this process has finished).
    pub async fn tx(&self) -> Result<WriteTx, StoreError> {
        let lock = match &self.write_lock {
            Some(lock) => Some(lock.clone().lock_owned().await),
            None => None,
        };
        Ok(WriteTx { txn: self.writer.as_ref().unwrap_or(&self.db).begin().await?, _lock: lock })
    }

    /// A raw statement written with PostgreSQL's `$n` placeholders, for either backend (SQLite takes
    /// them as `?n`).
    pub fn statement(&self, sql: &str, values: Vec<sea_orm::Value>) -> Statement {
        statement(self.backend(), sql, values)
    }
}

/// See [`Store::statement`].
pub fn statement(backend: DbBackend, sql: &str, values: Vec<sea_orm::Value>) -> Statement {
    if backend == DbBackend::Postgres {
        return Statement::from_sql_and_values(backend, sql, values);
    }
    Statement::from_sql_and_values(backend, sql.replace('$', "?"), values)
}

/// Runs a statement and returns how many rows it changed.
pub async fn execute(db: &impl ConnectionTrait, statement: Statement) -> Result<u64, StoreError> {
    Ok(db.execute_raw(statement).await?.rows_affected())
}

/// A float from a JSON number or from its text: SQLite's JSON functions print a REAL with 15
/// significant digits, which does not always give the same `f64` back, so queries that hand rows over
/// as JSON send such columns as `printf('%!.17g', column)`, which does.
pub fn json_f64<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum NumberOrText {
        Number(f64),
        Text(String),
    }
    match NumberOrText::deserialize(deserializer)? {
        NumberOrText::Number(n) => Ok(n),
        NumberOrText::Text(t) => t.trim().parse().map_err(serde::de::Error::custom),
    }
}
