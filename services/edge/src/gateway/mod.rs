//! DeerFlow's gateway REST surface (`/api/*` and `/api/v1/auth/*`), the routes DeerFlow's web UI calls
//! beside the LangGraph API: models, uploads, artifacts, memory, skills, MCP configuration, features,
//! suggestions, run feedback, thread token usage, and the auth routes the UI probes first.
//!
//! Like the LangGraph routes, each handler is a thin translation onto the gRPC API of the service that
//! owns the data (sandbox, memory, models, mcp, runs), called as the caller: auth, ownership (another
//! user's object is 404, exactly like a missing one), validation and errors are that service's.
//! Paths, JSON shapes and status codes follow DeerFlow's `backend/app/gateway/routers/` and the UI's
//! `frontend/src/core/**/api.ts`. What Antler does not serve answers 501 naming the capability, and
//! `/api/features` reports it disabled first so the UI hides it.
//!
//! Files: one per resource (`auth.rs`, `models.rs`, `uploads.rs`, `artifacts.rs`, `memory.rs`,
//! `skills.rs`, `mcp.rs`, `features.rs`, `suggestions.rs`, `feedback.rs`, `usage.rs`, `changes.rs`),
//! `session.rs` (the browser session: cookie credential and CSRF check, used by the edge's gate), `login_limit.rs`
//! (bounds on failed sign-ins per username and client address), and this file:
//! the router, the 501 table, and the helpers every handler shares.

pub mod artifacts;
pub mod auth;
pub mod changes;
pub mod features;
pub mod feedback;
pub mod login_limit;
pub mod mcp;
pub mod memory;
pub mod models;
pub mod session;
pub mod skills;
pub mod suggestions;
pub mod uploads;
pub mod usage;

use std::sync::Arc;

use antler_kit::client::{CallContext, ServiceClient};
use axum::routing::{any, get, post};
use axum::{Extension, Router};

use crate::edge::{Caller, Edge};
use crate::error::ApiError;

/// DeerFlow gateway endpoints Antler does not serve, with the capability that is missing. Each
/// answers 501 `{"detail": "not supported by Antler: …", "code": "unsupported"}`; `/api/features`
/// reports the features disabled, so the UI does not call them.
pub const UNSUPPORTED: &[(&str, &str)] = &[
    ("/api/agents", "custom agents (agents_api): Antler runs the one agent runs.agent configures"),
    ("/api/agents/check", "custom agents (agents_api): Antler runs the one agent runs.agent configures"),
    ("/api/agents/{name}", "custom agents (agents_api): Antler runs the one agent runs.agent configures"),
    ("/api/agents/{name}/{*rest}", "custom agents (agents_api): Antler runs the one agent runs.agent configures"),
    ("/api/threads/{thread_id}/browser/{*rest}", "browser control: Antler has no live browser"),
    ("/api/threads/{thread_id}/mcp-tasks", "durable MCP tasks (mcp_tasks)"),
    ("/api/threads/{thread_id}/mcp-tasks/{*rest}", "durable MCP tasks (mcp_tasks)"),
    ("/api/threads/{thread_id}/scheduled-tasks", "scheduled tasks: Antler does not schedule runs"),
    ("/api/scheduled-tasks", "scheduled tasks: Antler does not schedule runs"),
    ("/api/scheduled-tasks/{*rest}", "scheduled tasks: Antler does not schedule runs"),
    ("/api/integrations/{*rest}", "integrations (Lark/Feishu skill pack)"),
    ("/api/input-polish", "input polishing"),
    ("/api/console/{*rest}", "the admin console's usage reports: use GET /api/threads/{id}/token-usage or Prometheus"),
    ("/api/webhooks/{*rest}", "GitHub webhooks"),
    ("/api/threads/{thread_id}/compact", "compacting a thread on request: the Summarization layer compacts as runs go"),
    ("/api/threads/{thread_id}/branches", "branching a thread from a turn: start a run from a checkpoint (checkpoint_id) instead"),
    ("/api/threads/{thread_id}/goal", "thread goals"),
    ("/api/runs/{run_id}/feedback", "listing feedback: SubmitFeedback stores one rating per user and run; there is no listing RPC"),
    ("/api/threads/{thread_id}/runs/{run_id}/feedback/stats", "feedback statistics: there is no listing RPC"),
    ("/api/threads/{thread_id}/runs/{run_id}/feedback/{feedback_id}", "deleting feedback by id: submit a new rating instead"),
    ("/api/skills/custom/{skill_name}/history", "the edit history of custom skills: Antler keeps none"),
    ("/api/skills/custom/{skill_name}/rollback", "rolling back custom skills: Antler keeps no edit history"),
    ("/api/memory/config", "the memory configuration: it is antler.yaml's memory section, not served over HTTP"),
    ("/api/memory/status", "the memory configuration: it is antler.yaml's memory section, not served over HTTP"),
    ("/api/v1/auth/register", "registering users: Antler's users are server.auth's API keys (or JWTs of your identity provider)"),
    ("/api/v1/auth/initialize", "creating the first admin: Antler's users are server.auth's API keys"),
    ("/api/v1/auth/change-password", "changing passwords: Antler's users sign in with an API key (server.auth.api_keys)"),
    ("/api/v1/auth/oauth/{provider}", "single sign-on: configure server.auth.jwt and sign in with a JWT of your identity provider"),
    ("/api/v1/auth/callback/{provider}", "single sign-on: configure server.auth.jwt and sign in with a JWT of your identity provider"),
];

