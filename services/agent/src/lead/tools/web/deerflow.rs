//! DeerFlow's `tools:` section, read as it is: each entry (`name`, `group`, `use:
//! deerflow.<module>:<attribute>` and the provider's options) maps onto `runs.lead.web` or names one
//! of Antler's built-in tools. The translation of a whole DeerFlow `config.yaml` calls
//! [`apply_tool_entry`] once per entry; an unknown `use:` is an error that names it, so a start-up
//! with such a file fails instead of running without the tool.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::config::{FetchConfig, FetchProviderKind, ImageProviderKind, ImageSearchConfig, SearchConfig, SearchProviderKind, WebConfig};

/// One entry of DeerFlow's `tools:` list.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ToolEntry {
    pub name: String,
    #[serde(default)]
    pub group: String,
    #[serde(rename = "use")]
    pub use_path: String,
    /// Everything else: the provider's options (`max_results`, `api_key`, `base_url`, …).
    #[serde(flatten)]
    pub options: BTreeMap<String, Value>,
}

/// What an entry became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// The Antler tool the entry stands for (`web_search`, `bash`, …).
    pub tool: &'static str,
    /// The entry's `group` (DeerFlow's `tool_groups` and agents' group lists select tools by it).
    pub group: String,
    /// Options DeerFlow reads and Antler does not (its own limits apply instead), for a log line.
    pub ignored: Vec<String>,
}

/// Why an entry cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeerflowToolError {
    #[error("tools[{index}] ({name}): `use: {use_path}` is not a tool Antler has\nhint: {hint}")]
    UnknownUse { index: usize, name: String, use_path: String, hint: String },
    #[error("tools[{index}] (`use: {use_path}`): `{option}` {message}")]
    BadOption { index: usize, use_path: String, option: String, message: String },
    #[error("tools[{index}] (`use: {use_path}`): a second {tool} entry; DeerFlow and Antler use one provider per tool")]
    Duplicate { index: usize, use_path: String, tool: &'static str },
}

const SEARCH_USES: [(&str, SearchProviderKind); 6] = [
    ("searxng", SearchProviderKind::Searxng),
    ("tavily", SearchProviderKind::Tavily),
    ("brave", SearchProviderKind::Brave),
    ("serper", SearchProviderKind::Serper),
    ("exa", SearchProviderKind::Exa),
    ("firecrawl", SearchProviderKind::Firecrawl),
];
const FETCH_USES: [(&str, FetchProviderKind); 2] = [("jina_ai", FetchProviderKind::Jina), ("firecrawl", FetchProviderKind::Firecrawl)];
const IMAGE_USES: [(&str, ImageProviderKind); 2] = [("brave", ImageProviderKind::Brave), ("serper", ImageProviderKind::Serper)];
/// `deerflow.sandbox.tools:<name>_tool` → Antler's built-in of that name.
const BUILTINS: [&str; 7] = ["ls", "read_file", "glob", "grep", "write_file", "str_replace", "bash"];

/// The supported `use:` paths, for hints.
pub fn supported_uses() -> Vec<String> {
    let mut uses = Vec::new();
    uses.extend(SEARCH_USES.iter().map(|(m, _)| format!("deerflow.community.{m}.tools:web_search_tool")));
    uses.extend(FETCH_USES.iter().map(|(m, _)| format!("deerflow.community.{m}.tools:web_fetch_tool")));
    uses.extend(IMAGE_USES.iter().map(|(m, _)| format!("deerflow.community.{m}.tools:image_search_tool")));
    uses.extend(BUILTINS.iter().map(|b| format!("deerflow.sandbox.tools:{b}_tool")));
    uses
}

struct Options<'a> {
    index: usize,
    use_path: &'a str,
    options: BTreeMap<String, Value>,
}

