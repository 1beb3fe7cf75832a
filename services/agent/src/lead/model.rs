//! The innermost model call: ModelService.ChatStream, its deltas streamed to the run's events as
//! they arrive (text, thinking, tool-call arguments), the finished message returned. Cancellation is
//! checked at every chunk; dropping the stream aborts the upstream call.

use antler_proto::models::chat_stream_response::Delta;
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::{ChatRequest, ChatStreamRequest, FinishReason};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{MessageDelta, ToolCallDelta};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use super::pipeline::{LoopError, ModelResult, ModelTerminal, ModelTurn};
use super::run_env::RunEnv;

/// Longest a model stream may take end to end.
const STREAM_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Calls the models service (`clients.models`).
#[derive(Debug, Default)]
pub struct ChatStreamCall;

impl ModelTerminal for ChatStreamCall {
    fn call<'a>(&'a self, env: &'a RunEnv, request: ChatRequest) -> BoxFuture<'a, ModelResult> {
        Box::pin(stream_turn(env, request))
    }
}

fn unavailable(message: String) -> LoopError {
    LoopError::Model { code: "model_unavailable".to_owned(), message, retryable: true }
}

async fn stream_turn(env: &RunEnv, request: ChatRequest) -> ModelResult {
    let ctx = &env.ctx;
    let client = ctx
        .clients()
        .get("models")
        .ok_or_else(|| unavailable("no models client is configured\nhint: set clients.models in antler.yaml".to_owned()))?;
    let cancel = ctx.cancelled();
    let message_id = uuid::Uuid::now_v7().to_string();
    let mut call = client.request(&ctx.call_context(), ChatStreamRequest { request: Some(request) });
    // The client's default deadline (`clients.models.timeout_ms`, 30 s) is for unary calls; a long
    // answer streams for longer. Liveness is the models service's chunk timeout; this is a backstop.
    call.set_timeout(STREAM_DEADLINE);
    let mut grpc = ModelServiceClient::new(client.channel());
    let opened = tokio::select! {
        opened = grpc.chat_stream(call) => opened,
        () = cancel.cancelled() => return Err(LoopError::Cancelled),
    };
    let mut stream = opened.map_err(model_status)?.into_inner();
    let (mut text_offset, mut thinking_offset) = (0u64, 0u64);
    let mut argument_offsets = ArgumentOffsets::default();
    // Deltas are written whenever the stream has nothing more ready, one write in flight at a time:
    // chunks that arrive together (or during a write) go in one transaction, each with its own seq,
    // and a model slower than the write path — any real one — sees each delta written at once.
    let mut pending: Vec<Kind> = Vec::new();
    let mut writing: Option<BoxFuture<'_, Result<(), crate::Fenced>>> = None;
    loop {
        if cancel.is_cancelled() {
            return Err(LoopError::Cancelled);
        }
        let ready = match stream.next().now_or_never() {
            Some(item) => Some(item),
            None => {
                if writing.is_none() && !pending.is_empty() {
                    writing = Some(Box::pin(ctx.emit_many(std::mem::take(&mut pending))));
                }
                None
            }
        };
        let item = match ready {
            Some(item) => item,
            None => tokio::select! {
                item = stream.next() => item,
                written = wait(&mut writing) => {
                    writing = None;
                    written?;
                    continue;
                }
                () = cancel.cancelled() => return Err(LoopError::Cancelled),
            },
        };
        let response = match item {
            None => return Err(unavailable("the model stream ended without a finish".to_owned())),
            Some(Err(status)) => return Err(model_status(status)),
            Some(Ok(response)) => response,
        };
        let delta = match response.delta {
            Some(Delta::Text(t)) if !t.text.is_empty() => {
                let delta = MessageDelta { text: t.text.clone(), text_offset, ..base(&message_id) };
                text_offset += t.text.len() as u64;
                delta
            }
            Some(Delta::Thinking(t)) if !t.text.is_empty() => {
                let delta = MessageDelta { thinking: t.text.clone(), thinking_offset, ..base(&message_id) };
                thinking_offset += t.text.len() as u64;
                delta
            }
            Some(Delta::ToolCallStart(start)) => {
                let tool = ToolCallDelta { index: start.index, id: start.id, name: start.name, ..ToolCallDelta::default() };
                MessageDelta { tool_calls: vec![tool], ..base(&message_id) }
            }
            Some(Delta::ToolCallDelta(d)) if !d.arguments_delta.is_empty() => {
                let tool = ToolCallDelta {
                    index: d.index,
                    arguments: d.arguments_delta.clone(),
                    arguments_offset: argument_offsets.advance(d.index, d.arguments_delta.len()),
                    ..ToolCallDelta::default()
                };
                MessageDelta { tool_calls: vec![tool], ..base(&message_id) }
            }
            Some(Delta::Finish(finish)) => {
                let info = finish.info.unwrap_or_default();
                let finish_reason = info.finish_reason();
                if finish_reason == FinishReason::Error {
                    let error = info.error.unwrap_or_default();
                    return Err(LoopError::Model {
                        code: "model_error".to_owned(),
                        message: format!("the model failed mid-answer: {} ({})", error.message, error.code),
                        retryable: error.retryable,
                    });
                }
                if let Some(write) = writing.take() {
                    write.await?;
                }
                // The step's checkpoint follows at once: the last deltas go with it, in order.
                for delta in pending.drain(..) {
                    ctx.stage(delta);
                }
                let mut message = finish.message.unwrap_or_default();
                message.id = message_id;
                message.usage = info.usage;
                return Ok(ModelTurn { message, finish_reason, usage: info.usage, model_name: info.model_name });
            }
            _ => continue,
        };
        pending.push(Kind::MessageDelta(delta));
    }
}

