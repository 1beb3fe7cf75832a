//! Serper, Google results (`https://serper.dev`): `POST {base}/search` with `X-API-KEY` and `{"q",
//! "num"}`, answered by `{"organic": [{"title", "link", "snippet"}]}`; `POST {base}/images` answers
//! `{"images": [{"title", "imageUrl", "imageWidth", "imageHeight", "thumbnailUrl", "link"}]}`. Errors
//! are `{"message": "…", "statusCode": 403}`.

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Hit, ImageHit, SearchProvider, web_url};
use crate::lead::tools::web::http::{Endpoint, ProviderError, array, number, text};

#[derive(Debug)]
pub struct Serper {
    pub endpoint: Endpoint,
}

fn message_of(body: &Value) -> Option<String> {
    body.get("message").and_then(Value::as_str).map(str::to_owned)
}

impl Serper {
    async fn post(&self, path: &str, query: &str, count: u32) -> Result<Value, ProviderError> {
        let request = self
            .endpoint
            .client
            .post(self.endpoint.url(path))
            .header("x-api-key", self.endpoint.key())
            .json(&json!({"q": query, "num": count}));
        self.endpoint.json(request, message_of).await
    }
}

impl SearchProvider for Serper {
    fn name(&self) -> &'static str {
        "serper"
    }

    fn search<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<Hit>, ProviderError>> {
        Box::pin(async move {
            let answer = self.post("/search", query, count).await?;
            let results = array(&answer, &["organic"]).map_err(|e| self.endpoint.malformed(e))?;
            Ok(results
                .iter()
                .map(|r| Hit { title: text(r, "title"), url: text(r, "link"), snippet: text(r, "snippet") })
                .filter(|h| !h.url.is_empty())
                .take(count as usize)
                .collect())
        })
    }

    fn images<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<ImageHit>, ProviderError>> {
        Box::pin(async move {
            let answer = self.post("/images", query, count).await?;
            let results = array(&answer, &["images"]).map_err(|e| self.endpoint.malformed(e))?;
            Ok(results
                .iter()
                .filter_map(|r| {
                    let image_url = web_url(text(r, "imageUrl"));
                    (!image_url.is_empty()).then(|| ImageHit {
                        title: text(r, "title"),
                        image_url,
                        thumbnail_url: web_url(text(r, "thumbnailUrl")),
                        source_url: web_url(text(r, "link")),
                        width: number(r, "imageWidth"),
                        height: number(r, "imageHeight"),
                    })
                })
                .take(count as usize)
                .collect())
        })
    }
}
