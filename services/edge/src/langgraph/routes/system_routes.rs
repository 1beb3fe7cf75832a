//! `/ok`, `/info` and the assistants: the one agent this replica runs (`runs.agent`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use serde_json::{Value, json};

use crate::edge::Edge;
use crate::error::ApiError;
use crate::json::json_response;
use crate::request::{Fields, Query, read_body};

pub async fn ok() -> Response {
    json_response(&json!({ "ok": true }))
}

pub async fn info(State(edge): State<Arc<Edge>>) -> Response {
    json_response(&json!({
        "version": env!("CARGO_PKG_VERSION"),
        "server": "antler",
        "flags": { "assistants": true, "crons": false, "langsmith": false, "langsmith_tracing_replicas": false, "strict_resume": true },
        "host": { "kind": "antler", "assistant": edge.assistant.id() },
    }))
}

pub async fn get_assistant(State(edge): State<Arc<Edge>>, Path(assistant_id): Path<String>) -> Result<Response, ApiError> {
    if !edge.assistant.answers_to(&assistant_id) {
        return Err(ApiError::not_found(format!("assistant `{assistant_id}` (this server runs `{}`: runs.agent)", edge.assistant.id())));
    }
    Ok(json_response(&edge.assistant.to_json()))
}

/// `POST /assistants/search` (what the SDKs send) and `GET /assistants/search` (query parameters).
pub async fn search_assistants(
    State(edge): State<Arc<Edge>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let max = u64::from(edge.config.max_page);
    let max_offset = u64::from(edge.config.max_offset);
    let (graph_id, name, metadata, limit, offset) = if method == Method::GET {
        let query = Query::parse(raw.as_deref());
        let limit = query.integer("limit", 1, max).map_err(|e| e.naming_setting("edge.max_page"))?.unwrap_or(10);
        let offset = query.integer("offset", 0, max_offset).map_err(|e| e.naming_setting("edge.max_offset"))?.unwrap_or(0);
        (query.last("graph_id").map(str::to_owned), query.last("name").map(str::to_owned), None, limit, offset)
    } else {
        let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
        let graph_id = fields.string("graph_id")?;
        let name = fields.string("name")?;
        let metadata = fields.object("metadata")?;
        let limit = fields.integer("limit", 1, max).map_err(|e| e.naming_setting("edge.max_page"))?.unwrap_or(10);
        let offset = fields.integer("offset", 0, max_offset).map_err(|e| e.naming_setting("edge.max_offset"))?.unwrap_or(0);
        // One assistant: any order is the order; which fields come back is all of them.
        fields.choice("sort_by", &["assistant_id", "graph_id", "name", "created_at", "updated_at"])?;
        fields.choice("sort_order", &["asc", "desc"])?;
        fields.take("select");
        fields.finish("an assistant search")?;
        (graph_id, name, metadata, limit, offset)
    };
    let assistant = edge.assistant.to_json();
    let matches = graph_id.is_none_or(|g| g == edge.assistant.graph_id())
        && name.is_none_or(|n| edge.assistant.id().contains(n.as_str()))
        && metadata.is_none_or(|m| m.iter().all(|(k, v)| assistant["metadata"].get(k) == Some(v)));
    let found: Vec<Value> = if matches && offset == 0 && limit > 0 { vec![assistant] } else { Vec::new() };
    Ok(json_response(&Value::Array(found)))
}
