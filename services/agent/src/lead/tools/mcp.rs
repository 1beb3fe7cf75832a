//! MCP tools: the tools of the MCP servers the run's user may use, discovered through McpService at
//! the start of each attempt and called through it (the pool, its sessions, OAuth and argument checks
//! live in the MCP service; the agent only names the tool and passes the arguments).
//!
//! Every MCP call changes the world unless the server annotates the tool `readOnlyHint: true`: such
//! calls go through the side-effect journal (`tool_exec.rs`), so an attempt that resumes after a crash
//! is told "outcome unknown" instead of calling a remote tool a second time.
//!
//! When the MCP service marks its tools deferred (`mcp.tool_search.enabled`), they are left out of
//! the model's tool list until `tool_search` promotes them (see `tool_search.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use antler_proto::common::ToolSpec;
use antler_proto::mcp::mcp_service_client::McpServiceClient;
use antler_proto::mcp::tool_content::Content;
use antler_proto::mcp::{CallToolRequest, CallToolResponse, ListToolsRequest};
use futures::future::BoxFuture;
use serde_json::Value;

use super::{Args, Tool, ToolError, ToolOutput};
use crate::AgentContext;
use crate::lead::run_env::RunEnv;

/// Longest tool name model providers accept; longer MCP names are left out (and logged).
const MAX_NAME_CHARS: usize = 64;
/// Client deadline of a CallTool: above the MCP service's largest `tool_call_timeout` (1800 s), so the
/// server's own per-tool timeout is what bounds a call.
const CALL_DEADLINE: Duration = Duration::from_secs(1830);

/// One MCP tool as the model sees it.
#[derive(Debug)]
pub struct McpTool {
    spec: Arc<ToolSpec>,
    server: String,
    read_only: bool,
    deferred: bool,
}

/// The MCP tools of one attempt.
#[derive(Debug, Default)]
pub struct McpCatalog {
    pub tools: Vec<Arc<McpTool>>,
    /// The MCP service's hash of the deferred tools (promotions under another hash are stale).
    pub catalog_hash: String,
}

impl McpCatalog {
    pub fn deferred_names(&self) -> Vec<String> {
        self.tools.iter().filter(|t| t.deferred).map(|t| t.spec.name.clone()).collect()
    }
}

impl std::fmt::Display for McpCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} MCP tools ({} deferred)", self.tools.len(), self.tools.iter().filter(|t| t.deferred).count())
    }
}

impl McpTool {
    fn from_proto(tool: antler_proto::mcp::Tool) -> Self {
        let read_only = tool.annotations.as_ref().and_then(|a| a.read_only_hint).unwrap_or(false);
        // As JSON text (see `spec_with_schema`), converted once per attempt rather than per model call.
        let parameters_json = match &tool.input_schema {
            Some(schema) => antler_kit::json::struct_to_json_text_as(schema, antler_kit::json::Numbers::WholeAsInteger),
            None => r#"{"type":"object"}"#.to_owned(),
        };
        Self {
            spec: Arc::new(ToolSpec { name: tool.name, description: tool.description, parameters: None, parameters_json }),
            server: tool.server,
            read_only,
            deferred: tool.deferred,
        }
    }

    pub fn server(&self) -> &str {
        &self.server
    }
}

