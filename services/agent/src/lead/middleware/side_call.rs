//! A model call a middleware makes for its own purpose (a title, a summary), not the run's turn:
//! unary, thinking off, tagged with the middleware's caller so its tokens land in the middleware
//! bucket, and given up at once when the run is cancelled.

use antler_proto::common::Role;
use antler_proto::models::ChatRequest;
use antler_proto::models::model_service_client::ModelServiceClient;

use crate::lead::pipeline::LoopError;
use crate::lead::run_env::RunEnv;
use crate::lead::state::{text_message, text_of};

/// Sends `prompt` as one user message to `model` (empty: the models service's default) as `caller`,
/// records the usage, and returns the answer's text. None when there is no models client or the
/// call fails (logged with `caller`): the middleware then does without.
pub async fn ask(env: &RunEnv, caller: &'static str, model: &str, prompt: String) -> Result<Option<String>, LoopError> {
    let ctx = &env.ctx;
    let Some(client) = ctx.clients().get("models") else { return Ok(None) };
    let request = ChatRequest {
        model_name: model.to_owned(),
        messages: vec![text_message(Role::User, prompt)],
        thinking_enabled: false,
        caller: caller.to_owned(),
        run_id: ctx.spec.run_id.clone(),
        thread_id: ctx.spec.thread_id.clone(),
        ..ChatRequest::default()
    };
    let call = client.request(&ctx.call_context(), request);
    let mut grpc = ModelServiceClient::new(client.channel());
    let cancel = ctx.cancelled();
    let response = tokio::select! {
        response = grpc.chat(call) => response,
        () = cancel.cancelled() => return Err(LoopError::Cancelled),
    };
    let response = match response {
        Ok(response) => response.into_inner(),
        Err(status) => {
            tracing::warn!(run_id = %ctx.spec.run_id, caller, code = ?status.code(), "middleware model call failed; the layer does without it: {}", status.message());
            return Ok(None);
        }
    };
    let info = response.info.unwrap_or_default();
    if let Some(usage) = &info.usage {
        let name = if info.model_name.is_empty() { model } else { info.model_name.as_str() };
        ctx.record_usage(caller, name, usage).await?;
    }
    Ok(Some(response.message.as_ref().map(text_of).unwrap_or_default()))
}
