//! Search and reader providers, one file each, behind two traits: [`SearchProvider`] (web search, and
//! image search where the API has one) and [`FetchProvider`] (a service that fetches and converts a
//! page for us). Each file speaks its API's real wire format: request shape, auth header, JSON answer,
//! error bodies; `integration-tests/src/web_double.rs` serves the same formats for the tests.

pub mod brave;
pub mod exa;
pub mod firecrawl;
pub mod jina;
pub mod searxng;
pub mod serper;
pub mod tavily;

use futures::future::BoxFuture;
use reqwest::Url;
use serde::Serialize;

use super::http::ProviderError;

/// One web search result, as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hit {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

/// One image search result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageHit {
    pub title: String,
    pub image_url: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub thumbnail_url: String,
    /// The page the image is on.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub source_url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub height: Option<u32>,
}

/// A page as a reader provider returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub title: String,
    /// The page's URL as the provider reports it (after its redirects).
    pub url: String,
    pub markdown: String,
}

/// A web search API.
pub trait SearchProvider: Send + Sync + std::fmt::Debug {
    /// The provider's name in config, errors and metrics (`tavily`).
    fn name(&self) -> &'static str;
    /// At most `count` results for `query`.
    fn search<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<Hit>, ProviderError>>;
    /// At most `count` images for `query`; only providers with an image API override it (the
    /// configuration refuses the others before a call can get here).
    fn images<'a>(&'a self, query: &'a str, count: u32) -> BoxFuture<'a, Result<Vec<ImageHit>, ProviderError>> {
        let _ = (query, count);
        Box::pin(async move { Err(ProviderError::Malformed { provider: self.name(), detail: "no image search API".to_owned() }) })
    }
}

/// A service that fetches a page and returns it as Markdown.
pub trait FetchProvider: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &'static str;
    fn fetch<'a>(&'a self, url: &'a Url) -> BoxFuture<'a, Result<Page, ProviderError>>;
}

/// An image URL only when it is http(s): a provider's `data:` thumbnails and the like are not
/// something the model can fetch.
pub fn web_url(url: String) -> String {
    if url.starts_with("https://") || url.starts_with("http://") { url } else { String::new() }
}
