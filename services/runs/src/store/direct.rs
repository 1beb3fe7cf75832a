//! SQLite: the writer thread's own connection, on which the hot write transactions (start, a step's
//! checkpoint and events, the journal, finalize) execute their statements synchronously.
//!
//! sqlx runs every SQLite statement on a thread per connection and hands it there and back over
//! channels: two thread wake-ups per statement (and per BEGIN and COMMIT). #32's profile found the
//! write slot held ~100 µs per statement, nearly all of it those wake-ups waiting for a core, while
//! SQLite's own work was a few percent: the one writer of the file, not the CPUs, set the rate of runs.
//! Here a statement is a call into SQLite on the thread that asked for it.
//!
//! The transactions stay sea-orm code, shared with PostgreSQL: this connection is handed to sea-orm
//! through its synchronous `MockDatabaseTrait` interface (the one sea-orm offers for a connection it
//! does not drive itself), with rusqlite underneath. Nothing is scripted or faked here: every
//! statement runs against the database file. sea-orm's `proxy` interface, made for this, does not
//! compile together with `sqlx-sqlite` in sea-orm 2.0.4 (see the runs README, "Throughput").
//!
//! What the interface cannot say, this module makes up for:
//! - it cannot report a failed BEGIN or COMMIT: the store runs those itself ([`Direct::begin`],
//!   [`Direct::commit`]), and sea-orm's own transaction on this connection only counts depth;
//! - its rows are looked up by name with exact value types: each result column is converted to the
//!   type its entity declares ([`ColumnKinds`]). Rows cannot be read by position (they are keyed by
//!   name), so the hot transactions read models and named columns only, never `into_tuple`; a
//!   positional read fails loudly instead of reading some other column ([`POSITIONAL`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::types::{Value as Sql, ValueRef};
use sea_orm::sea_query::Value;
use sea_orm::{
    ColumnTrait, ColumnType, DatabaseConnection, DatabaseConnectionType, DbBackend, DbErr, EntityTrait, ExecResult, IdenStatic, Iterable,
    MockDatabase, MockDatabaseConnection, MockDatabaseTrait, MockExecResult, QueryResult, RuntimeErr, Statement, Transaction,
};

use super::entity;

/// A key that sorts before every column name, holding a value no column type accepts. sea-orm reads
/// a row of this interface by position in key order: `into_tuple` here would read columns in
/// alphabetical order, a silent mix-up when two columns share a type. With this first, the first
/// positional read fails with a type error.
const POSITIONAL: &str = "\u{1}by name only";

/// Prepared statements kept per connection (the hot transactions use a few dozen distinct texts).
const STATEMENT_CACHE: usize = 128;

/// How a column's values are presented to sea-orm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Int,
    BigInt,
    Text,
    Bytes,
    Double,
}

/// The declared kind of every column of the runs database, by column name. Names shared by several
/// tables have the same kind in each (checked by a test), so a result column is typed by its name.
#[derive(Debug)]
struct ColumnKinds(HashMap<String, Kind>);

impl ColumnKinds {
    fn of_runs_database() -> Self {
        let mut kinds = HashMap::new();
        for (name, kind) in all_columns() {
            kinds.entry(name).or_insert(kind);
        }
        Self(kinds)
    }

    fn get(&self, name: &str) -> Option<Kind> {
        self.0.get(name).copied()
    }
}

fn columns_of<E: EntityTrait>() -> impl Iterator<Item = (String, Kind)> {
    E::Column::iter().map(|c| (c.as_str().to_owned(), kind_of(c.def().get_column_type())))
}

fn all_columns() -> Vec<(String, Kind)> {
    use entity::*;
    let mut all = Vec::new();
    all.extend(columns_of::<runs::Entity>());
    all.extend(columns_of::<run_events::Entity>());
    all.extend(columns_of::<run_inputs::Entity>());
    all.extend(columns_of::<threads::Entity>());
    all.extend(columns_of::<checkpoints::Entity>());
    all.extend(columns_of::<checkpoint_blobs::Entity>());
    all.extend(columns_of::<tool_effects::Entity>());
    all.extend(columns_of::<workers::Entity>());
    all.extend(columns_of::<feedback::Entity>());
    all
}