/// Lists the MCP tools the run's user sees. Without an MCP service (not mounted in this process, or
/// unreachable) the run goes on with the built-in tools; the reason is logged.
pub async fn discover(ctx: &AgentContext) -> McpCatalog {
    let Some(client) = ctx.clients().get("mcp") else { return McpCatalog::default() };
    let request = client.request(&ctx.call_context(), ListToolsRequest::default());
    let listing = match McpServiceClient::new(client.channel()).list_tools(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            // UNIMPLEMENTED: this process serves no MCP service (e.g. `antler-runs` alone with an empty
            // clients.mcp.endpoint); anything else is worth a warning.
            if status.code() == tonic::Code::Unimplemented {
                tracing::debug!(run_id = %ctx.spec.run_id, "no MCP service here; built-in tools only");
            } else {
                tracing::warn!(run_id = %ctx.spec.run_id, code = ?status.code(), "MCP tools not listed; built-in tools only: {}", status.message());
            }
            return McpCatalog::default();
        }
    };
    if !listing.unavailable_servers.is_empty() {
        tracing::warn!(run_id = %ctx.spec.run_id, servers = ?listing.unavailable_servers, "MCP servers unavailable for this run");
    }
    let mut tools = Vec::with_capacity(listing.tools.len());
    for tool in listing.tools {
        if tool.name.chars().count() > MAX_NAME_CHARS {
            tracing::warn!(run_id = %ctx.spec.run_id, tool = %tool.name, "MCP tool left out: its name is longer than {MAX_NAME_CHARS} characters, which model providers refuse");
            continue;
        }
        tools.push(Arc::new(McpTool::from_proto(tool)));
    }
    McpCatalog { tools, catalog_hash: listing.catalog_hash }
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn description(&self) -> &str {
        &self.spec.description
    }

    fn parameters(&self) -> Value {
        serde_json::from_str(&self.spec.parameters_json).unwrap_or_else(|_| serde_json::json!({"type": "object"}))
    }

    fn side_effect(&self) -> bool {
        !self.read_only
    }

    fn deferred(&self) -> bool {
        self.deferred
    }

    fn own_spec(&self) -> Option<Arc<ToolSpec>> {
        Some(self.spec.clone())
    }

    fn mcp_server(&self) -> Option<&str> {
        Some(&self.server)
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let client = env.ctx.clients().get("mcp").ok_or(ToolError::NoMcpClient)?;
            let arguments = antler_kit::json::json_to_value(&Value::Object(args.0.clone()));
            let arguments = match arguments.kind {
                Some(prost_types::value::Kind::StructValue(s)) => Some(s),
                _ => None,
            };
            let mut request = client.request(
                &env.ctx.call_context(),
                CallToolRequest {
                    tool_name: self.spec.name.clone(),
                    arguments,
                    thread_id: env.thread_id().to_owned(),
                    run_id: env.ctx.spec.run_id.clone(),
                    ..CallToolRequest::default()
                },
            );
            request.set_timeout(CALL_DEADLINE);
            let started = Instant::now();
            let result = McpServiceClient::new(client.channel()).call_tool(request).await;
            let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
            match result {
                Ok(response) => {
                    let response = response.into_inner();
                    tracing::info!(run_id = %env.ctx.spec.run_id, server = %self.server, tool = %self.spec.name, elapsed_ms, is_error = response.is_error, reused = response.session_reused, "MCP tool called");
                    metrics::histogram!("antler_agent_mcp_call_seconds", "server" => self.server.clone(), "outcome" => if response.is_error { "tool_error" } else { "ok" })
                        .record(elapsed_ms / 1e3);
                    let text = result_text(&response);
                    Ok(if response.is_error { ToolOutput::error(text) } else { ToolOutput::ok(text) })
                }
                Err(status) => {
                    tracing::warn!(run_id = %env.ctx.spec.run_id, server = %self.server, tool = %self.spec.name, code = ?status.code(), elapsed_ms, "MCP tool call failed: {}", status.message());
                    metrics::histogram!("antler_agent_mcp_call_seconds", "server" => self.server.clone(), "outcome" => "rpc_error")
                        .record(elapsed_ms / 1e3);
                    mcp_failure(&self.spec.name, status)
                }
            }
        })
    }
}

