//! The `models` section of `antler.yaml`, and its resolution into [`ModelSpec`]s.
//!
//! The section is either a list of model entries (so DeerFlow's `models:` block can be pasted as it is)
//! or a mapping with `models:` (the list) and `retry:` (backoff timing shared by every model). Entries take
//! Antler's own keys (`provider: openai|anthropic|replay`) or DeerFlow's (`use: module:Class`, with
//! `api_base`, `request_timeout`, `num_predict`, …). Unknown keys are refused with their YAML path, as
//! everywhere in Antler; a DeerFlow class that cannot be served is refused with the reason.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use antler_kit::Config;
use antler_kit::config::{ConfigError, check_range};
use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::deerflow;
use crate::providers::replay::script::ReplayScript;
use crate::spec::{ApiKey, Capabilities, ModelSpec, ProviderKind, RetryPolicy, Timeouts};

/// Settings of the models service.
#[derive(Debug, Clone)]
pub struct ModelsConfig {
    /// Configured models, in order; the first is the default.
    pub models: Vec<ModelEntry>,
    /// Backoff timing of retries.
    pub retry: RetryConfig,
    /// The YAML path of the model list in errors: `models` (list form) or `models.models` (mapping form).
    pub list_path: &'static str,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self { models: Vec::new(), retry: RetryConfig::default(), list_path: "models.models" }
    }
}

/// The mapping form of the section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SectionMap {
    models: Vec<ModelEntry>,
    retry: RetryConfig,
}

impl<'de> Deserialize<'de> for ModelsConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SectionVisitor;

        impl<'de> Visitor<'de> for SectionVisitor {
            type Value = ModelsConfig;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of models, or a mapping with `models` and `retry`")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<ModelsConfig, A::Error> {
                let models = Vec::<ModelEntry>::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(ModelsConfig { models, retry: RetryConfig::default(), list_path: "models" })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ModelsConfig, A::Error> {
                let section = SectionMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ModelsConfig { models: section.models, retry: section.retry, list_path: "models.models" })
            }

            fn visit_unit<E: de::Error>(self) -> Result<ModelsConfig, E> {
                Ok(ModelsConfig::default())
            }

            fn visit_none<E: de::Error>(self) -> Result<ModelsConfig, E> {
                Ok(ModelsConfig::default())
            }
        }

        deserializer.deserialize_any(SectionVisitor)
    }
}

/// Backoff between attempts: `base_delay_ms * 2^(attempt-1)`, capped, with jitter; `Retry-After` honoured.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Delay before the second attempt, in milliseconds (0..600000).
    pub base_delay_ms: u64,
    /// Largest computed delay, in milliseconds (base_delay_ms..600000).
    pub cap_delay_ms: u64,
    /// Longest upstream `Retry-After` waited for, in milliseconds (0..3600000); a longer one ends the model's
    /// retries at once (its fallbacks are tried, or the caller gets the wait in `retry-after`).
    pub max_retry_after_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self { base_delay_ms: 1000, cap_delay_ms: 8000, max_retry_after_ms: 60_000 }
    }
}

/// Provider kinds as written in `provider:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderName {
    #[serde(alias = "openai-compatible", alias = "openai_compatible")]
    Openai,
    Anthropic,
    Replay,
    #[serde(alias = "google", alias = "google_genai")]
    Gemini,
    #[serde(alias = "azure_openai", alias = "azure-openai")]
    Azure,
}

impl From<ProviderName> for ProviderKind {
    fn from(name: ProviderName) -> Self {
        match name {
            ProviderName::Openai => ProviderKind::OpenAi,
            ProviderName::Anthropic => ProviderKind::Anthropic,
            ProviderName::Replay => ProviderKind::Replay,
            ProviderName::Gemini => ProviderKind::Gemini,
            ProviderName::Azure => ProviderKind::Azure,
        }
    }
}

