//! `/api/models`: the models the caller may use (ModelService.ListModels / GetModel), in DeerFlow's
//! `ModelResponse` shape. Credentials and endpoints are never part of a model's description.

use std::sync::Arc;

use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::{GetModelRequest, ListModelsRequest, ModelInfo};
use axum::Extension;
use axum::extract::{Path, State};
use axum::response::Response;
use serde_json::{Value, json};

use super::Call;
use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;

fn model_json(model: &ModelInfo) -> Value {
    let capabilities = model.capabilities.unwrap_or_default();
    let text = |s: &str| if s.is_empty() { Value::Null } else { Value::String(s.to_owned()) };
    json!({
        "name": model.name,
        "model": model.upstream_model,
        "display_name": text(&model.display_name),
        "description": text(&model.description),
        "supports_thinking": capabilities.supports_thinking,
        "supports_reasoning_effort": capabilities.supports_reasoning_effort,
        // Antler's own, which the UI ignores: what the model accepts and its window.
        "supports_vision": capabilities.supports_vision,
        "context_window": model.context_window,
        "is_default": model.is_default,
    })
}

/// `GET /api/models`: `{models, token_usage: {enabled}}`. Token usage is always recorded per run, so
/// the UI's usage display is on.
pub async fn list(State(edge): State<Arc<Edge>>, Extension(caller): Extension<Caller>) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "models", &caller)?;
    let reply = ModelServiceClient::new(call.channel()).list_models(call.unary(ListModelsRequest {})).await?.into_inner();
    let models: Vec<Value> = reply.models.iter().map(model_json).collect();
    Ok(json_response(&json!({ "models": models, "token_usage": { "enabled": true } })))
}

/// `GET /api/models/{model_name}`: one model; 404 for a name the caller may not use or that is not
/// configured.
pub async fn get(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(model_name): Path<String>,
) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "models", &caller)?;
    let reply = ModelServiceClient::new(call.channel()).get_model(call.unary(GetModelRequest { name: model_name })).await?.into_inner();
    let model = reply.model.ok_or_else(|| ApiError::internal("GetModel answered without a model"))?;
    Ok(json_response(&model_json(&model)))
}
