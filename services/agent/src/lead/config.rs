//! The `runs.lead` section: settings of the lead agent (used when `runs.agent: lead`).

use serde::{Deserialize, Serialize};

/// Lead agent settings; the defaults follow DeerFlow.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeadConfig {
    /// Replaces the built-in system prompt when not empty.
    pub system_prompt: String,
    pub title: TitleConfig,
    pub loop_detection: LoopDetectionConfig,
    pub guardrails: GuardrailsConfig,
    pub middlewares: MiddlewaresConfig,
    pub mcp: McpToolsConfig,
}

/// MCP tools in the lead agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpToolsConfig {
    /// List the MCP service's tools at the start of each attempt and offer them to the model (whether
    /// they are deferred behind `tool_search` is the MCP service's `tool_search.enabled`).
    pub enabled: bool,
}

impl Default for McpToolsConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Switching built-in layers off.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MiddlewaresConfig {
    /// Names of built-in layers to leave out, e.g. `[Title, Uploads]` (Clarification cannot be).
    pub disabled: Vec<String>,
}

/// Built-in layers that `middlewares.disabled` may name.
pub const SWITCHABLE: [&str; 10] = [
    "ThreadData",
    "Uploads",
    "Sandbox",
    "DanglingToolCall",
    "Guardrail",
    "ToolErrorHandling",
    "Todo",
    "Title",
    "LoopDetection",
    "Clarification",
];

/// Guardrail middleware with the built-in allow/deny-list provider.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardrailsConfig {
    pub enabled: bool,
    /// Deny when the provider fails (true) or allow (false).
    pub fail_closed: bool,
    /// When set, only these tools may run.
    pub allowed_tools: Option<Vec<String>>,
    /// These tools never run.
    pub denied_tools: Vec<String>,
    /// An external policy service asked after the lists allow a call.
    pub webhook: WebhookConfig,
}

impl Default for GuardrailsConfig {
    fn default() -> Self {
        Self { enabled: false, fail_closed: true, allowed_tools: None, denied_tools: Vec::new(), webhook: WebhookConfig::default() }
    }
}

/// The webhook guardrail provider: `POST url` with the call as JSON, answered by
/// `{"allow": bool, "reasons": [{"code": …, "message": …}]}`. Any other answer (status, body, timeout,
/// connection error) is a provider failure, which `fail_closed` turns into a denial.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://` or `https://` URL; empty: no webhook.
    pub url: String,
    /// Longest wait for the answer, in milliseconds (10..60000).
    pub timeout_ms: u64,
    /// Sent as `Authorization: Bearer …` when not empty (usually `$VAR`).
    pub bearer_token: String,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self { url: String::new(), timeout_ms: 2_000, bearer_token: String::new() }
    }
}

/// Title middleware: a title after the first exchange.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TitleConfig {
    pub enabled: bool,
    /// Longest title, in words (1..20), as the prompt asks the model.
    pub max_words: u32,
    /// Longest title, in characters (10..200).
    pub max_chars: u32,
    /// Model that writes titles (caller `middleware:title`); empty: the local fallback (the first
    /// user message, cut), which costs no tokens.
    pub model_name: String,
    /// The prompt; `{max_words}`, `{user_msg}` and `{assistant_msg}` are filled in.
    pub prompt_template: String,
}

impl Default for TitleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_words: 6,
            max_chars: 60,
            model_name: String::new(),
            prompt_template: "Generate a concise title (max {max_words} words) for this conversation.\nUser: {user_msg}\nAssistant: {assistant_msg}\n\nReturn ONLY the title, no quotes, no explanation.".to_owned(),
        }
    }
}

/// LoopDetection middleware: identical tool-call sets repeated within a window.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoopDetectionConfig {
    pub enabled: bool,
    /// Repetitions of one call set that inject a warning.
    pub warn_threshold: u32,
    /// Repetitions that force a final answer (stop_reason `loop_capped`); at least `warn_threshold`.
    pub hard_limit: u32,
    /// Model turns remembered.
    pub window_size: u32,
    /// Calls of one tool (any arguments) that inject a warning.
    pub tool_freq_warn: u32,
    /// Calls of one tool that force a final answer; at least `tool_freq_warn`. Counted over the last
    /// max(`window_size`, `tool_freq_hard_limit`) tool calls.
    pub tool_freq_hard_limit: u32,
}

impl Default for LoopDetectionConfig {
    fn default() -> Self {
        Self { enabled: true, warn_threshold: 3, hard_limit: 5, window_size: 20, tool_freq_warn: 30, tool_freq_hard_limit: 50 }
    }
}

impl LeadConfig {
    /// Checks ranges; the error names the setting.
    pub fn validate(&self) -> Result<(), antler_kit::config::ConfigError> {
        use antler_kit::config::check_range;
        let webhook = &self.guardrails.webhook;
        if !(webhook.url.is_empty() || webhook.url.starts_with("http://") || webhook.url.starts_with("https://")) {
            return Err(antler_kit::config::ConfigError::Invalid {
                path: "runs.lead.guardrails.webhook.url".to_owned(),
                message: format!("`{}` must start with http:// or https://", webhook.url),
            });
        }
        check_range("runs.lead.guardrails.webhook.timeout_ms", webhook.timeout_ms, 10, 60_000)?;
        for name in &self.middlewares.disabled {
            if name == "Clarification" || !SWITCHABLE.contains(&name.as_str()) {
                return Err(antler_kit::config::ConfigError::Invalid {
                    path: "runs.lead.middlewares.disabled".to_owned(),
                    message: format!(
                        "`{name}` is not a layer that can be switched off; valid names: {}",
                        SWITCHABLE.iter().filter(|n| **n != "Clarification").copied().collect::<Vec<_>>().join(", ")
                    ),
                });
            }
        }
        check_range("runs.lead.title.max_chars", self.title.max_chars.into(), 10, 200)?;
        check_range("runs.lead.title.max_words", self.title.max_words.into(), 1, 20)?;
        let l = &self.loop_detection;
        check_range("runs.lead.loop_detection.warn_threshold", l.warn_threshold.into(), 1, 10_000)?;
        check_range("runs.lead.loop_detection.hard_limit", l.hard_limit.into(), l.warn_threshold.into(), 10_000)?;
        check_range("runs.lead.loop_detection.window_size", l.window_size.into(), 1, 10_000)?;
        check_range("runs.lead.loop_detection.tool_freq_warn", l.tool_freq_warn.into(), 1, 100_000)?;
        check_range("runs.lead.loop_detection.tool_freq_hard_limit", l.tool_freq_hard_limit.into(), l.tool_freq_warn.into(), 100_000)?;
        Ok(())
    }
}