fn kind_of(column: &ColumnType) -> Kind {
    match column {
        ColumnType::Boolean => Kind::Bool,
        ColumnType::TinyInteger | ColumnType::SmallInteger | ColumnType::Integer => Kind::Int,
        ColumnType::BigInteger => Kind::BigInt,
        ColumnType::Float | ColumnType::Double | ColumnType::Decimal(_) => Kind::Double,
        ColumnType::Binary(_) | ColumnType::VarBinary(_) | ColumnType::Blob | ColumnType::Bit(_) | ColumnType::VarBit(_) => Kind::Bytes,
        // Strings, text and the string-backed enums (`Status`).
        _ => Kind::Text,
    }
}

/// The connection, shared by the store (BEGIN, COMMIT, ROLLBACK) and sea-orm (the statements).
struct Inner {
    conn: rusqlite::Connection,
    kinds: ColumnKinds,
    /// sea-orm's nesting depth inside the store's transaction (savepoints beyond 0).
    depth: usize,
    /// A SAVEPOINT statement that failed where sea-orm cannot hear of it: the next statement and
    /// the commit fail with it.
    failed: Option<String>,
}

/// The writer thread's connection. Cheap to clone; used by one write transaction at a time (the
/// write slot is held around every use).
#[derive(Clone)]
pub struct Direct {
    inner: Arc<Mutex<Inner>>,
    /// The same connection as sea-orm sees it.
    db: DatabaseConnection,
}

impl std::fmt::Debug for Direct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direct").finish_non_exhaustive()
    }
}

/// Runs one statement that returns no rows (BEGIN, COMMIT, ROLLBACK), prepared once per connection.
fn run(conn: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.raw_execute().map(|_| ())
}

fn db_err(error: impl std::fmt::Display) -> DbErr {
    DbErr::Exec(RuntimeErr::Internal(format!("SQLite (runs writer): {error}")))
}

impl Direct {
    /// Opens `file` (which the pool has already created and migrated) with the same settings as the
    /// pool's connections.
    pub fn open(file: &Path, busy_timeout: Duration, wal_limit_bytes: u64) -> Result<Self, DbErr> {
        use rusqlite::OpenFlags;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = rusqlite::Connection::open_with_flags(file, flags).map_err(db_err)?;
        conn.busy_timeout(busy_timeout).map_err(db_err)?;
        // As the pool's connections (see `Store::open`): WAL, NORMAL sync, foreign keys, no
        // checkpoint inside a commit, the WAL capped after a rewind.
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; \
             PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = {wal_limit_bytes};"
        ))
        .map_err(db_err)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let inner = Arc::new(Mutex::new(Inner { conn, kinds: ColumnKinds::of_runs_database(), depth: 0, failed: None }));
        let db = DatabaseConnectionType::MockDatabaseConnection(Arc::new(MockDatabaseConnection::new(Adapter {
            inner: inner.clone(),
            statements: metrics::counter!("antler_runs_db_statements_total"),
        })))
        .into();
        Ok(Self { inner, db })
    }

    /// The connection for sea-orm: begin a transaction on it after [`Direct::begin`].
    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// BEGIN IMMEDIATE: takes SQLite's write lock now (waiting up to the busy timeout for another
    /// process), so no statement of the transaction can fail to upgrade a read lock later. A
    /// transaction some earlier failure left open is rolled back first.
    pub fn begin(&self) -> Result<(), DbErr> {
        let mut inner = self.lock();
        if !inner.conn.is_autocommit() {
            tracing::warn!("the runs writer found a transaction left open; rolling it back");
            let _ = run(&inner.conn, "ROLLBACK");
        }
        inner.depth = 0;
        inner.failed = None;
        run(&inner.conn, "BEGIN IMMEDIATE").map_err(db_err)
    }

    /// COMMIT; on failure the transaction is rolled back, so nothing of it stays.
    pub fn commit(&self) -> Result<(), DbErr> {
        let inner = self.lock();
        if let Some(failed) = &inner.failed {
            let error = db_err(failed);
            let _ = run(&inner.conn, "ROLLBACK");
            return Err(error);
        }
        match run(&inner.conn, "COMMIT") {
            Ok(()) => Ok(()),
            Err(error) => {
                if !inner.conn.is_autocommit() {
                    let _ = run(&inner.conn, "ROLLBACK");
                }
                Err(db_err(error))
            }
        }
    }

    /// SAVEPOINT around one write of a group (see `store::group`).
    pub fn savepoint(&self) -> Result<(), DbErr> {
        let mut inner = self.lock();
        inner.depth = 0;
        run(&inner.conn, "SAVEPOINT group_member").map_err(db_err)
    }

    /// RELEASE of a write that succeeded; an error when one of its own savepoints failed (its
    /// statements cannot be trusted, nor the transaction's).
    pub fn release(&self) -> Result<(), DbErr> {
        let inner = self.lock();
        inner.check()?;
        run(&inner.conn, "RELEASE group_member").map_err(db_err)
    }

    /// Undoes a write that failed, and only it; an error when the transaction itself is gone (SQLite
    /// rolls the whole of it back on some errors).
    pub fn rollback_to(&self) -> Result<(), DbErr> {
        let mut inner = self.lock();
        inner.failed = None;
        inner.depth = 0;
        run(&inner.conn, "ROLLBACK TO group_member").map_err(db_err)?;
        run(&inner.conn, "RELEASE group_member").map_err(db_err)?;
        if inner.conn.is_autocommit() {
            return Err(db_err("the group's transaction was rolled back by SQLite"));
        }
        Ok(())
    }

    /// ROLLBACK, when a transaction is open.
    pub fn rollback(&self) {
        let inner = self.lock();
        if !inner.conn.is_autocommit()
            && let Err(error) = run(&inner.conn, "ROLLBACK")
        {
            tracing::warn!(%error, "the runs writer could not roll back");
        }
    }
}

