//! The web tools' machinery (`runs.lead.web`): providers (`providers/`, one file each), the direct
//! fetcher (`direct.rs`), the choice between it and a reader service (`fetcher.rs`) and what a fetch may
//! connect to (`ssrf.rs`), HTML to Markdown (`convert.rs`),
//! provider HTTP (`http.rs`), the settings (`config.rs`) and DeerFlow's `tools:` entries mapped onto
//! them (`deerflow.rs`). The tools themselves are `tools/web_search.rs`, `tools/web_fetch.rs` and
//! `tools/image_search.rs`.
//!
//! All three are read-only as far as the run's journal is concerned: a search or a GET changes
//! nothing, so a call repeated after a crash is harmless and none of them writes an intent. (An image
//! or PDF that `web_fetch` saves into the workspace is written under a name derived from its URL, so
//! a repeat writes the same file again.)

pub mod config;
pub mod convert;
pub mod deerflow;
pub mod direct;
pub mod fetcher;
pub mod http;
pub mod providers;
pub mod ssrf;

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use self::config::{
    FetchConfig, FetchProviderKind, ImageProviderKind, ImageSearchConfig, SearchConfig, SearchProviderKind, WebConfig, resolve_key,
};
use self::fetcher::Fetcher;
use self::http::Endpoint;
use self::providers::{FetchProvider, SearchProvider};
use super::Tool;

/// Why the web tools could not be built (a configuration that passed validation only fails here
/// when an environment variable it relied on went away, or TLS roots cannot be loaded).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Config(#[from] antler_kit::config::ConfigError),
    #[error("cannot build the web tools' HTTP client: {0}")]
    Client(String),
}

