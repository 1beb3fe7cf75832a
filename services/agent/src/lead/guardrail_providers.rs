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

/// Asks several providers in order: the first denial holds, a failure ends the evaluation (the
/// middleware then applies `fail_closed`), and the call is allowed only when every provider allows it.
pub struct Chain(pub Vec<std::sync::Arc<dyn GuardrailProvider>>);

impl GuardrailProvider for Chain {
    fn name(&self) -> &str {
        "chain"
    }

    fn evaluate<'a>(&'a self, request: &'a GuardrailRequest) -> BoxFuture<'a, Result<GuardrailDecision, GuardrailError>> {
        Box::pin(async move {
            let mut last = GuardrailDecision::allow("oap.allowed");
            for provider in &self.0 {
                last = provider.evaluate(request).await?;
                if !last.allow {
                    break;
                }
            }
            Ok(last)
        })
    }
}

/// Asks an external policy service over HTTP (`runs.lead.guardrails.webhook`).
pub struct WebhookProvider {
    pub url: String,
    pub timeout: std::time::Duration,
    pub bearer_token: String,
}

/// One HTTP client for every webhook call of the process (connection reuse; building a client
/// loads TLS roots, too slow to do per call).
fn http() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(reqwest::Client::new)
}

#[derive(serde::Deserialize)]
struct WebhookAnswer {
    allow: bool,
    #[serde(default)]
    reasons: Vec<WebhookReason>,
}

#[derive(serde::Deserialize)]
struct WebhookReason {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

impl GuardrailProvider for WebhookProvider {
    fn name(&self) -> &str {
        "webhook"
    }

    fn evaluate<'a>(&'a self, request: &'a GuardrailRequest) -> BoxFuture<'a, Result<GuardrailDecision, GuardrailError>> {
        Box::pin(async move {
            let fail = |message: String| GuardrailError { provider: "webhook".to_owned(), message };
            let body = serde_json::json!({
                "tool_name": request.tool_name,
                "tool_input": request.tool_input,
                "tool_call_id": request.tool_call_id,
                "run_id": request.run_id,
                "thread_id": request.thread_id,
                "user_id": request.user_id,
            });
            let mut call = http().post(&self.url).timeout(self.timeout).json(&body);
            if !self.bearer_token.is_empty() {
                call = call.bearer_auth(&self.bearer_token);
            }
            let response = call.send().await.map_err(|e| fail(format!("{} did not answer: {e}", self.url)))?;
            let status = response.status();
            if !status.is_success() {
                return Err(fail(format!("{} answered HTTP {status}", self.url)));
            }
            let answer: WebhookAnswer = response
                .json()
                .await
                .map_err(|e| fail(format!("{} answered something other than {{\"allow\": bool, …}}: {e}", self.url)))?;
            let reasons = answer.reasons.into_iter().map(|r| GuardrailReason { code: r.code, message: r.message }).collect();
            Ok(GuardrailDecision { allow: answer.allow, reasons })
        })
    }
}
