//! Calling the other Antler services: channels from the `clients` config section, the caller's identity
//! and trace context on every outbound request, and retries on UNAVAILABLE.
//!
//! Services talk to each other only through these gRPC clients, also inside one `antler up` process, so
//! the embedded default and a Kubernetes install take the same code paths.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

use crate::auth::{ACT_AS_HEADER, Identity, Principal};
use crate::backoff::{Backoff, Jitter};
use crate::config::{ClientConfig, ClientsConfig, Config, ConfigError};
use crate::status::{is_retryable, retry_after};
use crate::tls::{ClientTls, Fields, ServerTls};
use crate::trace_context::{TRACEPARENT, TraceContext};
use crate::transport::{LocalServer, Transport};

/// Who a call is made for, and in which trace: taken from the incoming request a handler is serving.
#[derive(Debug, Clone)]
pub struct CallContext {
    pub identity: Identity,
    pub trace: TraceContext,
    /// Set on the calls an agent makes for a run: outbound requests carry it as the fencing token
    /// ([`RUN_ID_HEADER`], [`ATTEMPT_HEADER`]), which the sandbox service enforces.
    pub run: Option<RunAttempt>,
}

/// gRPC metadata naming the run an outbound call is made for (see [`RunAttempt`]).
pub const RUN_ID_HEADER: &str = "x-antler-run-id";
/// gRPC metadata naming the run's attempt (1 for the first, +1 per takeover).
pub const ATTEMPT_HEADER: &str = "x-antler-run-attempt";

/// The run attempt a call is made for: the sandbox service refuses calls of an attempt lower than
/// the highest it has seen for the run, and kills that attempt's commands when a higher one calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAttempt {
    pub run_id: String,
    pub attempt: u32,
}

impl CallContext {
    /// The context of an incoming request (identity from the auth layer, trace from the trace layer).
    pub fn from_request<T>(request: &tonic::Request<T>) -> Result<Self, tonic::Status> {
        let identity = Identity::of(request)?.clone();
        let trace = request.extensions().get::<TraceContext>().copied().unwrap_or_else(TraceContext::new_root);
        Ok(Self { identity, trace, run: None })
    }

    /// A context for work a service does on its own for `user_id` (for example a background worker).
    /// Outbound calls present the client's `service_token` and name the user in `x-antler-user`, and
    /// continue the current span's exported trace (a run's), if any.
    pub fn background(user_id: impl Into<String>) -> Self {
        let user_id = user_id.into();
        Self {
            identity: Identity { user_id, principal: Principal::Service { service: String::new() }, credential: None },
            trace: TraceContext::current(),
            run: None,
        }
    }

    /// This context, its calls made for `attempt` of `run_id`.
    pub fn for_run(mut self, run_id: impl Into<String>, attempt: u32) -> Self {
        self.run = Some(RunAttempt { run_id: run_id.into(), attempt });
        self
    }
}

/// One configured outbound service.
#[derive(Debug, Clone)]
pub struct ServiceClient {
    channel: Channel,
    config: ClientConfig,
    /// The endpoint is this very process (`antler up`): calls carry the process's internal mark, and
    /// go through its server stack in memory once it serves (see [`crate::transport`]).
    same_process: bool,
    local: Option<LocalServer>,
}

impl ServiceClient {
    /// The transport, for building a generated client: `RunServiceClient::new(client.channel())`. For
    /// this process's own services, its server stack in memory once it serves; else the channel.
    pub fn channel(&self) -> Transport {
        match self.local.as_ref().and_then(LocalServer::get) {
            Some(local) => Transport::Local(local),
            None => Transport::Channel(self.channel.clone()),
        }
    }

    /// The network channel, whatever the endpoint (for a caller that must use the socket).
    pub fn network_channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Wraps `message` in a request carrying the caller's credentials, trace context and deadline.
    pub fn request<T>(&self, ctx: &CallContext, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(Duration::from_millis(self.config.timeout_ms));
        let metadata = request.metadata_mut();
        if let Ok(value) = MetadataValue::try_from(ctx.trace.to_traceparent()) {
            metadata.insert(TRACEPARENT, value);
        }
        if let Some(run) = &ctx.run
            && let Ok(run_id) = MetadataValue::try_from(run.run_id.as_str())
        {
            metadata.insert(RUN_ID_HEADER, run_id);
            metadata.insert(ATTEMPT_HEADER, MetadataValue::from(run.attempt));
        }
        if self.same_process
            && let Ok(value) = MetadataValue::try_from(crate::internal::internal_mark())
        {
            metadata.insert(crate::internal::INTERNAL_HEADER, value);
        }
        let (token, act_as) = match (&ctx.identity.principal, &ctx.identity.credential) {
            (Principal::User, Some(token)) => (Some(token.to_string()), None),
            (Principal::Service { .. }, Some(token)) => (Some(token.to_string()), Some(&ctx.identity.user_id)),
            // Local mode, or a background context: present our own service token, if configured.
            _ => ((!self.config.service_token.is_empty()).then(|| self.config.service_token.clone()), Some(&ctx.identity.user_id)),
        };
        let bearer = token.and_then(|t| MetadataValue::try_from(format!("Bearer {t}")).ok());
        let has_token = bearer.is_some();
        if let Some(value) = bearer {
            metadata.insert("authorization", value);
        }
        // With a service token the callee reads whom it acts for from here; without any token, so does
        // this process's own server (the internal mark above stands in for the token).
        if (has_token || self.same_process)
            && let Some(value) = act_as.and_then(|u| MetadataValue::try_from(u.as_str()).ok())
        {
            metadata.insert(ACT_AS_HEADER, value);
        }
        request
    }

