//! `runs.lead.web`: the web tools (`web_search`, `web_fetch`, `image_search`). Each block switches
//! its tool on; an absent block leaves the tool out (nothing reaches the network by default).

use antler_kit::config::{ConfigError, check_range};
use serde::{Deserialize, Serialize};

/// Where settings of this section live in `antler.yaml` (for error messages).
pub const PATH: &str = "runs.lead.web";

/// The `runs.lead.web` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    /// `web_search`: one provider.
    pub search: Option<SearchConfig>,
    /// `web_fetch`: the direct fetcher or a reader service.
    pub fetch: Option<FetchConfig>,
    /// `image_search`: one provider.
    pub image_search: Option<ImageSearchConfig>,
}

/// Search providers (`web_search`), one file each under `web/providers/`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SearchProviderKind {
    /// A self-hosted SearXNG instance's JSON API: no key, the default.
    #[default]
    Searxng,
    Tavily,
    Brave,
    Serper,
    Exa,
    Firecrawl,
}

/// Image search providers (`image_search`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageProviderKind {
    #[default]
    Searxng,
    Brave,
    Serper,
}

/// How `web_fetch` gets a page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FetchProviderKind {
    /// Antler fetches the page itself (no third party) and converts it.
    #[default]
    Direct,
    /// Jina Reader (`r.jina.ai`) fetches and converts; a key is optional (rate limits without).
    Jina,
    /// Firecrawl's scrape API; needs a key.
    Firecrawl,
}

impl SearchProviderKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Searxng => "searxng",
            Self::Tavily => "tavily",
            Self::Brave => "brave",
            Self::Serper => "serper",
            Self::Exa => "exa",
            Self::Firecrawl => "firecrawl",
        }
    }

    /// The API's address when `base_url` is empty.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Self::Searxng => "http://localhost:8088",
            Self::Tavily => "https://api.tavily.com",
            Self::Brave => "https://api.search.brave.com",
            Self::Serper => "https://google.serper.dev",
            Self::Exa => "https://api.exa.ai",
            Self::Firecrawl => "https://api.firecrawl.dev",
        }
    }

    /// The environment variable read when `api_key` is empty (None: the provider takes no key).
    pub fn key_env(self) -> Option<&'static str> {
        match self {
            Self::Searxng => None,
            Self::Tavily => Some("TAVILY_API_KEY"),
            Self::Brave => Some("BRAVE_SEARCH_API_KEY"),
            Self::Serper => Some("SERPER_API_KEY"),
            Self::Exa => Some("EXA_API_KEY"),
            Self::Firecrawl => Some("FIRECRAWL_API_KEY"),
        }
    }

    /// The most results one request may ask for (the API's own cap).
    pub fn max_results_cap(self) -> u32 {
        match self {
            Self::Searxng | Self::Serper => 10,
            Self::Tavily | Self::Brave => 20,
            Self::Exa | Self::Firecrawl => 100,
        }
    }
}

impl ImageProviderKind {
    pub fn name(self) -> &'static str {
        self.as_search().name()
    }

    /// The same provider seen as a search provider (one file serves both tools).
    pub fn as_search(self) -> SearchProviderKind {
        match self {
            Self::Searxng => SearchProviderKind::Searxng,
            Self::Brave => SearchProviderKind::Brave,
            Self::Serper => SearchProviderKind::Serper,
        }
    }

    pub fn max_results_cap(self) -> u32 {
        match self {
            Self::Searxng => 50,
            Self::Brave => 200,
            Self::Serper => 100,
        }
    }
}

impl FetchProviderKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Jina => "jina",
            Self::Firecrawl => "firecrawl",
        }
    }

    pub fn default_base_url(self) -> &'static str {
        match self {
            Self::Direct => "",
            Self::Jina => "https://r.jina.ai",
            Self::Firecrawl => "https://api.firecrawl.dev",
        }
    }

    pub fn key_env(self) -> Option<&'static str> {
        match self {
            Self::Direct => None,
            Self::Jina => Some("JINA_API_KEY"),
            Self::Firecrawl => Some("FIRECRAWL_API_KEY"),
        }
    }
}

