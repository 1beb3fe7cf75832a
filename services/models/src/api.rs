//! Thin tonic handlers for `antler.models.v1`. The capability behind them has not landed yet, so each RPC
//! answers UNIMPLEMENTED with a message naming what is missing, never a fake success.

use antler_kit::status::unimplemented;
use antler_proto::models::*;
use tonic::{Request, Response, Status};

/// `antler.models.v1.ModelService`: every RPC answers UNIMPLEMENTED until its capability lands.
#[derive(Debug, Default, Clone)]
pub struct ModelApi;

const MODEL_SERVICE_CAPABILITY: &str =
    "the model gateway (config-driven OpenAI-compatible, Anthropic and replay providers) lands with issue #4";

#[tonic::async_trait]
impl model_service_server::ModelService for ModelApi {
    async fn list_models(&self, _request: Request<ListModelsRequest>) -> Result<Response<ListModelsResponse>, Status> {
        Err(unimplemented("ModelService.ListModels", MODEL_SERVICE_CAPABILITY))
    }

    async fn get_model(&self, _request: Request<GetModelRequest>) -> Result<Response<GetModelResponse>, Status> {
        Err(unimplemented("ModelService.GetModel", MODEL_SERVICE_CAPABILITY))
    }

    async fn chat(&self, _request: Request<ChatRequest>) -> Result<Response<ChatResponse>, Status> {
        Err(unimplemented("ModelService.Chat", MODEL_SERVICE_CAPABILITY))
    }

    type ChatStreamStream = tokio_stream::Empty<Result<ChatStreamResponse, Status>>;

    async fn chat_stream(&self, _request: Request<ChatStreamRequest>) -> Result<Response<Self::ChatStreamStream>, Status> {
        Err(unimplemented("ModelService.ChatStream", MODEL_SERVICE_CAPABILITY))
    }
}
