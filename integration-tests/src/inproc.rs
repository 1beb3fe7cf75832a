//! Services mounted in the calling process, as `antler_kit::cli::run` mounts them: each
//! [`Registration`] on a kit `ServiceSet`, served by `antler_kit::server::serve` with the kit's trace,
//! auth, concurrency and size layers, on 127.0.0.1. For benchmarks that measure a service without a
//! process boundary between it and the bench (the runs bench, the antler crate's agent_step,
//! subagent_spawn and run_throughput); tests start the real binaries through [`crate::start`].

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use antler_kit::cli::{Registration, ServiceContext};
use antler_kit::{Authenticator, Clients, Config, ServiceSet};
use anyhow::{Result, anyhow, bail};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long [`InProcess::stop`] waits for the server to end.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Services served by this process until [`InProcess::stop`].
pub struct InProcess {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    serving: tokio::task::JoinHandle<Result<(), antler_kit::server::ServeError>>,
    // Held so that the services' config watch stays open (a closed one reads as "no more reloads").
    _updates: watch::Sender<Arc<Config>>,
    // The data dir, deleted when this goes away.
    _dir: tempfile::TempDir,
}

impl InProcess {
    /// Parses `yaml(data_dir)` as the config of program `name` (a fresh temporary folder is the data
    /// dir; the yaml should listen on `127.0.0.1:0`) and mounts `services` on it, in order.
    pub async fn start(name: &str, yaml: impl FnOnce(&Path) -> String, services: &[Registration]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = Config::parse(&yaml(dir.path()), name, &|_| None)?;
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
        for service in services {
            (service.register)(&mut set, &ctx).await.map_err(|e| anyhow!("{} service failed to start: {e}", service.name))?;
        }
        let server_config = config.server.clone();
        let token = shutdown.clone();
        let serving = tokio::spawn(async move { antler_kit::server::serve(listener, set, &server_config, auth, token).await });
        Ok(Self { addr, shutdown, serving, _updates: updates_tx, _dir: dir })
    }

    /// Shuts the services down and waits (at most 20 s) for the server to end.
    pub async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        match tokio::time::timeout(STOP_TIMEOUT, self.serving).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => bail!("server ended with {e}"),
            Ok(Err(e)) => bail!("server task failed: {e}"),
            Err(_) => bail!("server did not stop within {STOP_TIMEOUT:?}"),
        }
    }
}
