//! Exa (`https://docs.exa.ai/reference/search`): `POST {base}/search` with `x-api-key` and
//! `{"query", "type", "numResults", "contents": {"highlights": {"maxCharacters"}}}`, answered by
//! `{"results": [{"title", "url", "highlights": […], "text"}]}`; errors are `{"error": "…", "tag"}`.

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Hit, SearchProvider};
use crate::lead::tools::web::http::{Endpoint, ProviderError, array, text};

#[derive(Debug)]
pub struct Exa {
    pub endpoint: Endpoint,
    /// `auto`, `neural`, `keyword` or `fast`.
    pub search_type: String,
    /// Characters of highlights per result.
    pub highlight_chars: u32,
}

fn message_of(body: &Value) -> Option<String> {
    body.get("error").and_then(Value::as_str).map(str::to_owned)
}

impl SearchProvider for Exa {
    fn name(&self) -> &'static str {
        "exa"
    }

    fn search<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<Hit>, ProviderError>> {
        Box::pin(async move {
            let body = json!({
                "query": query,
                "type": self.search_type,
                "numResults": count,
                "contents": {"highlights": {"maxCharacters": self.highlight_chars}},
            });
            let request = self.endpoint.client.post(self.endpoint.url("/search")).header("x-api-key", self.endpoint.key()).json(&body);
            let answer = self.endpoint.json(request, message_of).await?;
            let results = array(&answer, &["results"]).map_err(|e| self.endpoint.malformed(e))?;
            Ok(results
                .iter()
                .map(|r| {
                    let highlights: Vec<&str> = r
                        .get("highlights")
                        .and_then(Value::as_array)
                        .map(|h| h.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let snippet = if highlights.is_empty() {
                        text(r, "text").chars().take(self.highlight_chars as usize).collect()
                    } else {
                        highlights.join("\n")
                    };
                    Hit { title: text(r, "title"), url: text(r, "url"), snippet }
                })
                .filter(|h| !h.url.is_empty())
                .take(count as usize)
                .collect())
        })
    }
}
