//! The Antler memory service: long-term memory of users — append-only facts with invalidation, summary
//! sections, full-text search, a durable extraction queue worked under leases, and budgeted injection.
//!
//! Where things happen, by file: the RPC handlers and their validation (`api.rs`), facts and search
//! (`facts.rs`), summary sections (`profile.rs`), the injection block (`render.rs`), the queue and its
//! claim (`queue.rs`), QueueUpdate's group commit (`queue_batch.rs`), extraction workers (`worker.rs`),
//! the prompt and answer schema (`extract.rs`),
//! message filtering (`filter.rs`), junk guards (`guards.rs`), DeerFlow memory.json (`import.rs`).
//!
//! [`SERVICE`] plugs it into a server binary (`antler-memory`, or `antler up` with every other service).

pub mod api;
pub mod config;
pub mod error;
pub mod extract;
pub mod facts;
pub mod filter;
pub mod guards;
pub mod import;
pub mod metrics_catalog;
pub mod profile;
pub mod queue;
pub mod queue_batch;
pub mod relevance;
pub mod render;
pub mod render_cache;
pub mod service;
pub mod store;
pub mod tokens;
pub mod worker;

use std::sync::Arc;

use antler_kit::ServiceSet;
use antler_kit::cli::{BoxError, RegisterFuture, Registration, ServiceContext};
use antler_proto::memory::memory_service_server;

/// How `antler-memory` and `antler up` mount this service.
pub const SERVICE: Registration =
    Registration { name: "memory", validate: config::validate, register, metrics: &[metrics_catalog::CATALOGUE] };

fn register<'a>(set: &'a mut ServiceSet, ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        mount(set, ctx).await?;
        Ok(())
    })
}

/// Opens the database, starts this replica's extraction workers and mounts the gRPC service.
pub async fn mount(set: &mut ServiceSet, ctx: &ServiceContext) -> Result<Arc<service::Memory>, BoxError> {
    let config = config::load(&ctx.config)?;
    let store = store::Store::open(&config.database, &ctx.config.server.data_dir).await?;
    let worker_id = format!("{}-{}", hostname(), uuid::Uuid::new_v4().simple());
    let enabled = config.enabled;
    let memory = service::Memory::new(store, config, ctx.clients.clone(), worker_id, ctx.shutdown.child_token())?;
    if enabled {
        let mut workers = worker::spawn(&memory);
        // Workers stop at shutdown; an update they were processing keeps its lease and is taken over
        // when it expires (or finished by this replica if it completes within the grace period).
        set.on_drain(async move { while workers.join_next().await.is_some() {} });
    }
    set.describe(antler_proto::FILE_DESCRIPTOR_SET);
    antler_kit::add_service!(set, memory_service_server::MemoryServiceServer::new(api::MemoryApi::new(memory.clone())));
    Ok(memory)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "memory".to_owned())
}
