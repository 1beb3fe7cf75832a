//! The Antler HTTP edge: the LangGraph Agent Server API (threads, runs, streams, state, history) that
//! `langgraph-sdk`, `@langchain/langgraph-sdk` and DeerFlow's web UI speak, served on `edge.listen`.
//!
//! A service of its own (`antler serve edge`, and part of `antler up`) that owns no state: every route
//! is a translation onto the gRPC API of the service that owns the data, called as the caller, so
//! auth, ownership, validation and errors are the gRPC API's.
//!
//! Files: `server.rs` (the listener), `edge.rs` (shared state and authentication), `gate.rs` (what
//! every request passes: limits, auth, tracing, counts), `json.rs` (JSON answers), `error.rs` (HTTP
//! errors and the gRPC → HTTP table), `request.rs` (bodies and queries),
//! `config.rs` (the `edge` section), `langgraph/` (the LangGraph API: routes, run options, SSE),
//! `gateway/` (DeerFlow's gateway routes: `/api/*` and `/api/v1/auth/*`).

pub mod config;
pub mod edge;
pub mod error;
pub mod gate;
pub mod gateway;
pub mod json;
pub mod langgraph;
pub mod metrics_catalog;
pub mod request;
pub mod server;

use antler_kit::ServiceSet;
use antler_kit::cli::{RegisterFuture, Registration, ServiceContext};

/// How `antler up` and `antler serve edge` mount the edge.
pub const SERVICE: Registration =
    Registration { name: "edge", validate: config::validate, register, metrics: &[metrics_catalog::CATALOGUE] };

fn register<'a>(_set: &'a mut ServiceSet, ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        if let Some(addr) = server::start(ctx).await? {
            // The LangGraph SDKs connect here; tests and scripts read the address from this line.
            println!("langgraph api listening on http://{addr}");
        }
        Ok(())
    })
}
