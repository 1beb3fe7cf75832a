//! ToolErrorHandling: a failing tool becomes an error result the model can read, never a failed
//! run (DeerFlow's wording). A stopping run (cancel, lost ownership) is not a tool failure and
//! passes through.

use antler_proto::common::ToolCall;
use futures::future::BoxFuture;

use crate::lead::pipeline::{Middleware, ToolNext, ToolResult};
use crate::lead::run_env::RunEnv;
use crate::lead::tools::{Args, ToolError, ToolOutput, error_text};

#[derive(Debug)]
pub struct ToolErrorHandling;

impl Middleware for ToolErrorHandling {
    fn name(&self) -> &'static str {
        "ToolErrorHandling"
    }

    fn wrap_tool_call<'a>(&'a self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args, next: ToolNext<'a>) -> BoxFuture<'a, ToolResult> {
        Box::pin(async move {
            match next.run(env, call, args).await {
                Err(ToolError::Stopping) => Err(ToolError::Stopping),
                Err(error) => {
                    tracing::info!(run_id = %env.ctx.spec.run_id, tool = %call.name, %error, "tool failed; the model gets the error");
                    Ok(ToolOutput::error(error_text(&call.name, &error)))
                }
                ok => ok,
            }
        })
    }
}
