//! The innermost tool call: find the tool, run it — and for side-effecting tools, journal it. The
//! intent is durable before the call starts and the result after it ends; a call whose intent an
//! earlier attempt wrote without a result is not executed again (its outcome is unknown), and one
//! with a recorded result returns that result.

use antler_proto::common::ToolCall;
use futures::future::BoxFuture;

use super::pipeline::{ToolResult, ToolTerminal};
use super::run_env::RunEnv;
use super::tools::{Args, ToolError, ToolOutput, ToolSet};
use crate::Effect;

pub struct ExecuteTool {
    pub tools: ToolSet,
}

/// What the model is told about a call whose outcome is unknown.
pub fn outcome_unknown_text(name: &str) -> String {
    format!(
        "Error: the outcome of this `{name}` call is unknown. The run was interrupted (its worker stopped) after the call \
         started and before its result was recorded, and the call was NOT executed again. Check its effects first (for example \
         read back the files it would have changed) and only then decide whether to run it again."
    )
}

impl ToolTerminal for ExecuteTool {
    fn call<'a>(&'a self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            let Some(tool) = self.tools.get(&call.name) else {
                let names = self.tools.names();
                return Ok(ToolOutput::error(format!("Error: {} is not a valid tool, try one of [{}].", call.name, names.join(", "))));
            };
            if tool.deferred() && !env.is_promoted(&call.name) {
                return Ok(ToolOutput::error(super::tools::tool_search::not_promoted_text(&call.name)));
            }
            if !tool.side_effect() {
                return tool.call_for(env, call, args).await;
            }
            let ctx = &env.ctx;
            match ctx.effect(&call.id).await.map_err(|_| ToolError::Stopping)? {
                Effect::Done { result, is_error } => {
                    tracing::info!(run_id = %ctx.spec.run_id, tool_call_id = %call.id, "journalled result reused; not executed again");
                    return Ok(ToolOutput { text: result, is_error, outcome_unknown: false });
                }
                Effect::Unknown => {
                    tracing::warn!(run_id = %ctx.spec.run_id, tool_call_id = %call.id, tool = %call.name, "outcome unknown; not executed again");
                    return Ok(ToolOutput { text: outcome_unknown_text(&call.name), is_error: true, outcome_unknown: true });
                }
                Effect::None => {}
            }
            let arguments = serde_json::Value::Object(args.0.clone()).to_string();
            ctx.record_intent(&call.id, &call.name, &arguments).await.map_err(|_| ToolError::Stopping)?;
            let result = tool.call_for(env, call, args).await;
            let (text, is_error) = match &result {
                Ok(output) => (output.text.clone(), output.is_error),
                // A run that stops mid-call leaves the intent alone: the outcome really is unknown.
                Err(ToolError::Stopping) => return result,
                Err(error) => (super::tools::error_text(&call.name, error), true),
            };
            ctx.record_result(&call.id, &text, is_error).await.map_err(|_| ToolError::Stopping)?;
            result
        })
    }
}
