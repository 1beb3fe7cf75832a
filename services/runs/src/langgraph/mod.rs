//! The LangGraph-compatible HTTP + SSE edge: the subset of the LangGraph Agent Server API that
//! langgraph-sdk's thread, run, stream, join, wait, cancel, state and history calls use, served on
//! `runs.langgraph_api.listen` (off by default).
//!
//! It is a translation layer and nothing more: every call authenticates with the server's own
//! [`Authenticator`] (`Authorization: Bearer` or LangGraph's `x-api-key`), then calls the very same
//! `ThreadService` / `RunService` handlers the gRPC server mounts, in process, with the caller's
//! identity — so ownership, validation, admission, cancellation and streaming are the gRPC API's,
//! and their errors come back as the HTTP statuses LangGraph uses (`error.rs`).
//!
//! Files: `routes/` (one per resource), `run_request.rs` (run options → `CreateRunRequest`),
//! `stream.rs` (Antler events → SSE frames per stream mode), `messages.rs` and `convert.rs` (JSON
//! shapes), `request.rs` (body and query reading), `error.rs`, `config.rs`.

pub mod config;
pub mod convert;
pub mod error;
pub mod messages;
pub mod paging;
pub mod request;
pub mod routes;
pub mod run_request;
pub mod stream;

use std::net::SocketAddr;
use std::sync::Arc;

use antler_kit::Identity;
use antler_kit::auth::{AuthError, Authenticator};
use antler_kit::cli::BoxError;
use antler_kit::trace_context::TraceContext;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::api::runs::RunApi;
use crate::api::threads::ThreadApi;
use crate::engine::Engine;
use config::LangGraphApiConfig;
use convert::Assistant;
use error::ApiError;

