//! SearXNG (`https://docs.searxng.org/dev/search_api.html`): a self-hosted metasearch engine, no key.
//! `GET {base}/search?q=…&format=json` answers `{"results": [{"url", "title", "content", …}]}`; with
//! `categories=images` the results carry `img_src`, `thumbnail_src` and `resolution` ("1920x1080").
//! An instance whose `search.formats` lacks `json` answers 403.

use futures::future::BoxFuture;
use serde_json::Value;

use super::{Hit, ImageHit, SearchProvider, web_url};
use crate::lead::tools::web::http::{Endpoint, ProviderError, array, text};

#[derive(Debug)]
pub struct Searxng {
    pub endpoint: Endpoint,
    /// `0`, `1` or `2` (off, moderate, strict); None: the instance's default.
    pub safesearch: Option<&'static str>,
}

/// SearXNG answers errors as HTML or plain text; the status says enough.
fn message_of(_: &Value) -> Option<String> {
    None
}

impl Searxng {
    async fn query(&self, query: &str, images: bool) -> Result<Value, ProviderError> {
        let mut params = vec![("q", query), ("format", "json"), ("pageno", "1"), ("language", "auto")];
        if images {
            params.push(("categories", "images"));
        }
        if let Some(level) = self.safesearch {
            params.push(("safesearch", level));
        }
        let request = self.endpoint.client.get(self.endpoint.url_with("/search", &params)?).header("accept", "application/json");
        self.endpoint.json(request, message_of).await.map_err(|e| match e {
            ProviderError::Status { provider, status: 403, message, .. } => ProviderError::Status {
                provider,
                status: 403,
                message,
                hint: "SearXNG refuses JSON unless `json` is in `search.formats` of its settings.yml".to_owned(),
            },
            other => other,
        })
    }
}

impl SearchProvider for Searxng {
    fn name(&self) -> &'static str {
        "searxng"
    }

    fn search<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<Hit>, ProviderError>> {
        Box::pin(async move {
            let answer = self.query(query, false).await?;
            let results = array(&answer, &["results"]).map_err(|e| self.endpoint.malformed(e))?;
            Ok(results
                .iter()
                .map(|r| Hit { title: text(r, "title"), url: text(r, "url"), snippet: text(r, "content") })
                .filter(|h| !h.url.is_empty())
                .take(count as usize)
                .collect())
        })
    }

    fn images<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<ImageHit>, ProviderError>> {
        Box::pin(async move {
            let answer = self.query(query, true).await?;
            let results = array(&answer, &["results"]).map_err(|e| self.endpoint.malformed(e))?;
            Ok(results
                .iter()
                .filter_map(|r| {
                    let image_url = web_url(text(r, "img_src"));
                    if image_url.is_empty() {
                        return None;
                    }
                    let size = text(r, "resolution");
                    let (width, height) = match size.split_once(['x', '×']) {
                        Some((w, h)) => (w.trim().parse().ok(), h.trim().parse().ok()),
                        None => (None, None),
                    };
                    Some(ImageHit {
                        title: text(r, "title"),
                        image_url,
                        thumbnail_url: web_url(text(r, "thumbnail_src")),
                        source_url: web_url(text(r, "url")),
                        width,
                        height,
                    })
                })
                .take(count as usize)
                .collect())
        })
    }
}
