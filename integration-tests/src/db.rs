//! Databases for tests: a SQLite file in a temporary folder, or a fresh PostgreSQL database on the
//! machine's server (127.0.0.1:5432, trust auth) created for one test and dropped afterwards.
//!
//! `ANTLER_TEST_PG_URL` names the server's admin database (default
//! `postgres://postgres@127.0.0.1:5432/postgres`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};

/// Which backend a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Both backends, for tests that must hold on each.
pub const BACKENDS: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];

fn admin_url() -> String {
    std::env::var("ANTLER_TEST_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// One test's database; dropped (PostgreSQL) or deleted (SQLite) when this goes out of scope.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    pg_name: Option<String>,
    /// Where the PostgreSQL database was created (and is dropped from).
    admin_url: String,
    _dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb").field("url", &self.url).finish_non_exhaustive()
    }
}

impl TestDb {
    pub async fn new(backend: Backend) -> Result<Self> {
        Self::new_on(backend, &admin_url()).await
    }

    /// As [`TestDb::new`], with PostgreSQL databases created on the server of `admin_url` (an admin
    /// database's URL) instead of `ANTLER_TEST_PG_URL`'s; benches name their own.
    pub async fn new_on(backend: Backend, admin_url: &str) -> Result<Self> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()?;
                let path: PathBuf = dir.path().join("runs.db");
                Ok(Self {
                    backend,
                    url: format!("sqlite://{}?mode=rwc", path.display()),
                    pg_name: None,
                    admin_url: String::new(),
                    _dir: Some(dir),
                })
            }
            Backend::Postgres => {
                let name = format!("antler_test_{}", uuid::Uuid::new_v4().simple());
                let admin = Database::connect(admin_url).await.with_context(|| format!("connecting to PostgreSQL at {admin_url}"))?;
                admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await?;
                admin.close().await?;
                let url = match admin_url.rfind('/') {
                    Some(i) => format!("{}/{name}", &admin_url[..i]),
                    None => anyhow::bail!("{admin_url} has no database part"),
                };
                Ok(Self { backend, url, pg_name: Some(name), admin_url: admin_url.to_owned(), _dir: None })
            }
        }
    }

    /// A direct connection, for tests that inspect or tamper with rows.
    pub async fn connect(&self) -> Result<DatabaseConnection> {
        Ok(Database::connect(self.url.clone()).await?)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(name) = self.pg_name.take() else { return };
        let admin_url = std::mem::take(&mut self.admin_url);
        // Drop runs outside any runtime the test may be using.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async {
                if let Ok(admin) = Database::connect(admin_url).await {
                    let _ = admin.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
                    let _ = admin.close().await;
                }
            });
        })
        .join();
    }
}
