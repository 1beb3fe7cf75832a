//! `antler.yaml`: one file, a section per service plus `server` and `clients`.
//!
//! Loading is strict on purpose: an unknown key is an error naming the key and its YAML path (a typo
//! must not silently fall back to a default), a missing environment variable is an error naming the
//! path that referenced it, and every number is checked against its documented range.

pub mod deerflow;
mod env;
pub mod error;
pub mod reload;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_yaml_ng::{Mapping, Value};
use sha2::Digest;

pub use error::{ConfigError, SECTIONS, check_range};

use crate::auth::AuthConfig;
use crate::tls::{ClientTlsConfig, Fields, ServerTlsConfig};

/// The `server` section: how this process listens and protects itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on. Port 0 picks a free port (printed at start-up).
    pub listen: SocketAddr,
    /// Where services keep their files (SQLite database, workspaces).
    pub data_dir: PathBuf,
    /// Allow a non-loopback listen address without authentication. Off by default.
    pub allow_insecure: bool,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Client requests handled at once by this process; further requests get UNAVAILABLE with
    /// `retry-after`. Calls between Antler services (see `internal_concurrency_limit`) do not count.
    pub concurrency_limit: usize,
    /// Requests from other Antler services handled at once: calls from this very process (`antler
    /// up`), and calls authenticated as a service principal from another pod. Separate from the
    /// client limit, so the services' own work (a run waiting on its model stream) never takes the
    /// room client calls such as CancelRun need.
    pub internal_concurrency_limit: usize,
    /// Upper bound on a unary request's handling time in seconds (0 = only the client's deadline).
    pub request_timeout_secs: u64,
    /// The deadline of a client call that carries none (no `grpc-timeout`), in seconds: past it the
    /// call answers DEADLINE_EXCEEDED naming this setting (0 = none). Bounds the time to the
    /// response head, so streams, once started, are not cut; calls between the services and the
    /// methods a service declares as waits (WaitRun) are exempt. See `deadline.rs`.
    pub default_deadline_secs: u64,
    /// How long a SIGTERM waits for open requests and streams before the process exits anyway.
    pub shutdown_grace_secs: u64,
    /// How often the config file is checked for changes, in milliseconds (0 = never).
    pub reload_interval_ms: u64,
    /// Authentication of callers.
    pub auth: AuthConfig,
    /// Log output.
    pub log: LogConfig,
    /// The Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// Export of the `tracing` spans (OTLP).
    pub tracing: TracingConfig,
    /// TLS for this server's listener (off when `cert` is empty).
    pub tls: ServerTlsConfig,
    /// `host:port` of a second, plaintext listener that serves only `grpc.health.v1.Health` (the
    /// same statuses as the main listener, NOT_SERVING while draining); empty (the default): none.
    /// For health checkers that cannot speak TLS, such as Kubernetes' gRPC probes, when `tls` is on.
    /// It needs no token and answers nothing but SERVING / NOT_SERVING per service name.
    pub health_listen: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            data_dir: PathBuf::from("antler-data"),
            allow_insecure: false,
            max_message_bytes: 16 * 1024 * 1024,
            concurrency_limit: 1024,
            internal_concurrency_limit: 16384,
            request_timeout_secs: 0,
            default_deadline_secs: 300,
            shutdown_grace_secs: 30,
            reload_interval_ms: 2000,
            auth: AuthConfig::default(),
            log: LogConfig::default(),
            metrics: MetricsConfig::default(),
            tracing: TracingConfig::default(),
            tls: ServerTlsConfig::default(),
            health_listen: String::new(),
        }
    }
}

impl ServerConfig {
    /// The health-only listener's address, or None when there is none.
    pub fn health_listen_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.health_listen.trim().is_empty() {
            return Ok(None);
        }
        self.health_listen.trim().parse().map(Some).map_err(|_| ConfigError::Invalid {
            path: "server.health_listen".to_owned(),
            message: format!("`{}` is not a host:port address such as 0.0.0.0:8081 (empty: no health-only listener)", self.health_listen),
        })
    }
}

