//! `GET /api/features`: which optional features this server serves, so DeerFlow's UI hides the rest
//! before it calls them. DeerFlow's own keys (`agents_api`, `browser_control`, `mcp_tasks`) come first;
//! the others say the same for the features the UI calls without asking (channels, scheduled tasks,
//! …), and `unsupported` lists every gateway path that answers 501 with the capability it lacks.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};

use crate::edge::Edge;
use crate::json::json_response;

pub async fn get(State(edge): State<Arc<Edge>>) -> Response {
    let off = json!({ "enabled": false });
    let on = json!({ "enabled": true });
    let unsupported: Vec<Value> =
        super::UNSUPPORTED.iter().map(|(path, capability)| json!({ "path": path, "capability": capability })).collect();
    json_response(&json!({
        "agents_api": off,
        "browser_control": off,
        "mcp_tasks": off,
        "channels": off,
        "scheduled_tasks": off,
        "integrations": off,
        "input_polish": off,
        "thread_branches": off,
        "thread_compact": off,
        "custom_skill_editing": off,
        "workspace_changes": off,
        "uploads": on,
        "artifacts": on,
        "memory": on,
        "skills": on,
        "mcp_config": on,
        "feedback": on,
        "token_usage": on,
        "suggestions": { "enabled": edge.config.gateway.suggestions.enabled },
        "auth": { "enabled": edge.auth.enabled(), "providers": [] },
        "unsupported": unsupported,
    }))
}
