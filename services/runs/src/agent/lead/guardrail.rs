//! Guardrail providers: who decides whether a tool call may run. The Guardrail middleware
//! (`middleware/guardrail.rs`) asks one before every call. Built in: [`AllowlistProvider`].

use futures::future::BoxFuture;
use serde_json::{Map, Value};

/// What a provider is asked.
#[derive(Debug, Clone)]
pub struct GuardrailRequest {
    pub tool_name: String,
    pub tool_input: Map<String, Value>,
    pub tool_call_id: String,
    pub run_id: String,
    pub thread_id: String,
    pub user_id: String,
}

/// One reason of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardrailReason {
    pub code: String,
    pub message: String,
}

/// A provider's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardrailDecision {
    pub allow: bool,
    pub reasons: Vec<GuardrailReason>,
}

impl GuardrailDecision {
    pub fn allow(code: &str) -> Self {
        Self { allow: true, reasons: vec![GuardrailReason { code: code.to_owned(), message: String::new() }] }
    }

    pub fn deny(code: &str, message: impl Into<String>) -> Self {
        Self { allow: false, reasons: vec![GuardrailReason { code: code.to_owned(), message: message.into() }] }
    }
}

/// A provider could not decide.
#[derive(Debug, Clone, thiserror::Error)]
#[error("guardrail provider {provider} failed: {message}")]
pub struct GuardrailError {
    pub provider: String,
    pub message: String,
}

/// Decides whether tool calls may run.
pub trait GuardrailProvider: Send + Sync {
    fn name(&self) -> &str;
    fn evaluate<'a>(&'a self, request: &'a GuardrailRequest) -> BoxFuture<'a, Result<GuardrailDecision, GuardrailError>>;
}

/// DeerFlow's built-in provider: a tool outside `allowed` (when set) or inside `denied` is refused.
#[derive(Debug, Clone, Default)]
pub struct AllowlistProvider {
    pub allowed: Option<Vec<String>>,
    pub denied: Vec<String>,
}

impl GuardrailProvider for AllowlistProvider {
    fn name(&self) -> &str {
        "allowlist"
    }

    fn evaluate<'a>(&'a self, request: &'a GuardrailRequest) -> BoxFuture<'a, Result<GuardrailDecision, GuardrailError>> {
        let name = &request.tool_name;
        let decision = if self.allowed.as_ref().is_some_and(|allowed| !allowed.contains(name)) {
            GuardrailDecision::deny("oap.tool_not_allowed", format!("tool '{name}' is not in the allowlist"))
        } else if self.denied.contains(name) {
            GuardrailDecision::deny("oap.tool_denied", format!("tool '{name}' is in the denylist"))
        } else {
            GuardrailDecision::allow("oap.allowed")
        };
        Box::pin(async move { Ok(decision) })
    }
}
