//! Server bootstrap shared by every binary: health, reflection, tracing, authentication, limits and
//! graceful shutdown around whatever services a binary mounts.
//!
//! Over TLS when `server.tls` is set (see [`crate::tls`]): connections are then accepted by the kit's
//! TLS acceptor and handed to tonic through `serve_with_incoming`.
//!
//! Layer order, outermost first: redaction of status messages (so no layer's refusal can carry a
//! secret out), trace (so refusals are logged inside the request's span), auth,
//! concurrency limit, the default deadline, message-size status mapping, then the routes. Health answers NOT_SERVING until the listener accepts and again
//! from the moment shutdown starts; draining then waits up to `server.shutdown_grace_secs` for open
//! requests and streams before the process exits.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::service::RoutesBuilder;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tower::ServiceBuilder;

use crate::auth::{AuthLayer, Authenticator};
use crate::config::ServerConfig;
use crate::deadline::DeadlineLayer;
use crate::limit::ConcurrencyLayer;
use crate::message_size::MessageSizeLayer;
use crate::redact::RedactLayer;
use crate::tls::ServerTls;
use crate::trace_context::TraceLayer;
use crate::transport::{LocalServer, LocalService};

/// Failures of start-up or serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {addr} without authentication\nhint: enable server.auth (api_keys or jwt), listen on a loopback address, or set server.allow_insecure: true if a proxy in front authenticates"
    )]
    InsecureBind { addr: SocketAddr },
    #[error(
        "refusing to serve plaintext gRPC on {addr}: server.tls.required is set and server.tls.cert is empty\nhint: set server.tls.cert and server.tls.key, listen on a loopback address, or set server.tls.required: false"
    )]
    PlaintextBind { addr: SocketAddr },
    #[error("cannot listen on {addr}: {source}\nhint: is another process using the port? pass --listen 127.0.0.1:0 for a free one")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("reflection setup failed: {0}")]
    Reflection(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Refuses a configuration that would expose unauthenticated services beyond this machine, and
/// plaintext beyond it when `server.tls.required` (without it, plaintext there is a logged warning).
pub fn check_bind(config: &ServerConfig, auth: &Authenticator) -> Result<(), ServeError> {
    let network = !config.listen.ip().is_loopback();
    if !auth.enabled() && network && !config.allow_insecure {
        return Err(ServeError::InsecureBind { addr: config.listen });
    }
    if network && !config.tls.enabled() {
        if config.tls.required {
            return Err(ServeError::PlaintextBind { addr: config.listen });
        }
        tracing::warn!(
            addr = %config.listen,
            "serving plaintext gRPC on a non-loopback address: tokens and data cross the network unencrypted; set server.tls.cert and server.tls.key (server.tls.required: true refuses to start like this)"
        );
    }
    Ok(())
}

/// Binds the listen address (after [`check_bind`]).
pub async fn bind(config: &ServerConfig, auth: &Authenticator) -> Result<TcpListener, ServeError> {
    check_bind(config, auth)?;
    TcpListener::bind(config.listen).await.map_err(|source| ServeError::Bind { addr: config.listen, source })
}

/// The services one server mounts, with the names health reports and the descriptors reflection serves.
pub struct ServiceSet {
    routes: RoutesBuilder,
    names: Vec<&'static str>,
    descriptors: Vec<&'static [u8]>,
    max_message_bytes: usize,
    drains: Vec<futures::future::BoxFuture<'static, ()>>,
    /// Methods exempt from `server.default_deadline_secs` (see [`crate::deadline`]).
    waits: Vec<&'static str>,
    /// Filled with the server stack while serving: this process's clients call it in memory.
    local: Option<LocalServer>,
}

impl std::fmt::Debug for ServiceSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSet").field("names", &self.names).finish_non_exhaustive()
    }
}

impl ServiceSet {
    pub fn new(config: &ServerConfig) -> Self {
        Self {
            routes: RoutesBuilder::default(),
            names: Vec::new(),
            descriptors: Vec::new(),
            max_message_bytes: config.max_message_bytes,
            drains: Vec::new(),
            waits: Vec::new(),
            local: None,
        }
    }