/// The provider client: plain reqwest (HTTPS_PROXY and the like from the environment apply), no SSRF
/// checks — a provider's address is the operator's choice (SearXNG usually lives on the same host).
fn provider_client(timeout_ms: u64) -> Result<reqwest::Client, BuildError> {
    reqwest::Client::builder()
        .user_agent(concat!("Antler/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_millis(timeout_ms))
        .build()
        .map_err(|e| BuildError::Client(http::chain(&e)))
}

/// Registers a configured key with the process's redactor, so no event, log line or status can carry
/// it out even when a provider echoes it back.
fn register_key(key: &Option<String>) {
    if let Some(key) = key {
        antler_kit::redact::register_static(key);
    }
}

fn endpoint(
    client: reqwest::Client,
    provider: &'static str,
    base_url: &str,
    key: Option<String>,
    timeout_ms: u64,
    setting: &'static str,
) -> Endpoint {
    register_key(&key);
    Endpoint { client, provider, base_url: base_url.to_owned(), key, timeout: Duration::from_millis(timeout_ms), setting }
}

/// The web tools a configuration switches on, in the order the model sees them.
pub fn build(config: &WebConfig, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Arc<dyn Tool>>, BuildError> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    if let Some(search) = &config.search {
        tools.push(Arc::new(web_search(search, lookup)?));
    }
    if let Some(fetch) = &config.fetch {
        tools.push(Arc::new(web_fetch(fetch, lookup)?));
    }
    if let Some(images) = &config.image_search {
        tools.push(Arc::new(image_search(images, lookup)?));
    }
    Ok(tools)
}

/// `web_search` under one `search` block.
pub fn web_search(search: &SearchConfig, lookup: &dyn Fn(&str) -> Option<String>) -> Result<super::web_search::WebSearch, BuildError> {
    const SETTING: &str = "runs.lead.web.search";
    let kind = search.provider;
    let key = resolve_key(SETTING, kind.name(), &search.api_key, kind.key_env(), kind.key_env().is_some(), lookup)?;
    let endpoint = endpoint(provider_client(search.timeout_ms)?, kind.name(), search.base_url(), key, search.timeout_ms, SETTING);
    let provider: Arc<dyn SearchProvider> = match kind {
        SearchProviderKind::Searxng => Arc::new(providers::searxng::Searxng { endpoint, safesearch: None }),
        SearchProviderKind::Tavily => Arc::new(providers::tavily::Tavily { endpoint }),
        SearchProviderKind::Brave => Arc::new(providers::brave::Brave { endpoint, image_params: Vec::new() }),
        SearchProviderKind::Serper => Arc::new(providers::serper::Serper { endpoint }),
        SearchProviderKind::Exa => Arc::new(providers::exa::Exa {
            endpoint,
            search_type: search.search_type.clone().unwrap_or_else(|| "auto".to_owned()),
            highlight_chars: search.contents_max_characters.unwrap_or(1000),
        }),
        SearchProviderKind::Firecrawl => Arc::new(providers::firecrawl::Firecrawl { endpoint }),
    };
    Ok(super::web_search::WebSearch { provider, max_results: search.max_results })
}

/// `web_fetch` under one `fetch` block.
pub fn web_fetch(fetch: &FetchConfig, lookup: &dyn Fn(&str) -> Option<String>) -> Result<super::web_fetch::WebFetch, BuildError> {
    const SETTING: &str = "runs.lead.web.fetch";
    let kind = fetch.provider;
    let key = resolve_key(SETTING, kind.name(), &fetch.api_key, kind.key_env(), kind == FetchProviderKind::Firecrawl, lookup)?;
    let fetcher = match kind {
        FetchProviderKind::Direct => Fetcher::Direct(direct::DirectFetcher::new(fetch).map_err(|e| BuildError::Client(http::chain(&e)))?),
        FetchProviderKind::Jina | FetchProviderKind::Firecrawl => {
            let endpoint = endpoint(provider_client(fetch.timeout_ms)?, kind.name(), fetch.base_url(), key, fetch.timeout_ms, SETTING);
            let provider: Arc<dyn FetchProvider> = if kind == FetchProviderKind::Jina {
                Arc::new(providers::jina::Jina { endpoint })
            } else {
                Arc::new(providers::firecrawl::Firecrawl { endpoint })
            };
            Fetcher::Reader { provider, policy: Arc::new(ssrf::Policy::new(&fetch.ports, &fetch.allow_hosts, &fetch.allow_cidrs)) }
        }
    };
    Ok(super::web_fetch::WebFetch {
        fetcher,
        cut_chars: fetch.cut_chars as usize,
        max_bytes: fetch.max_bytes,
        timeout: Duration::from_millis(fetch.timeout_ms),
    })
}

/// `image_search` under one `image_search` block.
pub fn image_search(
    images: &ImageSearchConfig,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<super::image_search::ImageSearch, BuildError> {
    const SETTING: &str = "runs.lead.web.image_search";
    let kind = images.provider;
    let search_kind = kind.as_search();
    let key = resolve_key(SETTING, kind.name(), &images.api_key, search_kind.key_env(), search_kind.key_env().is_some(), lookup)?;
    let endpoint = endpoint(provider_client(images.timeout_ms)?, kind.name(), images.base_url(), key, images.timeout_ms, SETTING);
    let provider: Arc<dyn SearchProvider> = match kind {
        ImageProviderKind::Searxng => Arc::new(providers::searxng::Searxng {
            endpoint,
            safesearch: images.safesearch.as_deref().map(|level| match level {
                "off" => "0",
                "moderate" => "1",
                _ => "2",
            }),
        }),
        ImageProviderKind::Brave => {
            let mut image_params = Vec::new();
            for (name, value) in [
                ("country", images.country.clone()),
                ("search_lang", images.search_lang.clone()),
                ("safesearch", images.safesearch.clone()),
                ("spellcheck", images.spellcheck.map(|b| b.to_string())),
            ] {
                if let Some(value) = value {
                    image_params.push((name, value));
                }
            }
            Arc::new(providers::brave::Brave { endpoint, image_params })
        }
        ImageProviderKind::Serper => Arc::new(providers::serper::Serper { endpoint }),
    };
    Ok(super::image_search::ImageSearch { provider, max_results: images.max_results })
}

/// Configurations whose tools were built, newest last: a run reuses its configuration's clients (and
/// their connection pools) instead of building them again. A reload that changes `runs.lead.web`
/// gets new ones; a few old ones are kept for runs of other configurations in the same process.
type Built = Vec<(WebConfig, Vec<Arc<dyn Tool>>)>;
static BUILT: LazyLock<Mutex<Built>> = LazyLock::new(Default::default);
const KEPT: usize = 4;

/// [`build`] on the process environment, cached per configuration.
pub fn tools(config: &WebConfig) -> Result<Vec<Arc<dyn Tool>>, BuildError> {
    if config == &WebConfig::default() {
        return Ok(Vec::new());
    }
    {
        let built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, tools)) = built.iter().find(|(c, _)| c == config) {
            return Ok(tools.clone());
        }
    }
    // Built outside the lock: loading TLS roots takes milliseconds, and two runs racing here only
    // build twice; the first to finish is kept, so every run of the configuration shares its clients.
    let tools = build(config, &|name| std::env::var(name).ok())?;
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, kept)) = built.iter().find(|(c, _)| c == config) {
        return Ok(kept.clone());
    }
    built.push((config.clone(), tools.clone()));
    if built.len() > KEPT {
        built.remove(0);
    }
    Ok(tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lead::subagents::{SubagentDef, SubagentsConfig};
    use crate::lead::tools::ToolSet;

    fn configured() -> WebConfig {
        WebConfig {
            search: Some(SearchConfig::default()),
            fetch: Some(FetchConfig::default()),
            image_search: Some(ImageSearchConfig::default()),
        }
    }

    #[test]
    fn the_web_tools_follow_the_built_ins_and_per_agent_tool_lists_select_them() {
        let mut tools = ToolSet::builtin(false);
        tools.add_web(&configured()).unwrap_or_else(|e| panic!("{e}"));
        let names = tools.names();
        assert_eq!(names[names.len() - 3..], ["web_search", "web_fetch", "image_search"]);

        let registry = SubagentsConfig::default().registry();
        let mut general = tools.clone();
        general.retain(|n| registry.get("general-purpose").is_some_and(|d| d.allows(n)));
        assert!(["web_search", "web_fetch", "image_search"].iter().all(|t| general.get(t).is_some()), "{:?}", general.names());
        let mut bash = tools.clone();
        bash.retain(|n| registry.get("bash").is_some_and(|d| d.allows(n)));
        assert!(bash.get("web_search").is_none(), "the bash type lists its tools: {:?}", bash.names());
        let researcher = SubagentDef { tools: Some(vec!["web_search".to_owned(), "read_file".to_owned()]), ..SubagentDef::default() };
        let mut custom = tools.clone();
        custom.retain(|n| researcher.allows(n));
        assert_eq!(custom.names(), ["read_file", "web_search"]);
    }

    #[test]
    fn no_web_block_adds_no_tool_and_one_configuration_builds_its_clients_once() {
        let mut tools = ToolSet::builtin(false);
        tools.add_web(&WebConfig::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(tools.get("web_search").is_none() && tools.get("web_fetch").is_none());
        let first = super::tools(&configured()).unwrap_or_else(|e| panic!("{e}"));
        let again = super::tools(&configured()).unwrap_or_else(|e| panic!("{e}"));
        assert!(first.iter().zip(&again).all(|(a, b)| Arc::ptr_eq(a, b)), "the cached tools are shared");
    }
}