/// One model. Antler keys and DeerFlow `config.yaml` keys are both accepted (DeerFlow names are aliases).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelEntry {
    /// Unique name callers use. Required.
    pub name: String,
    pub display_name: Option<String>,
    pub description: Option<String>,
    /// `openai`, `anthropic`, `gemini`, `azure` or `replay`. Required unless `use` is given; wins over `use`
    /// when both are.
    pub provider: Option<ProviderName>,
    /// DeerFlow class path (`langchain_openai:ChatOpenAI`), mapped to a provider.
    #[serde(rename = "use")]
    pub use_class: Option<String>,
    /// Upstream model id. Required for openai and anthropic.
    pub model: Option<String>,
    /// API key, usually `$VAR`.
    #[serde(alias = "openai_api_key", alias = "anthropic_api_key", alias = "gemini_api_key", alias = "google_api_key")]
    pub api_key: Option<String>,
    /// Name of an environment variable holding the key (read when the configuration is loaded).
    pub api_key_env: Option<String>,
    /// Endpoint root.
    #[serde(alias = "api_base", alias = "openai_api_base", alias = "anthropic_api_url")]
    pub base_url: Option<String>,
    /// Default and largest output tokens per completion.
    #[serde(alias = "num_predict", alias = "max_tokens_to_sample", alias = "max_output_tokens")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature, 0..2.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u32>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub seed: Option<i64>,
    /// Connection set-up timeout in milliseconds (1..600000; default 10000).
    pub connect_timeout_ms: Option<u64>,
    /// Time to the response status line in milliseconds (1..3600000; default 600000).
    pub first_byte_timeout_ms: Option<u64>,
    /// Longest gap between stream events in milliseconds (1..3600000; default 240000).
    pub chunk_timeout_ms: Option<u64>,
    /// DeerFlow/httpx read timeout in seconds → first_byte_timeout_ms.
    #[serde(alias = "request_timeout", alias = "default_request_timeout", alias = "read_timeout")]
    pub timeout: Option<f64>,
    /// DeerFlow connect timeout in seconds → connect_timeout_ms.
    pub connect_timeout: Option<f64>,
    /// DeerFlow inter-chunk timeout in seconds → chunk_timeout_ms.
    pub stream_chunk_timeout: Option<f64>,
    /// Accepted for DeerFlow compatibility; writes are not timed separately.
    pub write_timeout: Option<f64>,
    /// Accepted for DeerFlow compatibility; the connection pool does not queue.
    pub pool_timeout: Option<f64>,
    /// Further attempts after the first on retryable failures (0..20; default 2).
    pub max_retries: Option<u32>,
    /// Models tried in order when this one fails after its retries.
    pub fallbacks: Vec<String>,
    /// Requests in flight at once (0 = unbounded, the default; up to 100000).
    pub max_concurrency: Option<u32>,
    pub supports_thinking: bool,
    pub supports_vision: bool,
    pub supports_reasoning_effort: bool,
    /// Speak HTTP/2 from the first byte (h2c) to an `http://` endpoint that serves it; `https://`
    /// endpoints negotiate HTTP/2 on their own (TLS ALPN).
    pub http2_prior_knowledge: bool,
    /// Tools may be passed (default true).
    pub supports_tools: Option<bool>,
    /// Parameters deep-merged into the request when thinking is on.
    pub when_thinking_enabled: Option<Map<String, Value>>,
    /// Parameters deep-merged when thinking is off (wins over the derived off switch).
    pub when_thinking_disabled: Option<Map<String, Value>>,
    /// Shortcut merged into `when_thinking_enabled.thinking`.
    pub thinking: Option<Map<String, Value>>,
    /// Context window in tokens (shown to callers only).
    pub context_window: Option<u32>,
    /// Prices, shown to nobody yet; accepted so DeerFlow entries load.
    pub pricing: Option<Value>,
    /// Merged into the top level of every request body.
    pub extra_body: Option<Map<String, Value>>,
    /// Same as extra_body (LangChain's name).
    pub model_kwargs: Option<Map<String, Value>>,
    /// Extra HTTP headers.
    pub default_headers: Option<BTreeMap<String, String>>,
    /// OpenAI organization header.
    #[serde(alias = "openai_organization")]
    pub organization: Option<String>,
    /// Replay earlier thinking as `reasoning_content` (openai kind).
    pub send_reasoning_content: Option<bool>,
    /// `anthropic-version` header (default 2023-06-01).
    pub anthropic_version: Option<String>,
    /// Azure: the resource's endpoint, `https://{resource}.openai.azure.com` (default
    /// `$AZURE_OPENAI_ENDPOINT`).
    pub azure_endpoint: Option<String>,
    /// Azure: the deployment called (default: `model`).
    #[serde(alias = "deployment_name")]
    pub azure_deployment: Option<String>,
    /// Azure: the `api-version` query (default `$OPENAI_API_VERSION`; none on the v1 API).
    #[serde(alias = "openai_api_version")]
    pub api_version: Option<String>,
    /// Azure: a Microsoft Entra ID token, sent as `Authorization: Bearer` instead of an `api-key`
    /// (default `$AZURE_OPENAI_AD_TOKEN` when there is no key).
    pub azure_ad_token: Option<String>,
    /// Azure: accepted for DeerFlow / LangChain compatibility (tracing metadata there).
    pub model_version: Option<String>,
    /// Azure: accepted for LangChain compatibility (`azure` is implied by the class).
    pub openai_api_type: Option<String>,
    /// Gemini: `thinkingConfig.thinkingBudget` (tokens; -1 = dynamic, 0 = off where the model allows).
    pub thinking_budget: Option<i64>,
    /// Gemini: `thinkingConfig.includeThoughts` (default: true while thinking is enabled).
    pub include_thoughts: Option<bool>,
    /// Gemini: `thinkingConfig.thinkingLevel` (Gemini 3: `low`, `high`, …).
    pub thinking_level: Option<String>,
    /// Gemini: `safetySettings`, as `{category: threshold}` or the API's list.
    pub safety_settings: Option<Value>,
    /// Gemini: `generationConfig.responseMimeType` (e.g. `application/json`).
    pub response_mime_type: Option<String>,
    /// Replay script file (replay kind), relative to the config file's directory.
    pub replay_file: Option<PathBuf>,
    /// Inline replay script (replay kind).
    pub replay: Option<ReplayScript>,
    // DeerFlow keys with nothing to configure here; accepted and noted.
    pub use_responses_api: Option<bool>,
    pub output_version: Option<String>,
    /// Ollama `reasoning` (think) switch.
    pub reasoning: Option<bool>,
    pub cumulative_stream_usage: Option<bool>,
    pub stream_usage: Option<bool>,
    pub streaming: Option<bool>,
    pub enable_prompt_caching: Option<bool>,
    pub prompt_cache_size: Option<u32>,
}