    /// While the server serves, `local` holds its whole stack (every layer, then the routes), which the
    /// clients of this process's own services call in memory instead of over loopback (see
    /// [`crate::transport`]); it is emptied when serving ends.
    pub fn serve_locally(&mut self, local: LocalServer) -> &mut Self {
        self.local = Some(local);
        self
    }

    /// Work the server waits for during shutdown (bounded by `server.shutdown_grace_secs`), for
    /// example a service handing its in-flight jobs to another replica. The future should itself wait
    /// for the shutdown token before acting; it is polled from the moment serving starts.
    pub fn on_drain(&mut self, drain: impl std::future::Future<Output = ()> + Send + 'static) -> &mut Self {
        self.drains.push(Box::pin(drain));
        self
    }

    /// The message size limit to apply to each generated server (see [`crate::add_service!`]).
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Mounts a generated tonic server. Prefer [`crate::add_service!`], which also sets message limits.
    pub fn add<S>(&mut self, service: S) -> &mut Self
    where
        S: tower_service::Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        if !self.names.contains(&S::NAME) {
            self.names.push(S::NAME);
            self.routes.add_service(service);
        }
        self
    }

    /// Declares `path` (`/package.Service/Method`) a wait whose length the service bounds itself, exempt
    /// from `server.default_deadline_secs` (see [`crate::deadline`]).
    pub fn without_default_deadline(&mut self, path: &'static str) -> &mut Self {
        self.waits.push(path);
        self
    }

    /// Registers an encoded `FileDescriptorSet` for reflection (each distinct set once).
    pub fn describe(&mut self, descriptor_set: &'static [u8]) -> &mut Self {
        if !self.descriptors.iter().any(|d| std::ptr::eq(*d, descriptor_set)) {
            self.descriptors.push(descriptor_set);
        }
        self
    }

    /// The fully qualified names of the mounted services.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }
}

/// Mounts a generated server with the set's message size limits applied.
#[macro_export]
macro_rules! add_service {
    ($set:expr, $server:expr) => {{
        let limit = $set.max_message_bytes();
        $set.add($server.max_decoding_message_size(limit).max_encoding_message_size(limit))
    }};
}

/// Serves `services` on `listener` (plaintext) until `shutdown` is cancelled, then drains.
pub async fn serve(
    listener: TcpListener,
    services: ServiceSet,
    config: &ServerConfig,
    auth: Authenticator,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    serve_with_tls(listener, services, config, auth, None, shutdown).await
}

