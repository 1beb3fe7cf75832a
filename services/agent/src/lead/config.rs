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
    pub skills: SkillsConfig,
    /// DeerFlow's `skill_evolution`: the `skill_manage` tool.
    pub skill_evolution: SkillEvolutionConfig,
    pub summarization: SummarizationConfig,
    pub token_budget: TokenBudgetConfig,
    pub memory: MemoryConfig,
    /// The `task` tool and its subagents (see `subagents.rs`).
    pub subagents: super::subagents::SubagentsConfig,
    /// What a run whose final answer was cut at the model's output limit (finish reason `length`,
    /// no tool calls) ends as.
    pub truncated_answer: TruncatedAnswer,
    /// The web tools (`web_search`, `web_fetch`, `image_search`); each is off until its block is set.
    /// A `web:` with nothing under it (every block commented out) is the same as none.
    #[serde(deserialize_with = "super::tools::web::config::null_as_default")]
    pub web: super::tools::web::config::WebConfig,
    /// What a run that asks for thinking on a model without `supports_thinking` does (see
    /// `thinking.rs`): `ignore` (run without it, say so in an event and a WARN line) or `refuse`.
    pub thinking_unsupported: super::thinking::ThinkingUnsupported,
    /// DeerFlow's `acp_agents`: external coding agents `invoke_acp_agent` may start, by name (none:
    /// no tool).
    pub acp_agents: std::collections::BTreeMap<String, super::tools::acp::config::AcpAgentConfig>,
    /// How ACP calls are bounded and what their permission requests get.
    pub acp: super::tools::acp::config::AcpConfig,
}

/// `runs.lead.truncated_answer`: a final answer the model could not finish is not a success by
/// default — the words stop mid-sentence, and a client reading SUCCESS would deliver them as done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TruncatedAnswer {
    /// ERROR with code `model_length_capped` (the cut answer stays in the thread's state).
    #[default]
    Error,
    /// SUCCESS with stop_reason `model_length_capped` (the behaviour before this setting existed).
    Accept,
}

/// The Memory layer (the memory service's own settings, debounce, caps and thresholds, are in its
/// `memory:` section).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Inject the user's memory and queue each finished conversation for extraction. Off by default:
    /// extraction spends model tokens (DeerFlow's example config turns it on).
    pub enabled: bool,
    /// With `enabled`: put the rendered memory into the system prompt (false: only collect).
    pub injection_enabled: bool,
    /// Token budget of the `<memory>` block; 0 = the memory service's (2000). Else 100..8000.
    pub max_injection_tokens: u32,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self { enabled: false, injection_enabled: true, max_injection_tokens: 0 }
    }
}

/// Token budgets of runs (RunConfig.token_budget).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TokenBudgetConfig {
    /// Budget of a run that asks for none; 0 = no budget.
    pub default_tokens: u64,
    /// Largest budget a run may ask for (larger ones are clamped); 0 = no limit.
    pub max_tokens: u64,
    /// Share of the budget at which the model is told to wrap up, in (0, 1].
    pub warn_fraction: f64,
}

impl Default for TokenBudgetConfig {
    fn default() -> Self {
        Self { default_tokens: 0, max_tokens: 0, warn_fraction: 0.7 }
    }
}

impl TokenBudgetConfig {
    /// The budget of a run that asked for `requested` (0: none asked); 0 = no budget.
    pub fn effective(&self, requested: u64) -> u64 {
        let budget = if requested == 0 { self.default_tokens } else { requested };
        if self.max_tokens > 0 && (budget == 0 || budget > self.max_tokens) { self.max_tokens } else { budget }
    }
}

/// Summarization middleware (DeerFlow's `summarization:` section): before a model call whose input
/// meets any trigger, the older messages are replaced by a summary kept in the state.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SummarizationConfig {
    pub enabled: bool,
    /// Model that writes the summary (caller `middleware:summarization`); empty: the run's model.
    pub model_name: String,
    /// Any one met starts a summary (a single size or a list, as DeerFlow accepts).
    #[serde(deserialize_with = "one_or_many")]
    pub trigger: Vec<ContextSize>,
    /// How much of the conversation stays as it is (the newest messages).
    pub keep: ContextSize,
    /// Most tokens of older messages given to the summarizer (the newest of them).
    pub trim_tokens_to_summarize: u64,
    /// Replaces the built-in prompt; `{messages}` is filled in with the messages to summarize.
    pub summary_prompt: String,
}

impl Default for SummarizationConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            model_name: String::new(),
            trigger: vec![ContextSize { kind: SizeKind::Tokens, value: 32_000.0 }],
            keep: ContextSize { kind: SizeKind::Messages, value: 20.0 },
            trim_tokens_to_summarize: 4_000,
            summary_prompt: String::new(),
        }
    }
}

/// A size of the model's input: in tokens (approximate, as DeerFlow counts them), messages, or a
/// fraction of the model's context window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextSize {
    #[serde(rename = "type")]
    pub kind: SizeKind,
    pub value: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SizeKind {
    Tokens,
    Messages,
    Fraction,
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<ContextSize>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(ContextSize),
        Many(Vec<ContextSize>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(size) => vec![size],
        OneOrMany::Many(sizes) => sizes,
    })
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

