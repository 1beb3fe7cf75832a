//! Brave Search (`https://api-dashboard.search.brave.com/app/documentation`): `GET
//! {base}/res/v1/web/search?q=…&count=…` with `X-Subscription-Token`, answered by `{"web": {"results":
//! [{"title", "url", "description"}]}}`; images from `GET {base}/res/v1/images/search` as `{"results":
//! [{"title", "url", "thumbnail": {"src"}, "properties": {"url", "width", "height"}}]}`. Errors are
//! `{"type": "ErrorResponse", "error": {"code", "detail", "status"}}`.

use futures::future::BoxFuture;
use serde_json::Value;

use super::{Hit, ImageHit, SearchProvider, web_url};
use crate::lead::tools::web::http::{Endpoint, ProviderError, array, number, text};

#[derive(Debug)]
pub struct Brave {
    pub endpoint: Endpoint,
    /// Image search options passed through as query parameters (country, search_lang, safesearch,
    /// spellcheck).
    pub image_params: Vec<(&'static str, String)>,
}

fn message_of(body: &Value) -> Option<String> {
    let error = body.get("error")?;
    let detail = text(error, "detail");
    let code = text(error, "code");
    Some(match (code.is_empty(), detail.is_empty()) {
        (false, false) => format!("{code}: {detail}"),
        (true, false) => detail,
        (false, true) => code,
        (true, true) => return None,
    })
}

impl Brave {
    async fn get(&self, path: &str, params: &[(&str, String)]) -> Result<Value, ProviderError> {
        let request = self
            .endpoint
            .client
            .get(self.endpoint.url_with(path, &params.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>())?)
            .header("accept", "application/json")
            .header("x-subscription-token", self.endpoint.key());
        self.endpoint.json(request, message_of).await
    }
}

impl SearchProvider for Brave {
    fn name(&self) -> &'static str {
        "brave"
    }

    fn search<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<Hit>, ProviderError>> {
        Box::pin(async move {
            let params = [("q", query.to_owned()), ("count", count.to_string()), ("text_decorations", "false".to_owned())];
            let answer = self.get("/res/v1/web/search", &params).await?;
            let results = array(&answer, &["web", "results"]).map_err(|e| self.endpoint.malformed(e))?;
            Ok(results
                .iter()
                .map(|r| Hit { title: text(r, "title"), url: text(r, "url"), snippet: text(r, "description") })
                .filter(|h| !h.url.is_empty())
                .take(count as usize)
                .collect())
        })
    }

    fn images<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<ImageHit>, ProviderError>> {
        Box::pin(async move {
            let mut params = vec![("q", query.to_owned()), ("count", count.to_string())];
            params.extend(self.image_params.iter().map(|(k, v)| (*k, v.clone())));
            let answer = self.get("/res/v1/images/search", &params).await?;
            let results = array(&answer, &["results"]).map_err(|e| self.endpoint.malformed(e))?;
            let empty = Value::Null;
            Ok(results
                .iter()
                .filter_map(|r| {
                    let properties = r.get("properties").unwrap_or(&empty);
                    let thumbnail = r.get("thumbnail").unwrap_or(&empty);
                    let full = web_url(text(properties, "url"));
                    let thumb = web_url(text(thumbnail, "src"));
                    let (image_url, dims) = if full.is_empty() { (thumb.clone(), thumbnail) } else { (full, properties) };
                    (!image_url.is_empty()).then(|| ImageHit {
                        title: text(r, "title"),
                        image_url,
                        thumbnail_url: thumb,
                        source_url: web_url(text(r, "url")),
                        width: number(dims, "width"),
                        height: number(dims, "height"),
                    })
                })
                .take(count as usize)
                .collect())
        })
    }
}