/// Parses and checks the `models` section (every entry resolved, replay files read).
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    resolve(config).map(|_| ())
}

/// The resolved section.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub models: Vec<ModelSpec>,
    pub retry: RetryPolicy,
}

/// Parses the section and resolves every entry.
pub fn resolve(config: &Config) -> Result<Resolved, ConfigError> {
    let section: ModelsConfig = config.section("models")?;
    let base_dir = config.path.as_deref().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default();
    let key_refs = config.path.as_deref().map(key_references).unwrap_or_default();
    resolve_section(&section, &base_dir, &key_refs)
}

/// Resolves a parsed section. `base_dir` anchors relative replay files; `key_refs` gives, per model name,
/// the variable its `api_key` referenced in the file (the kit substitutes variables before we see them).
pub fn resolve_section(section: &ModelsConfig, base_dir: &Path, key_refs: &BTreeMap<String, String>) -> Result<Resolved, ConfigError> {
    let retry = &section.retry;
    check_range("models.retry.base_delay_ms", retry.base_delay_ms, 0, 600_000)?;
    check_range("models.retry.cap_delay_ms", retry.cap_delay_ms, retry.base_delay_ms, 600_000)?;
    check_range("models.retry.max_retry_after_ms", retry.max_retry_after_ms, 0, 3_600_000)?;
    let policy = RetryPolicy {
        base_delay: Duration::from_millis(retry.base_delay_ms),
        cap_delay: Duration::from_millis(retry.cap_delay_ms),
        max_retry_after: Duration::from_millis(retry.max_retry_after_ms),
    };

    let builtin;
    let entries = if section.models.is_empty() {
        builtin = [demo_model()?];
        &builtin[..]
    } else {
        &section.models[..]
    };
    let mut models = Vec::with_capacity(entries.len());
    let mut seen = HashSet::new();
    for (index, entry) in entries.iter().enumerate() {
        let path = format!("{}[{index}]", section.list_path);
        let spec = resolve_entry(entry, &path, base_dir, key_refs.get(&entry.name))?;
        if !seen.insert(spec.name.clone()) {
            return Err(invalid(&format!("{path}.name"), format!("`{}` is used by an earlier model; names must be unique", spec.name)));
        }
        models.push(spec);
    }
    let names: HashSet<&str> = models.iter().map(|m| m.name.as_str()).collect();
    for (index, model) in models.iter().enumerate() {
        let mut listed = HashSet::new();
        for (f, fallback) in model.fallbacks.iter().enumerate() {
            let path = format!("{}[{index}].fallbacks[{f}]", section.list_path);
            if fallback == &model.name {
                return Err(invalid(&path, format!("`{fallback}` is the model itself")));
            }
            if !names.contains(fallback.as_str()) {
                let mut known: Vec<&str> = names.iter().copied().collect();
                known.sort_unstable();
                return Err(invalid(&path, format!("`{fallback}` is not a configured model (configured: {})", known.join(", "))));
            }
            if !listed.insert(fallback) {
                return Err(invalid(&path, format!("`{fallback}` is listed twice")));
            }
        }
    }
    Ok(Resolved { models, retry: policy })
}