/// Like [`serve`], over TLS when `tls` is given (see [`ServerTls::load`]).
pub async fn serve_with_tls(
    listener: TcpListener,
    services: ServiceSet,
    config: &ServerConfig,
    auth: Authenticator,
    tls: Option<ServerTls>,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    set_all(&reporter, &services.names, ServingStatus::NotServing).await;

    let reflection = || {
        let mut builder =
            tonic_reflection::server::Builder::configure().register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
        for set in &services.descriptors {
            builder = builder.register_encoded_file_descriptor_set(set);
        }
        // Advertise what this server mounts, not every service the descriptor sets happen to contain.
        builder = builder
            .with_service_name("grpc.health.v1.Health")
            .with_service_name("grpc.reflection.v1.ServerReflection")
            .with_service_name("grpc.reflection.v1alpha.ServerReflection");
        for name in &services.names {
            builder = builder.with_service_name(*name);
        }
        builder
    };
    let reflection_error = |e: tonic_reflection::server::Error| ServeError::Reflection(e.to_string());
    // grpcurl (the PyPI build) speaks only v1alpha; current clients speak v1: serve both.
    let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;

    let ServiceSet { mut routes, names, drains, waits, local, .. } = services;
    // Stops the health-only listener when this function returns, not at the signal: during the
    // drain it keeps answering NOT_SERVING, as the main listener does.
    let health_only = CancellationToken::new();
    let _stop_health_only = health_only.clone().drop_guard();
    // Bound now (a taken port fails the start), served only once the statuses say SERVING below: a
    // checker that connected early waits for its answer instead of reading NOT_SERVING from a server
    // about to serve.
    let health_only_listener = match config.health_listen_addr()? {
        Some(addr) => Some(TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?),
        None => None,
    };
    let drains = tokio::spawn(futures::future::join_all(drains));
    let health_for_only = health.clone();
    routes.add_service(health).add_service(reflection_v1).add_service(reflection_v1alpha);

    let mut builder = tonic::transport::Server::builder();
    if config.request_timeout_secs > 0 {
        builder = builder.timeout(Duration::from_secs(config.request_timeout_secs));
    }
    let layers = ServiceBuilder::new()
        .layer(RedactLayer)
        .layer(TraceLayer)
        .layer(AuthLayer::new(auth))
        .layer(ConcurrencyLayer::new(config.concurrency_limit, config.internal_concurrency_limit))
        .layer(DeadlineLayer::new(config.default_deadline_secs, waits))
        .layer(MessageSizeLayer::new(config.max_message_bytes));
    let routes = routes.routes();
    // Cleared when this function returns, whichever way: calls after that go to the socket and fail.
    let _stop_local = local.as_ref().map(|local| {
        local.install(LocalService::new(layers.clone().service(routes.clone())));
        StopLocal(local.clone())
    });
    let router = builder.layer(layers).add_routes(routes);

    let addr = listener.local_addr().ok();
    let draining = {
        let shutdown = shutdown.clone();
        let reporter = reporter.clone();
        let names = names.clone();
        async move {
            shutdown.cancelled().await;
            set_all(&reporter, &names, ServingStatus::NotServing).await;
            tracing::info!("draining: health is NOT_SERVING, no new connections are accepted");
        }
    };
    let server: futures::future::BoxFuture<'_, Result<(), tonic::transport::Error>> = match &tls {
        Some(tls) => Box::pin(router.serve_with_incoming_shutdown(tls.incoming(listener, shutdown.clone()), draining)),
        None => {
            // Without TCP_NODELAY the last frames of a streamed reply wait on a delayed ACK (~40 ms).
            let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            Box::pin(router.serve_with_incoming_shutdown(incoming, draining))
        }
    };
    tokio::pin!(server);

    // The listener is bound and accepting from here on.
    set_all(&reporter, &names, ServingStatus::Serving).await;
    if let Some(listener) = health_only_listener {
        let mut only = RoutesBuilder::default();
        only.add_service(health_for_only);
        tokio::spawn(serve_health_only(listener, only.routes(), health_only.clone()));
    }
    tracing::info!(addr = ?addr, services = ?names, tls = tls.is_some(), mtls = tls.as_ref().is_some_and(ServerTls::mutual), "serving");

    let grace = Duration::from_secs(config.shutdown_grace_secs);
    // The drain deadline is `grace` after the signal; both phases below share it.
    let deadline = {
        let shutdown = shutdown.clone();
        async move {
            shutdown.cancelled().await;
            tokio::time::sleep(grace).await
        }
    };
    let deadline = futures::FutureExt::fuse(deadline);
    tokio::pin!(deadline);
    tokio::select! {
        result = &mut server => result?,
        () = &mut deadline => {
            tracing::warn!(grace_secs = config.shutdown_grace_secs, "drain deadline passed; closing the remaining requests and streams");
        }
    }
    // Services' own draining (started at the signal) gets what is left of the grace period.
    if !futures::future::FusedFuture::is_terminated(&deadline) {
        tokio::select! {
            _ = drains => {}
            () = &mut deadline => tracing::warn!("drain deadline passed before the services finished draining"),
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// Empties a [`LocalServer`] when dropped.
struct StopLocal(LocalServer);

impl Drop for StopLocal {
    fn drop(&mut self) {
        self.0.clear();
    }
}

/// `server.health_listen`: plaintext, `grpc.health.v1.Health` only (no reflection, no auth: health
/// needs no token on the main listener either), for checkers that cannot speak TLS.
async fn serve_health_only(listener: TcpListener, health: tonic::service::Routes, stop: CancellationToken) {
    let addr = listener.local_addr().ok();
    tracing::info!(addr = ?addr, "serving grpc.health.v1.Health only, plaintext");
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let served =
        tonic::transport::Server::builder().add_routes(health).serve_with_incoming_shutdown(incoming, stop.cancelled_owned()).await;
    if let Err(error) = served {
        tracing::warn!(%error, "the health-only listener stopped");
    }
}

async fn set_all(reporter: &HealthReporter, names: &[&'static str], status: ServingStatus) {
    reporter.set_service_status("", status).await;
    for name in names {
        reporter.set_service_status(*name, status).await;
    }
}
