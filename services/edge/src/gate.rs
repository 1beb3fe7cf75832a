//! The gate every request passes before its route: the concurrency limit (429 beyond it, not a
//! queue), authentication (a key, a JWT or the gateway's session cookie), a span with the caller's
//! trace, and the request count by endpoint and status.

use std::sync::Arc;

use antler_kit::Identity;
use antler_kit::trace_context::TraceContext;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use crate::edge::{Caller, Edge};
use crate::error::ApiError;

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
    let Some(permit) = edge.try_admit() else {
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
