//! What every server binary does between `main` and serving: flags, config, logging, auth, binding,
//! mounting the services, config reload, and graceful shutdown. `antler-<service>` binaries and
//! `antler up` / `antler serve` all go through [`run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::client::Clients;
use crate::config::{Config, ConfigError, reload};
use crate::server::{self, ServeError, ServiceSet};
use crate::tls::{ServerTls, TlsError};

/// Flags shared by every server binary.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ServeArgs {
    /// Path to antler.yaml. Without it the built-in defaults apply (loopback, no auth, ./antler-data).
    #[arg(long, env = "ANTLER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on, overriding server.listen (port 0 picks a free port).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Data directory, overriding server.data_dir.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Not a flag: a program's own override of server.log.filter (`antler up --demo` logs at WARN so
    /// the demo's output is not interleaved with INFO lines). `RUST_LOG` still wins.
    #[arg(skip)]
    pub log_filter: Option<String>,
}

impl ServeArgs {
    /// Loads the config file and applies the flag overrides.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut config = Config::load(self.config.as_deref())?;
        if let Some(listen) = self.listen {
            config.server.listen = listen;
        }
        if let Some(dir) = &self.data_dir {
            config.server.data_dir = dir.clone();
        }
        if let Some(filter) = &self.log_filter {
            config.server.log.filter = filter.clone();
        }
        Ok(config)
    }
}

/// What a service gets when it is mounted.
#[derive(Debug, Clone)]
pub struct ServiceContext {
    /// The configuration at start-up.
    pub config: Arc<Config>,
    /// Always the newest valid configuration (see [`crate::config::reload`]).
    pub config_updates: watch::Receiver<Arc<Config>>,
    /// Channels to the other services.
    pub clients: Clients,
    /// Cancelled when shutdown starts; long-running work and streams should wind down.
    pub shutdown: CancellationToken,
    /// The address this process actually listens on.
    pub local_addr: SocketAddr,
    /// The server's authenticator (reloaded with the config), for a service that serves another
    /// protocol beside gRPC and must authenticate its callers exactly as the gRPC stack does.
    pub auth: Authenticator,
}

/// A boxed error from a service's own set-up.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a service's `register` returns: set-up may be asynchronous (opening a database, running
/// migrations) and finishes before the server reports SERVING.
pub type RegisterFuture<'a> = futures::future::BoxFuture<'a, Result<(), BoxError>>;