/// Log format and filter.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (human) or `json` (one object per line).
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `info,antler_runs=debug`; `RUST_LOG` overrides it. The
    /// default keeps the database driver's per-statement notices out.
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Text, filter: "info,sqlx=warn".to_owned() }
    }
}

/// The Prometheus endpoint: `GET /metrics` in the text exposition format, served on its own port so
/// it needs no gRPC client and no token (bind it where only the scraper can reach it).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` of the endpoint; empty (the default): no endpoint and nothing recorded. Port 0 picks
    /// a free port, printed at start-up as `metrics on http://…/metrics`.
    pub listen: String,
    /// Upper bounds of every histogram's buckets, in the metric's unit (seconds for `*_seconds`),
    /// strictly increasing, at most [`MAX_BUCKETS`].
    pub buckets: Vec<f64>,
    /// Buckets of particular histograms by full metric name, replacing `buckets` for that metric
    /// (built in: `antler_admission_batch_size`, whose unit is runs).
    pub buckets_by_metric: std::collections::BTreeMap<String, Vec<f64>>,
}

/// Most bucket bounds one histogram may have: each bound is one series per label set.
pub const MAX_BUCKETS: usize = 64;

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: String::new(),
            buckets: vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
            buckets_by_metric: Default::default(),
        }
    }
}

impl MetricsConfig {
    /// The endpoint's address, or None when metrics are off.
    pub fn listen_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.listen.trim().is_empty() {
            return Ok(None);
        }
        self.listen.trim().parse().map(Some).map_err(|_| ConfigError::Invalid {
            path: "server.metrics.listen".to_owned(),
            message: format!("`{}` is not a host:port address such as 127.0.0.1:9464 (empty turns metrics off)", self.listen),
        })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        check_buckets("server.metrics.buckets", &self.buckets)?;
        self.buckets_by_metric.iter().try_for_each(|(name, b)| check_buckets(&format!("server.metrics.buckets_by_metric.{name}"), b))
    }
}

fn check_buckets(path: &str, buckets: &[f64]) -> Result<(), ConfigError> {
    let invalid = |message: String| Err(ConfigError::Invalid { path: path.to_owned(), message });
    if buckets.is_empty() || buckets.len() > MAX_BUCKETS {
        return invalid(format!("{} bucket bounds given; between 1 and {MAX_BUCKETS} are allowed", buckets.len()));
    }
    if buckets.iter().any(|b| !b.is_finite()) || buckets.windows(2).any(|w| w[0] >= w[1]) {
        return invalid(format!("{buckets:?}: bounds must be finite and strictly increasing"));
    }
    Ok(())
}

/// OTLP export of the `tracing` spans: each RPC's `rpc` span and each run's `run` span (with their
/// children), in the trace the W3C `traceparent` metadata carries between the services.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// Collector endpoint; empty (the default): no export. `grpc`: `http://collector:4317`; `http`:
    /// `http://collector:4318/v1/traces`.
    pub otlp_endpoint: String,
    /// `grpc` (OTLP over gRPC) or `http` (OTLP protobuf over HTTP).
    pub otlp_protocol: OtlpProtocol,
    /// The `service.name` resource attribute; empty: the binary's name (`antler`, `antler-runs`, …).
    pub service_name: String,
    /// Which spans are exported, as a `tracing` filter (independent of `server.log.filter`).
    pub filter: String,
    /// Fraction of new traces exported, 0.0..=1.0. A request that arrives with a `traceparent`
    /// follows its caller's sampling decision.
    pub sample_ratio: f64,
    /// Longest wait between two exports of finished spans, in milliseconds.
    pub batch_delay_ms: u64,
    /// Finished spans held for export; beyond it new spans are dropped (and a warning logged).
    pub max_queue_size: usize,
    /// Deadline of one export call, in milliseconds.
    pub export_timeout_ms: u64,
    /// TLS to an `https://` collector (`server.tracing.tls.ca`, `cert`, `key`, `server_name`), as for
    /// `clients.<service>.tls`: an empty `ca` trusts the operating system's roots; `cert`/`key` are
    /// presented to a collector that asks for a client certificate. Over gRPC the files are re-read
    /// when they change (every `server.tls.reload_interval_ms`); over HTTP they are read at start.
    pub tls: crate::tls::ClientTlsConfig,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            otlp_protocol: OtlpProtocol::Grpc,
            service_name: String::new(),
            filter: "info,sqlx=warn".to_owned(),
            sample_ratio: 1.0,
            batch_delay_ms: 5_000,
            max_queue_size: 2_048,
            export_timeout_ms: 10_000,
            tls: crate::tls::ClientTlsConfig::default(),
        }
    }
}

