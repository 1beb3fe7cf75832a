//! What every HTTP handler shares: the settings, the assistant this server runs, the gRPC clients of
//! the services the routes translate onto, and the gate every request passes (the concurrency limit,
//! authentication exactly as the gRPC stack does it, a span with the caller's trace).
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
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

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

/// JSON text of a value (serde_json cannot fail on a `Value`).
pub fn json_text(value: &serde_json::Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// A JSON response body.
pub fn json_body(value: &serde_json::Value) -> axum::body::Body {
    axum::body::Body::from(json_text(value))
}

/// A 200 JSON response.
pub fn json_response(value: &serde_json::Value) -> Response {
    let mut response = json_body(value).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A 501 naming `capability` (an endpoint Antler does not serve), answered once the request's body
/// is read and dropped — bounded by `edge.max_body_bytes`, 413 past it — so a client still uploading
/// sees the 501 rather than a reset connection, and can send its next request on the same one.
pub async fn unsupported(State(edge): State<Arc<Edge>>, headers: HeaderMap, body: axum::body::Body, capability: &'static str) -> ApiError {
    crate::request::answer_after_body(&headers, body, edge.config.max_body_bytes, ApiError::unsupported_endpoint(capability)).await
}

/// Paths served without credentials: liveness and the server's description (no user data), and the
/// gateway's sign-in routes (which check the credential they are given themselves).
fn is_public(path: &str) -> bool {
    matches!(path, "/ok" | "/info") || crate::gateway::auth::is_public(path)
}

/// The `endpoint` label of `antler_langgraph_requests_total`: a fixed word per kind of call (the
/// LangGraph API under `/api/` counts as at the root).
pub fn endpoint_of(path: &str) -> &'static str {
    if crate::gateway::is_gateway_path(path) {
        return "gateway";
    }
    let path = path.strip_prefix(crate::langgraph::routes::API_PREFIX).filter(|p| p.starts_with('/')).unwrap_or(path);
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["ok"] | ["info"] => "system",
        ["assistants", ..] => "assistants",
        ["threads", _, "runs", "stream"] | ["threads", _, "runs", _, "stream"] => "stream",
        ["threads", _, "runs", "wait"] => "wait",
        ["threads", _, "runs", _, "join"] => "join",
        ["threads", _, "runs", _, "cancel"] => "cancel",
        ["threads", _, "runs", ..] => "runs",
        ["threads", _, "state", ..] => "state",
        ["threads", _, "history"] | ["threads", _, "messages", "page"] => "history",
        ["threads", ..] => "threads",
        _ => "other",
    }
}

/// Counts each request by endpoint and HTTP status (both bounded sets), then passes it to [`admit`].
pub async fn gate(State(edge): State<Arc<Edge>>, request: Request, next: Next) -> Response {
    let endpoint = endpoint_of(request.uri().path());
    let response = admit(edge, request, next).await;
    metrics::counter!("antler_langgraph_requests_total", "endpoint" => endpoint, "status" => response.status().as_str().to_owned())
        .increment(1);
    response
}

/// Sheds load beyond `max_concurrent_requests` (429, not a queue), authenticates, and hands the
/// handler its [`Caller`].
async fn admit(edge: Arc<Edge>, mut request: Request, next: Next) -> Response {
    let Ok(permit) = edge.permits.clone().try_acquire_owned() else {
        return refuse(&edge, request, ApiError::busy(edge.config.max_concurrent_requests)).await;
    };
    let trace = TraceContext::from_traceparent(request.headers().get("traceparent").and_then(|v| v.to_str().ok()));
    let identity = if is_public(request.uri().path()) {
        Identity::local("anonymous")
    } else {
        // A browser signed in through the gateway presents its session cookie instead of a key.
        let session = match crate::gateway::session::cookie_headers(edge.auth.enabled(), request.method(), request.headers()) {
            Ok(session) => session,
            Err(error) => return refuse(&edge, request, error).await,
        };
        match edge.authenticate(session.as_ref().unwrap_or(request.headers())) {
            Ok(identity) => identity,
            Err(error) => return refuse(&edge, request, error).await,
        }
    };
    let span = tracing::info_span!("edge", method = %request.method(), path = %request.uri().path(), trace_id = %trace.trace_id_hex());
    request.extensions_mut().insert(Caller { identity, trace, permit: Arc::new(permit) });
    next.run(request).instrument(span).await
}

/// The gate's own refusal (busy, unauthenticated, a missing CSRF token), answered once the request's
/// body is read and dropped (at most `edge.max_body_bytes`): unread, it makes the server close the
/// connection after the answer, and a client that reuses the connection — a browser after a 403 —
/// sees it cut instead of an answer. Past the limit the reading stops and this refusal still answers.
async fn refuse(edge: &Edge, request: Request, error: ApiError) -> Response {
    let (parts, body) = request.into_parts();
    let _ = crate::request::discard_body(&parts.headers, body, edge.config.max_body_bytes).await;
    error.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_a_fixed_set_of_words() {
        assert_eq!(endpoint_of("/threads/t-1/runs/stream"), "stream");
        assert_eq!(endpoint_of("/threads/t-1/runs/r-1/stream"), "stream");
        assert_eq!(endpoint_of("/threads/t-1/runs/r-1"), "runs");
        assert_eq!(endpoint_of("/threads/t-1/state/c-1"), "state");
        assert_eq!(endpoint_of("/threads/search"), "threads");
        assert_eq!(endpoint_of("/store/items"), "other");
        assert_eq!(endpoint_of("/api/threads/search"), "threads");
        assert_eq!(endpoint_of("/api/threads/t-1/runs/r-1/stream"), "stream");
        assert_eq!(endpoint_of("/api/threads/t-1/messages/page"), "history");
        assert_eq!(endpoint_of("/apiary"), "other");
        assert_eq!(endpoint_of("/api/threads/t-1/uploads/list"), "gateway");
    }
}
