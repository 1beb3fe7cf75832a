//! The routes: which LangGraph endpoints are served (at the root and under `/api/`), and which
//! answer 501 naming what is missing.

pub mod run_routes;
pub mod system_routes;
pub mod thread_routes;
pub mod ui_routes;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{any, get, post};

use crate::edge::{Edge, unsupported};
use crate::error::ApiError;
use crate::request::answer_after_body;

/// Endpoints of the LangGraph API that Antler does not serve, with what is missing.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("/runs", "stateless runs (no thread): create a thread first (POST /threads), or use if_not_exists=create on /threads/{id}/runs"),
    (
        "/runs/stream",
        "stateless runs (no thread): create a thread first (POST /threads), or use if_not_exists=create on /threads/{id}/runs/stream",
    ),
    (
        "/runs/wait",
        "stateless runs (no thread): create a thread first (POST /threads), or use if_not_exists=create on /threads/{id}/runs/wait",
    ),
    ("/runs/batch", "batch run creation: create runs one by one"),
    ("/runs/cancel", "bulk cancellation: cancel runs one by one (POST /threads/{id}/runs/{run_id}/cancel)"),
    ("/runs/crons", "cron jobs: Antler does not schedule runs"),
    ("/runs/crons/search", "cron jobs: Antler does not schedule runs"),
    ("/runs/crons/count", "cron jobs: Antler does not schedule runs"),
    ("/runs/crons/{cron_id}", "cron jobs: Antler does not schedule runs"),
    ("/threads/{thread_id}/runs/crons", "cron jobs: Antler does not schedule runs"),
    ("/threads/count", "counting threads: page through POST /threads/search"),
    ("/threads/prune", "pruning threads: delete them one by one (DELETE /threads/{id})"),
    ("/threads/{thread_id}/copy", "copying threads"),
    (
        "/threads/{thread_id}/stream",
        "thread-level streams (all runs of a thread): join a run's stream (GET /threads/{id}/runs/{run_id}/stream)",
    ),
    ("/assistants", "creating assistants: the assistant is the agent runs.agent configures"),
    ("/assistants/count", "counting assistants: there is one (POST /assistants/search)"),
    ("/assistants/{assistant_id}/graph", "graph drawings: Antler's agent is a loop, not a LangGraph graph"),
    ("/assistants/{assistant_id}/schemas", "graph schemas: Antler's agent is a loop, not a LangGraph graph"),
    ("/assistants/{assistant_id}/subgraphs", "subgraphs: Antler's agent has none"),
    ("/assistants/{assistant_id}/subgraphs/{namespace}", "subgraphs: Antler's agent has none"),
    ("/assistants/{assistant_id}/versions", "assistant versions: the assistant is configured in antler.yaml"),
    ("/assistants/{assistant_id}/latest", "assistant versions: the assistant is configured in antler.yaml"),
    ("/store/items", "the key-value store: use the memory service (antler.memory.v1.MemoryService)"),
    ("/store/items/search", "the key-value store: use the memory service (antler.memory.v1.MemoryService)"),
    ("/store/namespaces", "the key-value store: use the memory service (antler.memory.v1.MemoryService)"),
    ("/mcp", "the MCP endpoint: Antler's agent is not exposed as an MCP server"),
    ("/a2a/{assistant_id}", "the A2A endpoint"),
];

/// The LangGraph endpoints Antler serves (what both mounts share).
fn served() -> Router<Arc<Edge>> {
    Router::new()
        .route("/ok", get(system_routes::ok))
        .route("/info", get(system_routes::info))
        .route("/assistants/search", post(system_routes::search_assistants).get(system_routes::search_assistants))
        .route(
            "/assistants/{assistant_id}",
            get(system_routes::get_assistant).patch(unsupported_assistant_change).delete(unsupported_assistant_change),
        )
        .route("/threads", post(thread_routes::create))
        .route("/threads/search", post(thread_routes::search))
        .route("/threads/{thread_id}", get(thread_routes::get).patch(thread_routes::patch).delete(thread_routes::delete))
        .route("/threads/{thread_id}/state", get(thread_routes::state).post(thread_routes::update_state).patch(unsupported_state_patch))
        .route("/threads/{thread_id}/state/checkpoint", post(thread_routes::state_at_checkpoint))
        .route("/threads/{thread_id}/state/{checkpoint_id}", get(thread_routes::state_at))
        .route("/threads/{thread_id}/history", post(thread_routes::history).get(thread_routes::history_get))
        .route("/threads/{thread_id}/runs", post(run_routes::create).get(run_routes::list))
        .route("/threads/{thread_id}/runs/stream", post(run_routes::stream))
        .route("/threads/{thread_id}/runs/wait", post(run_routes::wait))
        .route("/threads/{thread_id}/runs/{run_id}", get(run_routes::get).delete(run_routes::delete))
        .route("/threads/{thread_id}/runs/{run_id}/cancel", post(run_routes::cancel))
        .route("/threads/{thread_id}/runs/{run_id}/join", get(run_routes::join))
        .route("/threads/{thread_id}/runs/{run_id}/stream", get(run_routes::join_stream))
}

/// Where DeerFlow's same-origin deployment finds the LangGraph API: its Next.js rewrites send the
/// SDK's calls (`/api/langgraph/*`) to the gateway's `/api/*`, where the gateway serves them.
pub const API_PREFIX: &str = "/api";

/// The LangGraph API at the root (the SDKs pointed at the edge, `NEXT_PUBLIC_LANGGRAPH_BASE_URL`)
/// with the 501s naming what is missing, and again under [`API_PREFIX`] with the two gateway calls
/// DeerFlow's UI makes beside it (`ui_routes.rs`). The rest of `/api/` is DeerFlow's gateway's: its
/// routes are mounted beside these (server.rs), and the 501 list stays at the root so that
/// namespace is theirs.
pub fn router(edge: Arc<Edge>) -> Router {
    let mut root = served();
    for (path, capability) in UNSUPPORTED {
        let capability: &'static str = capability;
        root = root
            .route(path, any(move |edge: State<Arc<Edge>>, headers: HeaderMap, body: Body| unsupported(edge, headers, body, capability)));
    }
    let api = served()
        .route("/threads/{thread_id}/messages/page", get(ui_routes::messages_page))
        .route("/channels/providers", get(ui_routes::channel_providers))
        .route("/channels/connections", get(ui_routes::channel_connections));
    root.nest(API_PREFIX, api)
        .fallback(|State(edge): State<Arc<Edge>>, headers: HeaderMap, body: Body| async move {
            let answer = ApiError::not_found("this path (it is not a LangGraph API endpoint Antler knows)");
            answer_after_body(&headers, body, edge.config.max_body_bytes, answer).await
        })
        .with_state(edge)
}

async fn unsupported_assistant_change(edge: State<Arc<Edge>>, headers: HeaderMap, body: Body) -> ApiError {
    unsupported(edge, headers, body, "changing assistants: the assistant is the agent runs.agent configures in antler.yaml").await
}

async fn unsupported_state_patch(edge: State<Arc<Edge>>, headers: HeaderMap, body: Body) -> ApiError {
    unsupported(
        edge,
        headers,
        body,
        "patching a checkpoint's metadata (threads.patchState): checkpoints record who wrote them; change thread metadata with PATCH /threads/{id}",
    )
    .await
}