/// The gateway's routes, to be merged beside the LangGraph API's (they share the gate and CORS). The
/// path parameters are named as the LangGraph routes name them (`thread_id`, `run_id`): the router
/// refuses two names for one segment.
pub fn router(edge: Arc<Edge>) -> Router {
    use axum::routing::{delete, put};
    // The sandbox's upload limits last seen, for a thread that has no sandbox yet (uploads.rs).
    let upload_limits = uploads::LastLimits::default();
    let mut router = Router::new()
        .route("/api/v1/auth/me", get(auth::me))
        .route("/api/v1/auth/providers", get(auth::providers))
        .route("/api/v1/auth/setup-status", get(auth::setup_status))
        .route("/api/v1/auth/login/local", post(auth::login))
        .route("/api/v1/auth/logout", post(auth::logout))
        .route("/api/features", get(features::get))
        .route("/api/models", get(models::list))
        .route("/api/models/{model_name}", get(models::get))
        .route("/api/threads/{thread_id}/uploads", post(uploads::upload).layer(Extension(upload_limits.clone())))
        // A file may be called `list` or `limits`: DELETE of those names still deletes it.
        .route("/api/threads/{thread_id}/uploads/list", get(uploads::list).delete(uploads::delete_list))
        .route(
            "/api/threads/{thread_id}/uploads/limits",
            get(uploads::limits).layer(Extension(upload_limits)).delete(uploads::delete_limits),
        )
        .route("/api/threads/{thread_id}/uploads/{filename}", delete(uploads::delete))
        .route("/api/threads/{thread_id}/artifacts/{*path}", get(artifacts::get).put(artifacts::put))
        .route("/api/memory", get(memory::get).delete(memory::clear))
        .route("/api/memory/reload", post(memory::get))
        .route("/api/memory/export", get(memory::export))
        .route("/api/memory/import", post(memory::import))
        .route("/api/memory/facts", post(memory::create_fact))
        .route("/api/memory/facts/{fact_id}", axum::routing::patch(memory::update_fact).delete(memory::delete_fact))
        .route("/api/skills", get(skills::list))
        .route("/api/skills/install", post(skills::install))
        .route("/api/skills/reload", post(skills::reload))
        .route("/api/skills/custom", get(skills::list_custom))
        .route("/api/skills/custom/{skill_name}", get(skills::get_custom).put(skills::edit_custom).delete(skills::delete_custom))
        .route("/api/skills/{skill_name}", get(skills::get).put(skills::set_enabled))
        .route("/api/mcp/config", get(mcp::get).put(mcp::put).patch(mcp::patch))
        .route("/api/mcp/cache/reset", post(mcp::reset))
        .route("/api/suggestions/config", get(suggestions::config))
        .route("/api/threads/{thread_id}/suggestions", post(suggestions::generate))
        .route("/api/threads/{thread_id}/token-usage", get(usage::thread))
        .route("/api/threads/{thread_id}/runs/{run_id}/feedback", put(feedback::upsert).post(feedback::create).delete(feedback::delete))
        .route("/api/threads/{thread_id}/runs/{run_id}/workspace-changes", get(changes::workspace_changes));
    for (path, capability) in UNSUPPORTED {
        let capability: &'static str = capability;
        router = router.route(
            path,
            any(move |edge: axum::extract::State<Arc<Edge>>, headers: axum::http::HeaderMap, body: axum::body::Body| {
                crate::edge::unsupported(edge, headers, body, capability)
            }),
        );
    }
    router.with_state(edge)
}

