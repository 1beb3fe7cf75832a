//! Thin tonic handlers for `antler.models.v1.ModelService`: validate, call the gateway, convert.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use antler_kit::{CallContext, Identity};
use antler_proto::models::*;
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::error::ModelError;
use crate::gateway::Gateway;
use crate::registry::Model;
use crate::request::ChatCall;
use crate::spec;

/// `antler.models.v1.ModelService`.
#[derive(Debug, Clone)]
pub struct ModelApi {
    gateway: Arc<Gateway>,
}

impl ModelApi {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        Self { gateway }
    }
}

fn provider_kind(kind: spec::ProviderKind) -> ProviderKind {
    match kind {
        spec::ProviderKind::OpenAi => ProviderKind::Openai,
        spec::ProviderKind::Anthropic => ProviderKind::Anthropic,
        spec::ProviderKind::Replay => ProviderKind::Replay,
        spec::ProviderKind::Gemini => ProviderKind::Gemini,
        spec::ProviderKind::Azure => ProviderKind::AzureOpenai,
    }
}

/// The public description of a model: never its key, base URL or headers.
fn model_info(model: &Model, is_default: bool) -> ModelInfo {
    let s = &model.spec;
    ModelInfo {
        name: s.name.clone(),
        display_name: s.display_name.clone(),
        description: s.description.clone(),
        provider: provider_kind(s.kind) as i32,
        upstream_model: s.upstream_model.clone(),
        capabilities: Some(ModelCapabilities {
            supports_thinking: s.capabilities.thinking,
            supports_vision: s.capabilities.vision,
            supports_reasoning_effort: s.capabilities.reasoning_effort,
            supports_tools: s.capabilities.tools,
        }),
        context_window: s.context_window.unwrap_or(0),
        max_output_tokens: s.max_tokens.unwrap_or(0),
        is_default,
        fallbacks: s.fallbacks.clone(),
    }
}

type ChatStreamBox = Pin<Box<dyn Stream<Item = Result<ChatStreamResponse, Status>> + Send>>;

#[tonic::async_trait]
impl model_service_server::ModelService for ModelApi {
    async fn list_models(&self, request: Request<ListModelsRequest>) -> Result<Response<ListModelsResponse>, Status> {
        Identity::of(&request)?;
        let registry = self.gateway.registry();
        let models = registry.models().iter().enumerate().map(|(i, m)| model_info(m, i == 0)).collect();
        let default_model_name = registry.default_model().map(|m| m.spec.name.clone()).unwrap_or_default();
        Ok(Response::new(ListModelsResponse { models, default_model_name }))
    }

    async fn get_model(&self, request: Request<GetModelRequest>) -> Result<Response<GetModelResponse>, Status> {
        Identity::of(&request)?;
        let name = request.into_inner().name;
        if name.is_empty() {
            return Err(ModelError::invalid("name", "is required").into());
        }
        let registry = self.gateway.registry();
        let model = registry.resolve(&name)?;
        let is_default = registry.default_model().is_some_and(|d| Arc::ptr_eq(d, model));
        Ok(Response::new(GetModelResponse { model: Some(model_info(model, is_default)) }))
    }

    async fn chat(&self, request: Request<ChatRequest>) -> Result<Response<ChatResponse>, Status> {
        let received = Instant::now();
        let ctx = CallContext::from_request(&request)?;
        let call = ChatCall::from_proto(request.into_inner(), received)?;
        tracing::debug!(user = %ctx.identity.user_id, model = %call.model_name, caller = %call.caller, run_id = %call.run_id, "chat");
        let outcome = self.gateway.chat(call, ctx).await?;
        Ok(Response::new(ChatResponse { message: Some(outcome.message), info: Some(outcome.info) }))
    }

    type ChatStreamStream = ChatStreamBox;

    async fn chat_stream(&self, request: Request<ChatStreamRequest>) -> Result<Response<Self::ChatStreamStream>, Status> {
        let received = Instant::now();
        let ctx = CallContext::from_request(&request)?;
        let inner = request.into_inner().request.ok_or_else(|| Status::from(ModelError::invalid("request", "is required")))?;
        let call = ChatCall::from_proto(inner, received)?;
        tracing::debug!(user = %ctx.identity.user_id, model = %call.model_name, caller = %call.caller, run_id = %call.run_id, "chat stream");
        let mut deltas = ReceiverStream::new(self.gateway.chat_stream(call, ctx)).map(|item| *item);
        // Errors before the first delta are the RPC's status, not a message in an open stream.
        let first = match deltas.next().await {
            Some(Ok(delta)) => delta,
            Some(Err(error)) => return Err(error.into()),
            None => return Err(Status::cancelled("the call ended without an answer")),
        };
        let rest = deltas.map(|item| item.map_err(Status::from));
        let stream: ChatStreamBox = Box::pin(futures::stream::once(async { Ok(first) }).chain(rest));
        Ok(Response::new(stream))
    }
}