/// `runs.lead.web.search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    pub provider: SearchProviderKind,
    /// The API's address; empty: the provider's public endpoint (SearXNG: `http://localhost:8088`).
    pub base_url: String,
    /// The key (write `$TAVILY_API_KEY`); empty: the provider's environment variable. Never logged.
    pub api_key: String,
    /// Results per search, and the most a call's `max_results` may ask for (1..the provider's cap).
    pub max_results: u32,
    /// Longest wait for the provider's answer, in milliseconds (100..300000).
    pub timeout_ms: u64,
    /// Exa only: `auto`, `neural`, `keyword` or `fast` (default `auto`).
    pub search_type: Option<String>,
    /// Exa only: characters of highlights per result (1..100000, default 1000).
    pub contents_max_characters: Option<u32>,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            provider: SearchProviderKind::default(),
            base_url: String::new(),
            api_key: String::new(),
            max_results: 5,
            timeout_ms: 15_000,
            search_type: None,
            contents_max_characters: None,
        }
    }
}

/// `runs.lead.web.image_search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageSearchConfig {
    pub provider: ImageProviderKind,
    pub base_url: String,
    pub api_key: String,
    /// Images per search (1..the provider's cap).
    pub max_results: u32,
    pub timeout_ms: u64,
    /// Brave only: a country code, e.g. `US`.
    pub country: Option<String>,
    /// Brave only: a language code, e.g. `en`.
    pub search_lang: Option<String>,
    /// Brave (`off`, `strict`) and SearXNG (`off`, `moderate`, `strict`).
    pub safesearch: Option<String>,
    /// Brave only.
    pub spellcheck: Option<bool>,
}

impl Default for ImageSearchConfig {
    fn default() -> Self {
        Self {
            provider: ImageProviderKind::default(),
            base_url: String::new(),
            api_key: String::new(),
            max_results: 5,
            timeout_ms: 15_000,
            country: None,
            search_lang: None,
            safesearch: None,
            spellcheck: None,
        }
    }
}

/// `runs.lead.web.fetch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FetchConfig {
    pub provider: FetchProviderKind,
    /// Jina / Firecrawl: the API's address; empty: the public one.
    pub base_url: String,
    /// Jina (optional) / Firecrawl (required); empty: `$JINA_API_KEY` / `$FIRECRAWL_API_KEY`.
    pub api_key: String,
    /// The whole fetch, redirects and body included, in milliseconds (100..300000).
    pub timeout_ms: u64,
    /// Largest body read, in bytes (1024..104857600). Text (HTML included) is read up to it and
    /// converted with a note that the page was longer; an image or PDF over it is refused (unread when
    /// its Content-Length says so).
    pub max_bytes: u64,
    /// Redirects followed (0..20), each hop checked like the first.
    pub max_redirects: u32,
    /// Characters of converted text the model gets (500..1000000); longer pages are cut with a marker.
    pub cut_chars: u32,
    /// Media types fetched: `type/subtype` or `type/*`. Anything else is refused by name.
    pub allowed_content_types: Vec<String>,
    /// Ports a URL may name (its scheme's default when it names none); empty: any port.
    pub ports: Vec<u16>,
    /// Hosts exempt from the address rules: exact names, or `*.example.com` for the subdomains of one
    /// (for intranets and tests). Schemes and ports still apply.
    pub allow_hosts: Vec<String>,
    /// Address ranges exempt from the address rules, e.g. `10.1.0.0/16`, `127.0.0.1/32`, `fd00::/8`.
    pub allow_cidrs: Vec<String>,
    /// The User-Agent header of direct fetches; empty: `Antler-web_fetch/<version>`.
    pub user_agent: String,
}

/// Media types `web_fetch` reads by default.
pub const DEFAULT_CONTENT_TYPES: [&str; 10] = [
    "text/*",
    "application/xhtml+xml",
    "application/json",
    "application/xml",
    "application/pdf",
    "image/png",
    "image/jpeg",
    "image/webp",
    "image/gif",
    "application/rss+xml",
];

impl Default for FetchConfig {
    fn default() -> Self {
        Self {
            provider: FetchProviderKind::default(),
            base_url: String::new(),
            api_key: String::new(),
            timeout_ms: 15_000,
            max_bytes: 5 * 1024 * 1024,
            max_redirects: 5,
            cut_chars: 20_000,
            allowed_content_types: DEFAULT_CONTENT_TYPES.iter().map(|t| (*t).to_owned()).collect(),
            ports: vec![80, 443, 8080, 8443],
            allow_hosts: Vec::new(),
            allow_cidrs: Vec::new(),
            user_agent: String::new(),
        }
    }
}

