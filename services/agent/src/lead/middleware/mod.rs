//! The built-in middlewares, one file each, in DeerFlow's order (DESIGN §5):
//! ThreadData → Uploads → Sandbox → DanglingToolCall → Guardrail (when enabled) → ToolErrorHandling →
//! SkillToolPolicy (when skills are on) → Summarization (when enabled) → Todo (plan mode) → Title → Memory (when
//! enabled) → SubagentLimit (when the run may delegate) → TokenBudget (with a budget) → LoopDetection →
//! Clarification (always last).

pub mod clarification;
pub mod dangling_tool_call;
pub mod guardrail;
pub mod loop_detection;
pub mod memory;
pub mod sandbox;
pub mod side_call;
pub mod skill_policy;
pub mod subagent_limit;
pub mod summarization;
pub mod thread_data;
pub mod title;
pub mod todo;
pub mod token_budget;
pub mod tool_error_handling;
pub mod uploads;

use std::sync::Arc;

use super::config::LeadConfig;
use super::pipeline::Middleware;

/// What decides a run's layers besides the configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunLayers {
    pub plan_mode: bool,
    pub clarification_disabled: bool,
    /// The run's effective token budget (0: none).
    pub token_budget: u64,
    /// (max_concurrent, max_total) task calls when the run may delegate to subagents.
    pub subagent_limit: Option<(u32, u32)>,
    /// A subagent's child run: no Uploads (its input is the task), no Title (its thread is hidden),
    /// no Memory (the lead agent's conversation is what is remembered).
    pub subagent: bool,
}

/// The built-in layers a run gets under `config` (each built fresh: some keep per-run state).
pub fn defaults(config: &LeadConfig, run: RunLayers) -> Vec<Arc<dyn Middleware>> {
    let RunLayers { plan_mode, clarification_disabled, token_budget, subagent_limit, subagent } = run;
    let mut layers: Vec<Arc<dyn Middleware>> = vec![Arc::new(thread_data::ThreadData)];
    if !subagent {
        layers.push(Arc::new(uploads::Uploads));
    }
    layers.extend([Arc::new(sandbox::SandboxMiddleware) as Arc<dyn Middleware>, Arc::new(dangling_tool_call::DanglingToolCall)]);
    if config.guardrails.enabled {
        use super::guardrail_providers::{AllowlistProvider, Chain, GuardrailProvider, WebhookProvider};
        let lists = AllowlistProvider { allowed: config.guardrails.allowed_tools.clone(), denied: config.guardrails.denied_tools.clone() };
        let webhook = &config.guardrails.webhook;
        let provider: Arc<dyn GuardrailProvider> = if webhook.url.is_empty() {
            Arc::new(lists)
        } else {
            let webhook = WebhookProvider {
                url: webhook.url.clone(),
                timeout: std::time::Duration::from_millis(webhook.timeout_ms),
                bearer_token: webhook.bearer_token.clone(),
            };
            Arc::new(Chain(vec![Arc::new(lists), Arc::new(webhook)]))
        };
        layers.push(Arc::new(guardrail::Guardrail { provider, fail_closed: config.guardrails.fail_closed }));
    }
    layers.push(Arc::new(tool_error_handling::ToolErrorHandling));
    if config.skills.enabled {
        layers.push(Arc::new(skill_policy::SkillToolPolicy::default()));
    }
    if config.summarization.enabled {
        layers.push(Arc::new(summarization::Summarization::new(config.summarization.clone())));
    }
    if plan_mode {
        layers.push(Arc::new(todo::TodoMiddleware::default()));
    }
    if config.title.enabled && !subagent {
        layers.push(Arc::new(title::Title::new(config.title.clone())));
    }
    if config.memory.enabled && !subagent {
        layers.push(Arc::new(memory::MemoryMiddleware::new(config.memory.clone())));
    }
    if let Some((max_concurrent, max_total)) = subagent_limit {
        layers.push(Arc::new(subagent_limit::SubagentLimit { max_concurrent, max_total }));
    }
    if token_budget > 0 {
        layers.push(Arc::new(token_budget::TokenBudget::new(token_budget, config.token_budget.warn_fraction)));
    }
    if config.loop_detection.enabled {
        layers.push(Arc::new(loop_detection::LoopDetection::new(config.loop_detection.clone())));
    }
    layers.push(Arc::new(clarification::Clarification { disabled: clarification_disabled }));
    layers.retain(|layer| !config.middlewares.disabled.iter().any(|name| name == layer.name()));
    layers
}
