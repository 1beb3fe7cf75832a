//! The Antler models service: the model gateway: config-driven streaming chat against OpenAI-compatible, Anthropic and replay providers.
//!
//! [`SERVICE`] plugs it into a server binary (`antler-models`, or `antler up` with every other service).

pub mod api;
pub mod config;

use antler_kit::ServiceSet;
use antler_kit::cli::{RegisterFuture, Registration, ServiceContext};
use antler_proto::models::model_service_server;

/// How `antler-models` and `antler up` mount this service.
pub const SERVICE: Registration = Registration { name: "models", validate: config::validate, register };

fn register<'a>(set: &'a mut ServiceSet, _ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        set.describe(antler_proto::FILE_DESCRIPTOR_SET);
        antler_kit::add_service!(set, model_service_server::ModelServiceServer::new(api::ModelApi));
        Ok(())
    })
}
