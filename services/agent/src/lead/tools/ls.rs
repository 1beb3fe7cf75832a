//! `ls`: a two-level tree of a directory (ListDir).

use antler_proto::sandbox::{EntryKind, ListDirRequest};
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput, description_param, sandbox_failure};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct Ls;

impl Tool for Ls {
    fn name(&self) -> &'static str {
        "ls"
    }

    fn description(&self) -> &'static str {
        "List the contents of a directory up to 2 levels deep in tree format."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "description": description_param(),
                "path": {"type": "string", "description": "The **absolute** path to the directory to list."}
            },
            "required": ["description", "path"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let path = args.required("path")?;
            let (mut grpc, client) = env.sandbox().await?;
            let request = ListDirRequest { thread_id: env.thread_id().to_owned(), path, max_depth: 2, ..Default::default() };
            let listing = match grpc.list_dir(client.request(&env.ctx.call_context(), request)).await {
                Ok(response) => response.into_inner(),
                Err(status) => return sandbox_failure(status),
            };
            if listing.entries.is_empty() {
                return Ok(ToolOutput::ok("(empty)"));
            }
            let mut lines: Vec<String> = listing
                .entries
                .iter()
                .map(|e| {
                    let slash = if e.kind == EntryKind::Directory as i32 && !e.path.ends_with('/') { "/" } else { "" };
                    format!("{}{}{slash}", "  ".repeat(e.depth.saturating_sub(1) as usize), e.path)
                })
                .collect();
            if listing.truncated {
                lines.push("... (truncated)".to_owned());
            }
            Ok(ToolOutput::ok(lines.join("\n")))
        })
    }
}
