//! `bash`: runs a command in the sandbox (ExecuteCommand), output streamed and collected.

use antler_proto::sandbox::execute_command_response::Event;
use antler_proto::sandbox::{ExecuteCommandRequest, OutputStream};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput, description_param, sandbox_failure};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct Bash;

impl Tool for Bash {
    fn name(&self) -> &'static str {
        "bash"
    }

    fn description(&self) -> &'static str {
        "Execute a bash command in a Linux environment.\n\n\
         - Use `python` to run Python code.\n\
         - Prefer a thread-local virtual environment in `/mnt/user-data/workspace/.venv`.\n\
         - Use `python -m pip` inside the virtual environment to install Python packages.\n\
         - Start long-running servers in the background with output redirected: `cmd > /mnt/user-data/workspace/server.log 2>&1 &`."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "description": description_param(),
                "command": {"type": "string", "description": "The bash command to execute. Always use absolute paths for files and directories."}
            },
            "required": ["description", "command"]
        })
    }

    fn side_effect(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let command = args.required("command")?;
            let (mut grpc, client) = env.sandbox().await?;
            // The run's secrets as environment variables; the sandbox masks their values in the output.
            let request = ExecuteCommandRequest {
                thread_id: env.thread_id().to_owned(),
                command,
                env: env.ctx.spec.secrets.env(),
                ..Default::default()
            };
            let mut call = client.request(&env.ctx.call_context(), request);
            // A command may run up to the sandbox's longest timeout (3600 s), far beyond the client's
            // default deadline for unary calls; the sandbox enforces the command's own timeout.
            call.set_timeout(std::time::Duration::from_secs(3660));
            let mut stream = match grpc.execute_command(call).await {
                Ok(response) => response.into_inner(),
                Err(status) => return sandbox_failure(status),
            };
            let cancel = env.ctx.cancelled();
            let (mut stdout, mut stderr, mut exit) = (String::new(), String::new(), None);
            loop {
                // Dropping the stream cancels the call, which kills the command's process group.
                let item = tokio::select! {
                    item = stream.next() => item,
                    () = cancel.cancelled() => return Err(ToolError::Stopping),
                };
                match item {
                    None => break,
                    Some(Err(status)) => return sandbox_failure(status),
                    Some(Ok(response)) => match response.event {
                        Some(Event::Output(output)) if output.stream == OutputStream::Stderr as i32 => stderr.push_str(&output.text),
                        Some(Event::Output(output)) => stdout.push_str(&output.text),
                        Some(Event::Exit(e)) => exit = Some(e),
                        _ => {}
                    },
                }
            }
            let mut text = stdout;
            if !stderr.is_empty() {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str("Std Error:\n");
                text.push_str(&stderr);
            }
            let exit = exit.unwrap_or_default();
            if exit.timed_out {
                return Ok(ToolOutput::error(format!("Error: command timed out\n{text}")));
            }
            if exit.exit_code != 0 || exit.killed {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str(&format!("Exit Code: {}", exit.exit_code));
            }
            if text.is_empty() {
                text = "(no output)".to_owned();
            }
            Ok(ToolOutput::ok(text))
        })
    }
}
