//! `read_file`: a text file, optionally a line range (ReadFile).

use antler_proto::sandbox::ReadFileRequest;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput, description_param, sandbox_failure};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct ReadFile;

impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        "read_file"
    }

    fn description(&self) -> &'static str {
        "Read the contents of a text file. Use this to examine source code, configuration files, logs, or any text-based file."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "description": description_param(),
                "path": {"type": "string", "description": "The **absolute** path to the file to read."},
                "start_line": {"type": "integer", "description": "Optional starting line number (1-indexed, inclusive). Use with end_line to read a specific range."},
                "end_line": {"type": "integer", "description": "Optional ending line number (1-indexed, inclusive). Use with start_line to read a specific range."}
            },
            "required": ["description", "path"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let path = args.required("path")?;
            let start = args.number("start_line");
            let end = args.number("end_line");
            if start == Some(0) {
                return Ok(ToolOutput::ok("(start_line must be >= 1)"));
            }
            if let (Some(s), Some(e)) = (start, end)
                && s > e
            {
                return Ok(ToolOutput::ok("(start_line > end_line — no lines in range)"));
            }
            let (mut grpc, client) = env.sandbox().await?;
            let request = ReadFileRequest {
                thread_id: env.thread_id().to_owned(),
                path,
                start_line: start.unwrap_or(0).min(u32::MAX as u64) as u32,
                end_line: end.unwrap_or(0).min(u32::MAX as u64) as u32,
                ..Default::default()
            };
            let file = match grpc.read_file(client.request(&env.ctx.call_context(), request)).await {
                Ok(response) => response.into_inner(),
                Err(status) => return sandbox_failure(status),
            };
            if file.binary {
                return Ok(ToolOutput::error(format!(
                    "Error: {} is a binary file and cannot be read as text; use bash (e.g. `file`, `xxd | head`) to inspect it",
                    file.path
                )));
            }
            if file.content.is_empty() {
                if start.is_some() && u64::from(file.total_lines) < start.unwrap_or(0) {
                    return Ok(ToolOutput::ok("(start_line exceeds file length)"));
                }
                return Ok(ToolOutput::ok("(empty)"));
            }
            Ok(ToolOutput::ok(file.content))
        })
    }
}
