//! `/api/mcp/config`: the MCP servers in DeerFlow's `{mcp_servers: {name: entry}}` shape, through the MCP
//! service, which owns `extensions_config.json`. GET answers the file's entries as written (GetConfig,
//! secrets read "***") for an operator (`mcp.operators`; empty: every user), and for anyone else the
//! servers they see (ListServers) without commands or URLs. PUT replaces the file's servers and PATCH
//! turns one on or off (UpdateConfig: checked, written atomically, applied at once; "***" keeps a stored
//! secret). What each server is doing now is beside the entries, under `status`, so that a PUT of what
//! GET answered writes back only configuration.

use std::sync::Arc;

use antler_proto::mcp::mcp_service_client::McpServiceClient;
use antler_proto::mcp::{
    GetConfigRequest, ListServersRequest, ReloadConfigRequest, ReloadConfigResponse, ServerStatus, Transport, UpdateConfigRequest,
};
use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::Call;
use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::request::{Fields, read_body};

fn transport(value: i32) -> &'static str {
    match Transport::try_from(value).unwrap_or(Transport::Unspecified) {
        Transport::Stdio => "stdio",
        Transport::Sse => "sse",
        Transport::StreamableHttp => "http",
        Transport::Unspecified => "unknown",
    }
}

fn status(value: i32) -> &'static str {
    match ServerStatus::try_from(value).unwrap_or(ServerStatus::Unspecified) {
        ServerStatus::Disabled => "disabled",
        ServerStatus::Pending => "pending",
        ServerStatus::Ready => "ready",
        ServerStatus::Error => "error",
        ServerStatus::Unspecified => "unknown",
    }
}

fn client(call: &Call) -> McpServiceClient<antler_kit::transport::Transport> {
    McpServiceClient::new(call.channel())
}

fn struct_json(value: Option<&prost_types::Struct>) -> Map<String, Value> {
    match value.map(antler_kit::json::struct_to_json) {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

fn reload_json(reload: Option<&ReloadConfigResponse>) -> Value {
    let Some(r) = reload else { return Value::Null };
    let errors: Vec<Value> = r.errors.iter().map(|e| json!({ "server": e.server, "message": e.message })).collect();
    json!({
        "changed": r.changed,
        "added_servers": r.added_servers,
        "removed_servers": r.removed_servers,
        "changed_servers": r.changed_servers,
        "sessions_closed": r.sessions_closed,
        "errors": errors,
    })
}

/// `GET /api/mcp/config`.
pub async fn get(State(edge): State<Arc<Edge>>, Extension(caller): Extension<Caller>) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "mcp", &caller)?;
    let listed = client(&call).list_servers(call.unary(ListServersRequest {})).await?.into_inner();
    let mut states = Map::new();
    let mut seen = Map::new();
    for server in &listed.servers {
        states.insert(
            server.name.clone(),
            json!({
                "status": status(server.status),
                "tool_count": server.tool_count,
                "last_error": if server.last_error.is_empty() { Value::Null } else { json!(server.last_error) },
            }),
        );
        seen.insert(
            server.name.clone(),
            json!({
                "enabled": server.enabled,
                "type": transport(server.transport),
                "description": server.description,
                "tool_name_prefix": server.tool_name_prefix,
            }),
        );
    }
    let errors: Vec<Value> = listed.errors.iter().map(|e| json!({ "server": e.server, "message": e.message })).collect();
    let (servers, inline, editable) = match client(&call).get_config(call.unary(GetConfigRequest {})).await {
        Ok(reply) => {
            let reply = reply.into_inner();
            (struct_json(reply.servers.as_ref()), reply.inline_servers, true)
        }
        // Not an operator: the servers this user sees, as ListServers describes them.
        Err(status) if status.code() == tonic::Code::PermissionDenied => (seen, Vec::new(), false),
        Err(status) => return Err(status.into()),
    };
    Ok(json_response(&json!({
        "mcp_servers": servers,
        "inline_servers": inline,
        "editable": editable,
        "status": states,
        "config_hash": listed.config_hash,
        "errors": errors,
    })))
}

async fn update(edge: &Edge, caller: &Caller, servers: Map<String, Value>, replace: bool) -> Result<Response, ApiError> {
    let call = Call::new(edge, "mcp", caller)?;
    let request = UpdateConfigRequest { servers: Some(struct_of(servers)), replace };
    let reply = client(&call).update_config(call.unary(request)).await?.into_inner();
    Ok(json_response(&json!({ "mcp_servers": struct_json(reply.servers.as_ref()), "reload": reload_json(reply.reload.as_ref()) })))
}

fn struct_of(map: Map<String, Value>) -> prost_types::Struct {
    match antler_kit::json::json_to_value(&Value::Object(map)).kind {
        Some(prost_types::value::Kind::StructValue(s)) => s,
        _ => prost_types::Struct::default(),
    }
}

/// `PUT /api/mcp/config` with `{mcp_servers: {name: entry}}`: the file's servers become exactly these.
pub async fn put(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let servers = fields.object("mcp_servers")?.ok_or_else(|| ApiError::invalid("mcp_servers", "is required: the servers by name"))?;
    // What GET answered beside the entries may come back with them; it is not configuration.
    for key in ["inline_servers", "editable", "status", "config_hash", "errors"] {
        fields.take(key);
    }
    fields.finish("an MCP configuration")?;
    for (name, entry) in &servers {
        if !entry.is_object() {
            return Err(ApiError::invalid(&format!("mcp_servers.{name}"), "must be an object (the server's entry)"));
        }
    }
    update(&edge, &caller, servers, true).await
}

/// `PATCH /api/mcp/config` with `{server_name, enabled}`: one server on or off.
pub async fn patch(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let name = fields.string("server_name")?.filter(|n| !n.is_empty()).ok_or_else(|| ApiError::invalid("server_name", "is required"))?;
    let enabled = fields.bool("enabled")?.ok_or_else(|| ApiError::invalid("enabled", "is required: true or false"))?;
    fields.finish("an MCP server update")?;
    let mut servers = Map::new();
    servers.insert(name, json!({ "enabled": enabled }));
    update(&edge, &caller, servers, false).await
}

/// `POST /api/mcp/cache/reset`: ReloadConfig with `force`, which closes every pooled session and
/// rediscovers the tools (403 unless the caller is one of `mcp.operators`, when that list is set).
pub async fn reset(State(edge): State<Arc<Edge>>, Extension(caller): Extension<Caller>) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "mcp", &caller)?;
    let reply = client(&call).reload_config(call.unary(ReloadConfigRequest { force: true })).await?.into_inner();
    Ok(json_response(&json!({
        "success": true,
        "message": format!("MCP tools cache reset: {} session(s) closed; tools reload on next use.", reply.sessions_closed),
    })))
}
