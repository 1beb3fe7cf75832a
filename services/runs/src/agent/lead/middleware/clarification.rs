//! Clarification (always last): an `ask_clarification` call never executes. The question, its
//! options and context become a ClarificationEvent, the tool result carries the readable question,
//! and the run ends with stop_reason `clarification`; the user's answer arrives as the next run's
//! input on the thread. With `clarification_disabled`, the model is told to proceed on its own.

use antler_proto::common::ToolCall;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{ClarificationEvent, ClarificationOption};
use futures::future::BoxFuture;

use crate::agent::lead::env::RunEnv;
use crate::agent::lead::pipeline::{Middleware, ToolNext, ToolResult};
use crate::agent::lead::tools::{Args, ToolError, ToolOutput};

#[derive(Debug)]
pub struct Clarification {
    pub disabled: bool,
}

fn icon(kind: &str) -> &'static str {
    match kind {
        "missing_info" => "❓",
        "ambiguous_requirement" => "🤔",
        "approach_choice" => "🔀",
        "risk_confirmation" => "⚠️",
        "suggestion" => "💡",
        _ => "❓",
    }
}

/// The readable form of the question (DeerFlow's layout).
pub fn render(question: &str, kind: &str, context: &str, options: &[String]) -> String {
    let mut text = String::new();
    if !context.is_empty() {
        text.push_str(&format!("{} {context}\n\n", icon(kind)));
        text.push_str(question);
    } else {
        text.push_str(&format!("{} {question}", icon(kind)));
    }
    if !options.is_empty() {
        text.push('\n');
        for (i, option) in options.iter().enumerate() {
            text.push_str(&format!("\n  {}. {option}", i + 1));
        }
    }
    text
}

impl Middleware for Clarification {
    fn name(&self) -> &'static str {
        "Clarification"
    }

    fn wrap_tool_call<'a>(&'a self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args, next: ToolNext<'a>) -> BoxFuture<'a, ToolResult> {
        if call.name != "ask_clarification" {
            return next.run(env, call, args);
        }
        Box::pin(async move {
            if self.disabled {
                return Ok(ToolOutput::ok(
                    "Clarification is disabled for this run: do not ask the user. Proceed with the most reasonable assumption and state it in your answer.",
                ));
            }
            let question = args.string("question").unwrap_or_default();
            let kind = args.string("clarification_type").unwrap_or_else(|| "missing_info".to_owned());
            let context = args.string("context").unwrap_or_default();
            let options: Vec<String> = {
                let mut seen = Vec::new();
                for option in args.strings("options").into_iter().map(|o| o.trim().to_owned()).filter(|o| !o.is_empty()).take(24) {
                    if !seen.contains(&option) {
                        seen.push(option);
                    }
                }
                seen
            };
            let event = ClarificationEvent {
                interrupt_id: call.id.clone(),
                question: question.clone(),
                category: kind.clone(),
                context: context.clone(),
                options: options
                    .iter()
                    .enumerate()
                    .map(|(i, o)| ClarificationOption { id: (i + 1).to_string(), label: o.clone(), description: String::new() })
                    .collect(),
                multi_select: false,
                allow_free_text: true,
                fields: Vec::new(),
                tool_call_id: call.id.clone(),
            };
            env.ctx.emit(Kind::Clarification(event)).await.map_err(|_| ToolError::Stopping)?;
            env.stop("clarification");
            Ok(ToolOutput::ok(render(&question, &kind, &context, &options)))
        })
    }
}