    /// Runs `call` and retries it on UNAVAILABLE with exponential backoff and full jitter (honouring a
    /// `retry-after` the callee sent), up to the configured number of retries.
    pub async fn with_retry<T, F, Fut>(&self, call: F) -> Result<T, tonic::Status>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        policy(&self.config)
            .retry(call, |status, retry, _| {
                if !is_retryable(status) {
                    return None;
                }
                let attempt = retry - 1;
                let delay = backoff(&self.config, attempt, retry_after(status));
                tracing::debug!(attempt, delay_ms = delay.as_millis() as u64, error = %status.message(), "retrying after UNAVAILABLE");
                Some(delay)
            })
            .await
    }
}

/// A client's retry policy: `backoff_base_ms` doubling to `backoff_max_ms`, full jitter, `retries`.
fn policy(config: &ClientConfig) -> Backoff {
    Backoff::doubling(Duration::from_millis(config.backoff_base_ms), Duration::from_millis(config.backoff_max_ms))
        .with_jitter(Jitter::Full)
        .with_retries(config.retries)
}

/// The wait before retry `attempt + 1`: the policy's, or at least the callee's `retry-after`
/// (bounded by the larger of `backoff_max_ms` and 1 s).
fn backoff(config: &ClientConfig, attempt: u32, retry_after_secs: Option<u64>) -> Duration {
    let floor = retry_after_secs.map_or(0, |s| s.saturating_mul(1000)).min(config.backoff_max_ms.max(1000));
    policy(config).delay(attempt.saturating_add(1)).max(Duration::from_millis(floor))
}

/// Channels to every other service, connected lazily (a service that is down does not stop start-up;
/// calls to it fail with UNAVAILABLE until it is up).
#[derive(Debug, Clone)]
pub struct Clients {
    // Shared: every run's context carries the clients, and a copy of the map per run was ~1.4 KiB
    // of a waiting run's memory.
    clients: Arc<HashMap<&'static str, ServiceClient>>,
    /// This process's server stack, for the clients whose endpoint is this process.
    local: LocalServer,
}

impl Clients {
    /// Builds the channels. An empty endpoint means `own_addr` (every service in one process), over
    /// plaintext; an `https://` endpoint uses its `tls` settings (certificate files not reloaded).
    pub fn from_config(config: &ClientsConfig, own_addr: SocketAddr) -> Result<Self, ConfigError> {
        Self::build(config, own_addr, None, Duration::ZERO, None)
    }

    /// The channels of a server process: an empty endpoint calls `own_addr` over TLS when the server
    /// serves it (`own_tls`), and every client's certificate files are polled every
    /// `server.tls.reload_interval_ms` until `shutdown`.
    pub fn for_server(
        config: &Config,
        own_addr: SocketAddr,
        own_tls: Option<&ServerTls>,
        shutdown: &CancellationToken,
    ) -> Result<Self, ConfigError> {
        let interval = Duration::from_millis(config.server.tls.reload_interval_ms);
        Self::build(&config.clients, own_addr, own_tls, interval, Some(shutdown))
    }

    pub(crate) fn build(
        config: &ClientsConfig,
        own_addr: SocketAddr,
        own_tls: Option<&ServerTls>,
        reload_interval: Duration,
        shutdown: Option<&CancellationToken>,
    ) -> Result<Self, ConfigError> {
        let own = loopback_form(own_addr);
        let local = LocalServer::default();
        let mut clients = HashMap::new();
        for (name, client) in config.iter() {
            let same_process = client.endpoint.is_empty();
            let fields = Fields::Yaml(format!("clients.{name}.tls"));
            let (url, tls) = match (same_process, own_tls) {
                (true, Some(server)) => {
                    (format!("https://{own}"), Some(ClientTls::for_own_server(&client.tls, &fields, server, reload_interval, shutdown)?))
                }
                (true, None) => (format!("http://{own}"), None),
                (false, _) if client.endpoint.starts_with("https://") => {
                    (client.endpoint.clone(), Some(ClientTls::load(&client.tls, &fields, reload_interval, shutdown)?))
                }
                (false, _) => (client.endpoint.clone(), None),
            };
            let endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| ConfigError::Invalid { path: format!("clients.{name}.endpoint"), message: format!("`{url}`: {e}") })?
                .connect_timeout(Duration::from_millis(client.connect_timeout_ms))
                .tcp_nodelay(true);
            let channel = match &tls {
                Some(tls) => tls.channel(endpoint),
                None => endpoint.connect_lazy(),
            };
            let local = same_process.then(|| local.clone());
            clients.insert(name, ServiceClient { channel, config: client.clone(), same_process, local });
        }
        Ok(Self { clients: Arc::new(clients), local })
    }

    /// The server stack the clients of this process's own services call in memory: the server fills
    /// it when it serves (see [`crate::server::ServiceSet::serve_locally`]).
    pub fn local_server(&self) -> LocalServer {
        self.local.clone()
    }

    /// The client of one service: `runs`, `sandbox`, `mcp`, `models` or `memory`.
    pub fn get(&self, service: &str) -> Option<&ServiceClient> {
        self.clients.get(service)
    }
}