/// The script of the built-in `demo` model.
pub const DEMO_TRANSCRIPT: &str = include_str!("../demo/transcript.yaml");

/// What the service serves when `models` lists nothing: one replay model, `demo`, playing the shipped
/// transcript (a plan → write → check → present → answer run of the lead agent), so a fresh `antler up`
/// shows a whole run without an API key. Configuring any model replaces it.
fn demo_model() -> Result<ModelEntry, ConfigError> {
    let script: ReplayScript = serde_yaml_ng::from_str(DEMO_TRANSCRIPT)
        .map_err(|e| invalid("models", format!("the built-in demo transcript does not parse: {e}")))?;
    Ok(ModelEntry {
        name: "demo".to_owned(),
        display_name: Some("Demo (replay)".to_owned()),
        description: Some(
            "Built-in scripted model, served because no models are configured; add an entry under `models` to use a real one".to_owned(),
        ),
        provider: Some(ProviderName::Replay),
        supports_thinking: true,
        replay: Some(script),
        ..ModelEntry::default()
    })
}

fn invalid(path: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { path: path.to_owned(), message: message.into() }
}

fn float_range(path: &str, value: f64, min: f64, max: f64) -> Result<(), ConfigError> {
    if value.is_finite() && (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange { path: path.to_owned(), value: value.to_string(), limit: format!("must be between {min} and {max}") })
    }
}

/// Seconds (DeerFlow) to a duration, with the range checked in milliseconds.
fn seconds(path: &str, secs: f64, max_ms: u64) -> Result<u64, ConfigError> {
    float_range(path, secs, 0.001, max_ms as f64 / 1000.0)?;
    Ok((secs * 1000.0).round() as u64)
}

fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || "._:-/@+".contains(c))
}

