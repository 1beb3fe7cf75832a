//! The services a benchmark measures, in the bench's own process: runs (lead agent), models and
//! sandbox on loopback, on SQLite under a temporary data dir or on a fresh PostgreSQL database
//! (`BENCH_DATABASE_URL`, an admin URL: the database is created for the run and dropped after it).

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::inproc::InProcess;

/// The services, served in this process until [`Server::stop`].
pub struct Server {
    pub addr: std::net::SocketAddr,
    services: InProcess,
}

impl Server {
    /// Starts the services of `bench` on `database_url` (empty: SQLite in the data dir), with
    /// `runs_extra` added to the `runs:` section (two-space indented lines) and `models` as the
    /// `models:` section.
    pub async fn start(bench: &str, database_url: &str, runs_extra: &str, models: &str) -> anyhow::Result<Self> {
        let yaml = |dir: &std::path::Path| {
            format!(
                "server:\n  listen: 127.0.0.1:0\n  data_dir: {data:?}\n  shutdown_grace_secs: 5\n  reload_interval_ms: 0\n  concurrency_limit: 100000\n\
                 runs:\n  agent: lead\n  drain_secs: 0\n  max_concurrent_runs: 1000\n  database:\n    url: {database_url:?}\n{runs_extra}\
                 sandbox:\n  provider: local\n{models}",
                data = dir.display().to_string(),
            )
        };
        let services = InProcess::start(bench, yaml, &[antler_runs::SERVICE, antler_models::SERVICE, antler_sandbox::SERVICE]).await?;
        Ok(Self { addr: services.addr, services })
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.services.stop().await
    }
}

/// The database of one bench run: with `BENCH_DATABASE_URL` (an admin URL) a fresh PostgreSQL database on
/// that server, the harness's [`TestDb`], dropped with it; without, none: the services keep SQLite under
/// their data dir.
pub async fn database() -> anyhow::Result<Option<TestDb>> {
    match std::env::var("BENCH_DATABASE_URL") {
        Ok(admin) => Ok(Some(TestDb::new_on(Backend::Postgres, &admin).await?)),
        Err(_) => Ok(None),
    }
}

/// The `runs.database.url` for `db` (empty: SQLite under the data dir).
pub fn url(db: &Option<TestDb>) -> String {
    db.as_ref().map(|db| db.url.clone()).unwrap_or_default()
}

/// The value at quantile `p` of `sorted` (NaN when empty), by the harness's one percentile.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    antler_integration_tests::percentile::percentile(sorted, p).unwrap_or(f64::NAN)
}
