//! `ask_clarification`: the schema the model sees. The call never executes: the Clarification
//! middleware intercepts it and ends the run with a ClarificationEvent.

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct AskClarification;

impl Tool for AskClarification {
    fn name(&self) -> &'static str {
        "ask_clarification"
    }

    fn description(&self) -> &'static str {
        "Ask the user for clarification when you need more information to proceed.\n\n\
         Use this tool when required information is missing, the requirement is ambiguous, there are several valid approaches, \
         or an operation is risky and needs confirmation. The run pauses until the user answers."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The clarification question to ask the user. Be specific and clear."},
                "clarification_type": {"type": "string", "enum": ["missing_info", "ambiguous_requirement", "approach_choice", "risk_confirmation", "suggestion"], "description": "The type of clarification needed."},
                "context": {"type": "string", "description": "Optional context explaining why clarification is needed."},
                "options": {"type": "array", "items": {"type": "string"}, "description": "Optional list of choices (for approach_choice or suggestion types)."},
                "multi_select": {"type": "boolean", "description": "Whether the user may pick several of the options.", "default": false},
                "fields": {
                    "type": "array",
                    "description": "Optional form: the inputs to ask for when several values are needed at once (at most 16).",
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "description": "Key of the answer, letters, digits and _ only."},
                            "label": {"type": "string", "description": "Text shown next to the input."},
                            "kind": {"type": "string", "enum": ["text", "textarea", "number", "select", "multi_select", "checkbox", "date"]},
                            "required": {"type": "boolean", "default": false},
                            "options": {"type": "array", "items": {"type": "string"}, "description": "Choices for select and multi_select."},
                            "placeholder": {"type": "string"}
                        },
                        "required": ["name", "label", "kind"]
                    }
                }
            },
            "required": ["question", "clarification_type"]
        })
    }

    fn call<'a>(&'a self, _env: &'a RunEnv, _args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        // Reached only when the Clarification middleware is switched off.
        Box::pin(async { Ok(ToolOutput::ok("Clarification is not available in this run; proceed with your best judgement.")) })
    }
}