impl TracingConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let endpoint = self.otlp_endpoint.trim();
        if !endpoint.is_empty() && !["http://", "https://"].iter().any(|s| endpoint.starts_with(s)) {
            return Err(ConfigError::Invalid {
                path: "server.tracing.otlp_endpoint".to_owned(),
                message: format!("`{endpoint}` must start with http:// or https:// (empty turns export off)"),
            });
        }
        self.tls.validate(&crate::tls::Fields::Yaml("server.tracing.tls".to_owned()))?;
        if !self.tls.is_empty() && !endpoint.starts_with("https://") {
            return Err(ConfigError::Invalid {
                path: "server.tracing.tls".to_owned(),
                message: format!(
                    "is set but server.tracing.otlp_endpoint `{endpoint}` is not https://\nhint: name the collector as https://host:port, or remove server.tracing.tls"
                ),
            });
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(ConfigError::OutOfRange {
                path: "server.tracing.sample_ratio".to_owned(),
                value: self.sample_ratio.to_string(),
                limit: "must be between 0.0 and 1.0".to_owned(),
            });
        }
        check_range("server.tracing.batch_delay_ms", self.batch_delay_ms, 1, 600_000)?;
        check_range("server.tracing.max_queue_size", self.max_queue_size as u64, 1, 1_000_000)?;
        check_range("server.tracing.export_timeout_ms", self.export_timeout_ms, 1, 600_000)?;
        Ok(())
    }
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OtlpProtocol {
    Grpc,
    Http,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// The `clients` section: how this process reaches the other services.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientsConfig {
    pub runs: ClientConfig,
    pub sandbox: ClientConfig,
    pub mcp: ClientConfig,
    pub models: ClientConfig,
    pub memory: ClientConfig,
}

/// One outbound channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// `http://host:port` (or `https://`). Empty: this process's own listen address, which is right for
    /// `antler up` where every service shares one server.
    pub endpoint: String,
    /// Time to establish a connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Deadline of each unary call, in milliseconds.
    pub timeout_ms: u64,
    /// Further attempts after an UNAVAILABLE answer (0 = none).
    pub retries: u32,
    /// First backoff between attempts, in milliseconds; doubles each time, with jitter.
    pub backoff_base_ms: u64,
    /// Largest backoff between attempts, in milliseconds.
    pub backoff_max_ms: u64,
    /// Bearer token this service presents when it acts on its own (no caller credential to forward),
    /// for example a background worker. It must map to a service principal on the callee.
    pub service_token: String,
    /// TLS settings of this channel (see [`crate::tls`]): used for an `https://` endpoint, and for an
    /// empty one when `server.tls` is on.
    pub tls: ClientTlsConfig,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            connect_timeout_ms: 2_000,
            timeout_ms: 30_000,
            retries: 3,
            backoff_base_ms: 100,
            backoff_max_ms: 2_000,
            service_token: String::new(),
            tls: ClientTlsConfig::default(),
        }
    }
}