/// sea-orm's view of [`Direct`].
struct Adapter {
    inner: Arc<Mutex<Inner>>,
    /// `antler_runs_db_statements_total`, as the pool's statements count in it (see `count_statements`).
    statements: metrics::Counter,
}

impl std::fmt::Debug for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("runs writer (SQLite)")
    }
}

impl Adapter {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, statement: &Statement, started: std::time::Instant, failed: bool) {
        self.statements.increment(1);
        tracing::trace!(target: "antler_runs::sql", micros = started.elapsed().as_micros() as u64, failed, sql = %statement.sql);
    }
}

/// `MockDatabase` is the one public way to build sea-orm's `ExecResult` and `QueryResult` from
/// outside it; this one holds exactly the result of the statement just run.
fn exec_result(result: MockExecResult, statement: Statement) -> Result<ExecResult, DbErr> {
    MockDatabase::new(DbBackend::Sqlite).append_exec_results([result]).execute(0, statement)
}

fn query_result(rows: Vec<std::collections::BTreeMap<String, Value>>, statement: Statement) -> Result<Vec<QueryResult>, DbErr> {
    MockDatabase::new(DbBackend::Sqlite).append_query_results([rows]).query(0, statement)
}

impl Inner {
    /// Runs `template` (each `{}` the savepoint's number) for a transaction nested `depth` deep in
    /// the store's; nothing at depth 0, the store's own. A failure is kept in `failed`.
    fn savepoint(&mut self, depth: usize, template: &str) {
        if depth == 0 {
            return;
        }
        if let Err(error) = self.conn.execute_batch(&template.replace("{}", &depth.to_string())) {
            self.failed.get_or_insert(error.to_string());
        }
    }

    fn check(&self) -> Result<(), DbErr> {
        match &self.failed {
            Some(failed) => Err(db_err(failed)),
            None => Ok(()),
        }
    }

