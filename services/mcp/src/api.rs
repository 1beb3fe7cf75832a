//! Thin tonic handlers for `antler.mcp.v1`: read the caller, check the request's own fields, call the
//! [`Hub`], convert. Errors become statuses in one place (`impl From<McpError> for Status`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use antler_kit::Identity;
use antler_kit::json::{self, Numbers};
use antler_proto::mcp::*;
use prost::Message as _;
use tonic::{Request, Response, Status};

use crate::catalog::ToolEntry;
use crate::content;
use crate::error::McpError;
use crate::pool::breaker;
use crate::search;
use crate::servers::Status as LifeStatus;
use crate::service::{CallInput, Hub, NotReady};
use crate::spec::TransportKind;

/// `antler.mcp.v1.McpService`.
#[derive(Debug, Clone)]
pub struct McpApi {
    hub: Arc<Hub>,
}

impl McpApi {
    pub fn new(hub: Arc<Hub>) -> Self {
        Self { hub }
    }
}

fn user<T>(request: &Request<T>) -> Result<String, Status> {
    Ok(Identity::of(request)?.user_id.clone())
}

/// What applying a configuration changed, as ReloadConfig (and UpdateConfig) answer it.
fn reload_response(report: crate::service::ReloadReport) -> ReloadConfigResponse {
    ReloadConfigResponse {
        changed: report.changed,
        added_servers: report.added,
        removed_servers: report.removed,
        changed_servers: report.changed_servers,
        errors: report.problems.iter().map(|p| ConfigError { server: p.server.clone(), message: p.to_string() }).collect(),
        sessions_closed: report.sessions_closed,
        config_hash: report.hash,
    }
}

fn timestamp(time: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(time)
}

fn transport(kind: TransportKind) -> Transport {
    match kind {
        TransportKind::Stdio => Transport::Stdio,
        TransportKind::Sse => Transport::Sse,
        TransportKind::Http => Transport::StreamableHttp,
    }
}

fn tool_message(tool: &ToolEntry, deferred: bool) -> Tool {
    Tool {
        name: tool.name.clone(),
        original_name: tool.original.clone(),
        description: tool.description.clone(),
        input_schema: Some(json::map_to_struct(&tool.input_schema)),
        output_schema: tool.output_schema.as_ref().map(json::map_to_struct),
        server: tool.server.clone(),
        deferred,
        annotations: tool.annotations.as_ref().map(|a| antler_proto::mcp::ToolAnnotations {
            title: a.title.clone(),
            read_only_hint: a.read_only,
            destructive_hint: a.destructive,
            idempotent_hint: a.idempotent,
            open_world_hint: a.open_world,
        }),
    }
}

fn not_ready(servers: &[(String, NotReady)]) -> Vec<NotReadyServer> {
    servers
        .iter()
        .map(|(server, why)| {
            let (reason, error, starting_for) = match why {
                NotReady::Starting(running) => (NotReadyReason::Starting, String::new(), prost_types::Duration::try_from(*running).ok()),
                NotReady::Failed(error) => (NotReadyReason::Failed, error.clone(), None),
                NotReady::BreakerOpen(error) => (NotReadyReason::BreakerOpen, error.clone(), None),
            };
            NotReadyServer { server: server.clone(), reason: reason as i32, error, starting_for }
        })
        .collect()
}

/// Thread ids become directory names: the sandbox's rule.
fn check_thread_id(thread_id: &str) -> Result<(), McpError> {
    let ok = (1..=64).contains(&thread_id.len()) && thread_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok { Ok(()) } else { Err(McpError::invalid("thread_id", "must match ^[A-Za-z0-9_-]{1,64}$")) }
}

/// Longest run_id / tool_call_id kept for logs.
const MAX_ID_LEN: usize = 256;

#[tonic::async_trait]
impl mcp_service_server::McpService for McpApi {
    async fn list_servers(&self, request: Request<ListServersRequest>) -> Result<Response<ListServersResponse>, Status> {
        let user = user(&request)?;
        let snapshot = self.hub.snapshot();
        let servers = self
            .hub
            .visible(&snapshot, &user)
            .iter()
            .map(|runtime| {
                let spec = &runtime.spec;
                let view = runtime.view();
                ServerInfo {
                    name: spec.name.clone(),
                    transport: transport(spec.transport) as i32,
                    enabled: spec.enabled,
                    status: match view.status {
                        LifeStatus::Disabled => ServerStatus::Disabled,
                        LifeStatus::Pending => ServerStatus::Pending,
                        LifeStatus::Ready => ServerStatus::Ready,
                        LifeStatus::Error => ServerStatus::Error,
                    } as i32,
                    tool_count: u32::try_from(view.tool_count).unwrap_or(u32::MAX),
                    last_error: view.last_error.as_ref().map(|(m, _)| m.clone()).unwrap_or_default(),
                    last_error_at: view.last_error.as_ref().map(|(_, at)| timestamp(*at)),
                    discovered_at: view.discovered_at.map(timestamp),
                    description: spec.description.clone(),
                    oauth_enabled: spec.oauth.is_some(),
                    tool_name_prefix: spec.tool_name_prefix,
                    protocol_version: view.protocol_version,
                }
            })
            .collect();
        let errors = snapshot.problems.iter().map(|p| ConfigError { server: p.server.clone(), message: p.to_string() }).collect();
        Ok(Response::new(ListServersResponse {
            servers,
            config_hash: snapshot.hash.clone(),
            loaded_at: Some(timestamp(snapshot.loaded_at)),
            errors,
        }))
    }