/// Skills in the lead agent (the skills themselves, their directories and install limits are the
/// sandbox's `sandbox.skills` section).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SkillsConfig {
    /// List the user's enabled skills in the system prompt (`<available_skills>`, from the sandbox
    /// service's SkillService at the start of each attempt) and apply the `allowed-tools` of the skills
    /// the model activates (the SkillToolPolicy layer).
    pub enabled: bool,
}

impl Default for SkillsConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// `runs.lead.skill_evolution` (DeerFlow's `skill_evolution`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SkillEvolutionConfig {
    /// Give the lead agent the `skill_manage` tool: create, update and delete the run user's custom
    /// skills through the sandbox's SkillService (the same archive checks and skill scan as an upload).
    /// Off by default, as in DeerFlow: a skill outlives the run that wrote it and steers later ones.
    pub enabled: bool,
}

/// Switching built-in layers off.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MiddlewaresConfig {
    /// Names of built-in layers to leave out, e.g. `[Title, Uploads]` (Clarification cannot be).
    pub disabled: Vec<String>,
}

/// Built-in layers that `middlewares.disabled` may name.
pub const SWITCHABLE: [&str; 15] = [
    "ThreadData",
    "Uploads",
    "Sandbox",
    "DanglingToolCall",
    "Guardrail",
    "ToolErrorHandling",
    "SkillToolPolicy",
    "Summarization",
    "Todo",
    "Title",
    "Memory",
    "TokenBudget",
    "SubagentLimit",
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

impl ContextSize {
    /// Fractions in (0, 1]; message counts at least `min_messages`; token counts at least 1.
    fn validate(&self, path: &str, min_messages: f64) -> Result<(), antler_kit::config::ConfigError> {
        let ok = match self.kind {
            SizeKind::Fraction => self.value > 0.0 && self.value <= 1.0,
            SizeKind::Messages => self.value >= min_messages && self.value <= 100_000.0 && self.value.fract() == 0.0,
            SizeKind::Tokens => self.value >= 1.0 && self.value <= 100_000_000.0 && self.value.fract() == 0.0,
        };
        if ok {
            return Ok(());
        }
        let range = match self.kind {
            SizeKind::Fraction => "a fraction in (0, 1]".to_owned(),
            SizeKind::Messages => format!("a whole number of messages from {min_messages} to 100000"),
            SizeKind::Tokens => "a whole number of tokens from 1 to 100000000".to_owned(),
        };
        Err(antler_kit::config::ConfigError::Invalid { path: format!("{path}.value"), message: format!("{} is not {range}", self.value) })
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
        let summarization = &self.summarization;
        if summarization.enabled && summarization.trigger.is_empty() {
            return Err(antler_kit::config::ConfigError::Invalid {
                path: "runs.lead.summarization.trigger".to_owned(),
                message: "at least one trigger is needed when summarization is enabled".to_owned(),
            });
        }
        for (index, size) in summarization.trigger.iter().enumerate() {
            size.validate(&format!("runs.lead.summarization.trigger[{index}]"), 2.0)?;
        }
        summarization.keep.validate("runs.lead.summarization.keep", 1.0)?;
        let budget = self.memory.max_injection_tokens;
        if budget != 0 {
            check_range("runs.lead.memory.max_injection_tokens", budget.into(), 100, 8_000)?;
        }
        let fraction = self.token_budget.warn_fraction;
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(antler_kit::config::ConfigError::Invalid {
                path: "runs.lead.token_budget.warn_fraction".to_owned(),
                message: format!("{fraction} is not a fraction in (0, 1]"),
            });
        }
        check_range("runs.lead.summarization.trim_tokens_to_summarize", summarization.trim_tokens_to_summarize, 100, 1_000_000)?;
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
        self.subagents.validate()?;
        self.web.validate()?;
        super::tools::acp::config::validate(&self.acp_agents, &self.acp)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_falls_back_to_the_default_and_is_clamped_to_the_maximum() {
        let none = TokenBudgetConfig::default();
        assert_eq!((none.effective(0), none.effective(500)), (0, 500));
        let capped = TokenBudgetConfig { default_tokens: 1_000, max_tokens: 5_000, warn_fraction: 0.7 };
        assert_eq!((capped.effective(0), capped.effective(2_000), capped.effective(9_000)), (1_000, 2_000, 5_000));
        let max_only = TokenBudgetConfig { default_tokens: 0, max_tokens: 5_000, warn_fraction: 0.7 };
        assert_eq!(max_only.effective(0), 5_000, "a maximum bounds runs that ask for nothing too");
    }

    #[test]
    fn summarization_sizes_read_as_deerflow_writes_them() {
        let one: SummarizationConfig = serde_yaml_ng::from_str("enabled: true\ntrigger: {type: messages, value: 8}\n").unwrap_or_default();
        assert_eq!(one.trigger, vec![ContextSize { kind: SizeKind::Messages, value: 8.0 }]);
        let many: SummarizationConfig =
            serde_yaml_ng::from_str("trigger: [{type: tokens, value: 1000}, {type: fraction, value: 0.5}]\n").unwrap_or_default();
        assert_eq!(many.trigger.len(), 2);
        let mut config = LeadConfig::default();
        config.summarization.enabled = true;
        config.summarization.trigger = vec![ContextSize { kind: SizeKind::Fraction, value: 1.5 }];
        assert!(config.validate().is_err_and(|e| e.to_string().contains("trigger[0].value")));
    }
}