/// What every handler shares.
pub struct Edge {
    pub engine: Arc<Engine>,
    pub threads: ThreadApi,
    pub runs: RunApi,
    pub auth: Authenticator,
    pub config: LangGraphApiConfig,
    pub assistant: Assistant,
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

impl Edge {
    /// A request to the in-process gRPC handlers, as the caller (what the kit's auth and trace
    /// layers put on a gRPC request).
    pub fn grpc<T>(&self, caller: &Caller, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.extensions_mut().insert(caller.identity.clone());
        request.extensions_mut().insert(caller.trace);
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
        self.auth.authenticate(headers).map_err(|error| {
            tracing::debug!(%error, "LangGraph edge request refused by authentication");
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

/// Paths served without credentials: liveness and the server's description (no user data).
fn is_public(path: &str) -> bool {
    matches!(path, "/ok" | "/info")
}

/// The `endpoint` label of `antler_langgraph_requests_total`: a fixed word per kind of call.
fn endpoint_of(path: &str) -> &'static str {
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
        ["threads", _, "history"] => "history",
        ["threads", ..] => "threads",
        _ => "other",
    }
}

/// Counts each request by endpoint and HTTP status (both bounded sets), then passes it to [`admit`].
async fn gate(State(edge): State<Arc<Edge>>, request: Request, next: Next) -> Response {
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
        return ApiError::busy(edge.config.max_concurrent_requests).into_response();
    };
    let trace = TraceContext::from_traceparent(request.headers().get("traceparent").and_then(|v| v.to_str().ok()));
    let identity = if is_public(request.uri().path()) {
        Identity::local("anonymous")
    } else {
        match edge.authenticate(request.headers()) {
            Ok(identity) => identity,
            Err(error) => return error.into_response(),
        }
    };
    let span = tracing::info_span!("langgraph", method = %request.method(), path = %request.uri().path(), trace_id = %trace.trace_id_hex());
    request.extensions_mut().insert(Caller { identity, trace, permit: Arc::new(permit) });
    next.run(request).instrument(span).await
}

/// The gRPC listener's rule for this one: no unauthenticated API beyond this machine unless a proxy
/// in front authenticates (`server.allow_insecure`).
fn check_bind(addr: SocketAddr, auth_enabled: bool, allow_insecure: bool) -> Result<(), String> {
    if !auth_enabled && !addr.ip().is_loopback() && !allow_insecure {
        return Err(format!(
            "refusing to serve the LangGraph API on {addr} without authentication (runs.langgraph_api.listen)\nhint: enable server.auth, listen on a loopback address, or set server.allow_insecure: true if a proxy in front authenticates"
        ));
    }
    Ok(())
}

/// Serves the edge when `runs.langgraph_api.listen` is set, until `engine.shutdown`. Returns the
/// address it listens on (None when off). Like the gRPC listener, a non-loopback address needs
/// authentication unless `server.allow_insecure` is set.
pub async fn start(
    engine: Arc<Engine>,
    threads: ThreadApi,
    runs: RunApi,
    ctx: &antler_kit::cli::ServiceContext,
) -> Result<Option<SocketAddr>, BoxError> {
    let config = engine.config.langgraph_api.clone();
    let Some(addr) = config.listen_addr()? else { return Ok(None) };
    check_bind(addr, ctx.auth.enabled(), ctx.config.server.allow_insecure)?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} (runs.langgraph_api.listen): {e}\nhint: is another process using the port?"))?;
    let local = listener.local_addr()?;
    let edge = Arc::new(Edge {
        assistant: Assistant { kind: engine.config.agent, since: crate::time::to_timestamp(crate::store::now_ms()) },
        permits: Arc::new(Semaphore::new(config.max_concurrent_requests as usize)),
        auth: ctx.auth.clone(),
        config,
        engine: engine.clone(),
        threads,
        runs,
    });
    let cors = edge.config.cors();
    let app = routes::router(edge.clone()).layer(axum::middleware::from_fn_with_state(edge, gate));
    // Outside the gate: a browser's preflight carries no credentials and is answered here.
    let app = match cors {
        Some(cors) => app.layer(cors),
        None => app,
    };
    let shutdown = engine.shutdown.clone();
    tokio::spawn(
        async move {
            if let Err(error) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
                tracing::error!(%error, "the LangGraph API server failed");
            }
        }
        .instrument(tracing::info_span!("langgraph_api", %local)),
    );
    tracing::info!(addr = %local, "serving the LangGraph API");
    Ok(Some(local))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unauthenticated_edge_stays_on_loopback_unless_allowed() {
        let public: SocketAddr = "0.0.0.0:2024".parse().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 2024)));
        let local: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 2024));
        assert!(check_bind(public, false, false).is_err_and(|e| e.contains("runs.langgraph_api.listen")));
        assert!(check_bind(public, true, false).is_ok());
        assert!(check_bind(public, false, true).is_ok());
        assert!(check_bind(local, false, false).is_ok());
    }

    #[test]
    fn endpoints_are_a_fixed_set_of_words() {
        assert_eq!(endpoint_of("/threads/t-1/runs/stream"), "stream");
        assert_eq!(endpoint_of("/threads/t-1/runs/r-1/stream"), "stream");
        assert_eq!(endpoint_of("/threads/t-1/runs/r-1"), "runs");
        assert_eq!(endpoint_of("/threads/t-1/state/c-1"), "state");
        assert_eq!(endpoint_of("/threads/search"), "threads");
        assert_eq!(endpoint_of("/store/items"), "other");
    }

    #[test]
    fn the_listen_setting_is_checked_by_name() {
        let bad = LangGraphApiConfig { listen: "localhost:2024".to_owned(), ..LangGraphApiConfig::default() };
        assert!(bad.validate().is_err_and(|e| e.to_string().contains("runs.langgraph_api.listen")));
        assert!(matches!(LangGraphApiConfig::default().listen_addr(), Ok(None)), "off by default");
        for bad in ["localhost:3000", "http://x/path", "ftp://x", "http://"] {
            let config = LangGraphApiConfig { cors_origins: vec![bad.to_owned()], ..LangGraphApiConfig::default() };
            assert!(config.validate().is_err_and(|e| e.to_string().contains("cors_origins[0]")), "{bad}");
        }
        let both = LangGraphApiConfig { cors_origins: vec!["*".to_owned(), "http://a".to_owned()], ..LangGraphApiConfig::default() };
        assert!(both.validate().is_err());
        let good = LangGraphApiConfig { cors_origins: vec!["http://localhost:3000/".to_owned()], ..LangGraphApiConfig::default() };
        assert!(good.validate().is_ok() && good.cors().is_some() && LangGraphApiConfig::default().cors().is_none());
        let zero = LangGraphApiConfig { max_concurrent_requests: 0, ..LangGraphApiConfig::default() };
        assert!(zero.validate().is_err_and(|e| e.to_string().contains("max_concurrent_requests")));
    }
}