    fn prepare<'c>(&'c self, statement: &Statement) -> Result<rusqlite::CachedStatement<'c>, DbErr> {
        let mut prepared = self.conn.prepare_cached(&statement.sql).map_err(db_err)?;
        if let Some(values) = &statement.values {
            for (i, value) in values.0.iter().enumerate() {
                prepared.raw_bind_parameter(i + 1, to_sql(value)?).map_err(db_err)?;
            }
        }
        Ok(prepared)
    }

    fn execute(&self, statement: &Statement) -> Result<MockExecResult, DbErr> {
        self.check()?;
        let mut prepared = self.prepare(statement)?;
        // Stepped to the end whatever it returns (an UPDATE … RETURNING run as a plain statement).
        let mut rows = prepared.raw_query();
        while rows.next().map_err(db_err)?.is_some() {}
        Ok(MockExecResult { last_insert_id: self.conn.last_insert_rowid() as u64, rows_affected: self.conn.changes() })
    }

    fn query(&self, statement: &Statement) -> Result<Vec<std::collections::BTreeMap<String, Value>>, DbErr> {
        self.check()?;
        let mut prepared = self.prepare(statement)?;
        let names: Vec<(String, Option<Kind>)> =
            prepared.column_names().into_iter().map(|name| (name.to_owned(), self.kinds.get(name))).collect();
        let mut rows = prepared.raw_query();
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(db_err)? {
            let mut values = std::collections::BTreeMap::new();
            values.insert(POSITIONAL.to_owned(), Value::Char(None));
            for (i, (name, kind)) in names.iter().enumerate() {
                let value = row.get_ref(i).map_err(db_err)?;
                values.insert(name.clone(), from_sql(value, *kind, name)?);
            }
            out.push(values);
        }
        Ok(out)
    }
}

impl MockDatabaseTrait for Adapter {
    fn execute(&mut self, _counter: usize, statement: Statement) -> Result<ExecResult, DbErr> {
        let statement = super::inline_limits(statement);
        let started = std::time::Instant::now();
        let result = self.lock().execute(&statement);
        self.count(&statement, started, result.is_err());
        exec_result(result?, statement)
    }

    fn query(&mut self, _counter: usize, statement: Statement) -> Result<Vec<QueryResult>, DbErr> {
        let statement = super::inline_limits(statement);
        let started = std::time::Instant::now();
        let rows = self.lock().query(&statement);
        self.count(&statement, started, rows.is_err());
        query_result(rows?, statement)
    }

    // The outermost transaction is the store's (`Direct::begin`/`commit`); nested ones are
    // savepoints, whose failure is kept for the next statement and the commit to report.
    fn begin(&mut self) {
        let mut inner = self.lock();
        let depth = inner.depth;
        inner.depth += 1;
        inner.savepoint(depth, "SAVEPOINT sp{}");
    }

    fn commit(&mut self) {
        let mut inner = self.lock();
        inner.depth = inner.depth.saturating_sub(1);
        let depth = inner.depth;
        inner.savepoint(depth, "RELEASE sp{}");
    }

    fn rollback(&mut self) {
        let mut inner = self.lock();
        inner.depth = inner.depth.saturating_sub(1);
        let depth = inner.depth;
        inner.savepoint(depth, "ROLLBACK TO sp{}; RELEASE sp{}");
    }

    fn drain_transaction_log(&mut self) -> Vec<Transaction> {
        Vec::new()
    }

    fn get_database_backend(&self) -> DbBackend {
        DbBackend::Sqlite
    }

    fn ping(&self) -> Result<(), DbErr> {
        Ok(())
    }
}

