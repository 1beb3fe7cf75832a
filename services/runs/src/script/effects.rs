//! The script agent's side-effecting steps (`custom`, `produce`) go through the run's side-effect
//! journal (`tool_effects`, DESIGN §4 invariant 6) as the lead agent's tool calls do: the intent is
//! durable before the step acts, its result after, under the stable key `script-step-<index>`.
//!
//! A takeover resumes after the run's last checkpoint, so a step that ran between that checkpoint
//! and the crash is met again. The journal decides what happens then:
//! - a result is recorded: the step already happened; it is skipped;
//! - an intent without a result: the outcome is unknown (the worker died between the two), and the
//!   step is not redone blindly. A `custom` step cannot be checked, so it is recorded as unknown
//!   (result text [`UNKNOWN`], `is_error`) and skipped, with a `script_effect_unknown` custom event
//!   that tells the run's clients; a `produce` step is checked by reading the file back and written
//!   only if it is not there.
//!
//! So a side effect of the script agent happens at most once per run, and the store says which ones
//! are uncertain; the replica-kill benchmark proves it from `tool_effects` and the event log.

use antler_agent::{AgentContext, Effect, Fenced};
use antler_proto::runs::CustomEvent;
use antler_proto::runs::run_event::Kind;
use serde_json::Value;

/// The result recorded for a step whose outcome an earlier attempt left unknown.
pub const UNKNOWN: &str = "outcome unknown: an earlier attempt recorded the intent but died before recording a result; not redone";

/// The journal key of step `index` (its position in the script, stable across attempts).
pub fn key(index: usize) -> String {
    format!("script-step-{index}")
}

/// `{"custom": value}`: emits a custom event named `script`, at most once per run.
pub async fn custom(ctx: &AgentContext, index: usize, value: &Value) -> Result<(), Fenced> {
    let key = key(index);
    match ctx.effect(&key).await? {
        Effect::Done { .. } => {
            tracing::debug!(run_id = %ctx.spec.run_id, step = index, "custom step already done by an earlier attempt; skipped");
            Ok(())
        }
        Effect::Unknown => {
            tracing::warn!(run_id = %ctx.spec.run_id, step = index, "custom step's outcome is unknown after a takeover; not redone");
            let note = CustomEvent { name: "script_effect_unknown".to_owned(), data: Some(antler_kit::json::json_to_value(value)) };
            ctx.emit(Kind::Custom(note)).await?;
            ctx.record_result(&key, UNKNOWN, true).await
        }
        Effect::None => {
            ctx.record_intent(&key, "script.custom", &value.to_string()).await?;
            let event = CustomEvent { name: "script".to_owned(), data: Some(antler_kit::json::json_to_value(value)) };
            ctx.emit(Kind::Custom(event)).await?;
            ctx.record_result(&key, "emitted", false).await
        }
    }
}

/// `{"produce": path, …}`: writes `text` to `path` in the run's sandbox, at most once per run (a
/// write whose outcome is unknown is read back first). A failed write is recorded as an error
/// result and the script goes on: what counts as produced is what the sandbox holds at the end.
pub async fn produce(ctx: &AgentContext, index: usize, path: &str, text: String) -> Result<(), Fenced> {
    let key = key(index);
    match ctx.effect(&key).await? {
        Effect::Done { .. } => return Ok(()),
        Effect::Unknown => match sandbox::holds(ctx, path, &text).await {
            Ok(true) => return ctx.record_result(&key, "written (found by read-back after a takeover)", false).await,
            // The check says the write never happened: doing it now is the first time.
            Ok(false) => {}
            Err(status) => {
                tracing::warn!(run_id = %ctx.spec.run_id, path, %status, "cannot read back a produce step of unknown outcome; not redone");
                return ctx.record_result(&key, UNKNOWN, true).await;
            }
        },
        Effect::None => {
            let arguments = serde_json::json!({"path": path, "bytes": text.len()}).to_string();
            ctx.record_intent(&key, "script.produce", &arguments).await?;
        }
    }
    let bytes = text.len();
    match sandbox::write(ctx, path, text).await {
        Ok(()) => ctx.record_result(&key, &format!("wrote {bytes} bytes"), false).await,
        Err(status) => {
            tracing::warn!(run_id = %ctx.spec.run_id, path, %status, "script produce step failed");
            ctx.record_result(&key, &format!("write failed: {:?}: {}", status.code(), status.message()), true).await
        }
    }
}

/// The two sandbox calls a `produce` step makes.
mod sandbox {
    use antler_agent::AgentContext;
    use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
    use antler_proto::sandbox::{AcquireSandboxRequest, ReadFileRequest, WriteFileRequest, write_file_request};

    type Grpc = SandboxServiceClient<antler_kit::transport::Transport>;

    fn client(ctx: &AgentContext) -> Result<(&antler_kit::client::ServiceClient, Grpc), tonic::Status> {
        let client = ctx.clients().get("sandbox").ok_or_else(|| tonic::Status::unavailable("no sandbox client"))?;
        let grpc = SandboxServiceClient::new(client.channel());
        Ok((client, grpc))
    }

    /// Writes `text` to `path` in the run's sandbox (acquiring it first).
    pub async fn write(ctx: &AgentContext, path: &str, text: String) -> Result<(), tonic::Status> {
        let (client, mut grpc) = client(ctx)?;
        let call = ctx.call_context();
        let thread_id = ctx.spec.thread_id.clone();
        grpc.acquire_sandbox(client.request(&call, AcquireSandboxRequest { thread_id: thread_id.clone() })).await?;
        let write = WriteFileRequest {
            thread_id,
            path: path.to_owned(),
            content: Some(write_file_request::Content::Text(text)),
            ..Default::default()
        };
        grpc.write_file(client.request(&call, write)).await?;
        Ok(())
    }

    /// Whether `path` holds exactly `text` (its size, and its content when the read is not cut).
    pub async fn holds(ctx: &AgentContext, path: &str, text: &str) -> Result<bool, tonic::Status> {
        let (client, mut grpc) = client(ctx)?;
        let call = ctx.call_context();
        let read = ReadFileRequest { thread_id: ctx.spec.thread_id.clone(), path: path.to_owned(), ..Default::default() };
        match grpc.read_file(client.request(&call, read)).await {
            Ok(response) => {
                let file = response.into_inner();
                Ok(file.size_bytes == text.len() as u64 && (file.truncated || file.content == text))
            }
            Err(status) if status.code() == tonic::Code::NotFound => Ok(false),
            Err(status) => Err(status),
        }
    }
}
