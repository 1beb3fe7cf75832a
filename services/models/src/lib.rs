//! The Antler models service: the model gateway. Config-driven streaming chat against OpenAI-compatible,
//! Anthropic and replay providers, with thinking rules, normalised usage, retries, fallbacks, per-model
//! concurrency limits and cancellation.
//!
//! [`SERVICE`] plugs it into a server binary (`antler-models`, or `antler up` with every other service).
//! Where things live: [`config`] (the `models:` section, DeerFlow compatibility in [`deerflow`]),
//! [`registry`] (models by name), [`gateway`] (one call: retries, fallbacks, streaming), [`thinking`]
//! (parameter merging), [`providers`] (one wire protocol per file), [`assemble`] (events → deltas and the
//! final message), [`usage`], [`error`] (the status table), [`api`] (tonic handlers).

pub mod api;
pub mod assemble;
pub mod config;
pub mod convert;
pub mod deerflow;
pub mod error;
pub mod events;
pub mod gateway;
pub mod images;
pub mod metrics_catalog;
pub mod providers;
pub mod registry;
pub mod request;
pub mod retry;
pub mod spec;
pub mod telemetry;
pub mod thinking;
pub mod tool_intern;
pub mod usage;

use std::sync::Arc;

use antler_kit::cli::{BoxError, RegisterFuture, Registration, ServiceContext};
use antler_kit::{Clients, Config, ServiceSet};
use antler_proto::models::model_service_server;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::gateway::Gateway;
use crate::registry::Registry;

/// How `antler-models` and `antler up` mount this service.
pub const SERVICE: Registration =
    Registration { name: "models", validate: config::validate, register, metrics: &[metrics_catalog::CATALOGUE] };

/// Builds the gateway from a configuration. `clients` gives the sandbox client that reads images given as
/// sandbox paths; without it such images are refused.
pub fn gateway(config: &Config, shutdown: CancellationToken, clients: Option<&Clients>) -> Result<Arc<Gateway>, BoxError> {
    let registry = Registry::build(config::resolve(config)?)?;
    let images = clients.and_then(|c| c.get("sandbox")).cloned().map(images::SandboxImages::new);
    Ok(Arc::new(Gateway::new(registry, shutdown, images)))
}

fn register<'a>(set: &'a mut ServiceSet, ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        let gateway = gateway(&ctx.config, ctx.shutdown.clone(), Some(&ctx.clients))?;
        tracing::info!(models = gateway.registry().models().len(), "model registry loaded");
        tokio::spawn(tracing::Instrument::instrument(
            follow_reloads(gateway.clone(), ctx.config_updates.clone(), ctx.shutdown.clone()),
            tracing::info_span!("models_reload"),
        ));
        set.describe(antler_proto::FILE_DESCRIPTOR_SET);
        antler_kit::add_service!(set, model_service_server::ModelServiceServer::new(api::ModelApi::new(gateway)));
        Ok(())
    })
}

/// Rebuilds the registry whenever a new valid configuration arrives; stops at shutdown. `updates` must not
/// have seen the change yet: a value published before this task first runs is still applied.
pub async fn follow_reloads(gateway: Arc<Gateway>, mut updates: watch::Receiver<Arc<Config>>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = updates.changed() => if changed.is_err() { return },
        }
        let config = updates.borrow_and_update().clone();
        match config::resolve(&config).map_err(|e| e.to_string()).and_then(Registry::build) {
            Ok(registry) => {
                let names: Vec<String> = registry.models().iter().map(|m| m.spec.name.clone()).collect();
                gateway.replace(registry);
                telemetry::reload("applied");
                tracing::info!(models = ?names, "model registry reloaded");
            }
            Err(error) => {
                // The kit validated this file with the same resolution, so this is rare (an HTTP client
                // that cannot be built); the previous registry stays in force.
                telemetry::reload("rejected");
                tracing::warn!(%error, "model registry not reloaded; the previous one stays in force");
            }
        }
    }
}
