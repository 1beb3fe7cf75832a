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
    _dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb").field("url", &self.url).finish_non_exhaustive()
    }
}

impl TestDb {
    pub async fn new(backend: Backend) -> Result<Self> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()?;
                let path: PathBuf = dir.path().join("runs.db");
                Ok(Self { backend, url: format!("sqlite://{}?mode=rwc", path.display()), pg_name: None, _dir: Some(dir) })
            }
            Backend::Postgres => {
                let name = format!("antler_test_{}", uuid::Uuid::new_v4().simple());
                let admin = Database::connect(admin_url()).await.with_context(|| format!("connecting to PostgreSQL at {}", admin_url()))?;
                admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await?;
                admin.close().await?;
                let base = admin_url();
                let url = match base.rfind('/') {
                    Some(i) => format!("{}/{name}", &base[..i]),
                    None => anyhow::bail!("ANTLER_TEST_PG_URL has no database part"),
                };
                Ok(Self { backend, url, pg_name: Some(name), _dir: None })
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
        // Drop runs outside any runtime the test may be using.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async {
                if let Ok(admin) = Database::connect(admin_url()).await {
                    let _ = admin.execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
                    let _ = admin.close().await;
                }
            });
        })
        .join();
    }
}