/// Reads (and drops) what is left of a request body before an early answer, at most 1 MiB. A body
/// left unread makes the server close the connection after the answer, and a client that is still
/// sending, or that sends its next request on the same connection, then sees it reset instead of the
/// answer.
pub async fn drain(body: axum::body::Body) {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut left: usize = 1024 * 1024;
    while let Some(Ok(chunk)) = stream.next().await {
        left = left.saturating_sub(chunk.len());
        if left == 0 {
            break;
        }
    }
}

/// Whether `path` is a gateway route (for the requests metric's `endpoint` label).
pub fn is_gateway_path(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api", "threads", _, rest, ..] => {
            matches!(
                *rest,
                "uploads"
                    | "artifacts"
                    | "suggestions"
                    | "token-usage"
                    | "browser"
                    | "mcp-tasks"
                    | "scheduled-tasks"
                    | "compact"
                    | "branches"
                    | "goal"
            ) || matches!(segments.as_slice(), ["api", "threads", _, "runs", _, "feedback" | "workspace-changes", ..])
        }
        ["api", "threads", ..] => false,
        ["api", "langgraph", ..] => false,
        ["api", "v1", "auth", ..] => true,
        ["api", first, ..] => !matches!(*first, "assistants"),
        _ => false,
    }
}

/// A call to one service the gateway translates onto, made as the caller (its token forwarded, or the
/// process's internal mark acting for its user), so the service checks auth and ownership itself.
pub struct Call {
    client: ServiceClient,
    context: CallContext,
}

impl Call {
    /// `service` is a `clients.*` name: `runs`, `sandbox`, `mcp`, `models` or `memory`.
    pub fn new(edge: &Edge, service: &'static str, caller: &Caller) -> Result<Self, ApiError> {
        let client = edge
            .clients
            .get(service)
            .cloned()
            .ok_or_else(|| ApiError::internal(format!("no `{service}` client is configured (clients.{service})")))?;
        Ok(Self { client, context: caller.context() })
    }

    pub fn channel(&self) -> antler_kit::transport::Transport {
        self.client.channel()
    }

    /// A unary call, with the client's `timeout_ms` as its deadline.
    pub fn unary<T>(&self, message: T) -> tonic::Request<T> {
        self.client.request(&self.context, message)
    }

    /// A call that moves a file (an upload, a download): no deadline of its own; it ends with the
    /// transfer or when the HTTP client goes away (the call is dropped).
    pub fn transfer<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = self.client.request(&self.context, message);
        request.metadata_mut().remove("grpc-timeout");
        request
    }
}

/// A refusal with a status of its own (413, 412, 415, 416, 400 …), naming the field it is about (in
/// `param`, and first in `detail`, as the edge's 422s do).
pub fn refused(status: axum::http::StatusCode, param: &str, detail: impl Into<String>) -> ApiError {
    let code = match status.as_u16() {
        400 | 422 => "invalid_argument",
        409 => "conflict",
        412 => "precondition_failed",
        413 => "payload_too_large",
        415 => "unsupported_media_type",
        416 => "range_not_satisfiable",
        _ => "refused",
    };
    ApiError { status, detail: format!("{param}: {}", detail.into()), code, param: Some(param.to_owned()), retry_after: None }
}

/// Whether the caller has a thread of this id (ThreadService.GetThread; another user's thread reads as
/// missing). A gateway route on a thread the caller has no sandbox for uses it to tell "nothing here
/// yet" from "no such thread".
pub async fn thread_exists(edge: &Edge, caller: &Caller, thread_id: &str) -> Result<bool, ApiError> {
    let request = antler_proto::runs::GetThreadRequest { thread_id: thread_id.to_owned() };
    match edge.threads().get_thread(edge.grpc(caller, request)).await {
        Ok(_) => Ok(true),
        Err(status) if status.code() == tonic::Code::NotFound => Ok(false),
        Err(status) => Err(status.into()),
    }
}

