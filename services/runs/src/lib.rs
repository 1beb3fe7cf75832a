//! The Antler runs service: threads and runs: the run lifecycle, leases, cancellation and durable event streams.
//!
//! [`SERVICE`] plugs it into a server binary (`antler-runs`, or `antler up` with every other service).

pub mod api;
pub mod config;

use antler_kit::ServiceSet;
use antler_kit::cli::{RegisterFuture, Registration, ServiceContext};
use antler_proto::runs::{run_service_server, thread_service_server};

/// How `antler-runs` and `antler up` mount this service.
pub const SERVICE: Registration = Registration { name: "runs", validate: config::validate, register };

fn register<'a>(set: &'a mut ServiceSet, _ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        set.describe(antler_proto::FILE_DESCRIPTOR_SET);
        antler_kit::add_service!(set, thread_service_server::ThreadServiceServer::new(api::ThreadApi));
        antler_kit::add_service!(set, run_service_server::RunServiceServer::new(api::RunApi));
        Ok(())
    })
}
