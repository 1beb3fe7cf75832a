//! The Antler mcp service: the MCP session pool: tools from MCP servers over stdio and HTTP.
//!
//! [`SERVICE`] plugs it into a server binary (`antler-mcp`, or `antler up` with every other service).

pub mod api;
pub mod config;

use antler_kit::ServiceSet;
use antler_kit::cli::{RegisterFuture, Registration, ServiceContext};
use antler_proto::mcp::mcp_service_server;

/// How `antler-mcp` and `antler up` mount this service.
pub const SERVICE: Registration = Registration { name: "mcp", validate: config::validate, register };

fn register<'a>(set: &'a mut ServiceSet, _ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        set.describe(antler_proto::FILE_DESCRIPTOR_SET);
        antler_kit::add_service!(set, mcp_service_server::McpServiceServer::new(api::McpApi));
        Ok(())
    })
}