/// The thread's sandbox, created (directories on disk) or reactivated if needed: what the agent does
/// before its first tool call (SandboxService.AcquireSandbox, idempotent, per user and thread).
pub async fn acquire_sandbox(call: &Call, thread_id: &str) -> Result<antler_proto::sandbox::Sandbox, ApiError> {
    use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
    let request = antler_proto::sandbox::AcquireSandboxRequest { thread_id: thread_id.to_owned() };
    let reply = SandboxServiceClient::new(call.channel()).acquire_sandbox(call.unary(request)).await?.into_inner();
    reply.sandbox.ok_or_else(|| ApiError::internal("AcquireSandbox answered without a sandbox"))
}

/// Makes the caller's existing sandbox of the thread writable: one released since its last run (by
/// the run's end or the idle reaper) takes no writes until acquired again, which keeps its files. A
/// thread the caller has no sandbox for stays NOT_FOUND (404): nothing is created for it.
pub async fn writable_sandbox(call: &Call, thread_id: &str) -> Result<(), ApiError> {
    use antler_proto::sandbox::SandboxStatus;
    use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
    let request = antler_proto::sandbox::GetSandboxRequest { thread_id: thread_id.to_owned() };
    let reply = SandboxServiceClient::new(call.channel()).get_sandbox(call.unary(request)).await?.into_inner();
    if reply.sandbox.is_some_and(|s| s.status == SandboxStatus::Released as i32) {
        acquire_sandbox(call, thread_id).await?;
    }
    Ok(())
}

/// Percent-encodes one path segment as Python's `urllib.parse.quote(s, safe="")` does (DeerFlow's
/// `artifact_url`s): everything but `A-Z a-z 0-9 - . _ ~`.
pub fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A virtual path as a URL path: each segment encoded, the slashes kept.
pub fn encode_path(path: &str) -> String {
    path.split('/').map(encode_segment).collect::<Vec<_>>().join("/")
}

/// `/api/threads/{thread_id}/artifacts{virtual_path}`, the URL the UI fetches a file from.
pub fn artifact_url(thread_id: &str, virtual_path: &str) -> String {
    format!("/api/threads/{}/artifacts{}", encode_segment(thread_id), encode_path(virtual_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The router refuses overlapping routes only when it is built: build it as the server does.
    #[tokio::test]
    async fn the_gateway_mounts_beside_the_langgraph_api() {
        let config = antler_kit::config::ClientsConfig::default();
        let clients = antler_kit::client::Clients::from_config(&config, std::net::SocketAddr::from(([127, 0, 0, 1], 1))).expect("clients");
        let auth = antler_kit::auth::Authenticator::new(&antler_kit::auth::AuthConfig::default()).expect("auth");
        let assistant =
            crate::langgraph::convert::Assistant { kind: antler_runs::config::AgentKind::Lead, since: prost_types::Timestamp::default() };
        let edge = Arc::new(
            Edge::new(Default::default(), assistant, Vec::new(), auth, clients, tokio_util::sync::CancellationToken::new()).expect("edge"),
        );
        let _app: Router = crate::langgraph::routes::router(edge.clone()).merge(router(edge));
    }

    #[test]
    fn artifact_urls_encode_each_segment_like_deerflow() {
        assert_eq!(
            artifact_url("t-1", "/mnt/user-data/uploads/a b#?.pdf"),
            "/api/threads/t-1/artifacts/mnt/user-data/uploads/a%20b%23%3F.pdf"
        );
        assert_eq!(encode_segment("naïve.md"), "na%C3%AFve.md");
    }

    #[test]
    fn gateway_paths_are_told_from_langgraph_paths() {
        assert!(is_gateway_path("/api/models"));
        assert!(is_gateway_path("/api/v1/auth/me"));
        assert!(is_gateway_path("/api/threads/t/uploads/list"));
        assert!(is_gateway_path("/api/threads/t/artifacts/mnt/user-data/outputs/a.md"));
        assert!(is_gateway_path("/api/threads/t/runs/r/feedback"));
        assert!(!is_gateway_path("/api/threads/t/runs/r"));
        assert!(!is_gateway_path("/api/threads/search"));
        assert!(!is_gateway_path("/threads/t/uploads"));
        assert!(!is_gateway_path("/api/langgraph/threads"));
    }
}
