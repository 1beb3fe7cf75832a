//! `ask_clarification`: the schema the model sees. The call never executes: the Clarification
//! middleware intercepts it and ends the run with a ClarificationEvent.

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput};
use crate::agent::lead::env::RunEnv;

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
                "options": {"type": "array", "items": {"type": "string"}, "description": "Optional list of choices (for approach_choice or suggestion types)."}
            },
            "required": ["question", "clarification_type"]
        })
    }

    fn call<'a>(&'a self, _env: &'a RunEnv, _args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        // Reached only when the Clarification middleware is switched off.
        Box::pin(async { Ok(ToolOutput::ok("Clarification is not available in this run; proceed with your best judgement.")) })
    }
}
