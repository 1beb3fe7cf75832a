//! Clarification (always last): an `ask_clarification` call never executes. The question, its
//! options and context become a ClarificationEvent, the tool result carries the readable question,
//! and the run ends with stop_reason `clarification`; the user's answer arrives as the next run's
//! input on the thread. With `clarification_disabled`, the model is told to proceed on its own.

use antler_proto::common::ToolCall;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{ClarificationEvent, ClarificationOption, FormField, FormFieldKind};
use futures::future::BoxFuture;
use serde_json::Value;

use crate::lead::pipeline::{Middleware, ToolNext, ToolResult};
use crate::lead::run_env::RunEnv;
use crate::lead::tools::{Args, ToolError, ToolOutput};

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
            let fields = form_fields(args);
            let multi_select = args.boolean("multi_select") && options.len() > 1;
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
                multi_select,
                allow_free_text: true,
                fields,
                tool_call_id: call.id.clone(),
            };
            env.ctx.emit(Kind::Clarification(event)).await.map_err(|_| ToolError::Stopping)?;
            env.stop("clarification");
            Ok(ToolOutput::ok(render(&question, &kind, &context, &options)))
        })
    }
}

/// Most form fields and options per field, as the proto documents.
const MAX_FIELDS: usize = 16;
const MAX_FIELD_OPTIONS: usize = 24;

/// The form the model asked for: fields with a valid, unique name (`^[A-Za-z0-9_]{1,64}$`) and a known
/// kind, at most 16; choice fields without choices are dropped. The model's mistakes shrink the form
/// rather than fail the run — the question itself still reaches the user.
fn form_fields(args: &Args) -> Vec<FormField> {
    let Some(Value::Array(items)) = args.0.get("fields") else { return Vec::new() };
    let mut fields: Vec<FormField> = Vec::new();
    for item in items {
        let text = |key: &str| item.get(key).and_then(Value::as_str).map(str::trim).unwrap_or_default().to_owned();
        let name = text("name");
        if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        if fields.iter().any(|f| f.name == name) {
            continue;
        }
        let kind = match text("kind").as_str() {
            "text" | "" => FormFieldKind::Text,
            "textarea" => FormFieldKind::Textarea,
            "number" => FormFieldKind::Number,
            "select" => FormFieldKind::Select,
            "multi_select" => FormFieldKind::MultiSelect,
            "checkbox" => FormFieldKind::Checkbox,
            "date" => FormFieldKind::Date,
            _ => continue,
        };
        let options: Vec<ClarificationOption> = item
            .get("options")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(Value::as_str)
                    .map(str::trim)
                    .filter(|o| !o.is_empty())
                    .take(MAX_FIELD_OPTIONS)
                    .enumerate()
                    .map(|(i, label)| ClarificationOption { id: (i + 1).to_string(), label: label.to_owned(), description: String::new() })
                    .collect()
            })
            .unwrap_or_default();
        if matches!(kind, FormFieldKind::Select | FormFieldKind::MultiSelect) && options.is_empty() {
            continue;
        }
        let label = text("label");
        fields.push(FormField {
            label: if label.is_empty() { name.clone() } else { label },
            name,
            kind: kind as i32,
            required: item.get("required").and_then(Value::as_bool).unwrap_or(false),
            options: if matches!(kind, FormFieldKind::Select | FormFieldKind::MultiSelect) { options } else { Vec::new() },
            placeholder: text("placeholder"),
            default_value: None,
        });
        if fields.len() == MAX_FIELDS {
            break;
        }
    }
    fields
}
