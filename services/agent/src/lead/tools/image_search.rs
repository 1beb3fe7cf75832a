//! `image_search` (`runs.lead.web.image_search`): image URLs and titles from Brave, Serper or SearXNG.
//! The model looks at one by fetching it with `web_fetch` (which saves images into the workspace)
//! and passing the saved path to `view_image`.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::web::providers::SearchProvider;
use super::web_search::{count, query, unless_stopped};
use super::{Args, Tool, ToolError, ToolOutput};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct ImageSearch {
    pub provider: Arc<dyn SearchProvider>,
    pub max_results: u32,
}

/// What the result tells the model to do with an image.
pub const USAGE_HINT: &str = "To look at an image, call web_fetch with its image_url: the image is saved under \
/mnt/user-data/workspace/web/ and the result names the path to pass to view_image.";

impl ImageSearch {
    pub async fn answer(&self, query: &str, count: u32) -> ToolOutput {
        let started = Instant::now();
        let result = self.provider.images(query, count).await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::histogram!("antler_agent_web_call_seconds", "tool" => "image_search", "provider" => self.provider.name(), "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(images) if images.is_empty() => ToolOutput::ok(format!("No images found for \"{query}\".")),
            Ok(images) => {
                let answer = json!({"query": query, "total_results": images.len(), "results": images, "usage_hint": USAGE_HINT});
                ToolOutput::ok(serde_json::to_string_pretty(&answer).unwrap_or_default())
            }
            Err(error) => {
                tracing::warn!(provider = self.provider.name(), error = %error, "image_search failed");
                ToolOutput::error(format!("Error: image_search failed: {error}"))
            }
        }
    }
}

impl Tool for ImageSearch {
    fn name(&self) -> &'static str {
        "image_search"
    }

    fn description(&self) -> &'static str {
        "Search for images on the web: reference pictures of people, objects, places or styles. Answers with JSON: \
         each result has a title, an image_url, a thumbnail_url and the page it is on. Fetch an image_url with \
         web_fetch to save it into the workspace, then view_image the saved path to look at it."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What the images should show. Specific keywords find better images."},
                "max_results": {"type": "integer", "description": "How many images to return (at most the configured number, 5 by default)."}
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