/// Reads `web:` with nothing under it (YAML null) as the default: every tool off.
pub fn null_as_default<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<WebConfig, D::Error> {
    Ok(Option::<WebConfig>::deserialize(deserializer)?.unwrap_or_default())
}

fn invalid(path: String, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { path, message: message.into() }
}

/// The API key of a provider: `configured` when set, else its environment variable (read through
/// `lookup`). Err names the setting when the provider needs a key and there is none.
pub fn resolve_key(
    path: &str,
    provider: &str,
    configured: &str,
    env: Option<&'static str>,
    required: bool,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    if !configured.trim().is_empty() {
        if env.is_none() {
            return Err(invalid(format!("{path}.api_key"), format!("the {provider} provider takes no API key")));
        }
        return Ok(Some(configured.trim().to_owned()));
    }
    let from_env = env.and_then(lookup).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    match (from_env, env) {
        (Some(key), _) => Ok(Some(key)),
        (None, Some(var)) if required => Err(invalid(
            format!("{path}.api_key"),
            format!("the {provider} provider needs an API key and {var} is not set\nhint: write `api_key: ${var}` and export it"),
        )),
        _ => Ok(None),
    }
}

fn check_base_url(path: &str, url: &str) -> Result<(), ConfigError> {
    if url.is_empty() {
        return Ok(());
    }
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some() => Ok(()),
        _ => Err(invalid(format!("{path}.base_url"), format!("`{url}` is not an http:// or https:// URL"))),
    }
}

fn only_for(path: &str, field: &str, set: bool, provider: &str, readers: &str) -> Result<(), ConfigError> {
    if set {
        return Err(invalid(format!("{path}.{field}"), format!("the {provider} provider does not read it (only {readers})")));
    }
    Ok(())
}

impl WebConfig {
    /// Checks every block; `lookup` reads environment variables (API keys left empty in the file).
    pub fn validate_with(&self, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(search) = &self.search {
            search.validate(&format!("{PATH}.search"), lookup)?;
        }
        if let Some(images) = &self.image_search {
            images.validate(&format!("{PATH}.image_search"), lookup)?;
        }
        if let Some(fetch) = &self.fetch {
            fetch.validate(&format!("{PATH}.fetch"), lookup)?;
        }
        Ok(())
    }

    /// [`validate_with`](Self::validate_with) on the process environment.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_with(&|name| std::env::var(name).ok())
    }
}

impl SearchConfig {
    pub fn validate(&self, path: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let provider = self.provider;
        check_base_url(path, &self.base_url)?;
        check_range(&format!("{path}.max_results"), self.max_results.into(), 1, provider.max_results_cap().into())?;
        check_range(&format!("{path}.timeout_ms"), self.timeout_ms, 100, 300_000)?;
        let exa = provider == SearchProviderKind::Exa;
        only_for(path, "search_type", !exa && self.search_type.is_some(), provider.name(), "exa")?;
        only_for(path, "contents_max_characters", !exa && self.contents_max_characters.is_some(), provider.name(), "exa")?;
        if let Some(kind) = &self.search_type
            && !["auto", "neural", "keyword", "fast"].contains(&kind.as_str())
        {
            return Err(invalid(format!("{path}.search_type"), format!("`{kind}` is not one of auto, neural, keyword, fast")));
        }
        if let Some(chars) = self.contents_max_characters {
            check_range(&format!("{path}.contents_max_characters"), chars.into(), 1, 100_000)?;
        }
        resolve_key(path, provider.name(), &self.api_key, provider.key_env(), provider.key_env().is_some(), lookup)?;
        Ok(())
    }

    pub fn base_url(&self) -> &str {
        if self.base_url.is_empty() { self.provider.default_base_url() } else { self.base_url.trim_end_matches('/') }
    }
}