/// A loaded, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (None: built-in defaults).
    pub path: Option<PathBuf>,
    pub server: ServerConfig,
    pub clients: ClientsConfig,
    /// Service sections after variable substitution, parsed by each service with [`Config::section`].
    sections: Mapping,
    /// SHA-256 of the file's bytes as loaded, so a reload can tell a real change from a touch.
    pub(crate) source_sha256: Option<[u8; 32]>,
    /// Set when the file was DeerFlow's `config.yaml`: what each of its sections became.
    pub deerflow: Option<Arc<deerflow::Translation>>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            path: None,
            server: ServerConfig::default(),
            clients: ClientsConfig::default(),
            sections: Mapping::new(),
            source_sha256: None,
            deerflow: None,
        }
    }
}

impl Config {
    /// Loads `path`, or the defaults when `path` is None. Variables come from the process environment.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let Some(path) = path else { return Ok(Self::default()) };
        let bytes = std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let text = String::from_utf8(bytes)
            .map_err(|_| ConfigError::Parse { origin: path.display().to_string(), message: "the file is not UTF-8".to_owned() })?;
        let base_dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        let mut config = Self::parse_at(&text, &path.display().to_string(), base_dir, &|name| std::env::var(name).ok())?;
        config.path = Some(path.to_owned());
        config.source_sha256 = Some(sha2::Sha256::digest(text.as_bytes()).into());
        Ok(config)
    }

    /// Parses YAML text. `origin` names the text in errors; `lookup` resolves `$VAR` references.
    pub fn parse(text: &str, origin: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::parse_at(text, origin, None, lookup)
    }

    /// [`Config::parse`] for a file in `base_dir`, against which a DeerFlow file's relative paths are
    /// taken (`skills.path`, `database.sqlite_dir`).
    pub fn parse_at(
        text: &str,
        origin: &str,
        base_dir: Option<&Path>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let root: Value =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse { origin: origin.to_owned(), message: e.to_string() })?;
        let root = match root {
            Value::Null => Mapping::new(),
            Value::Mapping(root) => root,
            _ => {
                return Err(ConfigError::Invalid {
                    path: "(root)".to_owned(),
                    message: "the file must be a mapping of sections".to_owned(),
                });
            }
        };
        // A DeerFlow file resolves the variables of what it applies only (see `deerflow`).
        let (mut root, translation) = if deerflow::is_deerflow(&root) {
            let (root, translation) = deerflow::translate(root, base_dir, lookup)?;
            (root, Some(Arc::new(translation)))
        } else {
            let mut root = Value::Mapping(root);
            env::substitute(&mut root, "", lookup)?;
            let Value::Mapping(root) = root else {
                return Err(ConfigError::Invalid { path: "(root)".to_owned(), message: "not a mapping".to_owned() });
            };
            (root, None)
        };
        for key in root.keys() {
            let name = env::key_name(key);
            if !SECTIONS.contains(&name.as_str()) {
                return Err(ConfigError::UnknownSection { section: name });
            }
        }
        let explain = |e: ConfigError| explain(translation.as_deref(), e);
        let server: ServerConfig = take_section(&mut root, "server").map_err(explain)?;
        let clients: ClientsConfig = take_section(&mut root, "clients").map_err(explain)?;
        let config = Self { path: None, server, clients, sections: root, source_sha256: None, deerflow: translation };
        config.validate().map_err(|e| config.explain(e))?;
        config.register_secrets();
        Ok(config)
    }

    /// Adds the DeerFlow key behind the setting `error` is about, when a DeerFlow file supplied it.
    pub fn explain(&self, error: ConfigError) -> ConfigError {
        explain(self.deerflow.as_deref(), error)
    }

    /// Parses a service's own section (absent → its defaults), with unknown keys and bad values
    /// reported by YAML path.
    pub fn section<T: DeserializeOwned + Default>(&self, name: &str) -> Result<T, ConfigError> {
        match self.sections.get(name) {
            None | Some(Value::Null) => Ok(T::default()),
            Some(value) => from_value(value.clone(), name),
        }
    }

    /// The resolved configuration as YAML, secrets masked: what `antler config check` prints.
    pub fn to_masked_yaml(&self) -> String {
        let mut root = self.to_value();
        mask_secrets(&mut root);
        serde_yaml_ng::to_string(&root).unwrap_or_default()
    }

    /// The whole resolved configuration as one YAML value.
    fn to_value(&self) -> Value {
        let mut root = Mapping::new();
        if let Ok(server) = serde_yaml_ng::to_value(&self.server) {
            root.insert("server".into(), server);
        }
        if let Ok(clients) = serde_yaml_ng::to_value(&self.clients) {
            root.insert("clients".into(), clients);
        }
        for (key, value) in &self.sections {
            root.insert(key.clone(), value.clone());
        }
        Value::Mapping(root)
    }

    /// Registers every credential in this configuration (the values `config check` masks) with the
    /// process's redactor, so no status, log line or stored text can carry one out.
    fn register_secrets(&self) {
        for_each_secret(&mut self.to_value(), &mut |s| crate::redact::register_static(s));
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        check_range("server.max_message_bytes", s.max_message_bytes as u64, 1024, 1 << 30)?;
        check_range("server.concurrency_limit", s.concurrency_limit as u64, 1, 1_000_000)?;
        check_range("server.internal_concurrency_limit", s.internal_concurrency_limit as u64, 1, 1_000_000)?;
        check_range("server.request_timeout_secs", s.request_timeout_secs, 0, 86_400)?;
        check_range("server.default_deadline_secs", s.default_deadline_secs, 0, 86_400)?;
        check_range("server.shutdown_grace_secs", s.shutdown_grace_secs, 0, 3_600)?;
        check_range("server.reload_interval_ms", s.reload_interval_ms, 0, 3_600_000)?;
        s.auth.validate("server.auth")?;
        s.metrics.validate()?;
        s.tracing.validate()?;
        s.health_listen_addr()?;
        for (name, client) in self.clients.iter() {
            let path = format!("clients.{name}");
            let scheme_ok = ["http://", "https://"].iter().any(|scheme| client.endpoint.starts_with(scheme));
            if !client.endpoint.is_empty() && !scheme_ok {
                return Err(ConfigError::Invalid {
                    path: format!("{path}.endpoint"),
                    message: format!("`{}` must start with http:// or https://", client.endpoint),
                });
            }
            check_range(&format!("{path}.connect_timeout_ms"), client.connect_timeout_ms, 1, 600_000)?;
            check_range(&format!("{path}.timeout_ms"), client.timeout_ms, 1, 86_400_000)?;
            check_range(&format!("{path}.retries"), u64::from(client.retries), 0, 20)?;
            check_range(&format!("{path}.backoff_max_ms"), client.backoff_max_ms, client.backoff_base_ms, 600_000)?;
        }
        validate_tls(self)?;
        Ok(())
    }
}

