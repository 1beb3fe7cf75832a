//! `present_files`: makes output files visible to the user. Only existing files under
//! `/mnt/user-data/outputs` are accepted; what is presented goes into the delivery receipt.

use antler_proto::sandbox::{EntryKind, ListDirRequest};
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, OUTPUTS, Tool, ToolError, ToolOutput};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct PresentFiles;

impl Tool for PresentFiles {
    fn name(&self) -> &'static str {
        "present_files"
    }

    fn description(&self) -> &'static str {
        "Make files visible to the user for viewing and rendering in the client interface.\n\n\
         Only files in `/mnt/user-data/outputs` can be presented. Write or copy files there first, then present them. \
         Present every deliverable you create."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "filepaths": {"type": "array", "items": {"type": "string"}, "description": "List of absolute file paths to present to the user. **Only** files in `/mnt/user-data/outputs` can be presented."}
            },
            "required": ["filepaths"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let paths = args.strings("filepaths");
            if paths.is_empty() {
                return Ok(ToolOutput::error("Error: `filepaths` must list at least one file under /mnt/user-data/outputs"));
            }
            let prefix = format!("{OUTPUTS}/");
            if let Some(outside) = paths.iter().find(|p| !p.starts_with(&prefix) || p.split('/').any(|s| s == "..")) {
                return Ok(ToolOutput::error(format!("Error: Only files in /mnt/user-data/outputs can be presented: {outside}")));
            }
            let (mut grpc, client) = env.sandbox().await?;
            let mut missing: Vec<&str> = Vec::new();
            for path in &paths {
                // The file must exist as a regular file: look for it in its directory's listing.
                let parent = path.rsplit_once('/').map(|(dir, _)| dir).unwrap_or(OUTPUTS);
                let request =
                    ListDirRequest { thread_id: env.thread_id().to_owned(), path: parent.to_owned(), max_depth: 1, ..Default::default() };
                let found = match grpc.list_dir(client.request(&env.ctx.call_context(), request)).await {
                    Ok(response) => {
                        response.into_inner().entries.iter().any(|e| e.kind == EntryKind::File as i32 && same_path(&e.path, path, parent))
                    }
                    Err(status) if status.code() == tonic::Code::NotFound => false,
                    Err(status) => return super::sandbox_failure(status),
                };
                if !found {
                    missing.push(path);
                }
            }
            if !missing.is_empty() {
                return Ok(ToolOutput::error(format!(
                    "Error: these files do not exist: {}. Write them to /mnt/user-data/outputs first, then present them.",
                    missing.join(", ")
                )));
            }
            env.present(&paths);
            Ok(ToolOutput::ok("Successfully presented files"))
        })
    }
}

/// Whether a listing entry (absolute, or relative to `parent`) names `path`.
fn same_path(entry: &str, path: &str, parent: &str) -> bool {
    let entry = entry.trim_end_matches('/');
    entry == path || format!("{parent}/{entry}") == path
}