/// A sea-query value as SQLite stores it (as sqlx's SQLite encoding does: booleans as 0/1).
fn to_sql(value: &Value) -> Result<Sql, DbErr> {
    fn int<T: Into<i64> + Copy>(v: &Option<T>) -> Sql {
        v.map_or(Sql::Null, |v| Sql::Integer(v.into()))
    }
    Ok(match value {
        Value::Bool(v) => v.map_or(Sql::Null, |v| Sql::Integer(v.into())),
        Value::TinyInt(v) => int(v),
        Value::SmallInt(v) => int(v),
        Value::Int(v) => int(v),
        Value::BigInt(v) => int(v),
        Value::TinyUnsigned(v) => int(v),
        Value::SmallUnsigned(v) => int(v),
        Value::Unsigned(v) => int(v),
        Value::BigUnsigned(v) => match v {
            None => Sql::Null,
            Some(v) => Sql::Integer(i64::try_from(*v).map_err(|_| db_err(format!("integer {v} is out of SQLite's range")))?),
        },
        Value::Float(v) => v.map_or(Sql::Null, |v| Sql::Real(v.into())),
        Value::Double(v) => v.map_or(Sql::Null, Sql::Real),
        Value::String(v) => v.as_ref().map_or(Sql::Null, |v| Sql::Text(v.clone())),
        Value::Char(v) => v.map_or(Sql::Null, |v| Sql::Text(v.to_string())),
        Value::Bytes(v) => v.as_ref().map_or(Sql::Null, |v| Sql::Blob(v.clone())),
        Value::Json(v) => v.as_ref().map_or(Sql::Null, |v| Sql::Text(v.to_string())),
        other => return Err(db_err(format!("a value of type {other:?} has no SQLite encoding in the runs writer"))),
    })
}