/// Where each tool call's next argument delta starts, keyed by the index the models service sends.
/// A map grows with the deltas received, never with the value of an index: a Vec resized to a hostile
/// or buggy index would allocate whatever that index asks for.
#[derive(Debug, Default)]
struct ArgumentOffsets(std::collections::HashMap<u32, u64>);

impl ArgumentOffsets {
    /// The offset of a delta of `len` bytes for call `index`; the next one starts after it.
    fn advance(&mut self, index: u32, len: usize) -> u64 {
        let offset = self.0.entry(index).or_insert(0);
        let start = *offset;
        *offset += len as u64;
        start
    }
}

/// The write in flight, or never when there is none.
async fn wait(writing: &mut Option<BoxFuture<'_, Result<(), crate::Fenced>>>) -> Result<(), crate::Fenced> {
    match writing.as_mut() {
        Some(write) => write.await,
        None => std::future::pending().await,
    }
}

fn base(message_id: &str) -> MessageDelta {
    MessageDelta { message_id: message_id.to_owned(), replayable: true, ..MessageDelta::default() }
}

fn model_status(status: tonic::Status) -> LoopError {
    let code = match status.code() {
        tonic::Code::Unavailable | tonic::Code::ResourceExhausted | tonic::Code::NotFound => "model_unavailable",
        _ => "model_error",
    };
    let retryable = matches!(status.code(), tonic::Code::Unavailable | tonic::Code::ResourceExhausted);
    LoopError::Model {
        code: code.to_owned(),
        message: format!("the models service answered {:?}: {}", status.code(), status.message()),
        retryable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_offsets_follow_each_call_and_a_huge_index_costs_one_entry() {
        let mut offsets = ArgumentOffsets::default();
        assert_eq!(offsets.advance(0, 5), 0);
        assert_eq!(offsets.advance(1, 3), 0);
        assert_eq!(offsets.advance(0, 2), 5);
        assert_eq!(offsets.advance(u32::MAX, 7), 0, "no allocation proportional to the index");
        assert_eq!(offsets.advance(u32::MAX, 1), 7);
        assert_eq!(offsets.0.len(), 3);
    }
}
