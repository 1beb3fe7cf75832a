//! `grep`: lines matching a pattern in files under a directory (Grep).

use antler_proto::sandbox::GrepRequest;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput, description_param, sandbox_failure};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct Grep;

impl Tool for Grep {
    fn name(&self) -> &'static str {
        "grep"
    }

    fn description(&self) -> &'static str {
        "Search for matching lines inside text files under a root directory."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "description": description_param(),
                "pattern": {"type": "string", "description": "The string or regex pattern to search for."},
                "path": {"type": "string", "description": "The **absolute** root directory to search under."},
                "glob": {"type": "string", "description": "Optional glob filter for candidate files, for example `**/*.py`."},
                "literal": {"type": "boolean", "description": "Whether to treat `pattern` as a plain string. Default is False.", "default": false},
                "case_sensitive": {"type": "boolean", "description": "Whether matching is case-sensitive. Default is False.", "default": false},
                "max_results": {"type": "integer", "description": "Maximum number of matching lines to return. Default is 100.", "default": 100}
            },
            "required": ["description", "pattern", "path"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let pattern = args.required("pattern")?;
            let request = GrepRequest {
                thread_id: env.thread_id().to_owned(),
                path: args.required("path")?,
                pattern: pattern.clone(),
                literal: args.boolean("literal"),
                case_insensitive: !args.boolean("case_sensitive"),
                glob: args.string("glob").unwrap_or_default(),
                max_results: args.number("max_results").unwrap_or(100).min(u32::MAX as u64) as u32,
            };
            let (mut grpc, client) = env.sandbox().await?;
            let found = match grpc.grep(client.request(&env.ctx.call_context(), request)).await {
                Ok(response) => response.into_inner(),
                Err(status) if status.code() == tonic::Code::InvalidArgument && status.message().contains("regex") => {
                    return Ok(ToolOutput::error(format!("Error: Invalid regex pattern: {}", status.message())));
                }
                Err(status) => return sandbox_failure(status),
            };
            if found.matches.is_empty() {
                return Ok(ToolOutput::ok("No matches found"));
            }
            let mut lines: Vec<String> = found.matches.iter().map(|m| format!("{}:{}: {}", m.path, m.line_number, m.line)).collect();
            if found.truncated {
                lines.push("... (more matches; narrow the search or raise max_results)".to_owned());
            }
            Ok(ToolOutput::ok(lines.join("\n")))
        })
    }
}