/// A wildcard listen address is not a destination: call our own port on loopback instead.
fn loopback_form(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        let ip =
            if addr.is_ipv4() { std::net::IpAddr::from([127, 0, 0, 1]) } else { std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST) };
        SocketAddr::new(ip, addr.port())
    } else {
        addr
    }
}

/// Reads every certificate and key file `config` names, as start-up would, without serving or
/// watching anything: what `antler config check` runs. (Here rather than in `tls`, which the clients
/// build on: TLS does not need to know the clients.)
pub fn check_tls(config: &crate::config::Config) -> Result<(), ConfigError> {
    let interval = std::time::Duration::ZERO;
    let server = crate::tls::ServerTls::load(&config.server.tls, interval, None)?;
    let own = SocketAddr::from(([127, 0, 0, 1], 0));
    Clients::build(&config.clients, own, server.as_ref(), interval, None).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_respects_retry_after() {
        let config = ClientConfig { backoff_base_ms: 100, backoff_max_ms: 1_000, ..ClientConfig::default() };
        for attempt in 0..10 {
            let d = backoff(&config, attempt, None);
            assert!(d <= Duration::from_millis(1_000), "attempt {attempt}: {d:?}");
            assert!(d <= Duration::from_millis(100 << attempt), "attempt {attempt}: {d:?}");
        }
        assert!(backoff(&config, 0, Some(1)) >= Duration::from_millis(1_000));
    }

    #[tokio::test]
    async fn retries_stop_after_the_configured_count_and_only_on_unavailable() {
        let config = ClientsConfig {
            models: ClientConfig { retries: 2, backoff_base_ms: 1, backoff_max_ms: 2, ..ClientConfig::default() },
            ..ClientsConfig::default()
        };
        let clients = Clients::from_config(&config, SocketAddr::from(([127, 0, 0, 1], 1)));
        let Some(client) = clients.as_ref().ok().and_then(|c| c.get("models")) else {
            panic!("models client missing");
        };
        let calls = std::sync::atomic::AtomicU32::new(0);
        let result: Result<(), _> = client
            .with_retry(|| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Err(tonic::Status::unavailable("down")) }
            })
            .await;
        assert!(result.is_err());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3, "one call plus two retries");

        calls.store(0, std::sync::atomic::Ordering::SeqCst);
        let _: Result<(), _> = client
            .with_retry(|| {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Err(tonic::Status::invalid_argument("bad")) }
            })
            .await;
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1, "no retry on INVALID_ARGUMENT");
    }

    #[tokio::test]
    async fn outbound_requests_forward_user_tokens_and_trace() {
        let clients = Clients::from_config(&ClientsConfig::default(), SocketAddr::from(([0, 0, 0, 0], 50051)));
        let Some(client) = clients.as_ref().ok().and_then(|c| c.get("sandbox")) else {
            panic!("sandbox client missing");
        };
        let ctx = CallContext {
            identity: Identity { user_id: "alice".into(), principal: Principal::User, credential: Some("alice-key".into()) },
            trace: TraceContext::new_root(),
            run: None,
        };
        let request = client.request(&ctx, ());
        assert_eq!(request.metadata().get("authorization").and_then(|v| v.to_str().ok()), Some("Bearer alice-key"));
        assert!(request.metadata().get(ACT_AS_HEADER).is_none(), "a user token speaks for itself");
        let sent = request.metadata().get(TRACEPARENT).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        assert!(sent.contains(&ctx.trace.trace_id_hex()), "{sent}");
        assert!(request.metadata().get(RUN_ID_HEADER).is_none(), "no run, no fencing token");
        let request = client.request(&ctx.clone().for_run("r-1", 2), ());
        assert_eq!(request.metadata().get(RUN_ID_HEADER).and_then(|v| v.to_str().ok()), Some("r-1"));
        assert_eq!(request.metadata().get(ATTEMPT_HEADER).and_then(|v| v.to_str().ok()), Some("2"));
    }
}
