//! Jina Reader (`https://jina.ai/reader`): `POST {base}/` with `{"url"}`, `Accept: application/json`,
//! `X-Return-Format: markdown`, `X-Timeout` (seconds) and, when there is a key, `Authorization: Bearer
//! jina_…` (without one the service works at a lower rate limit). The answer is `{"code": 200, "data":
//! {"title", "url", "content"}}`; errors are `{"code", "name", "message", "readableMessage"}`.

use futures::future::BoxFuture;
use reqwest::Url;
use serde_json::{Value, json};

use super::{FetchProvider, Page};
use crate::lead::tools::web::http::{Endpoint, ProviderError, text};

#[derive(Debug)]
pub struct Jina {
    pub endpoint: Endpoint,
}

fn message_of(body: &Value) -> Option<String> {
    ["readableMessage", "message"].iter().find_map(|k| body.get(*k).and_then(Value::as_str).filter(|m| !m.is_empty()).map(str::to_owned))
}

impl FetchProvider for Jina {
    fn name(&self) -> &'static str {
        "jina"
    }

    fn fetch<'a>(&'a self, url: &'a Url) -> BoxFuture<'a, Result<Page, ProviderError>> {
        Box::pin(async move {
            let seconds = self.endpoint.timeout.as_secs().max(1);
            let mut request = self
                .endpoint
                .client
                .post(self.endpoint.url("/"))
                .header("accept", "application/json")
                .header("x-return-format", "markdown")
                .header("x-timeout", seconds.to_string())
                .json(&json!({"url": url.as_str()}));
            if let Some(key) = self.endpoint.key.as_deref() {
                request = request.bearer_auth(key);
            }
            let answer = self.endpoint.json(request, message_of).await?;
            let data = answer.get("data").filter(|d| d.is_object()).ok_or_else(|| self.endpoint.malformed("no `data` object"))?;
            let source = text(data, "url");
            Ok(Page {
                title: text(data, "title"),
                url: if source.is_empty() { url.to_string() } else { source },
                markdown: text(data, "content"),
            })
        })
    }
}
