//! Firecrawl (`https://docs.firecrawl.dev/api-reference`), search and reader: `POST {base}/v2/search`
//! with `Authorization: Bearer fc-…` and `{"query", "limit"}`, answered by `{"success": true, "data":
//! {"web": [{"url", "title", "description"}]}}` (v1's `"data": […]` is read too); `POST
//! {base}/v2/scrape` with `{"url", "formats": ["markdown"], "onlyMainContent": true}`, answered by
//! `{"success": true, "data": {"markdown", "metadata": {"title", "sourceURL", "statusCode"}}}`. Errors
//! are `{"success": false, "error": "…"}` (401, 402 payment required, 429).

use futures::future::BoxFuture;
use reqwest::Url;
use serde_json::{Value, json};

use super::{FetchProvider, Hit, Page, SearchProvider};
use crate::lead::tools::web::http::{Endpoint, ProviderError, array, text};

#[derive(Debug)]
pub struct Firecrawl {
    pub endpoint: Endpoint,
}

fn message_of(body: &Value) -> Option<String> {
    body.get("error").and_then(Value::as_str).map(str::to_owned)
}

impl Firecrawl {
    async fn post(&self, path: &str, body: Value) -> Result<Value, ProviderError> {
        let request = self.endpoint.client.post(self.endpoint.url(path)).bearer_auth(self.endpoint.key()).json(&body);
        let answer = self.endpoint.json(request, message_of).await?;
        if answer.get("success").and_then(Value::as_bool) == Some(false) {
            return Err(self.endpoint.status_error(200, &message_of(&answer).unwrap_or_else(|| "success: false".to_owned())));
        }
        Ok(answer)
    }
}

impl SearchProvider for Firecrawl {
    fn name(&self) -> &'static str {
        "firecrawl"
    }

    fn search<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<Hit>, ProviderError>> {
        Box::pin(async move {
            let answer = self.post("/v2/search", json!({"query": query, "limit": count})).await?;
            let results = match answer.get("data") {
                Some(Value::Array(_)) => array(&answer, &["data"]),
                _ => array(&answer, &["data", "web"]),
            }
            .map_err(|e| self.endpoint.malformed(e))?;
            Ok(results
                .iter()
                .map(|r| Hit { title: text(r, "title"), url: text(r, "url"), snippet: text(r, "description") })
                .filter(|h| !h.url.is_empty())
                .take(count as usize)
                .collect())
        })
    }
}

impl FetchProvider for Firecrawl {
    fn name(&self) -> &'static str {
        "firecrawl"
    }

    fn fetch<'a>(&'a self, url: &'a Url) -> BoxFuture<'a, Result<Page, ProviderError>> {
        Box::pin(async move {
            let answer = self.post("/v2/scrape", json!({"url": url.as_str(), "formats": ["markdown"], "onlyMainContent": true})).await?;
            let data = answer.get("data").ok_or_else(|| self.endpoint.malformed("no `data`"))?;
            let metadata = data.get("metadata").cloned().unwrap_or(Value::Null);
            if let Some(status) = metadata.get("statusCode").and_then(Value::as_u64).filter(|s| *s >= 400) {
                return Err(ProviderError::Status {
                    provider: "firecrawl",
                    status: 502,
                    message: format!("the page answered HTTP {status}"),
                    hint: String::new(),
                });
            }
            let source = [text(&metadata, "sourceURL"), text(&metadata, "url")].into_iter().find(|u| !u.is_empty());
            Ok(Page { title: text(&metadata, "title"), url: source.unwrap_or_else(|| url.to_string()), markdown: text(data, "markdown") })
        })
    }
}
