//! `tool_search` (offered when the MCP service defers its tools): finds deferred tools by DeerFlow's
//! query grammar (`select:a,b`, `+required rest`, or a regex over name and description; the MCP
//! service's SearchTools does the matching) and promotes what it finds into the next model calls. The
//! result is the found tools' schemas, so the model can call them right away.

use antler_proto::mcp::SearchToolsRequest;
use antler_proto::mcp::mcp_service_client::McpServiceClient;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput};
use crate::lead::run_env::RunEnv;

/// Most tools one search returns (DeerFlow's `MAX_RESULTS`; `select:` queries are not capped).
const MAX_RESULTS: u32 = 5;

#[derive(Debug)]
pub struct ToolSearch;

impl Tool for ToolSearch {
    fn name(&self) -> &'static str {
        "tool_search"
    }

    fn description(&self) -> &'static str {
        "Fetches full schema definitions for deferred tools so they can be called. Deferred tools are listed by name in \
         <available-deferred-tools> in the system prompt; until fetched, only the name is known and the tool cannot be invoked. \
         This tool takes a query, matches it against the deferred tool list, and returns the matched tools' complete definitions. \
         Once a tool's schema appears in the result, it is callable exactly like any tool defined at the top of the prompt.\n\n\
         Query forms:\n\
         - \"select:Read,Edit,Grep\" — fetch these exact tools by name\n\
         - \"notebook jupyter\" — keyword search, up to 5 best matches\n\
         - \"+slack send\" — require \"slack\" in the name, rank by the remaining terms"
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "description": "Query to find deferred tools. Use \"select:<tool_name>\" for direct selection, or keywords to search."
                }
            },
            "required": ["query"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let query = args.required("query")?;
            let client = env.ctx.clients().get("mcp").ok_or(ToolError::NoMcpClient)?;
            let request = client.request(&env.ctx.call_context(), SearchToolsRequest { query: query.clone(), max_results: MAX_RESULTS });
            let found = match McpServiceClient::new(client.channel()).search_tools(request).await {
                Ok(response) => response.into_inner(),
                Err(status) if status.code() == tonic::Code::InvalidArgument => {
                    return Ok(ToolOutput::error(format!("Error: {}", status.message())));
                }
                Err(status) => return Err(ToolError::Mcp(status)),
            };
            let tools: Vec<_> = found.tools.into_iter().filter(|t| t.deferred).collect();
            if tools.is_empty() {
                return Ok(ToolOutput::ok(format!("No tools found matching: {query}")));
            }
            let names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
            env.promote(&found.catalog_hash, &names);
            tracing::info!(run_id = %env.ctx.spec.run_id, tools = ?names, "deferred tools promoted");
            let schemas: Vec<Value> = tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.input_schema.as_ref().map(antler_kit::json::struct_to_json).unwrap_or_else(|| json!({"type": "object"})),
                    })
                })
                .collect();
            Ok(ToolOutput::ok(serde_json::to_string(&schemas).unwrap_or_default()))
        })
    }
}

/// The error result of a call to a deferred tool that `tool_search` has not promoted (DeerFlow's text).
pub fn not_promoted_text(name: &str) -> String {
    format!(
        "Error: Tool '{name}' is deferred and has not been promoted yet. Call tool_search first to fetch its schema (e.g. query \"select:{name}\")."
    )
}

/// The system prompt section that names the deferred tools (sorted, HTML-escaped, as DeerFlow does).
pub fn deferred_section(names: &[String]) -> String {
    let mut names: Vec<String> = names.iter().map(|n| n.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")).collect();
    names.sort();
    format!("\n\n<available-deferred-tools>\n{}\n</available-deferred-tools>", names.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_section_lists_sorted_names() {
        let section = deferred_section(&["b_tool".to_owned(), "a_tool".to_owned()]);
        assert_eq!(section, "\n\n<available-deferred-tools>\na_tool\nb_tool\n</available-deferred-tools>");
    }
}