    async fn list_tools(&self, request: Request<ListToolsRequest>) -> Result<Response<ListToolsResponse>, Status> {
        let user = user(&request)?;
        let server = request.into_inner().server;
        let listing = self.hub.list_tools(&user, (!server.is_empty()).then_some(server.as_str())).await?;
        let deferred = self.hub.config().tool_search.enabled;
        Ok(Response::new(ListToolsResponse {
            tools: listing.tools.iter().map(|t| tool_message(t, deferred)).collect(),
            unavailable_servers: listing.not_ready.iter().map(|(server, _)| server.clone()).collect(),
            catalog_hash: listing.catalog_hash,
            not_ready: not_ready(&listing.not_ready),
        }))
    }

    async fn search_tools(&self, request: Request<SearchToolsRequest>) -> Result<Response<SearchToolsResponse>, Status> {
        let user = user(&request)?;
        let req = request.into_inner();
        if req.query.trim().is_empty() || req.query.chars().count() > search::MAX_QUERY_CHARS {
            // Checked before any discovery starts.
            search::search(&[], &req.query, 0)?;
        }
        let listing = self.hub.list_tools(&user, None).await?;
        let found = search::search(&listing.tools, &req.query, req.max_results)?;
        let deferred = self.hub.config().tool_search.enabled;
        Ok(Response::new(SearchToolsResponse {
            tools: found.tools.iter().map(|t| tool_message(t, deferred)).collect(),
            query_kind: match found.kind {
                search::QueryKind::Select => QueryKind::Select,
                search::QueryKind::RequiredKeyword => QueryKind::RequiredKeyword,
                search::QueryKind::Regex => QueryKind::Regex,
                search::QueryKind::Literal => QueryKind::Literal,
            } as i32,
            missing_names: found.missing,
            catalog_hash: listing.catalog_hash,
            not_ready: not_ready(&listing.not_ready),
        }))
    }

    async fn call_tool(&self, request: Request<CallToolRequest>) -> Result<Response<CallToolResponse>, Status> {
        let user = user(&request)?;
        let req = request.into_inner();
        if req.tool_name.is_empty() {
            return Err(McpError::invalid("tool_name", "is required").into());
        }
        if req.tool_name.len() > 256 {
            return Err(McpError::invalid("tool_name", "is longer than 256 bytes").into());
        }
        if !req.thread_id.is_empty() {
            check_thread_id(&req.thread_id)?;
        }
        for (field, value) in [("run_id", &req.run_id), ("tool_call_id", &req.tool_call_id)] {
            if value.len() > MAX_ID_LEN {
                return Err(McpError::invalid(field, format!("is longer than {MAX_ID_LEN} bytes")).into());
            }
        }
        let config = self.hub.config();
        let timeout = match req.timeout {
            None => None,
            Some(d) => {
                let max = config.calls.max_timeout_secs;
                let out_of_range = || McpError::invalid("timeout", format!("must be > 0 and <= {max}s (mcp.calls.max_timeout_secs)"));
                let d = Duration::try_from(d).map_err(|_| out_of_range())?;
                if d.is_zero() || d > Duration::from_secs(max) {
                    return Err(out_of_range().into());
                }
                Some(d)
            }
        };
        let input = CallInput {
            tool_name: req.tool_name,
            arguments: req.arguments.as_ref().map(|s| json::struct_to_map(s, Numbers::WholeAsInteger)).unwrap_or_default(),
            thread_id: (!req.thread_id.is_empty()).then_some(req.thread_id),
            timeout,
            run_id: req.run_id,
            tool_call_id: req.tool_call_id,
        };
        let output = self.hub.call(&user, input).await?;
        let mut result = serde_json::to_value(&output.result).unwrap_or_default();
        if let Some(structured) = result.get_mut("structuredContent") {
            content::rewrite_json(structured, &output.rewrites);
        }
        let content = result
            .get("content")
            .and_then(|c| c.as_array())
            .map(|blocks| blocks.iter().map(|b| content::block(b, &output.rewrites)).collect())
            .unwrap_or_default();
        let structured_content = match result.get("structuredContent") {
            Some(serde_json::Value::Object(map)) => Some(json::map_to_struct(map)),
            // A non-object structured result (allowed since 2026-07-28) is wrapped so nothing is lost.
            Some(serde_json::Value::Null) | None => None,
            Some(other) => Some(json::map_to_struct(&serde_json::Map::from_iter([("result".to_owned(), other.clone())]))),
        };
        let response = CallToolResponse {
            content,
            is_error: output.result.is_error == Some(true),
            structured_content,
            server: output.server,
            original_name: output.original_name,
            duration: prost_types::Duration::try_from(output.duration).ok(),
            session_reused: output.session_reused,
            session_reinitialized: output.session_reinitialized,
        };
        let size = response.encoded_len();
        let limit = config.calls.max_result_bytes as usize;
        if size > limit {
            return Err(McpError::ResourceExhausted(format!(
                "the result of `{}` is {size} bytes, over the limit of {limit} (mcp.calls.max_result_bytes)",
                response.original_name
            ))
            .into());
        }
        Ok(Response::new(response))
    }