/// The result as the model reads it: text blocks as they are, other blocks described in one line
/// (the bytes of images and audio are not text a model can use here), the structured result as JSON
/// when there is nothing else.
pub fn result_text(response: &CallToolResponse) -> String {
    let mut parts = Vec::with_capacity(response.content.len());
    for block in &response.content {
        match &block.content {
            Some(Content::Text(t)) => parts.push(t.text.clone()),
            Some(Content::Image(i)) => parts.push(format!("[image: {}, {} bytes]", i.mime_type, i.data.len())),
            Some(Content::Audio(a)) => parts.push(format!("[audio: {}, {} bytes]", a.mime_type, a.data.len())),
            Some(Content::Resource(r)) => match &r.content {
                Some(antler_proto::mcp::embedded_resource::Content::Text(text)) => parts.push(format!("[resource {}]\n{text}", r.uri)),
                Some(antler_proto::mcp::embedded_resource::Content::Blob(blob)) => {
                    parts.push(format!("[resource {}: {}, {} bytes]", r.uri, r.mime_type, blob.len()))
                }
                None => parts.push(format!("[resource {}]", r.uri)),
            },
            Some(Content::ResourceLink(l)) => parts.push(format!("[resource link: {} {}]", l.name, l.uri)),
            None => {}
        }
    }
    if parts.is_empty()
        && let Some(structured) = &response.structured_content
    {
        return antler_kit::json::struct_to_json(structured).to_string();
    }
    parts.join("\n")
}

/// Failures the model can act on (bad arguments, a server that is down, a timeout) are `Error:`
/// results; the rest are tool errors (which ToolErrorHandling also turns into results).
fn mcp_failure(name: &str, status: tonic::Status) -> Result<ToolOutput, ToolError> {
    use tonic::Code;
    let message = status.message();
    match status.code() {
        Code::InvalidArgument => Ok(ToolOutput::error(format!("Error: invalid arguments for `{name}`: {message}"))),
        Code::NotFound | Code::FailedPrecondition => Ok(ToolOutput::error(format!("Error: `{name}` is not available: {message}"))),
        Code::Unavailable => Ok(ToolOutput::error(format!(
            "Error: the MCP server of `{name}` is unavailable right now: {message}. Try again later or do without it."
        ))),
        Code::DeadlineExceeded => Ok(ToolOutput::error(format!(
            "Error: `{name}` timed out: {message}. The call may still have taken effect on the server; check before calling it again."
        ))),
        Code::ResourceExhausted => Ok(ToolOutput::error(format!("Error: the result of `{name}` is too large: {message}"))),
        _ => Err(ToolError::Mcp(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use antler_proto::mcp::{ImageContent, TextContent, ToolContent};

    #[test]
    fn text_blocks_are_kept_and_binary_blocks_described() {
        let response = CallToolResponse {
            content: vec![
                ToolContent { content: Some(Content::Text(TextContent { text: "hello".to_owned() })) },
                ToolContent { content: Some(Content::Image(ImageContent { data: vec![0; 10], mime_type: "image/png".to_owned() })) },
            ],
            ..CallToolResponse::default()
        };
        assert_eq!(result_text(&response), "hello\n[image: image/png, 10 bytes]");
        let structured = CallToolResponse {
            structured_content: Some(antler_kit::json::json_text_to_struct(r#"{"city":"Oslo"}"#)),
            ..CallToolResponse::default()
        };
        assert_eq!(result_text(&structured), r#"{"city":"Oslo"}"#);
    }

    #[test]
    fn only_annotated_read_only_tools_skip_the_journal() {
        let tool = |hint: Option<bool>| {
            McpTool::from_proto(antler_proto::mcp::Tool {
                name: "s_t".to_owned(),
                annotations: hint.map(|h| antler_proto::mcp::ToolAnnotations { read_only_hint: Some(h), ..Default::default() }),
                ..Default::default()
            })
        };
        assert!(tool(None).side_effect());
        assert!(tool(Some(false)).side_effect());
        assert!(!tool(Some(true)).side_effect());
        assert_eq!(tool(None).spec.parameters_json, r#"{"type":"object"}"#, "a tool without a schema gets an empty object schema");
    }

    #[test]
    fn expected_failures_are_results_the_model_reads() {
        let out = mcp_failure("s_t", tonic::Status::invalid_argument("arguments.message: required")).ok();
        assert!(out.is_some_and(|o| o.is_error && o.text.contains("arguments.message")));
        assert!(mcp_failure("s_t", tonic::Status::internal("boom")).is_err());
    }
}