impl Config {
    /// With `server.auth` on, the work `caller` does on its own account (`why`: a run's worker, the
    /// extraction queue), which has no caller token to forward, reaches `service` with
    /// `clients.<service>.service_token`. Services in one process need none (the internal mark, see
    /// [`crate::internal`]); at another address a missing token would refuse every such call while the
    /// feature quietly does nothing, so it is a configuration error that names the key.
    pub fn require_service_token(&self, caller: &str, service: &str, why: &str) -> Result<(), ConfigError> {
        if !self.server.auth.enabled {
            return Ok(());
        }
        let Some((_, client)) = self.clients.iter().find(|(name, _)| *name == service) else { return Ok(()) };
        if client.endpoint.is_empty() || !client.service_token.is_empty() {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            path: format!("clients.{service}.service_token"),
            message: format!(
                "the {caller} service calls the {service} service at {} {why}, with no caller token to forward, and \
                 server.auth is enabled: those calls would be refused\nhint: add an API key with `service: true` to \
                 server.auth.api_keys (of both services) and set it here, as the Helm chart does; services in one process \
                 (an empty endpoint, as in `antler up`) need none",
                client.endpoint
            ),
        })
    }
}

impl ClientsConfig {
    /// Every client with its service name.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &ClientConfig)> {
        [("runs", &self.runs), ("sandbox", &self.sandbox), ("mcp", &self.mcp), ("models", &self.models), ("memory", &self.memory)]
            .into_iter()
    }
}