/// A stored value as sea-orm reads it for a column of `kind` (unknown columns by storage class).
fn from_sql(value: ValueRef<'_>, kind: Option<Kind>, name: &str) -> Result<Value, DbErr> {
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).map_err(|_| db_err(format!("column {name} holds text that is not UTF-8")));
    let mismatch = || db_err(format!("column {name} holds {value:?}, not the {kind:?} its entity declares"));
    Ok(match (kind, value) {
        (Some(Kind::Bool), ValueRef::Null) => Value::Bool(None),
        (Some(Kind::Bool), ValueRef::Integer(i)) => Value::Bool(Some(i != 0)),
        (Some(Kind::Int), ValueRef::Null) => Value::Int(None),
        (Some(Kind::Int), ValueRef::Integer(i)) => Value::Int(Some(i32::try_from(i).map_err(|_| mismatch())?)),
        (Some(Kind::BigInt), ValueRef::Null) => Value::BigInt(None),
        (Some(Kind::BigInt) | None, ValueRef::Integer(i)) => Value::BigInt(Some(i)),
        (Some(Kind::Double), ValueRef::Null) => Value::Double(None),
        (Some(Kind::Double) | None, ValueRef::Real(f)) => Value::Double(Some(f)),
        (Some(Kind::Double), ValueRef::Integer(i)) => Value::Double(Some(i as f64)),
        (Some(Kind::Text) | None, ValueRef::Null) => Value::String(None),
        (Some(Kind::Text) | None, ValueRef::Text(t)) => Value::String(Some(text(t)?)),
        (Some(Kind::Bytes), ValueRef::Null) => Value::Bytes(None),
        (Some(Kind::Bytes) | None, ValueRef::Blob(b)) => Value::Bytes(Some(b.to_vec())),
        // SQLite may hand back a blob column written as text (or the reverse) by another writer.
        (Some(Kind::Bytes), ValueRef::Text(t)) => Value::Bytes(Some(t.to_vec())),
        _ => return Err(mismatch()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Status;
    use crate::store::Busy;
    use crate::store::entity::runs;
    use sea_orm::{ActiveValue, QueryFilter, QuerySelect, TransactionTrait};

    #[test]
    fn a_column_name_has_one_kind_in_every_table() {
        let mut seen: HashMap<String, Kind> = HashMap::new();
        for (name, kind) in all_columns() {
            if let Some(before) = seen.insert(name.clone(), kind) {
                assert_eq!(before, kind, "column {name} is declared with two kinds; the runs writer types result columns by name");
            }
        }
        assert_eq!(ColumnKinds::of_runs_database().get("queued"), Some(Kind::Bool));
        assert_eq!(ColumnKinds::of_runs_database().get("attempt"), Some(Kind::Int));
        assert_eq!(ColumnKinds::of_runs_database().get("last_seq"), Some(Kind::BigInt));
    }

    fn run(run_id: &str) -> runs::Model {
        runs::Model {
            run_id: run_id.to_owned(),
            user_id: "u".to_owned(),
            thread_id: "t".to_owned(),
            status: Status::Pending,
            queued: true,
            attempt: 7,
            owner_worker_id: None,
            lease_expires_at: Some(1 << 40),
            cancel_action: None,
            cancel_cause: None,
            idempotency_key: None,
            fingerprint: "f".to_owned(),
            multitask_strategy: "reject".to_owned(),
            on_disconnect: "cancel".to_owned(),
            model_name: "m".to_owned(),
            request: vec![0, 1, 255],
            metadata: "{}".to_owned(),
            base_checkpoint_id: None,
            stop_reason: None,
            error_code: None,
            error_message: None,
            final_status: None,
            usage: Vec::new(),
            delivery: Some(vec![9]),
            last_seq: 0,
            created_at: 1,
            started_at: None,
            finished_at: None,
            updated_at: 1,
            parent_run_id: None,
            parent_task_id: None,
            usage_input_tokens: 0,
            usage_output_tokens: 0,
            usage_total_tokens: 0,
            usage_cache_read_tokens: 0,
            usage_reasoning_tokens: 0,
            usage_llm_calls: 0,
            usage_lead_agent_tokens: 0,
            usage_subagent_tokens: 0,
            usage_middleware_tokens: 0,
            usage_by_model: String::new(),
        }
    }

    /// A migrated runs database in a temporary directory, and the writer's connection to it.
    async fn open() -> (tempfile::TempDir, crate::store::Store, Direct) {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = crate::config::DatabaseConfig::default();
        let store = crate::store::Store::open(&config, dir.path()).await.expect("store");
        assert!(store.direct.is_some(), "a store on a database file writes its hot transactions through its own connection");
        let direct = Direct::open(&dir.path().join("runs.db"), Duration::from_secs(1), 1 << 20).expect("direct");
        (dir, store, direct)
    }

    #[tokio::test]
    async fn models_written_and_read_back_through_the_writer_keep_every_value() {
        let (_dir, store, direct) = open().await;
        direct.begin().expect("begin");
        let tx = direct.db().begin().await.expect("sea-orm transaction");
        runs::Entity::insert(runs::ActiveModel::from(run("r1"))).exec_without_returning(&tx).await.expect("insert");
        let read = runs::Entity::find_by_id("r1".to_owned()).one(&tx).await.expect("read").expect("row");
        assert_eq!(read, run("r1"));
        // An UPDATE … RETURNING, as starting a run does.
        let started = runs::Entity::update_many()
            .col_expr(runs::Column::Status, sea_orm::sea_query::Expr::value(Status::Running))
            .col_expr(runs::Column::Queued, sea_orm::sea_query::Expr::value(false))
            .filter(runs::Column::RunId.eq("r1"))
            .exec_with_returning(&tx)
            .await
            .expect("update");
        assert_eq!(started.len(), 1);
        assert_eq!((started[0].status, started[0].queued, started[0].attempt), (Status::Running, false, 7));
        tx.commit().await.expect("sea-orm commit");
        direct.commit().expect("commit");
        // The pool (sqlx) sees what the writer committed, value for value.
        let pooled = runs::Entity::find_by_id("r1".to_owned()).one(store.db()).await.expect("read").expect("row");
        assert_eq!(pooled, started[0]);
    }

    #[tokio::test]
    async fn a_positional_read_fails_instead_of_reading_another_column() {
        let (_dir, _store, direct) = open().await;
        direct.begin().expect("begin");
        let tx = direct.db().begin().await.expect("sea-orm transaction");
        runs::Entity::insert(runs::ActiveModel::from(run("r5"))).exec_without_returning(&tx).await.expect("insert");
        // Two text columns: by position in key order this would swap them without a word.
        let tuple: Result<Option<(String, String)>, _> = runs::Entity::find_by_id("r5".to_owned())
            .select_only()
            .column(runs::Column::UserId)
            .column(runs::Column::ThreadId)
            .into_tuple()
            .one(&tx)
            .await;
        assert!(tuple.is_err(), "a positional read must fail, got {tuple:?}");
        drop(tx);
        direct.rollback();
    }

    #[tokio::test]
    async fn a_rolled_back_or_failed_transaction_leaves_nothing() {
        let (_dir, store, direct) = open().await;
        direct.begin().expect("begin");
        let tx = direct.db().begin().await.expect("sea-orm transaction");
        runs::Entity::insert(runs::ActiveModel::from(run("r2"))).exec_without_returning(&tx).await.expect("insert");
        drop(tx);
        direct.rollback();
        assert!(runs::Entity::find_by_id("r2".to_owned()).one(store.db()).await.expect("read").is_none());

        // A constraint error surfaces as an error, and the next transaction starts clean.
        direct.begin().expect("begin");
        let tx = direct.db().begin().await.expect("sea-orm transaction");
        runs::Entity::insert(runs::ActiveModel::from(run("r3"))).exec_without_returning(&tx).await.expect("insert");
        let again = runs::Entity::insert(runs::ActiveModel::from(run("r3"))).exec_without_returning(&tx).await;
        assert!(
            again.is_err_and(|e| crate::store::StoreError::Db(e).is_unique_violation()),
            "a duplicate key is an error the store knows as a unique violation"
        );
        drop(tx);
        // A transaction left open (the caller went away) is rolled back by the next begin.
        direct.begin().expect("begin after one left open");
        let tx = direct.db().begin().await.expect("sea-orm transaction");
        let mut model = runs::ActiveModel::from(run("r4"));
        model.thread_id = ActiveValue::Set("t4".to_owned());
        runs::Entity::insert(model).exec_without_returning(&tx).await.expect("insert");
        tx.commit().await.expect("sea-orm commit");
        direct.commit().expect("commit");
        let ids: Vec<String> = runs::Entity::find().all(store.db()).await.expect("read").into_iter().map(|r| r.run_id).collect();
        assert_eq!(ids, ["r4"]);
    }

    #[tokio::test]
    async fn a_nested_transaction_is_a_savepoint_of_the_stores() {
        let (_dir, store, direct) = open().await;
        direct.begin().expect("begin");
        let tx = direct.db().begin().await.expect("sea-orm transaction");
        runs::Entity::insert(runs::ActiveModel::from(run("kept"))).exec_without_returning(&tx).await.expect("insert");
        let nested = tx.begin().await.expect("savepoint");
        let mut model = runs::ActiveModel::from(run("undone"));
        model.thread_id = ActiveValue::Set("t2".to_owned());
        runs::Entity::insert(model).exec_without_returning(&nested).await.expect("insert in the savepoint");
        nested.rollback().await.expect("back to the savepoint");
        let released = tx.begin().await.expect("second savepoint");
        let mut model = runs::ActiveModel::from(run("released"));
        model.thread_id = ActiveValue::Set("t3".to_owned());
        runs::Entity::insert(model).exec_without_returning(&released).await.expect("insert in the savepoint");
        released.commit().await.expect("release");
        tx.commit().await.expect("sea-orm commit");
        direct.commit().expect("commit");
        let mut ids: Vec<String> = runs::Entity::find().all(store.db()).await.expect("read").into_iter().map(|r| r.run_id).collect();
        ids.sort();
        assert_eq!(ids, ["kept", "released"]);
    }

    #[tokio::test]
    async fn a_lock_held_by_another_connection_is_reported_as_busy() {
        let (dir, _store, direct) = open().await;
        let other = rusqlite::Connection::open(dir.path().join("runs.db")).expect("other connection");
        other.execute_batch("BEGIN IMMEDIATE").expect("lock");
        let quick = Direct::open(&dir.path().join("runs.db"), Duration::from_millis(20), 1 << 20).expect("direct");
        let error = quick.begin().expect_err("the file is locked");
        assert!(crate::store::StoreError::Db(error).is_busy(), "busy errors are retried by the store");
        other.execute_batch("ROLLBACK").expect("unlock");
        direct.begin().expect("begin once free");
        direct.rollback();
    }
}
