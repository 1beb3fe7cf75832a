//! What every Antler service shares: server bootstrap ([`server`]), authentication ([`auth`]), trace
//! context ([`trace_context`]), the concurrency limit ([`limit`]), shutdown ([`shutdown`]), configuration
//! ([`config`]), client-supplied map keys ([`input_keys`]), outbound clients ([`client`]), the Prometheus endpoint ([`prometheus`]) and the metric families it registers ([`metrics_catalog`]), status helpers ([`status`]), secret redaction ([`redact`]), logging ([`telemetry`]), TLS ([`tls`]) and
//! the command line every service binary accepts ([`cli`]), retry delays ([`backoff`]), and with the `store` feature the
//! database toolkit of the services with a database (`store`: error classification, busy retry, migrations).

pub mod auth;
pub mod backoff;
pub mod cli;
pub mod client;
pub mod config;
pub mod deadline;
pub mod input_keys;
pub mod internal;
pub mod json;
pub mod limit;
pub mod message_size;
pub mod metrics_catalog;
pub mod otel;
pub mod prometheus;
pub mod redact;
pub mod server;
pub mod shutdown;
pub mod status;
#[cfg(feature = "store")]
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod trace_context;
pub mod transport;

pub use auth::{Authenticator, Identity};
pub use client::{CallContext, Clients};
pub use config::Config;
pub use server::ServiceSet;