/// Resolves `$VAR`, `${VAR}` and `${VAR:-default}` in every string below `value` exactly as in
/// `antler.yaml`, for other files Antler reads (DeerFlow's `extensions_config.json`). `path` names `value`
/// in errors; `lookup` resolves a variable name.
pub fn substitute_env(value: &mut Value, path: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    env::substitute(value, path, lookup)
}

fn explain(translation: Option<&deerflow::Translation>, error: ConfigError) -> ConfigError {
    let origin = translation.zip(error.path()).and_then(|(t, path)| t.origin_of(path).map(|origin| (path.to_owned(), origin)));
    match origin {
        Some((antler_path, deerflow_path)) => ConfigError::FromDeerflow { error: Box::new(error), antler_path, deerflow_path },
        None => error,
    }
}

/// Checks the TLS settings of `config` against the client endpoints (the files are read by [`crate::client::check_tls`]).
fn validate_tls(config: &Config) -> Result<(), ConfigError> {
    config.server.tls.validate()?;
    for (name, client) in config.clients.iter() {
        let fields = Fields::Yaml(format!("clients.{name}.tls"));
        client.tls.validate(&fields)?;
        if client.tls.is_empty() {
            continue;
        }
        let at = format!("clients.{name}.tls");
        if client.endpoint.starts_with("http://") {
            return Err(ConfigError::Invalid {
                path: at,
                message: format!(
                    "is set but clients.{name}.endpoint `{}` is plaintext\nhint: use an https:// endpoint, or remove clients.{name}.tls",
                    client.endpoint
                ),
            });
        }
        if client.endpoint.is_empty() && !config.server.tls.enabled() {
            return Err(ConfigError::Invalid {
                path: at,
                message: format!(
                    "is set but clients.{name}.endpoint is empty (this process) and server.tls.cert is not set, so the call is plaintext\nhint: set server.tls, or point the endpoint at an https:// server"
                ),
            });
        }
    }
    Ok(())
}

fn take_section<T: DeserializeOwned + Default>(root: &mut Mapping, name: &str) -> Result<T, ConfigError> {
    match root.remove(name) {
        None | Some(Value::Null) => Ok(T::default()),
        Some(value) => from_value(value, name),
    }
}

fn from_value<T: DeserializeOwned>(value: Value, prefix: &str) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let inner = err.path().to_string();
        let path = if inner == "." || inner.is_empty() { prefix.to_owned() } else { format!("{prefix}.{inner}") };
        ConfigError::Invalid { path, message: err.into_inner().to_string() }
    })
}

/// Keys whose values are credentials and are never printed.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["key", "secret", "token", "password", "pem"].iter().any(|word| key.contains(word))
}

/// Calls `f` on every non-empty string stored under a secret-looking key (see [`is_secret_key`]).
/// A `tls` mapping holds file paths (`key: /etc/antler/tls.key`), not secrets: masking or redacting a
/// path would only hide which file an error is about.
fn for_each_secret(value: &mut Value, f: &mut dyn FnMut(&mut String)) {
    match value {
        Value::Mapping(map) => {
            for (key, item) in map.iter_mut() {
                match item {
                    Value::Mapping(_) if env::key_name(key) == "tls" => {}
                    Value::String(s) if is_secret_key(&env::key_name(key)) && !s.is_empty() => f(s),
                    _ => for_each_secret(item, f),
                }
            }
        }
        Value::Sequence(items) => items.iter_mut().for_each(|item| for_each_secret(item, f)),
        _ => {}
    }
}

