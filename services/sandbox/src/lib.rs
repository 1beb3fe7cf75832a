//! The Antler sandbox service: per-thread workspaces, file tools and isolated command execution.
//!
//! [`SERVICE`] plugs it into a server binary (`antler-sandbox`, or `antler up` with every other service).

pub mod api;
pub mod config;

use antler_kit::ServiceSet;
use antler_kit::cli::{BoxError, Registration, ServiceContext};
use antler_proto::sandbox::sandbox_service_server;

/// How `antler-sandbox` and `antler up` mount this service.
pub const SERVICE: Registration = Registration { name: "sandbox", validate: config::validate, register };

fn register(set: &mut ServiceSet, _ctx: &ServiceContext) -> Result<(), BoxError> {
    set.describe(antler_proto::FILE_DESCRIPTOR_SET);
    antler_kit::add_service!(set, sandbox_service_server::SandboxServiceServer::new(api::SandboxApi));
    Ok(())
}
