//! `glob`: paths matching a pattern under a directory (Glob).

use antler_proto::sandbox::GlobRequest;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput, description_param, sandbox_failure};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct Glob;

impl Tool for Glob {
    fn name(&self) -> &'static str {
        "glob"
    }

    fn description(&self) -> &'static str {
        "Find files and directories that match a glob pattern under a root directory."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "description": description_param(),
                "pattern": {"type": "string", "description": "The glob pattern to match relative to the root path, for example `**/*.py`."},
                "path": {"type": "string", "description": "The **absolute** root directory under which to search."},
                "include_dirs": {"type": "boolean", "description": "Whether matching directories should also be returned. Default is False.", "default": false},
                "max_results": {"type": "integer", "description": "Maximum number of paths to return. Default is 200.", "default": 200}
            },
            "required": ["description", "pattern", "path"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let request = GlobRequest {
                thread_id: env.thread_id().to_owned(),
                pattern: args.required("pattern")?,
                path: args.required("path")?,
                include_dirs: args.boolean("include_dirs"),
                max_results: args.number("max_results").unwrap_or(200).min(u32::MAX as u64) as u32,
            };
            let (mut grpc, client) = env.sandbox().await?;
            let found = match grpc.glob(client.request(&env.ctx.call_context(), request)).await {
                Ok(response) => response.into_inner(),
                Err(status) => return sandbox_failure(status),
            };
            if found.paths.is_empty() {
                return Ok(ToolOutput::ok("No files matched"));
            }
            let mut text = found.paths.join("\n");
            if found.truncated {
                text.push_str("\n... (more results; narrow the pattern or raise max_results)");
            }
            Ok(ToolOutput::ok(text))
        })
    }
}
