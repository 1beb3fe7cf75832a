//! What every HTTP handler shares: the settings, the assistant this server runs, the gRPC clients of
//! the services the routes translate onto, and authentication exactly as the gRPC stack does it (the
//! gate every request passes is `gate.rs`).
//!
//! The edge owns no state of its own: each route is a call of the runs (or another service's) gRPC
//! API made as the caller — the caller's own token forwarded, or within one process the process's
//! internal mark acting for the caller's user (see `antler_kit::internal`) — so ownership, validation,
//! admission, cancellation and streaming are the gRPC API's, and its errors come back as HTTP statuses
//! in one table (`error.rs`).

use std::sync::Arc;

use antler_kit::Identity;
use antler_kit::auth::{AuthError, Authenticator};
use antler_kit::client::{CallContext, Clients, ServiceClient};
use antler_kit::trace_context::TraceContext;
use antler_kit::transport::Transport;
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::thread_service_client::ThreadServiceClient;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::EdgeConfig;
use crate::error::ApiError;
use crate::langgraph::convert::Assistant;

/// What every handler shares.
pub struct Edge {
    pub config: EdgeConfig,
    /// The one agent this server's runs service runs (`runs.agent`).
    pub assistant: Assistant,
    /// Run options passed on as `RunConfig.context` (`runs.context_keys`).
    pub context_keys: Vec<String>,
    pub auth: Authenticator,
    /// Cancelled when the server shuts down: open streams and waits end.
    pub shutdown: CancellationToken,
    /// Channels to the services (`clients.*`).
    pub clients: Clients,
    /// Failed browser sign-ins per username and client address (`edge.gateway.auth`).
    pub logins: crate::gateway::login_limit::LoginLimiter,
    runs: ServiceClient,
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for Edge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edge").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The authenticated caller of one request, and its share of `max_concurrent_requests` (a stream
/// keeps a clone until it closes).
#[derive(Debug, Clone)]
pub struct Caller {
    pub identity: Identity,
    pub trace: TraceContext,
    pub permit: Arc<OwnedSemaphorePermit>,
}

impl Caller {
    /// The caller as the gRPC clients present it.
    pub fn context(&self) -> CallContext {
        CallContext { identity: self.identity.clone(), trace: self.trace, run: None }
    }
}

impl Edge {
    pub fn new(
        config: EdgeConfig,
        assistant: Assistant,
        context_keys: Vec<String>,
        auth: Authenticator,
        clients: Clients,
        shutdown: CancellationToken,
    ) -> Result<Self, String> {
        let runs = clients.get("runs").cloned().ok_or("no `runs` client is configured (clients.runs)")?;
        let permits = Arc::new(Semaphore::new(config.max_concurrent_requests as usize));
        let logins = crate::gateway::login_limit::LoginLimiter::new(config.gateway.auth.clone());
        Ok(Self { config, assistant, context_keys, auth, shutdown, clients, logins, runs, permits })
    }

    /// A slot of `edge.max_concurrent_requests`, or none when all are taken.
    pub fn try_admit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    pub fn runs(&self) -> RunServiceClient<Transport> {
        RunServiceClient::new(self.runs.channel())
    }

    pub fn threads(&self) -> ThreadServiceClient<Transport> {
        ThreadServiceClient::new(self.runs.channel())
    }

    /// A unary call to the runs service as `caller`, with `clients.runs.timeout_ms` as its deadline.
    pub fn grpc<T>(&self, caller: &Caller, message: T) -> tonic::Request<T> {
        self.runs.request(&caller.context(), message)
    }

    /// A call that lasts as long as a run (a stream, a wait): no deadline of its own. It ends with the
    /// run, when the HTTP client goes away (the stream is dropped) or at shutdown.
    pub fn grpc_stream<T>(&self, caller: &Caller, message: T) -> tonic::Request<T> {
        let mut request = self.grpc(caller, message);
        request.metadata_mut().remove("grpc-timeout");
        request
    }

    /// Authenticates a request exactly as the gRPC stack does; LangGraph clients send their key as
    /// `x-api-key`, which counts as `Authorization: Bearer <key>` when no Authorization is given.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Identity, ApiError> {
        let mut effective;
        let headers = match (headers.get(header::AUTHORIZATION), headers.get("x-api-key")) {
            (None, Some(key)) => {
                effective = headers.clone();
                let bearer = key.to_str().ok().and_then(|k| HeaderValue::from_str(&format!("Bearer {}", k.trim())).ok());
                match bearer {
                    Some(value) => effective.insert(header::AUTHORIZATION, value),
                    None => return Err(ApiError::unauthenticated("malformed x-api-key header")),
                };
                &effective
            }
            _ => headers,
        };
        // The process's internal mark is for the services' own calls, never a browser's.
        if headers.contains_key(antler_kit::internal::INTERNAL_HEADER) {
            return Err(ApiError::unauthenticated("the x-antler-internal header is not accepted on the HTTP edge"));
        }
        self.auth.authenticate(headers).map_err(|error| {
            tracing::debug!(%error, "HTTP edge request refused by authentication");
            metrics::counter!("antler_auth_failures_total").increment(1);
            match error {
                AuthError::Missing => ApiError::unauthenticated(
                    "missing credentials\nhint: send `Authorization: Bearer <api key or JWT>` or `x-api-key: <api key>` (langgraph-sdk: get_client(url=…, api_key=…))",
                ),
                AuthError::ActAsForbidden => ApiError { status: axum::http::StatusCode::FORBIDDEN, ..ApiError::unauthenticated(error.to_string()) },
                other => ApiError::unauthenticated(other.to_string()),
            }
        })
    }
}

/// A 501 naming `capability` (an endpoint Antler does not serve), answered once the request's body
/// is read and dropped — bounded by `edge.max_body_bytes`, 413 past it — so a client still uploading
/// sees the 501 rather than a reset connection, and can send its next request on the same one.
pub async fn unsupported(State(edge): State<Arc<Edge>>, headers: HeaderMap, body: axum::body::Body, capability: &'static str) -> ApiError {
    crate::request::answer_after_body(&headers, body, edge.config.max_body_bytes, ApiError::unsupported_endpoint(capability)).await
}
