//! `str_replace`: replaces a substring in a file (EditFile).

use antler_proto::sandbox::EditFileRequest;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput, description_param, sandbox_failure};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct StrReplace;

impl Tool for StrReplace {
    fn name(&self) -> &'static str {
        "str_replace"
    }

    fn description(&self) -> &'static str {
        "Replace a substring in a file with another substring. If `replace_all` is False (default), the substring to replace must appear **exactly once** in the file."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "description": description_param(),
                "path": {"type": "string", "description": "The **absolute** path to the file to replace the substring in. ALWAYS PROVIDE THIS PARAMETER SECOND."},
                "old_str": {"type": "string", "description": "The substring to replace. ALWAYS PROVIDE THIS PARAMETER THIRD."},
                "new_str": {"type": "string", "description": "The new substring. ALWAYS PROVIDE THIS PARAMETER FOURTH."},
                "replace_all": {"type": "boolean", "description": "Whether to replace all occurrences of the substring. If False, only the first occurrence will be replaced. Default is False.", "default": false}
            },
            "required": ["description", "path", "old_str", "new_str"]
        })
    }

    fn side_effect(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let path = args.required("path")?;
            let old_str = args.string("old_str").unwrap_or_default();
            let new_str = args.string("new_str").unwrap_or_default();
            // DeerFlow treats an empty old_str as a no-op.
            if old_str.is_empty() {
                return Ok(ToolOutput::ok("OK"));
            }
            let (mut grpc, client) = env.sandbox().await?;
            let request = EditFileRequest {
                thread_id: env.thread_id().to_owned(),
                path: path.clone(),
                old_str,
                new_str,
                replace_all: args.boolean("replace_all"),
            };
            match grpc.edit_file(client.request(&env.ctx.call_context(), request)).await {
                Ok(_) => Ok(ToolOutput::ok("OK")),
                Err(status) if status.code() == tonic::Code::FailedPrecondition && status.message().contains("not found") => {
                    Ok(ToolOutput::error(format!("Error: String to replace not found in file: {path}")))
                }
                Err(status) => sandbox_failure(status),
            }
        })
    }
}
