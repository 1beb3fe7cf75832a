//! The Antler memory service: long-term memory: facts about a user, extraction queue, prompt injection.
//!
//! [`SERVICE`] plugs it into a server binary (`antler-memory`, or `antler up` with every other service).

pub mod api;
pub mod config;

use antler_kit::ServiceSet;
use antler_kit::cli::{RegisterFuture, Registration, ServiceContext};
use antler_proto::memory::memory_service_server;

/// How `antler-memory` and `antler up` mount this service.
pub const SERVICE: Registration = Registration { name: "memory", validate: config::validate, register };

fn register<'a>(set: &'a mut ServiceSet, _ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        set.describe(antler_proto::FILE_DESCRIPTOR_SET);
        antler_kit::add_service!(set, memory_service_server::MemoryServiceServer::new(api::MemoryApi));
        Ok(())
    })
}