/// How a service crate plugs into a server binary.
#[derive(Clone, Copy)]
pub struct Registration {
    /// The config section and short name (`runs`, `sandbox`, …).
    pub name: &'static str,
    /// Checks the service's config section; used at start-up, by `antler config check` and before a
    /// reloaded file is accepted.
    pub validate: fn(&Config) -> Result<(), ConfigError>,
    /// Sets the service up and mounts its gRPC servers.
    pub register: for<'a> fn(&'a mut ServiceSet, &'a ServiceContext) -> RegisterFuture<'a>,
    /// The metric families the service records (its own catalogue and those of libraries it hosts),
    /// described and registered at zero beside the kit's when the binary serves `/metrics`.
    pub metrics: &'static [crate::metrics_catalog::Catalogue],
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Failures before or while serving.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("cannot create data directory {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("the {service} service failed to start: {message}")]
    Service { service: &'static str, message: String },
    #[error(transparent)]
    Metrics(#[from] crate::prometheus::MetricsError),
    #[error(transparent)]
    Export(#[from] crate::otel::ExportError),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Validates the whole configuration, including each service's own section.
pub fn validate(config: &Config, services: &[Registration]) -> Result<(), ConfigError> {
    crate::Authenticator::new(&config.server.auth)?;
    services.iter().try_for_each(|s| (s.validate)(config)).map_err(|e| config.explain(e))
}

/// Logs what a DeerFlow `config.yaml` became, once, at start-up: a summary line, then one line per
/// section (`applied: title → runs.lead.title`, `accepted, not applied: channels (…)`).
fn log_deerflow_mapping(config: &Config) {
    let Some(translation) = &config.deerflow else { return };
    let file = config.path.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
    tracing::info!(file = %file, "{}", translation.summary());
    for line in &translation.lines {
        tracing::info!(deerflow_section = %line.section, "{line}");
    }
}

/// Runs a server with `services` until SIGTERM/SIGINT. `program` names the binary in the ready line,
/// which is printed on stdout as `<program> listening on <addr>` once the port accepts connections.
pub async fn run(program: &str, args: &ServeArgs, services: &[Registration]) -> Result<(), RunError> {
    let config = args.load()?;
    let reload = std::time::Duration::from_millis(config.server.tls.reload_interval_ms);
    let telemetry = crate::telemetry::init_with_export(&config.server.log, &config.server.tracing, program, reload)?;
    if telemetry.exporting() {
        tracing::info!(endpoint = %config.server.tracing.otlp_endpoint, protocol = ?config.server.tracing.otlp_protocol, "exporting spans over OTLP");
    }
    log_deerflow_mapping(&config);
    validate(&config, services)?;
    std::fs::create_dir_all(&config.server.data_dir)
        .map_err(|source| RunError::DataDir { path: config.server.data_dir.clone(), source })?;

    let auth = Authenticator::new(&config.server.auth)?;
    let shutdown = crate::shutdown::on_signal();
    // Before binding: a bad certificate path fails start-up without ever opening the port.
    let tls_reload = Duration::from_millis(config.server.tls.reload_interval_ms);
    let tls = ServerTls::load(&config.server.tls, tls_reload, Some(&shutdown))?;
    let listener = server::bind(&config.server, &auth).await?;
    let local_addr = listener.local_addr().map_err(|source| ServeError::Bind { addr: config.server.listen, source })?;
    let clients = Clients::for_server(&config, local_addr, tls.as_ref(), &shutdown)?;
    // Before the services are mounted, so what they record while starting is kept.
    let catalogues: Vec<crate::metrics_catalog::Catalogue> =
        std::iter::once(crate::metrics_catalog::KIT).chain(services.iter().flat_map(|s| s.metrics.iter().copied())).collect();
    let metrics = crate::prometheus::start(&config.server.metrics, &catalogues, shutdown.clone()).await?;

    let config = Arc::new(config);
    let owned: Vec<Registration> = services.to_vec();
    let validator: reload::Validator = Arc::new(move |c: &Config| validate(c, &owned).map_err(|e| e.to_string()));
    let updates = reload::spawn(config.clone(), Duration::from_millis(config.server.reload_interval_ms), validator, shutdown.clone());
    tokio::spawn(apply_reloads(updates.clone(), auth.clone(), shutdown.clone()));

    let ctx = ServiceContext {
        config: config.clone(),
        config_updates: updates,
        clients,
        shutdown: shutdown.clone(),
        local_addr,
        auth: auth.clone(),
    };
    let mut set = ServiceSet::new(&config.server);
    for service in services {
        (service.register)(&mut set, &ctx).await.map_err(|e| RunError::Service { service: service.name, message: e.to_string() })?;
    }
    // The services of this process call each other through its server stack in memory.
    set.serve_locally(ctx.clients.local_server());

    println!("{program} listening on {local_addr}");
    println!("  services: {}", set.names().join(", "));
    match &tls {
        None => println!("  try:      grpcurl -plaintext {local_addr} list"),
        Some(tls) if tls.mutual() => {
            println!("  try:      grpcurl -cacert <CA of server.tls.cert> -cert <client.pem> -key <client-key.pem> {local_addr} list")
        }
        Some(_) => println!("  try:      grpcurl -cacert <CA of server.tls.cert> {local_addr} list"),
    }
    if let Some(endpoint) = &metrics {
        println!("  metrics:  http://{}/metrics", endpoint.local_addr);
    }
    let served = server::serve_with_tls(listener, set, &config.server, auth, tls, shutdown).await;
    telemetry.shutdown().await;
    served?;
    Ok(())
}

/// The whole `main` of a single-service binary: flags, then [`run`], then the exit code.
///
/// ```ignore
/// antler_kit::service_main!("antler-runs", "threads and runs", antler_runs::SERVICE);
/// ```
#[macro_export]
macro_rules! service_main {
    ($program:literal, $about:literal, $service:expr) => {
        #[doc = concat!("Serve the Antler ", $about, ".")]
        #[derive(clap::Parser, Debug)]
        #[command(name = $program, version, about = concat!("Serve the Antler ", $about, "."))]
        struct Args {
            #[command(flatten)]
            serve: $crate::cli::ServeArgs,
        }

        #[tokio::main]
        async fn main() -> std::process::ExitCode {
            let args = <Args as clap::Parser>::parse();
            $crate::cli::exit_code($crate::cli::run($program, &args.serve, &[$service]).await)
        }
    };
}

/// Turns the outcome of [`run`] into the process exit code, printing a failure as `error: …` with its
/// hint (and no backtrace: these are an operator's errors, not the program's).
pub fn exit_code<E: std::fmt::Display>(result: Result<(), E>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Applies what can change without a restart (API keys and JWT settings) and says what cannot.
async fn apply_reloads(mut updates: watch::Receiver<Arc<Config>>, auth: Authenticator, shutdown: CancellationToken) {
    let mut previous = updates.borrow_and_update().clone();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = updates.changed() => if changed.is_err() { return },
        }
        let current = updates.borrow_and_update().clone();
        if let Err(error) = auth.reload(&current.server.auth) {
            tracing::warn!(%error, "new auth settings not applied");
        }
        let (old, new) = (&previous.server, &current.server);
        if old.listen != new.listen
            || old.data_dir != new.data_dir
            || old.max_message_bytes != new.max_message_bytes
            || old.concurrency_limit != new.concurrency_limit
            || old.internal_concurrency_limit != new.internal_concurrency_limit
            || old.metrics.listen != new.metrics.listen
            || old.metrics.buckets != new.metrics.buckets
            || old.metrics.buckets_by_metric != new.metrics.buckets_by_metric
            || old.tracing.otlp_endpoint != new.tracing.otlp_endpoint
            || old.tls != new.tls
            || previous.clients.iter().zip(current.clients.iter()).any(|((_, a), (_, b))| a.tls != b.tls || a.endpoint != b.endpoint)
        {
            tracing::warn!(
                "server.listen, data_dir, max_message_bytes, the concurrency limits, server.metrics, server.tracing, server.tls and clients.*.endpoint/tls take effect after a restart (the contents of the certificate files reload by themselves)"
            );
        }
        previous = current;
    }
}