    async fn reload_config(&self, request: Request<ReloadConfigRequest>) -> Result<Response<ReloadConfigResponse>, Status> {
        let user = user(&request)?;
        if !self.hub.may_reload(&user) {
            return Err(McpError::PermissionDenied(format!("user `{user}` may not reload the MCP config (mcp.operators)")).into());
        }
        let report = self.hub.reload(None, request.into_inner().force).await?;
        Ok(Response::new(reload_response(report)))
    }

    async fn get_config(&self, request: Request<GetConfigRequest>) -> Result<Response<GetConfigResponse>, Status> {
        let user = user(&request)?;
        let (servers, inline_servers, config_hash) = self.hub.get_config(&user).await?;
        Ok(Response::new(GetConfigResponse { servers: Some(json::map_to_struct(&servers)), inline_servers, config_hash }))
    }

    async fn update_config(&self, request: Request<UpdateConfigRequest>) -> Result<Response<UpdateConfigResponse>, Status> {
        let user = user(&request)?;
        let request = request.into_inner();
        let servers = match request.servers.as_ref().map(|s| json::struct_to_map(s, Numbers::WholeAsInteger)) {
            Some(map) if !map.is_empty() || request.replace => map,
            None if request.replace => serde_json::Map::new(),
            _ => return Err(McpError::invalid("servers", "is required: the entries to change, by server name").into()),
        };
        let (servers, report) = self.hub.update_config(&user, servers, request.replace).await?;
        Ok(Response::new(UpdateConfigResponse { servers: Some(json::map_to_struct(&servers)), reload: Some(reload_response(report)) }))
    }

    async fn get_pool_stats(&self, request: Request<GetPoolStatsRequest>) -> Result<Response<GetPoolStatsResponse>, Status> {
        use crate::pool::counters::Counters as C;
        let user = user(&request)?;
        let server = request.into_inner().server;
        let stats = self.hub.stats(&user, (!server.is_empty()).then_some(server.as_str()))?;
        let mut response = GetPoolStatsResponse {
            capacity: u32::try_from(self.hub.pool().settings().max_sessions).unwrap_or(u32::MAX),
            since: Some(timestamp(self.hub.started)),
            ..GetPoolStatsResponse::default()
        };
        for s in &stats {
            let c = &s.runtime.counters;
            let line = ServerPoolStats {
                server: s.runtime.spec.name.clone(),
                sessions_open: s.sessions.open(),
                hits: C::get(&c.hits),
                misses: C::get(&c.misses),
                evictions: C::get(&c.evictions),
                reinitializations: C::get(&c.reinitializations),
                creation_failures: C::get(&c.creation_failures),
                in_flight_calls: c.in_flight.load(std::sync::atomic::Ordering::Relaxed),
                circuit_state: match s.runtime.breaker.state() {
                    breaker::CircuitState::Closed => CircuitState::Closed,
                    breaker::CircuitState::Open => CircuitState::Open,
                    breaker::CircuitState::HalfOpen => CircuitState::HalfOpen,
                } as i32,
                creations: C::get(&c.creations),
                sessions_idle: s.sessions.idle,
                sessions_busy: s.sessions.busy,
                sessions_starting: s.sessions.creating,
                expirations: C::get(&c.expirations),
                restarts: C::get(&c.restarts),
            };
            response.sessions_open += line.sessions_open;
            response.hits += line.hits;
            response.misses += line.misses;
            response.evictions += line.evictions;
            response.creations += line.creations;
            response.per_server.push(line);
        }
        let calls = response.hits + response.misses;
        response.hit_ratio = if calls == 0 { 0.0 } else { response.hits as f64 / calls as f64 };
        Ok(Response::new(response))
    }
}
