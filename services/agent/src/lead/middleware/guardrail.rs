//! Guardrail: every tool call is put to a [`GuardrailProvider`] first. A denial never runs the tool;
//! the model gets DeerFlow's denial text as an error result, and a `guardrail_denied` event is
//! emitted. A provider that fails denies when `fail_closed` (the default): no answer is no permission.

use std::sync::Arc;

use antler_proto::common::ToolCall;
use antler_proto::runs::CustomEvent;
use antler_proto::runs::run_event::Kind;
use futures::future::BoxFuture;
use serde_json::json;

use crate::lead::guardrail_providers::{GuardrailDecision, GuardrailError, GuardrailProvider, GuardrailRequest};
use crate::lead::pipeline::{Middleware, ToolNext, ToolResult};
use crate::lead::run_env::RunEnv;
use crate::lead::tools::{Args, ToolError, ToolOutput};

pub struct Guardrail {
    pub provider: Arc<dyn GuardrailProvider>,
    pub fail_closed: bool,
}

/// The result text of a denied call.
pub fn denial_text(name: &str, decision: &GuardrailDecision) -> String {
    let (code, message) = decision
        .reasons
        .first()
        .map(|r| (r.code.as_str(), r.message.as_str()))
        .filter(|(_, m)| !m.is_empty())
        .unwrap_or(("oap.denied", "blocked by guardrail policy"));
    format!("Guardrail denied: tool '{name}' was blocked ({code}). Reason: {message}. Choose an alternative approach.")
}

impl Guardrail {
    async fn decide(&self, env: &RunEnv, call: &ToolCall, args: &Args) -> GuardrailDecision {
        let spec = &env.ctx.spec;
        let request = GuardrailRequest {
            tool_name: call.name.clone(),
            tool_input: args.0.clone(),
            tool_call_id: call.id.clone(),
            run_id: spec.run_id.clone(),
            thread_id: spec.thread_id.clone(),
            user_id: spec.user_id.clone(),
        };
        let answer = self.provider.evaluate(&request).await;
        if let Err(error) = &answer {
            tracing::warn!(run_id = %spec.run_id, tool = %call.name, %error, fail_closed = self.fail_closed, "guardrail provider failed");
        }
        resolve(answer, self.fail_closed)
    }
}

/// The decision that holds: the provider's, or on its failure a denial (fail-closed) or an allowance.
pub fn resolve(answer: Result<GuardrailDecision, GuardrailError>, fail_closed: bool) -> GuardrailDecision {
    match answer {
        Ok(decision) => decision,
        Err(_) if fail_closed => GuardrailDecision::deny("oap.evaluator_error", "guardrail provider error (fail-closed)"),
        Err(_) => GuardrailDecision::allow("oap.evaluator_error"),
    }
}

impl Middleware for Guardrail {
    fn name(&self) -> &'static str {
        "Guardrail"
    }

    fn wrap_tool_call<'a>(&'a self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args, next: ToolNext<'a>) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let decision = self.decide(env, call, args).await;
            if decision.allow {
                return next.run(env, call, args).await;
            }
            let text = denial_text(&call.name, &decision);
            let code = decision.reasons.first().map(|r| r.code.clone()).unwrap_or_default();
            let data = json!({"tool": call.name, "tool_call_id": call.id, "code": code, "provider": self.provider.name()});
            env.ctx
                .emit(Kind::Custom(CustomEvent { name: "guardrail_denied".to_owned(), data: Some(antler_kit::json::json_to_value(&data)) }))
                .await
                .map_err(|_| ToolError::Stopping)?;
            Ok(ToolOutput::error(text))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lead::guardrail_providers::{AllowlistProvider, GuardrailReason};

    fn request(tool: &str) -> GuardrailRequest {
        GuardrailRequest {
            tool_name: tool.to_owned(),
            tool_input: Default::default(),
            tool_call_id: "c".to_owned(),
            run_id: "r".to_owned(),
            thread_id: "t".to_owned(),
            user_id: "u".to_owned(),
        }
    }

    #[tokio::test]
    async fn allowlist_refuses_unlisted_and_denied_tools() {
        let provider = AllowlistProvider { allowed: Some(vec!["ls".to_owned(), "bash".to_owned()]), denied: vec!["bash".to_owned()] };
        let decide = |t: &'static str| {
            let provider = provider.clone();
            async move { provider.evaluate(&request(t)).await.map(|d| (d.allow, d.reasons[0].code.clone())).ok() }
        };
        assert_eq!(decide("ls").await, Some((true, "oap.allowed".to_owned())));
        assert_eq!(decide("bash").await, Some((false, "oap.tool_denied".to_owned())));
        assert_eq!(decide("write_file").await, Some((false, "oap.tool_not_allowed".to_owned())));
    }

    struct Broken;
    impl GuardrailProvider for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        fn evaluate<'a>(&'a self, _: &'a GuardrailRequest) -> BoxFuture<'a, Result<GuardrailDecision, GuardrailError>> {
            Box::pin(async { Err(GuardrailError { provider: "broken".to_owned(), message: "timeout".to_owned() }) })
        }
    }

    #[test]
    fn denial_text_follows_deerflow() {
        let decision =
            GuardrailDecision { allow: false, reasons: vec![GuardrailReason { code: "x.y".to_owned(), message: "no".to_owned() }] };
        assert_eq!(
            denial_text("bash", &decision),
            "Guardrail denied: tool 'bash' was blocked (x.y). Reason: no. Choose an alternative approach."
        );
        let empty = GuardrailDecision { allow: false, reasons: vec![] };
        assert!(denial_text("bash", &empty).contains("(oap.denied). Reason: blocked by guardrail policy."));
    }

    #[tokio::test]
    async fn a_failing_provider_denies_when_fail_closed_and_allows_when_fail_open() {
        let closed = resolve(Broken.evaluate(&request("bash")).await, true);
        assert!(!closed.allow);
        assert_eq!(closed.reasons[0].code, "oap.evaluator_error");
        assert!(denial_text("bash", &closed).contains("guardrail provider error (fail-closed)"));
        assert!(resolve(Broken.evaluate(&request("bash")).await, false).allow);
    }
}