impl Options<'_> {
    fn bad(&self, option: &str, message: impl Into<String>) -> DeerflowToolError {
        DeerflowToolError::BadOption {
            index: self.index,
            use_path: self.use_path.to_owned(),
            option: option.to_owned(),
            message: message.into(),
        }
    }

    fn string(&mut self, key: &str) -> Result<Option<String>, DeerflowToolError> {
        match self.options.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_owned())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(other) => Err(self.bad(key, format!("must be a string, not {other}"))),
        }
    }

    /// An integer; DeerFlow also coerces numeric strings.
    fn int(&mut self, key: &str) -> Result<Option<i64>, DeerflowToolError> {
        match self.options.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) if n.is_i64() => Ok(n.as_i64()),
            Some(Value::String(s)) if s.trim().parse::<i64>().is_ok() => Ok(s.trim().parse().ok()),
            Some(other) => Err(self.bad(key, format!("must be a whole number, not {other}"))),
        }
    }

    fn boolean(&mut self, key: &str) -> Result<Option<bool>, DeerflowToolError> {
        match self.options.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(Value::String(s)) if ["true", "false"].contains(&s.trim().to_ascii_lowercase().as_str()) => {
                Ok(Some(s.trim().eq_ignore_ascii_case("true")))
            }
            Some(other) => Err(self.bad(key, format!("must be true or false, not {other}"))),
        }
    }

    /// `max_results`, clamped to 1..=`cap` as DeerFlow's providers clamp it.
    fn max_results(&mut self, cap: u32, default: u32) -> Result<u32, DeerflowToolError> {
        Ok(self.int("max_results")?.map_or(default, |n| n.clamp(1, i64::from(cap)) as u32))
    }

    /// Anything left is an option this provider does not have.
    fn finish(self) -> Result<(), DeerflowToolError> {
        match self.options.keys().next() {
            None => Ok(()),
            Some(key) => Err(self.bad(key, "is not an option of this tool")),
        }
    }
}

