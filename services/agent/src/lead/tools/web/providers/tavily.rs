//! Tavily (`https://docs.tavily.com/documentation/api-reference/endpoint/search`):
//! `POST {base}/search` with `Authorization: Bearer tvly-…` and `{"query", "max_results",
//! "search_depth", "topic"}`, answered by `{"results": [{"title", "url", "content", "score"}]}`;
//! errors are `{"detail": {"error": "…"}}` (401 bad key, 429 rate limit, 432/433 plan limits).

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Hit, SearchProvider};
use crate::lead::tools::web::http::{Endpoint, ProviderError, array, text};

#[derive(Debug)]
pub struct Tavily {
    pub endpoint: Endpoint,
}

fn message_of(body: &Value) -> Option<String> {
    let detail = body.get("detail")?;
    detail.get("error").and_then(Value::as_str).or_else(|| detail.as_str()).map(str::to_owned)
}

impl SearchProvider for Tavily {
    fn name(&self) -> &'static str {
        "tavily"
    }

    fn search<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<Hit>, ProviderError>> {
        Box::pin(async move {
            let body = json!({"query": query, "max_results": count, "search_depth": "basic", "topic": "general", "include_answer": false});
            let request = self.endpoint.client.post(self.endpoint.url("/search")).bearer_auth(self.endpoint.key()).json(&body);
            let answer = self.endpoint.json(request, message_of).await?;
            let results = array(&answer, &["results"]).map_err(|e| self.endpoint.malformed(e))?;
            Ok(results
                .iter()
                .map(|r| Hit { title: text(r, "title"), url: text(r, "url"), snippet: text(r, "content") })
                .filter(|h| !h.url.is_empty())
                .take(count as usize)
                .collect())
        })
    }
}
