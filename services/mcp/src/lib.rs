//! The Antler mcp service: MCP servers' tools under stable names, called through a pool of sessions.
//!
//! [`SERVICE`] plugs it into a server binary (`antler-mcp`, or `antler up` with every other service).
//! Where things are:
//!
//! * configuration: [`config`] (the `mcp` section), [`extensions`] (DeerFlow's `extensions_config.json`
//!   and its entries), [`hardening`] (what a stdio server may run), [`loader`] (both into one list),
//!   [`reload`] (following changes);
//! * connections: [`transports`] (stdio, streamable HTTP, legacy SSE over rmcp), [`oauth`] (tokens),
//!   [`pool`] (sessions: keys, LRU, dedup, breaker, counters);
//! * tools: [`discovery`] (one server's listing, on its own task), [`catalog`] (names, hash),
//!   [`search`] (tool_search), [`schema`] (argument checks), [`content`] (results and path rewriting);
//! * [`service`] is the domain entry point, [`api`] the thin gRPC layer, [`error`] the status mapping.

pub mod api;
pub mod catalog;
pub mod config;
pub mod content;
pub mod discovery;
pub mod editor;
pub mod error;
pub mod extensions;
pub mod hardening;
pub mod loader;
pub mod metrics_catalog;
pub mod oauth;
pub mod pool;
pub mod redact;
pub mod reload;
pub mod schema;
pub mod search;
pub mod servers;
pub mod service;
pub mod spec;
pub mod transports;

use std::sync::Arc;

use antler_kit::ServiceSet;
use antler_kit::cli::{BoxError, RegisterFuture, Registration, ServiceContext};
use antler_proto::mcp::mcp_service_server;

/// How `antler-mcp` and `antler up` mount this service.
pub const SERVICE: Registration =
    Registration { name: "mcp", validate: config::validate, register, metrics: &[metrics_catalog::CATALOGUE] };

/// Builds the hub from configuration (loads the servers; discovery is lazy).
pub fn build(config: &antler_kit::Config) -> Result<Arc<service::Hub>, BoxError> {
    let mcp = config::load(config)?;
    let cwd = std::env::current_dir().map_err(|e| format!("cannot read the working directory: {e}"))?;
    Ok(service::Hub::new(mcp, config.path.as_deref(), &config.server.data_dir, cwd)?)
}

fn register<'a>(set: &'a mut ServiceSet, ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        let hub = build(&ctx.config)?;
        hub.spawn_background(ctx.shutdown.clone());
        // The hub applies reloads; following the extensions file and antler.yaml is `reload`'s job, so
        // the hub never imports the module that drives it.
        reload::spawn_watcher(hub.clone(), ctx.shutdown.clone());
        tokio::spawn(tracing::Instrument::instrument(
            reload::follow_config(hub.clone(), ctx.config_updates.clone(), ctx.shutdown.clone()),
            tracing::info_span!("mcp_config_follow"),
        ));
        let snapshot = hub.snapshot();
        tracing::info!(servers = snapshot.servers.len(), skipped = snapshot.problems.len(), file = ?snapshot.file, "MCP service ready");
        set.describe(antler_proto::FILE_DESCRIPTOR_SET);
        antler_kit::add_service!(set, mcp_service_server::McpServiceServer::new(api::McpApi::new(hub)));
        Ok(())
    })
}