fn mask_secrets(value: &mut Value) {
    for_each_secret(value, &mut |s| *s = "****".to_owned());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "antler.yaml", &|name| (name == "ALICE").then(|| "alice-secret-key".to_owned()))
    }

    #[test]
    fn an_empty_file_gives_the_defaults() -> Result<(), ConfigError> {
        let config = parse("")?;
        assert_eq!(config.server.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(config.server.shutdown_grace_secs, 30);
        Ok(())
    }

    #[test]
    fn an_unknown_key_is_named_with_its_path() {
        let text = parse("server:\n  auth:\n    local_usr: bob\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("server.auth"), "{text}");
        assert!(text.contains("local_usr"), "{text}");
    }

    #[test]
    fn an_unknown_section_is_refused() {
        let err = parse("serverr: {}\n").err();
        assert!(matches!(err, Some(ConfigError::UnknownSection { ref section }) if section == "serverr"), "{err:?}");
    }

    #[test]
    fn values_out_of_range_name_the_limit() {
        let text = parse("server:\n  max_message_bytes: 10\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("server.max_message_bytes"), "{text}");
        assert!(text.contains("between 1024 and"), "{text}");
    }

    #[test]
    fn service_sections_are_parsed_by_their_owner_with_paths() {
        #[derive(Debug, Default, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        struct Runs {
            #[allow(dead_code)]
            workers: u32,
        }
        let config = parse("runs:\n  workerz: 3\n");
        let text = config.and_then(|c| c.section::<Runs>("runs")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("runs") && text.contains("workerz"), "{text}");
    }

    #[test]
    fn the_health_only_listener_is_off_by_default_and_checked() {
        let text = parse("server:\n  health_listen: nowhere\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("server.health_listen") && text.contains("nowhere"), "{text}");
        assert!(parse("").is_ok_and(|c| c.server.health_listen_addr().is_ok_and(|a| a.is_none())), "off by default");
        let on = parse("server:\n  health_listen: 0.0.0.0:8081\n");
        assert!(on.is_ok_and(|c| c.server.health_listen_addr().is_ok_and(|a| a.is_some_and(|a| a.port() == 8081))));
    }

    #[test]
    fn metrics_settings_are_checked_with_their_paths() {
        let error = |text: &str| parse(text).err().map(|e| e.to_string()).unwrap_or_default();
        let text = error("server:\n  metrics:\n    listen: not-an-address\n");
        assert!(text.contains("server.metrics.listen") && text.contains("not-an-address"), "{text}");
        let text = error("server:\n  metrics:\n    buckets: [1, 0.5]\n");
        assert!(text.contains("server.metrics.buckets") && text.contains("strictly increasing"), "{text}");
        let text = error("server:\n  metrics:\n    buckets_by_metric:\n      antler_x: []\n");
        assert!(text.contains("server.metrics.buckets_by_metric.antler_x"), "{text}");
        let text = error("server:\n  tracing:\n    sample_ratio: 1.5\n");
        assert!(text.contains("server.tracing.sample_ratio") && text.contains("between 0.0 and 1.0"), "{text}");
        let text = error("server:\n  tracing:\n    otlp_endpoint: collector:4317\n");
        assert!(text.contains("server.tracing.otlp_endpoint"), "{text}");
        let text = error("server:\n  tracing:\n    otlp_endpoint: http://collector:4317\n    tls:\n      ca: /etc/ca.pem\n");
        assert!(text.contains("server.tracing.tls") && text.contains("not https://"), "{text}");
        let text = error("server:\n  tracing:\n    otlp_endpoint: https://collector:4317\n    tls:\n      cert: /etc/c.pem\n");
        assert!(text.contains("server.tracing.tls.key"), "{text}");
        assert!(parse("server:\n  tracing:\n    otlp_endpoint: https://collector:4317\n    tls:\n      ca: /etc/ca.pem\n").is_ok());
        assert!(
            parse("server:\n  metrics:\n    listen: 127.0.0.1:0\n").is_ok_and(|c| c
                .server
                .metrics
                .listen_addr()
                .is_ok_and(|a| a.is_some()))
        );
        assert!(parse("").is_ok_and(|c| c.server.metrics.listen_addr().is_ok_and(|a| a.is_none())), "off by default");
    }

    #[test]
    fn masked_output_hides_secrets_but_keeps_users() -> Result<(), ConfigError> {
        let config = parse("server:\n  auth:\n    api_keys:\n      - key: $ALICE\n        user: alice\n")?;
        let yaml = config.to_masked_yaml();
        assert!(!yaml.contains("alice-secret-key"), "{yaml}");
        assert!(yaml.contains("****") && yaml.contains("alice"), "{yaml}");
        Ok(())
    }

    #[test]
    fn tls_file_paths_are_neither_masked_nor_redacted() -> Result<(), ConfigError> {
        let config = parse("server:\n  tls:\n    cert: /etc/antler/tls/server-crt.pem\n    key: /etc/antler/tls/server-key-77.pem\n")?;
        let yaml = config.to_masked_yaml();
        assert!(yaml.contains("/etc/antler/tls/server-key-77.pem"), "{yaml}");
        assert_eq!(crate::redact::redact("cannot read /etc/antler/tls/server-key-77.pem"), "cannot read /etc/antler/tls/server-key-77.pem");
        Ok(())
    }

    #[test]
    fn tls_settings_are_checked_with_their_paths() {
        let error = |text: &str| parse(text).err().map(|e| e.to_string()).unwrap_or_default();
        let text = error("server:\n  tls:\n    cert: /a.pem\n");
        assert!(text.contains("server.tls.key") && text.contains("hint:"), "{text}");
        let text = error("server:\n  tls:\n    client_ca: /ca.pem\n");
        assert!(text.contains("server.tls.client_ca"), "{text}");
        let text = error("server:\n  tls:\n    cert: /a.pem\n    key: /a.key\n    handshake_timeout_ms: 0\n");
        assert!(text.contains("server.tls.handshake_timeout_ms"), "{text}");
        let text = error("clients:\n  models:\n    endpoint: http://models:50051\n    tls:\n      ca: /ca.pem\n");
        assert!(text.contains("clients.models.tls") && text.contains("https://"), "{text}");
        let text = error("clients:\n  models:\n    tls:\n      ca: /ca.pem\n");
        assert!(text.contains("clients.models.tls") && text.contains("server.tls"), "{text}");
        let text = error("clients:\n  models:\n    endpoint: https://models:50051\n    tls:\n      cert: /c.pem\n");
        assert!(text.contains("clients.models.tls.key"), "{text}");
        let text = error("clients:\n  models:\n    endpoint: https://models:50051\n    tls:\n      server_name: \"not a name\"\n");
        assert!(text.contains("clients.models.tls.server_name"), "{text}");
        assert!(
            parse(
                "clients:\n  models:\n    endpoint: https://models:50051\n    tls:\n      ca: /ca.pem\n      server_name: models.internal\n"
            )
            .is_ok()
        );
    }

    #[test]
    fn loaded_credentials_are_redacted_everywhere() -> Result<(), ConfigError> {
        parse(
            "models:\n  - name: m\n    api_key: sk-loaded-from-config-77\nclients:\n  models:\n    service_token: svc-token-from-config-88\n",
        )?;
        let text = "echo sk-loaded-from-config-77 and svc-token-from-config-88";
        assert_eq!(crate::redact::redact(text), "echo [redacted] and [redacted]");
        Ok(())
    }
}
