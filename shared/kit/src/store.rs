//! What the services with a database (runs, memory) share about it: the error type and what a retry
//! can fix (`is_transient`, `is_busy`, `is_unique_violation`), SQLite busy retry, migrations that
//! replicas starting together race to run, and stored time. Behind the `store` feature, so that the
//! crates without a database do not build sea-orm.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sea_orm::{DatabaseConnection, DbErr, SqlErr};
use sea_orm_migration::MigratorTrait;

use crate::backoff::Backoff;

/// Database failures, classified for the callers that care.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Db(#[from] DbErr),
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// A unique index said no (an idempotency key, a one-of rule).
    pub fn is_unique_violation(&self) -> bool {
        let StoreError::Db(e) = self else { return false };
        // sea-orm classifies the errors of its sqlx drivers; an error of a connection it does not
        // drive (the runs writer's own SQLite connection) is known by SQLite's message.
        matches!(e.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) || e.to_string().contains("UNIQUE constraint failed")
    }

    /// Worth retrying: the database could not be reached or was busy, or gave up a transaction that
    /// a retry can win. Everything else (a corrupt value, a schema that is not ours, a constraint we
    /// broke) is a bug or damage a retry cannot fix.
    pub fn is_transient(&self) -> bool {
        let StoreError::Db(e) = self else { return false };
        if self.is_busy() {
            return true;
        }
        match e {
            DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => true,
            DbErr::Exec(sea_orm::RuntimeErr::SqlxError(e)) | DbErr::Query(sea_orm::RuntimeErr::SqlxError(e)) => sqlx_transient(e),
            _ => false,
        }
    }
}

fn sqlx_transient(e: &sea_orm::sqlx::Error) -> bool {
    use sea_orm::sqlx::Error as E;
    match e {
        E::Io(_) | E::Tls(_) | E::Protocol(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed | E::BeginFailed => true,
        E::Database(db) => db.code().is_some_and(|code| transient_code(&code)),
        _ => false,
    }
}

/// PostgreSQL SQLSTATEs a retry can get past — class 08 (connection exception), 40001 (serialization
/// failure), 40P01 (deadlock), class 53 (insufficient resources), 55P03 (lock not available),
/// 57P01–57P03 (shutting down, cannot connect now) — and SQLite's BUSY (5) and LOCKED (6) with their
/// extended codes (`code & 0xff`).
fn transient_code(code: &str) -> bool {
    // SQLSTATEs are always five characters (some all digits); SQLite's codes are plain numbers.
    if code.len() != 5
        && let Ok(sqlite) = code.parse::<u32>()
    {
        return matches!(sqlite & 0xff, 5 | 6);
    }
    code.starts_with("08") || code.starts_with("53") || matches!(code, "40001" | "40P01" | "55P03" | "57P01" | "57P02" | "57P03")
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

/// SQLite busy across processes: 5 attempts in all, 50 ms doubling to 1 s between them.
const BUSY_RETRY: Backoff = Backoff::doubling(Duration::from_millis(50), Duration::from_secs(1)).with_retries(4);

/// Runs `op` again when SQLite reports a lock held by another process (see [`BUSY_RETRY`]).
pub async fn retry_busy<T, E, F, Fut>(op: F) -> Result<T, E>
where
    E: Busy + std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    BUSY_RETRY
        .retry(op, |e, attempt, delay| {
            e.is_busy().then(|| {
                tracing::warn!(attempt, error = %e, "database busy; retrying");
                delay
            })
        })
        .await
}

/// Migrations racing between replicas starting together: the loser sees the winner's tables on a
/// retry (5 retries, 200 ms more each time).
const MIGRATION_RETRY: Backoff = Backoff::linear(Duration::from_millis(200)).with_retries(5);

/// Applies `M`'s pending migrations to `db`, retrying as [`MIGRATION_RETRY`] says; `what` names them in
/// the log ("migration", "memory migration").
pub async fn migrate<M: MigratorTrait>(db: &DatabaseConnection, what: &str) -> Result<(), DbErr> {
    MIGRATION_RETRY
        .retry(
            || M::up(db, None),
            |error, attempt, delay| {
                tracing::warn!(%error, attempt, "{what} failed; retrying (another replica may be migrating)");
                Some(delay)
            },
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unique_violation_is_known_also_by_sqlites_message() {
        let direct = DbErr::Exec(sea_orm::RuntimeErr::Internal("SQLite (runs writer): UNIQUE constraint failed: runs.run_id".to_owned()));
        assert!(StoreError::Db(direct).is_unique_violation());
        assert!(!StoreError::Db(DbErr::Custom("FOREIGN KEY constraint failed".to_owned())).is_unique_violation());
    }

    #[test]
    fn only_errors_a_retry_can_fix_are_transient() {
        assert!(StoreError::Db(DbErr::ConnectionAcquire(sea_orm::ConnAcquireErr::Timeout)).is_transient());
        assert!(!StoreError::Db(DbErr::Custom("no such table: runs".to_owned())).is_transient());
        assert!(!StoreError::Corrupt("bad protobuf".to_owned()).is_transient());
        assert!(StoreError::Db(DbErr::Custom("database is locked".to_owned())).is_transient());
        for code in ["08006", "40001", "40P01", "53300", "57P01", "5", "517", "6"] {
            assert!(transient_code(code), "{code}");
        }
        for code in ["42P01", "23505", "22P02", "XX000", "1", "11"] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
