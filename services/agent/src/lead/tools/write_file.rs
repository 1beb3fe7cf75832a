//! `write_file`: writes (or appends) a text file (WriteFile).

use antler_proto::sandbox::{WriteFileRequest, write_file_request};
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput, description_param, sandbox_failure};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct WriteFile;

impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }

    fn description(&self) -> &'static str {
        "Write text content to a file. By default it overwrites the file; set append to add to its end."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "description": description_param(),
                "path": {"type": "string", "description": "The **absolute** path to the file to write to. ALWAYS PROVIDE THIS PARAMETER SECOND."},
                "content": {"type": "string", "description": "The content to write to the file. ALWAYS PROVIDE THIS PARAMETER THIRD."},
                "append": {"type": "boolean", "description": "Whether to append to the end of the file instead of overwriting it.", "default": false}
            },
            "required": ["description", "path", "content"]
        })
    }

    fn side_effect(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let path = args.required("path")?;
            let content = args.required("content")?;
            let (mut grpc, client) = env.sandbox().await?;
            let request = WriteFileRequest {
                thread_id: env.thread_id().to_owned(),
                path,
                content: Some(write_file_request::Content::Text(content)),
                append: args.boolean("append"),
            };
            match grpc.write_file(client.request(&env.ctx.call_context(), request)).await {
                Ok(_) => Ok(ToolOutput::ok("OK")),
                Err(status) => sandbox_failure(status),
            }
        })
    }
}