fn resolve_entry(entry: &ModelEntry, path: &str, base_dir: &Path, key_ref: Option<&String>) -> Result<ModelSpec, ConfigError> {
    if !valid_name(&entry.name) {
        return Err(invalid(
            &format!("{path}.name"),
            format!("`{}` must be 1 to 128 characters of letters, digits and . _ : - / @ +", entry.name),
        ));
    }
    let mut notes = Vec::new();
    let flavor = match &entry.use_class {
        Some(class) => match deerflow::map_class(class) {
            Ok(flavor) => Some(flavor),
            // An explicit `provider:` says how to call the class, so an unknown class is fine then.
            Err(_) if entry.provider.is_some() => None,
            Err(why) => return Err(invalid(&format!("{path}.use"), format!("`{class}` cannot be mapped: {why}"))),
        },
        None => None,
    };
    let kind = match (entry.provider, &flavor) {
        (Some(provider), _) => ProviderKind::from(provider),
        (None, Some(flavor)) => flavor.kind,
        (None, None) => {
            return Err(invalid(
                &format!("{path}.provider"),
                "missing: set `provider: openai|anthropic|gemini|azure|replay` (or DeerFlow's `use: module:Class`)",
            ));
        }
    };
    if let Some(note) = flavor.as_ref().and_then(|f| f.note) {
        notes.push(note.to_owned());
    }

    let upstream_model = match (&entry.model, kind) {
        (Some(model), _) if !model.trim().is_empty() => model.clone(),
        (_, ProviderKind::Replay) => entry.name.clone(),
        // An Azure deployment names its model; `model` is only what callers are told.
        (_, ProviderKind::Azure) if entry.azure_deployment.as_deref().is_some_and(|d| !d.trim().is_empty()) => {
            entry.azure_deployment.clone().unwrap_or_default()
        }
        _ => return Err(invalid(&format!("{path}.model"), "missing: the upstream model id (e.g. gpt-4o) is required")),
    };

    check_provider_keys(entry, path, kind)?;
    let (base_url, api_version) = match kind {
        ProviderKind::Azure => resolve_azure(entry, path, entry.azure_deployment.as_deref().unwrap_or(&upstream_model))?,
        _ => (resolve_base_url(entry, path, kind, flavor.as_ref())?, String::new()),
    };

    let key_value = match (&entry.api_key_env, &entry.api_key) {
        (Some(_), Some(_)) => return Err(invalid(&format!("{path}.api_key_env"), "give either api_key or api_key_env, not both")),
        (Some(var), None) => match std::env::var(var) {
            Ok(value) => Some(value),
            Err(_) => {
                return Err(ConfigError::MissingEnv { var: var.clone(), path: format!("{path}.api_key_env") });
            }
        },
        (None, key) => key.clone(),
    };
    let key_source = match (&entry.api_key_env, key_ref) {
        (Some(var), _) => format!("${var}"),
        (None, Some(var)) => format!("${var}"),
        (None, None) => format!("{path}.api_key"),
    };

    // As LangChain's classes do, a key not given comes from the provider's usual variable.
    let (key_value, key_source, bearer_token) = match (kind, key_value) {
        (ProviderKind::Azure, None) => match (&entry.azure_ad_token, env_var("AZURE_OPENAI_API_KEY"), env_var("AZURE_OPENAI_AD_TOKEN")) {
            (Some(token), _, _) => (Some(token.clone()), format!("{path}.azure_ad_token"), true),
            (None, Some(key), _) => (Some(key), "$AZURE_OPENAI_API_KEY".to_owned(), false),
            (None, None, Some(token)) => (Some(token), "$AZURE_OPENAI_AD_TOKEN".to_owned(), true),
            (None, None, None) => (None, key_source, false),
        },
        (ProviderKind::Azure, Some(_)) if entry.azure_ad_token.is_some() => {
            return Err(invalid(&format!("{path}.azure_ad_token"), "give either api_key or azure_ad_token, not both"));
        }
        (ProviderKind::Gemini, None) => match env_var("GOOGLE_API_KEY") {
            Some(key) => (Some(key), "$GOOGLE_API_KEY".to_owned(), false),
            None => (None, key_source, false),
        },
        (_, key) => (key, key_source, false),
    };

    if let Some(t) = entry.temperature {
        float_range(&format!("{path}.temperature"), t, 0.0, 2.0)?;
    }
    if let Some(p) = entry.top_p {
        float_range(&format!("{path}.top_p"), p, 0.0, 1.0)?;
    }
    for (name, value) in [("frequency_penalty", entry.frequency_penalty), ("presence_penalty", entry.presence_penalty)] {
        if let Some(v) = value {
            float_range(&format!("{path}.{name}"), v, -2.0, 2.0)?;
        }
    }
    if let Some(max) = entry.max_tokens {
        check_range(&format!("{path}.max_tokens"), u64::from(max), 1, 10_000_000)?;
    }
    if let Some(window) = entry.context_window {
        check_range(&format!("{path}.context_window"), u64::from(window), 1, 100_000_000)?;
    }

    let timeouts = resolve_timeouts(entry, path)?;
    let max_retries = entry.max_retries.or(flavor.as_ref().and_then(|f| f.default_max_retries)).unwrap_or(2);
    check_range(&format!("{path}.max_retries"), u64::from(max_retries), 0, 20)?;
    let max_concurrency = entry.max_concurrency.unwrap_or(0);
    check_range(&format!("{path}.max_concurrency"), u64::from(max_concurrency), 0, 100_000)?;

    let mut params = Map::new();
    let mut set = |key: &str, value: Option<Value>| {
        if let Some(value) = value {
            params.insert(key.to_owned(), value);
        }
    };
    set("temperature", entry.temperature.map(Value::from));
    set("top_p", entry.top_p.map(Value::from));
    set("top_k", entry.top_k.map(Value::from));
    set("frequency_penalty", entry.frequency_penalty.map(Value::from));
    set("presence_penalty", entry.presence_penalty.map(Value::from));
    set("seed", entry.seed.map(Value::from));
    set("model_kwargs", entry.model_kwargs.clone().map(Value::Object));
    set("extra_body", entry.extra_body.clone().map(Value::Object));
    set("thinking_budget", entry.thinking_budget.map(Value::from));
    set("include_thoughts", entry.include_thoughts.map(Value::from));
    set("thinking_level", entry.thinking_level.clone().map(Value::from));
    set("safety_settings", entry.safety_settings.clone());
    set("response_mime_type", entry.response_mime_type.clone().map(Value::from));
    if entry.reasoning == Some(false) && flavor.as_ref().is_some_and(|f| f.ollama) {
        // Ollama's OpenAI-compatible endpoint switches thinking off with reasoning_effort "none".
        params.insert("reasoning_effort".to_owned(), Value::from("none"));
    }

    // DeerFlow step 5: the `thinking` shortcut is merged into when_thinking_enabled.thinking.
    let when_thinking_enabled = match (&entry.when_thinking_enabled, &entry.thinking) {
        (None, None) => None,
        (wte, thinking) => {
            let mut wte = wte.clone().unwrap_or_default();
            if let Some(thinking) = thinking {
                let mut merged = match wte.remove("thinking") {
                    Some(Value::Object(existing)) => existing,
                    _ => Map::new(),
                };
                crate::thinking::deep_merge(&mut merged, thinking);
                wte.insert("thinking".to_owned(), Value::Object(merged));
            }
            Some(wte)
        }
    };

    let mut headers: Vec<(String, String)> = Vec::new();
    for (name, value) in entry.default_headers.iter().flatten() {
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() || reqwest::header::HeaderValue::from_str(value).is_err() {
            return Err(invalid(&format!("{path}.default_headers.{name}"), "not a valid HTTP header name and value"));
        }
        headers.push((name.clone(), value.clone()));
    }
    if let Some(org) = &entry.organization {
        headers.push(("OpenAI-Organization".to_owned(), org.clone()));
    }

    let replay = resolve_replay(entry, path, kind, base_dir)?;

    for (key, set) in [
        ("use_responses_api", entry.use_responses_api == Some(true)),
        ("write_timeout", entry.write_timeout.is_some()),
        ("pool_timeout", entry.pool_timeout.is_some()),
        ("enable_prompt_caching", entry.enable_prompt_caching.is_some()),
        ("prompt_cache_size", entry.prompt_cache_size.is_some()),
        ("output_version", entry.output_version.is_some()),
        ("model_version", entry.model_version.is_some()),
        ("openai_api_type", entry.openai_api_type.is_some()),
    ] {
        if set {
            notes.push(format!("`{key}` has no effect in Antler (Chat Completions / Messages streaming is used as is)"));
        }
    }

    if kind == ProviderKind::Gemini {
        check_gemini_settings(path, &params, &when_thinking_enabled, &entry.when_thinking_disabled)?;
    }

    let anthropic_version = entry.anthropic_version.clone().unwrap_or_else(|| "2023-06-01".to_owned());
    Ok(ModelSpec {
        name: entry.name.clone(),
        display_name: entry.display_name.clone().unwrap_or_default(),
        description: entry.description.clone().unwrap_or_default(),
        kind,
        upstream_model,
        base_url,
        api_key: ApiKey::new(key_value, key_source),
        headers,
        max_tokens: entry.max_tokens,
        params,
        when_thinking_enabled,
        when_thinking_disabled: entry.when_thinking_disabled.clone(),
        capabilities: Capabilities {
            thinking: entry.supports_thinking,
            vision: entry.supports_vision,
            reasoning_effort: entry.supports_reasoning_effort,
            tools: entry.supports_tools.unwrap_or(true),
        },
        context_window: entry.context_window,
        timeouts,
        max_retries,
        fallbacks: entry.fallbacks.clone(),
        max_concurrency,
        send_reasoning_content: entry.send_reasoning_content.or(flavor.as_ref().map(|f| f.send_reasoning_content)).unwrap_or(false),
        http2_prior_knowledge: entry.http2_prior_knowledge,
        anthropic_version,
        api_version,
        bearer_token,
        replay,
        notes,
    })
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Keys of one provider set on a model of another are refused: they would do nothing, or be sent as
/// fields the other API does not have.
fn check_provider_keys(entry: &ModelEntry, path: &str, kind: ProviderKind) -> Result<(), ConfigError> {
    let azure = [
        ("azure_endpoint", entry.azure_endpoint.is_some()),
        ("azure_deployment", entry.azure_deployment.is_some()),
        ("api_version", entry.api_version.is_some()),
        ("azure_ad_token", entry.azure_ad_token.is_some()),
    ];
    let gemini = [
        ("thinking_budget", entry.thinking_budget.is_some()),
        ("include_thoughts", entry.include_thoughts.is_some()),
        ("thinking_level", entry.thinking_level.is_some()),
        ("safety_settings", entry.safety_settings.is_some()),
        ("response_mime_type", entry.response_mime_type.is_some()),
    ];
    for (keys, owner, provider) in [(&azure[..], ProviderKind::Azure, "azure"), (&gemini[..], ProviderKind::Gemini, "gemini")] {
        if kind != owner
            && let Some((key, _)) = keys.iter().find(|(_, set)| *set)
        {
            return Err(invalid(
                &format!("{path}.{key}"),
                format!("is a setting of `provider: {provider}` models; this one is `{}`", kind.as_str()),
            ));
        }
    }
    Ok(())
}

/// An Azure model's deployment root (`https://{resource}.openai.azure.com/openai/deployments/{deployment}`,
/// or the v1 API's `…/openai/v1`) and its api-version. A `base_url` that already names a deployment or
/// the v1 API is used as it is; otherwise the deployment (default: `model`) is appended to
/// `azure_endpoint` (or `$AZURE_OPENAI_ENDPOINT`, or a resource-root `base_url`).
fn resolve_azure(entry: &ModelEntry, path: &str, deployment: &str) -> Result<(String, String), ConfigError> {
    let configured = entry.base_url.as_deref().map(|u| u.trim().trim_end_matches('/')).filter(|u| !u.is_empty());
    let endpoint = entry.azure_endpoint.as_deref().map(|u| u.trim().trim_end_matches('/').to_owned()).filter(|u| !u.is_empty());
    let (root, key) = match (configured, endpoint) {
        (Some(base), _) if base.contains("/openai/deployments/") || base.ends_with("/openai/v1") => (base.to_owned(), "base_url"),
        (_, Some(endpoint)) => (endpoint, "azure_endpoint"),
        (Some(base), None) => (base.to_owned(), "base_url"),
        (None, None) => match env_var("AZURE_OPENAI_ENDPOINT") {
            Some(endpoint) => (endpoint.trim().trim_end_matches('/').to_owned(), "azure_endpoint"),
            None => {
                return Err(invalid(
                    &format!("{path}.azure_endpoint"),
                    "missing: an Azure model needs its resource's endpoint (https://{resource}.openai.azure.com), here or in                      $AZURE_OPENAI_ENDPOINT",
                ));
            }
        },
    };
    if !(root.starts_with("http://") || root.starts_with("https://")) || reqwest::Url::parse(&root).is_err() {
        return Err(invalid(&format!("{path}.{key}"), format!("`{root}` must be an http:// or https:// URL")));
    }
    let root = if root.contains("/openai/deployments/") || root.ends_with("/openai/v1") {
        root
    } else {
        let deployment = deployment.trim();
        if deployment.is_empty() || !deployment.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
            return Err(invalid(
                &format!("{path}.azure_deployment"),
                format!("`{deployment}` is not a deployment name (letters, digits, . _ -)"),
            ));
        }
        format!("{root}/openai/deployments/{deployment}")
    };
    let version =
        entry.api_version.as_deref().map(str::trim).map(str::to_owned).or_else(|| env_var("OPENAI_API_VERSION")).unwrap_or_default();
    if version.is_empty() && !root.ends_with("/openai/v1") {
        return Err(invalid(
            &format!("{path}.api_version"),
            "missing: an Azure deployment is called with an api-version (e.g. 2024-10-21), here or in $OPENAI_API_VERSION",
        ));
    }
    if !version.chars().all(|c| c.is_ascii_alphanumeric() || "-.".contains(c)) {
        return Err(invalid(&format!("{path}.api_version"), format!("`{version}` is not an api-version such as 2024-10-21")));
    }
    Ok((root, version))
}

