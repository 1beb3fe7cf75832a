//! A configured model after resolution: what the gateway needs to call it, with every default applied.
//!
//! [`crate::config`] turns `antler.yaml` entries (native or DeerFlow-style) into these; nothing downstream
//! looks at the raw configuration again.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::providers::replay::script::ReplayScript;

/// Which wire protocol a model speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// OpenAI Chat Completions and everything compatible with it.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Scripted responses, no network.
    Replay,
    /// Google's Gemini API, native (`streamGenerateContent`).
    Gemini,
    /// Azure OpenAI: a deployment's Chat Completions with an `api-version`.
    Azure,
}

impl ProviderKind {
    /// The name used in configuration, logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::Anthropic => "anthropic",
            Self::Replay => "replay",
            Self::Gemini => "gemini",
            Self::Azure => "azure",
        }
    }
}

/// What a model supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub thinking: bool,
    pub vision: bool,
    pub reasoning_effort: bool,
    pub tools: bool,
}

/// How long the gateway waits on an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP + TLS connection set-up.
    pub connect: Duration,
    /// From sending the request to the response's status line and headers.
    pub first_byte: Duration,
    /// Between two stream events once the response has started (DeerFlow's `stream_chunk_timeout`).
    pub chunk: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { connect: Duration::from_secs(10), first_byte: Duration::from_secs(600), chunk: Duration::from_secs(240) }
    }
}

/// Retry timing shared by every model (the attempt count is per model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay before the second attempt; doubles per attempt.
    pub base_delay: Duration,
    /// Largest computed delay.
    pub cap_delay: Duration,
    /// Longest `Retry-After` the gateway is willing to wait; a longer one ends this model's retries at once.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { base_delay: Duration::from_millis(1000), cap_delay: Duration::from_millis(8000), max_retry_after: Duration::from_secs(60) }
    }
}

/// The credential of a model. Its `Debug` never shows the key.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiKey {
    value: Option<Arc<str>>,
    /// Where the key came from, for error messages: `$OPENAI_API_KEY`, or the YAML path of a literal.
    pub source: String,
}

impl ApiKey {
    /// The key is registered with the process's redactor for good, also when it came from a variable
    /// named by `api_key_env` (which the config loader never sees): an upstream that echoes it in an
    /// error cannot carry it into a status, a stored run error or a log line.
    pub fn new(value: Option<String>, source: String) -> Self {
        let value: Option<Arc<str>> = value.filter(|v| !v.is_empty()).map(Arc::from);
        if let Some(value) = &value {
            antler_kit::redact::register_static(value);
        }
        Self { value, source }
    }

    /// The key, when one is configured.
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKey").field("set", &self.value.is_some()).field("source", &self.source).finish()
    }
}

/// One configured model, resolved.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// Unique name (the `model_name` callers pass).
    pub name: String,
    pub display_name: String,
    pub description: String,
    pub kind: ProviderKind,
    /// Model id sent upstream.
    pub upstream_model: String,
    /// Endpoint root, without a trailing slash (`https://api.openai.com/v1`, `https://api.anthropic.com`).
    pub base_url: String,
    pub api_key: ApiKey,
    /// Extra HTTP headers sent with every request (`default_headers`).
    pub headers: Vec<(String, String)>,
    /// Default output token limit; also the largest a request may ask for.
    pub max_tokens: Option<u32>,
    /// Provider parameters merged into every request body, before the thinking blocks and the request's own
    /// values (`temperature`, `top_p`, `extra_body`, `model_kwargs`, …). Keys named `extra_body` or
    /// `model_kwargs` are flattened into the body by the provider, as LangChain does.
    pub params: Map<String, Value>,
    /// `when_thinking_enabled` with the `thinking` shortcut folded in (DeerFlow's "effective wte").
    pub when_thinking_enabled: Option<Map<String, Value>>,
    pub when_thinking_disabled: Option<Map<String, Value>>,
    pub capabilities: Capabilities,
    pub context_window: Option<u32>,
    pub timeouts: Timeouts,
    /// Further attempts after the first one, on retryable failures.
    pub max_retries: u32,
    /// Models tried in order when this one fails after its retries. Not transitive.
    pub fallbacks: Vec<String>,
    /// Requests in flight at once for this model; 0 = unbounded.
    pub max_concurrency: u32,
    /// Send earlier turns' thinking back as `reasoning_content` (DeepSeek, MiMo, StepFun, vLLM need it on
    /// tool-call continuations; plain OpenAI does not know the field).
    pub send_reasoning_content: bool,
    /// HTTP/2 without negotiation to an `http://` endpoint (h2c); over TLS, ALPN picks the version.
    pub http2_prior_knowledge: bool,
    /// `anthropic-version` header.
    pub anthropic_version: String,
    /// Azure: the `api-version` query parameter (empty for other providers).
    pub api_version: String,
    /// Azure: the credential is a Microsoft Entra ID token, sent as `Authorization: Bearer`, instead of
    /// a resource key sent as `api-key`.
    pub bearer_token: bool,
    /// The script of a replay model.
    pub replay: Option<Arc<ReplayScript>>,
    /// What the DeerFlow mapping changed or ignored, logged when the model is loaded.
    pub notes: Vec<String>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal model for unit tests.
    pub(crate) fn spec(name: &str, kind: ProviderKind) -> ModelSpec {
        ModelSpec {
            name: name.to_owned(),
            display_name: String::new(),
            description: String::new(),
            kind,
            upstream_model: format!("{name}-upstream"),
            base_url: "http://127.0.0.1:9".to_owned(),
            api_key: ApiKey::new(Some("sk-test".to_owned()), "$TEST_KEY".to_owned()),
            headers: Vec::new(),
            max_tokens: None,
            params: Map::new(),
            when_thinking_enabled: None,
            when_thinking_disabled: None,
            capabilities: Capabilities { thinking: false, vision: false, reasoning_effort: false, tools: true },
            context_window: None,
            timeouts: Timeouts::default(),
            max_retries: 2,
            fallbacks: Vec::new(),
            max_concurrency: 0,
            send_reasoning_content: false,
            http2_prior_knowledge: false,
            anthropic_version: "2023-06-01".to_owned(),
            api_version: String::new(),
            bearer_token: false,
            replay: None,
            notes: Vec::new(),
        }
    }
}
