//! `web_search` (`runs.lead.web.search`): one query to the configured provider, answered by a JSON
//! list of `{title, url, snippet}` as DeerFlow's search tools answer. A provider that fails (a refused
//! key, a rate limit, an outage, a timeout) is an `Error:` result the model reads, never a failed run.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::web::providers::SearchProvider;
use super::{Args, Tool, ToolError, ToolOutput};
use crate::lead::run_env::RunEnv;

/// Longest query sent (the APIs' own limits are 400 characters and up).
pub const MAX_QUERY_CHARS: usize = 400;

#[derive(Debug)]
pub struct WebSearch {
    pub provider: Arc<dyn SearchProvider>,
    /// Results per call, and the most a call may ask for.
    pub max_results: u32,
}

/// The query of a search tool's call: trimmed, present, at most [`MAX_QUERY_CHARS`].
pub fn query(args: &Args) -> Result<String, ToolOutput> {
    let query = args.string("query").unwrap_or_default();
    let query = query.trim();
    if query.is_empty() {
        return Err(ToolOutput::error("Error: `query` is empty; say what to search for"));
    }
    Ok(query.chars().take(MAX_QUERY_CHARS).collect())
}

/// `max_results` of a call, within 1..=`configured`.
pub fn count(args: &Args, configured: u32) -> u32 {
    args.number("max_results").map_or(configured, |n| n.clamp(1, u64::from(configured)) as u32)
}

/// Runs `work` unless the run stops first.
pub async fn unless_stopped<T>(env: &RunEnv, work: impl std::future::Future<Output = T>) -> Result<T, ToolError> {
    let cancel = env.ctx.cancelled();
    tokio::select! {
        out = work => Ok(out),
        () = cancel.cancelled() => Err(ToolError::Stopping),
    }
}

impl WebSearch {
    /// The tool's answer to `query` (also used by tests without a run).
    pub async fn answer(&self, query: &str, count: u32) -> ToolOutput {
        let started = Instant::now();
        let result = self.provider.search(query, count).await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::histogram!("antler_agent_web_call_seconds", "tool" => "web_search", "provider" => self.provider.name(), "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(hits) if hits.is_empty() => ToolOutput::ok(format!("No results found for \"{query}\".")),
            Ok(hits) => ToolOutput::ok(serde_json::to_string_pretty(&hits).unwrap_or_default()),
            Err(error) => {
                tracing::warn!(provider = self.provider.name(), error = %error, "web_search failed");
                ToolOutput::error(format!("Error: web_search failed: {error}"))
            }
        }
    }
}

impl Tool for WebSearch {
    fn name(&self) -> &'static str {
        "web_search"
    }

    fn description(&self) -> &'static str {
        "Search the web. Answers with a JSON list of results, each with a title, a url and a snippet. Read a \
         result's page with web_fetch before relying on it, and cite the urls you use."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to search for. Specific keywords find better results."},
                "max_results": {"type": "integer", "description": "How many results to return (at most the configured number, 5 by default)."}
            },
            "required": ["query"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let query = match query(args) {
                Ok(query) => query,
                Err(output) => return Ok(output),
            };
            unless_stopped(env, self.answer(&query, count(args, self.max_results))).await
        })
    }
}