impl ImageSearchConfig {
    pub fn validate(&self, path: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let provider = self.provider;
        check_base_url(path, &self.base_url)?;
        check_range(&format!("{path}.max_results"), self.max_results.into(), 1, provider.max_results_cap().into())?;
        check_range(&format!("{path}.timeout_ms"), self.timeout_ms, 100, 300_000)?;
        let brave = provider == ImageProviderKind::Brave;
        only_for(path, "country", !brave && self.country.is_some(), provider.name(), "brave")?;
        only_for(path, "search_lang", !brave && self.search_lang.is_some(), provider.name(), "brave")?;
        only_for(path, "spellcheck", !brave && self.spellcheck.is_some(), provider.name(), "brave")?;
        only_for(
            path,
            "safesearch",
            provider == ImageProviderKind::Serper && self.safesearch.is_some(),
            provider.name(),
            "brave, searxng",
        )?;
        if let Some(level) = &self.safesearch {
            let levels: &[&str] = if brave { &["off", "strict"] } else { &["off", "moderate", "strict"] };
            if !levels.contains(&level.as_str()) {
                return Err(invalid(format!("{path}.safesearch"), format!("`{level}` is not one of {}", levels.join(", "))));
            }
        }
        let search = provider.as_search();
        resolve_key(path, provider.name(), &self.api_key, search.key_env(), search.key_env().is_some(), lookup)?;
        Ok(())
    }

    pub fn base_url(&self) -> &str {
        if self.base_url.is_empty() { self.provider.as_search().default_base_url() } else { self.base_url.trim_end_matches('/') }
    }
}

impl FetchConfig {
    pub fn validate(&self, path: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let provider = self.provider;
        if provider == FetchProviderKind::Direct && !self.base_url.is_empty() {
            return Err(invalid(format!("{path}.base_url"), "the direct fetcher has no API address (only jina and firecrawl do)"));
        }
        check_base_url(path, &self.base_url)?;
        check_range(&format!("{path}.timeout_ms"), self.timeout_ms, 100, 300_000)?;
        check_range(&format!("{path}.max_bytes"), self.max_bytes, 1024, 100 * 1024 * 1024)?;
        check_range(&format!("{path}.max_redirects"), self.max_redirects.into(), 0, 20)?;
        check_range(&format!("{path}.cut_chars"), self.cut_chars.into(), 500, 1_000_000)?;
        if self.allowed_content_types.is_empty() {
            return Err(invalid(format!("{path}.allowed_content_types"), "at least one media type is needed"));
        }
        for (index, media) in self.allowed_content_types.iter().enumerate() {
            let ok = media.split_once('/').is_some_and(|(kind, sub)| {
                !kind.is_empty() && !sub.is_empty() && kind != "*" && !media.contains(char::is_whitespace) && !media.contains(';')
            });
            if !ok {
                return Err(invalid(
                    format!("{path}.allowed_content_types[{index}]"),
                    format!("`{media}` is not a media type (`type/subtype` or `type/*`)"),
                ));
            }
        }
        for (index, port) in self.ports.iter().enumerate() {
            if *port == 0 {
                return Err(invalid(format!("{path}.ports[{index}]"), "0 is not a port"));
            }
        }
        for (index, host) in self.allow_hosts.iter().enumerate() {
            let name = host.strip_prefix("*.").unwrap_or(host);
            if name.is_empty() || name.contains(['/', ':', '*', ' ']) {
                return Err(invalid(
                    format!("{path}.allow_hosts[{index}]"),
                    format!("`{host}` is not a host name (`intranet.example`, or `*.example.com` for its subdomains)"),
                ));
            }
        }
        for (index, cidr) in self.allow_cidrs.iter().enumerate() {
            super::ssrf::Cidr::parse(cidr).map_err(|message| invalid(format!("{path}.allow_cidrs[{index}]"), message))?;
        }
        resolve_key(path, provider.name(), &self.api_key, provider.key_env(), provider == FetchProviderKind::Firecrawl, lookup)?;
        Ok(())
    }