/// A Gemini model's parameters and thinking blocks may only hold what the provider turns into the
/// request (see `providers::gemini::SETTINGS`); anything else would be refused at the first call.
fn check_gemini_settings(
    path: &str,
    params: &Map<String, Value>,
    wte: &Option<Map<String, Value>>,
    wtd: &Option<Map<String, Value>>,
) -> Result<(), ConfigError> {
    let known = crate::providers::gemini::SETTINGS;
    let blocks = [("", Some(params)), ("when_thinking_enabled.", wte.as_ref()), ("when_thinking_disabled.", wtd.as_ref())];
    for (prefix, block) in blocks {
        if let Some(key) = block.into_iter().flat_map(|b| b.keys()).find(|k| !known.contains(&k.as_str())) {
            return Err(invalid(
                &format!("{path}.{prefix}{key}"),
                format!(
                    "is not a setting the Gemini API takes\nhint: the Gemini keys are {}; raw request fields go under extra_body",
                    known.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

fn resolve_base_url(entry: &ModelEntry, path: &str, kind: ProviderKind, flavor: Option<&deerflow::Flavor>) -> Result<String, ConfigError> {
    let configured = entry.base_url.as_deref().map(str::trim).filter(|u| !u.is_empty());
    let mut url = match (configured, flavor.and_then(|f| f.default_base_url), kind) {
        (Some(url), _, _) => url.to_owned(),
        (None, Some(default), _) => default.to_owned(),
        (None, None, ProviderKind::OpenAi) => "https://api.openai.com/v1".to_owned(),
        (None, None, ProviderKind::Anthropic) => "https://api.anthropic.com".to_owned(),
        (None, None, ProviderKind::Gemini) => "https://generativelanguage.googleapis.com".to_owned(),
        (None, None, ProviderKind::Replay | ProviderKind::Azure) => String::new(),
    };
    if kind == ProviderKind::Replay {
        return Ok(url);
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) || reqwest::Url::parse(&url).is_err() {
        return Err(invalid(&format!("{path}.base_url"), format!("`{url}` must be an http:// or https:// URL")));
    }
    while url.ends_with('/') {
        url.pop();
    }
    if flavor.is_some_and(|f| f.ollama) && !url.ends_with("/v1") {
        url.push_str("/v1");
    }
    Ok(url)
}

fn resolve_timeouts(entry: &ModelEntry, path: &str) -> Result<Timeouts, ConfigError> {
    let defaults = Timeouts::default();
    let pick = |native: Option<u64>, native_key: &str, deerflow: Option<f64>, deerflow_key: &str, default: Duration, max_ms: u64| {
        let ms = match (native, deerflow) {
            (Some(ms), _) => {
                check_range(&format!("{path}.{native_key}"), ms, 1, max_ms)?;
                ms
            }
            (None, Some(secs)) => seconds(&format!("{path}.{deerflow_key}"), secs, max_ms)?,
            (None, None) => return Ok(default),
        };
        Ok::<_, ConfigError>(Duration::from_millis(ms))
    };
    Ok(Timeouts {
        connect: pick(entry.connect_timeout_ms, "connect_timeout_ms", entry.connect_timeout, "connect_timeout", defaults.connect, 600_000)?,
        first_byte: pick(entry.first_byte_timeout_ms, "first_byte_timeout_ms", entry.timeout, "timeout", defaults.first_byte, 3_600_000)?,
        chunk: pick(
            entry.chunk_timeout_ms,
            "chunk_timeout_ms",
            entry.stream_chunk_timeout,
            "stream_chunk_timeout",
            defaults.chunk,
            3_600_000,
        )?,
    })
}

fn resolve_replay(entry: &ModelEntry, path: &str, kind: ProviderKind, base_dir: &Path) -> Result<Option<Arc<ReplayScript>>, ConfigError> {
    match (kind, &entry.replay_file, &entry.replay) {
        (ProviderKind::Replay, Some(_), Some(_)) => Err(invalid(&format!("{path}.replay"), "give either replay or replay_file, not both")),
        (ProviderKind::Replay, None, None) => {
            Err(invalid(&format!("{path}.replay_file"), "missing: a replay model needs a script (replay_file: PATH or an inline replay:)"))
        }
        (ProviderKind::Replay, None, Some(script)) => {
            script.check(&format!("{path}.replay"))?;
            Ok(Some(Arc::new(script.clone())))
        }
        (ProviderKind::Replay, Some(file), None) => {
            let full = if file.is_absolute() { file.clone() } else { base_dir.join(file) };
            let script = ReplayScript::load(&full).map_err(|message| invalid(&format!("{path}.replay_file"), message))?;
            Ok(Some(Arc::new(script)))
        }
        (_, None, None) => Ok(None),
        (_, _, _) => Err(invalid(&format!("{path}.replay"), "replay scripts belong to `provider: replay` models only")),
    }
}

/// Reads, per model name, which variable each entry's `api_key` referenced in the file as written. The kit
/// substitutes `$VAR` before the section reaches us; credential errors should still be able to say "check
/// $OPENAI_API_KEY". Best effort: any problem reading the file just leaves the map empty.
fn key_references(path: &Path) -> BTreeMap<String, String> {
    let mut refs = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(path) else { return refs };
    let Ok(root) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&text) else { return refs };
    let entries = match root.get("models") {
        Some(serde_yaml_ng::Value::Sequence(list)) => list,
        Some(map @ serde_yaml_ng::Value::Mapping(_)) => match map.get("models") {
            Some(serde_yaml_ng::Value::Sequence(list)) => list,
            _ => return refs,
        },
        _ => return refs,
    };
    for entry in entries {
        let Some(name) = entry.get("name").and_then(|n| n.as_str()) else { continue };
        let key = ["api_key", "openai_api_key", "anthropic_api_key", "gemini_api_key", "google_api_key"]
            .iter()
            .find_map(|k| entry.get(*k).and_then(|v| v.as_str()));
        if let Some(var) = key.and_then(variable_name) {
            refs.insert(name.to_owned(), var);
        }
    }
    refs
}

/// `$VAR`, `${VAR}` or `${VAR:-default}` → `VAR`.
fn variable_name(text: &str) -> Option<String> {
    let rest = text.trim().strip_prefix('$')?;
    let name = match rest.strip_prefix('{') {
        Some(inner) => inner.strip_suffix('}')?.split(":-").next()?,
        None => rest,
    };
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')).then(|| name.to_owned())
}

#[cfg(test)]
mod tests;
