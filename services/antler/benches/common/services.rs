//! The services a benchmark measures, in the bench's own process: runs (lead agent), models and
//! sandbox on loopback, on SQLite under a temporary data dir or on a fresh PostgreSQL database
//! (`BENCH_DATABASE_URL`, an admin URL: the database is created for the run and dropped after it).

use std::sync::Arc;

use antler_kit::cli::ServiceContext;
use antler_kit::{Authenticator, Clients, Config, ServiceSet};
use anyhow::anyhow;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub struct Server {
    pub addr: std::net::SocketAddr,
    shutdown: CancellationToken,
    serving: tokio::task::JoinHandle<Result<(), antler_kit::server::ServeError>>,
    _updates: watch::Sender<Arc<Config>>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts the services of `bench` on `database_url` (empty: SQLite in the data dir), with
    /// `runs_extra` added to the `runs:` section (two-space indented lines) and `models` as the
    /// `models:` section.
    pub async fn start(bench: &str, database_url: &str, runs_extra: &str, models: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let yaml = format!(
            "server:\n  listen: 127.0.0.1:0\n  data_dir: {data:?}\n  shutdown_grace_secs: 5\n  reload_interval_ms: 0\n  concurrency_limit: 100000\n\
             runs:\n  agent: lead\n  drain_secs: 0\n  max_concurrent_runs: 1000\n  database:\n    url: {database_url:?}\n{runs_extra}\
             sandbox:\n  provider: local\n{models}",
            data = dir.path().display().to_string(),
        );
        let config = Config::parse(&yaml, bench, &|_| None)?;
        let auth = Authenticator::new(&config.server.auth)?;
        let listener = antler_kit::server::bind(&config.server, &auth).await?;
        let addr = listener.local_addr()?;
        let clients = Clients::from_config(&config.clients, addr)?;
        let shutdown = CancellationToken::new();
        let config = Arc::new(config);
        let (updates_tx, updates) = watch::channel(config.clone());
        let ctx = ServiceContext {
            config: config.clone(),
            config_updates: updates,
            clients,
            shutdown: shutdown.clone(),
            local_addr: addr,
            auth: auth.clone(),
        };
        let mut set = ServiceSet::new(&config.server);
        for service in [antler_runs::SERVICE, antler_models::SERVICE, antler_sandbox::SERVICE] {
            (service.register)(&mut set, &ctx).await.map_err(|e| anyhow!("{} failed to start: {e}", service.name))?;
        }
        let server_config = config.server.clone();
        let token = shutdown.clone();
        let serving = tokio::spawn(async move { antler_kit::server::serve(listener, set, &server_config, auth, token).await });
        Ok(Self { addr, shutdown, serving, _updates: updates_tx, _dir: dir })
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.serving.await?.map_err(|e| anyhow!("server: {e}"))
    }
}

/// The database for a run of `bench`: a fresh PostgreSQL database when `BENCH_DATABASE_URL` is set
/// (its URL, and what [`drop_database`] needs), else an empty URL (SQLite under the data dir).
pub async fn database(bench: &str) -> anyhow::Result<(String, Option<(String, String)>)> {
    let Ok(admin) = std::env::var("BENCH_DATABASE_URL") else { return Ok((String::new(), None)) };
    let name = format!("antler_bench_{bench}_{}", std::process::id());
    let db = sea_orm::Database::connect(&admin).await?;
    sea_orm::ConnectionTrait::execute_unprepared(&db, &format!("CREATE DATABASE {name}")).await?;
    let base = admin.rsplit_once('/').map(|(base, _)| base.to_owned()).unwrap_or(admin.clone());
    Ok((format!("{base}/{name}"), Some((admin, name))))
}

/// Drops the database [`database`] created, if it did.
pub async fn drop_database(created: Option<(String, String)>) -> anyhow::Result<()> {
    if let Some((admin, name)) = created {
        let db = sea_orm::Database::connect(&admin).await?;
        sea_orm::ConnectionTrait::execute_unprepared(&db, &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await?;
    }
    Ok(())
}

/// The value at quantile `p` of `sorted` (NaN when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