    pub fn base_url(&self) -> &str {
        if self.base_url.is_empty() { self.provider.default_base_url() } else { self.base_url.trim_end_matches('/') }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> WebConfig {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"))
    }

    fn error(config: &WebConfig, env: &[(&str, &str)]) -> String {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        match config.validate_with(&|name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())) {
            Ok(()) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn an_empty_section_switches_nothing_on_and_an_empty_block_is_the_default_provider() {
        let config = parse("{}");
        assert_eq!(config, WebConfig::default());
        let config = parse("search: {}\nfetch: {}\n");
        assert_eq!(config.search.as_ref().map(|s| s.provider), Some(SearchProviderKind::Searxng));
        assert_eq!(config.search.as_ref().map(SearchConfig::base_url), Some("http://localhost:8088"));
        assert_eq!(config.fetch.as_ref().map(|f| f.provider), Some(FetchProviderKind::Direct));
        assert_eq!(error(&config, &[]), "");
    }

    #[test]
    fn a_provider_that_needs_a_key_is_refused_without_one_naming_the_setting_and_the_variable() {
        let config = parse("search: {provider: tavily}\n");
        let message = error(&config, &[]);
        assert!(message.contains("runs.lead.web.search.api_key") && message.contains("TAVILY_API_KEY"), "{message}");
        assert_eq!(error(&config, &[("TAVILY_API_KEY", "tvly-0123456789")]), "", "the environment variable is enough");
        let config = parse("fetch: {provider: jina}\n");
        assert_eq!(error(&config, &[]), "", "Jina works without a key");
        let config = parse("fetch: {provider: firecrawl}\n");
        assert!(error(&config, &[]).contains("runs.lead.web.fetch.api_key"));
        let config = parse("search: {provider: searxng, api_key: abcdefghij}\n");
        assert!(error(&config, &[]).contains("takes no API key"));
    }

    #[test]
    fn bad_values_name_their_field() {
        for (yaml, field) in [
            ("search: {provider: serper, max_results: 11, api_key: k}", "runs.lead.web.search.max_results"),
            ("search: {provider: tavily, search_type: neural, api_key: k}", "runs.lead.web.search.search_type"),
            ("search: {provider: exa, search_type: deep, api_key: k}", "runs.lead.web.search.search_type"),
            ("search: {base_url: 'ftp://x'}", "runs.lead.web.search.base_url"),
            ("search: {timeout_ms: 5}", "runs.lead.web.search.timeout_ms"),
            ("fetch: {cut_chars: 10}", "runs.lead.web.fetch.cut_chars"),
            ("fetch: {max_bytes: 1}", "runs.lead.web.fetch.max_bytes"),
            ("fetch: {max_redirects: 50}", "runs.lead.web.fetch.max_redirects"),
            ("fetch: {allowed_content_types: ['text']}", "runs.lead.web.fetch.allowed_content_types[0]"),
            ("fetch: {allowed_content_types: []}", "runs.lead.web.fetch.allowed_content_types"),
            ("fetch: {ports: [80, 0]}", "runs.lead.web.fetch.ports[1]"),
            ("fetch: {allow_cidrs: ['10.0.0.0/33']}", "runs.lead.web.fetch.allow_cidrs[0]"),
            ("fetch: {allow_cidrs: ['nonsense']}", "runs.lead.web.fetch.allow_cidrs[0]"),
            ("fetch: {allow_hosts: ['http://x']}", "runs.lead.web.fetch.allow_hosts[0]"),
            ("fetch: {base_url: 'http://x'}", "runs.lead.web.fetch.base_url"),
            ("image_search: {provider: serper, safesearch: off, api_key: k}", "runs.lead.web.image_search.safesearch"),
            ("image_search: {provider: searxng, country: US}", "runs.lead.web.image_search.country"),
            ("image_search: {provider: brave, safesearch: moderate, api_key: k}", "runs.lead.web.image_search.safesearch"),
        ] {
            let message = error(&parse(yaml), &[]);
            assert!(message.contains(field), "{yaml}: {message}");
        }
    }

    #[test]
    fn a_web_key_with_nothing_under_it_switches_nothing_on() {
        let lead: crate::lead::config::LeadConfig =
            serde_yaml_ng::from_str("web:\n  # search: {provider: tavily}\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(lead.web, WebConfig::default());
    }

    #[test]
    fn unknown_keys_and_providers_are_refused_by_the_parser() {
        assert!(serde_yaml_ng::from_str::<WebConfig>("search: {provider: duckduckgo}").is_err());
        assert!(serde_yaml_ng::from_str::<WebConfig>("fetch: {max_size: 3}").is_err());
        assert!(serde_yaml_ng::from_str::<WebConfig>("browse: {}").is_err());
    }
}
