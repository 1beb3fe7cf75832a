//! The Antler sandbox service: per-thread workspaces, file tools and isolated command execution.
//!
//! [`SERVICE`] plugs it into a server binary (`antler-sandbox`, or `antler up` with every other service).

pub mod api;
pub mod config;

use antler_kit::ServiceSet;
use antler_kit::cli::{RegisterFuture, Registration, ServiceContext};
use antler_proto::sandbox::sandbox_service_server;

/// How `antler-sandbox` and `antler up` mount this service.
pub const SERVICE: Registration = Registration { name: "sandbox", validate: config::validate, register };

fn register<'a>(set: &'a mut ServiceSet, _ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        set.describe(antler_proto::FILE_DESCRIPTOR_SET);
        antler_kit::add_service!(set, sandbox_service_server::SandboxServiceServer::new(api::SandboxApi));
        Ok(())
    })
}
