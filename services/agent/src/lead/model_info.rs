//! The run's model as the models service describes it (capabilities, context window).

use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::{GetModelRequest, ListModelsRequest, ModelInfo};

use crate::AgentContext;

/// The run's model: its `config.model_name`, else the models service's default. None when there is
/// no models service or it does not answer.
pub async fn run_model(ctx: &AgentContext) -> Option<ModelInfo> {
    let client = ctx.clients().get("models")?;
    let mut grpc = ModelServiceClient::new(client.channel());
    let name = ctx.spec.request.config.as_ref().map(|c| c.model_name.clone()).unwrap_or_default();
    if !name.is_empty() {
        return grpc.get_model(client.request(&ctx.call_context(), GetModelRequest { name })).await.ok()?.into_inner().model;
    }
    let models = grpc.list_models(client.request(&ctx.call_context(), ListModelsRequest::default())).await.ok()?.into_inner().models;
    let default = models.iter().position(|m| m.is_default).unwrap_or(0);
    models.into_iter().nth(default)
}