/// Maps DeerFlow `tools:` entry number `index` onto `web` (or onto a built-in tool).
pub fn apply_tool_entry(index: usize, entry: &ToolEntry, web: &mut WebConfig) -> Result<Mapped, DeerflowToolError> {
    let use_path = entry.use_path.trim();
    let mut options = Options { index, use_path, options: entry.options.clone() };
    let unknown = |hint: String| DeerflowToolError::UnknownUse { index, name: entry.name.clone(), use_path: use_path.to_owned(), hint };
    let (module, attribute) = use_path.split_once(':').ok_or_else(|| unknown("a `use:` is `module.path:attribute`".to_owned()))?;
    let group = entry.group.clone();
    let duplicate = |tool| DeerflowToolError::Duplicate { index, use_path: use_path.to_owned(), tool };

    if module == "deerflow.sandbox.tools"
        && let Some(builtin) = attribute.strip_suffix("_tool").and_then(|name| BUILTINS.iter().find(|b| **b == name))
    {
        let ignored = options.options.keys().cloned().collect();
        return Ok(Mapped { tool: builtin, group, ignored });
    }
    let provider = module.strip_prefix("deerflow.community.").and_then(|m| m.strip_suffix(".tools")).unwrap_or_default();
    match attribute {
        "web_search_tool" => {
            if let Some((_, kind)) = SEARCH_USES.iter().find(|(m, _)| *m == provider) {
                if web.search.is_some() {
                    return Err(duplicate("web_search"));
                }
                let mut search = SearchConfig { provider: *kind, ..SearchConfig::default() };
                search.max_results = options.max_results(kind.max_results_cap(), search.max_results)?;
                search.api_key = options.string("api_key")?.unwrap_or_default();
                search.base_url = options.string("base_url")?.unwrap_or_default();
                if *kind == SearchProviderKind::Exa {
                    search.search_type = options.string("search_type")?;
                    search.contents_max_characters = options.int("contents_max_characters")?.map(|n| n.clamp(1, 100_000) as u32);
                }
                options.finish()?;
                web.search = Some(search);
                return Ok(Mapped { tool: "web_search", group, ignored: Vec::new() });
            }
        }
        "web_fetch_tool" => {
            if let Some((_, kind)) = FETCH_USES.iter().find(|(m, _)| *m == provider) {
                if web.fetch.is_some() {
                    return Err(duplicate("web_fetch"));
                }
                let mut fetch = FetchConfig { provider: *kind, ..FetchConfig::default() };
                fetch.api_key = options.string("api_key")?.unwrap_or_default();
                fetch.base_url = options.string("base_url")?.unwrap_or_default();
                if let Some(seconds) = options.int("timeout")? {
                    fetch.timeout_ms = (seconds.clamp(1, 300) as u64) * 1000;
                }
                if *kind == FetchProviderKind::Jina {
                    if options.string("proxy")?.is_some_and(|p| !p.is_empty()) {
                        return Err(options.bad("proxy", "is not supported: the reader's client takes HTTPS_PROXY from the environment"));
                    }
                    if options.boolean("trust_env")? == Some(false) {
                        return Err(options.bad(
                            "trust_env",
                            "false is not supported: the reader's client always reads proxy settings from the environment",
                        ));
                    }
                }
                options.finish()?;
                web.fetch = Some(fetch);
                return Ok(Mapped { tool: "web_fetch", group, ignored: Vec::new() });
            }
        }
        "image_search_tool" => {
            if let Some((_, kind)) = IMAGE_USES.iter().find(|(m, _)| *m == provider) {
                if web.image_search.is_some() {
                    return Err(duplicate("image_search"));
                }
                let mut images = ImageSearchConfig { provider: *kind, ..ImageSearchConfig::default() };
                images.max_results = options.max_results(kind.max_results_cap(), images.max_results)?;
                images.api_key = options.string("api_key")?.unwrap_or_default();
                images.base_url = options.string("base_url")?.unwrap_or_default();
                if *kind == ImageProviderKind::Brave {
                    images.country = options.string("country")?;
                    images.search_lang = options.string("search_lang")?;
                    images.safesearch = options.string("safesearch")?;
                    images.spellcheck = options.boolean("spellcheck")?;
                }
                options.finish()?;
                web.image_search = Some(images);
                return Ok(Mapped { tool: "image_search", group, ignored: Vec::new() });
            }
        }
        _ => {}
    }
    let hint = match provider {
        "ddg_search" | "image_search" => {
            "DuckDuckGo has no search API (DeerFlow scrapes it); use searxng, which can query DuckDuckGo among its engines, \
             or another provider"
                .to_owned()
        }
        _ => format!(
            "the supported ones are {}; Antler also has its own direct fetcher (runs.lead.web.fetch: {{provider: direct}})",
            supported_uses().join(", ")
        ),
    };
    Err(unknown(hint))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `tools:` entries of DeerFlow's config.example.yaml (the active ones and the commented-out
    /// alternatives), as a user would switch them on.
    const EXAMPLE: &str = r#"
- {name: web_search, group: web, use: "deerflow.community.ddg_search.tools:web_search_tool", max_results: 5}
- {name: web_search, group: web, use: "deerflow.community.searxng.tools:web_search_tool", base_url: "http://localhost:8088", max_results: 5}
- {name: web_search, group: web, use: "deerflow.community.serper.tools:web_search_tool", max_results: 5}
- {name: web_search, group: web, use: "deerflow.community.brave.tools:web_search_tool", max_results: 5}
- {name: web_search, group: web, use: "deerflow.community.tavily.tools:web_search_tool", max_results: 5}
- {name: web_search, group: web, use: "deerflow.community.infoquest.tools:web_search_tool", search_time_range: 10}
- {name: web_search, group: web, use: "deerflow.community.exa.tools:web_search_tool", max_results: 5, search_type: auto, contents_max_characters: 1000}
- {name: web_search, group: web, use: "deerflow.community.firecrawl.tools:web_search_tool", max_results: 5}
- {name: web_fetch, group: web, use: "deerflow.community.jina_ai.tools:web_fetch_tool", timeout: 10}
- {name: web_fetch, group: web, use: "deerflow.community.firecrawl.tools:web_fetch_tool"}
- {name: web_fetch, group: web, use: "deerflow.community.exa.tools:web_fetch_tool"}
- {name: image_search, group: web, use: "deerflow.community.image_search.tools:image_search_tool", max_results: 5}
- {name: image_search, group: web, use: "deerflow.community.serper.tools:image_search_tool", max_results: 5}
- {name: image_search, group: web, use: "deerflow.community.brave.tools:image_search_tool", max_results: 5, country: US, search_lang: en, safesearch: strict, spellcheck: true}
- {name: ls, group: "file:read", use: "deerflow.sandbox.tools:ls_tool"}
- {name: read_file, group: "file:read", use: "deerflow.sandbox.tools:read_file_tool"}
- {name: glob, group: "file:read", use: "deerflow.sandbox.tools:glob_tool", max_results: 200}
- {name: grep, group: "file:read", use: "deerflow.sandbox.tools:grep_tool", max_results: 100}
- {name: write_file, group: "file:write", use: "deerflow.sandbox.tools:write_file_tool"}
- {name: str_replace, group: "file:write", use: "deerflow.sandbox.tools:str_replace_tool"}
- {name: bash, group: bash, use: "deerflow.sandbox.tools:bash_tool"}
"#;

    fn entries() -> Vec<ToolEntry> {
        serde_yaml_ng::from_str(EXAMPLE).unwrap_or_else(|e| panic!("{e}"))
    }

    fn one(entry: &ToolEntry) -> Result<(Mapped, WebConfig), DeerflowToolError> {
        let mut web = WebConfig::default();
        apply_tool_entry(3, entry, &mut web).map(|m| (m, web))
    }

    #[test]
    fn every_example_entry_maps_or_names_its_use() {
        let lookup = |name: &str| Some(format!("{name}-value-0123456789"));
        for entry in entries() {
            match one(&entry) {
                Ok((mapped, web)) => {
                    assert_eq!(mapped.tool, entry.name, "{entry:?}");
                    assert_eq!(mapped.group, entry.group);
                    web.validate_with(&lookup).unwrap_or_else(|e| panic!("{entry:?} maps to an invalid config: {e}"));
                }
                Err(DeerflowToolError::UnknownUse { use_path, index, hint, .. }) => {
                    assert_eq!(use_path, entry.use_path);
                    assert_eq!(index, 3);
                    assert!(
                        ["ddg_search", "infoquest", "image_search.tools", "exa.tools:web_fetch"].iter().any(|p| use_path.contains(p)),
                        "{use_path} should be supported"
                    );
                    assert!(!hint.is_empty());
                }
                Err(other) => panic!("{entry:?}: {other}"),
            }
        }
    }

    #[test]
    fn provider_options_carry_over() {
        let entries = entries();
        let find = |needle: &str| entries.iter().find(|e| e.use_path.contains(needle)).cloned().unwrap_or_else(|| panic!("{needle}"));
        let (_, web) = one(&find("searxng")).unwrap_or_else(|e| panic!("{e}"));
        let search = web.search.unwrap_or_default();
        assert_eq!(
            (search.provider, search.base_url.as_str(), search.max_results),
            (SearchProviderKind::Searxng, "http://localhost:8088", 5)
        );
        let (_, web) = one(&find("exa.tools:web_search")).unwrap_or_else(|e| panic!("{e}"));
        let search = web.search.unwrap_or_default();
        assert_eq!((search.search_type.as_deref(), search.contents_max_characters), (Some("auto"), Some(1000)));
        let (_, web) = one(&find("jina_ai")).unwrap_or_else(|e| panic!("{e}"));
        let fetch = web.fetch.unwrap_or_default();
        assert_eq!((fetch.provider, fetch.timeout_ms), (FetchProviderKind::Jina, 10_000));
        let (_, web) = one(&find("brave.tools:image")).unwrap_or_else(|e| panic!("{e}"));
        let images = web.image_search.unwrap_or_default();
        assert_eq!(images.country.as_deref(), Some("US"));
        assert_eq!((images.safesearch.as_deref(), images.spellcheck), (Some("strict"), Some(true)));
        let (mapped, web) = one(&find("glob_tool")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((mapped.tool, mapped.ignored), ("glob", vec!["max_results".to_owned()]));
        assert_eq!(web, WebConfig::default(), "a built-in changes no web setting");
    }

    #[test]
    fn unknown_uses_options_and_duplicates_are_named() {
        let entry = |yaml: &str| serde_yaml_ng::from_str::<ToolEntry>(yaml).unwrap_or_else(|e| panic!("{e}"));
        let error = one(&entry("{name: web_search, use: 'deerflow.community.ddg_search.tools:web_search_tool'}"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.starts_with("tools[3] (web_search): `use: deerflow.community.ddg_search.tools:web_search_tool` is not a tool Antler has"),
            "{error}"
        );
        assert!(error.contains("searxng"), "{error}");
        let error = one(&entry("{name: x, use: 'my.module:thing'}")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("`use: my.module:thing`") && error.contains("deerflow.community.tavily.tools:web_search_tool"), "{error}");
        let error = one(&entry("{name: web_search, use: 'deerflow.community.tavily.tools:web_search_tool', depth: advanced}"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("`depth` is not an option"), "{error}");
        let error = one(&entry("{name: web_fetch, use: 'deerflow.community.jina_ai.tools:web_fetch_tool', proxy: 'http://p:3128'}"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("`proxy`") && error.contains("HTTPS_PROXY"), "{error}");
        let mut web = WebConfig::default();
        let tavily = entry("{name: web_search, use: 'deerflow.community.tavily.tools:web_search_tool'}");
        assert!(apply_tool_entry(0, &tavily, &mut web).is_ok());
        assert!(matches!(apply_tool_entry(1, &tavily, &mut web), Err(DeerflowToolError::Duplicate { index: 1, .. })));
        let capped = entry("{name: web_search, use: 'deerflow.community.serper.tools:web_search_tool', max_results: '50'}");
        let (_, web) = one(&capped).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(web.search.map(|s| s.max_results), Some(10), "clamped to Serper's cap, as DeerFlow does");
    }
}
