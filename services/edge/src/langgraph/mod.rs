//! The LangGraph-compatible HTTP + SSE API: the subset of the LangGraph Agent Server API that
//! langgraph-sdk's thread, run, stream, join, wait, cancel, state and history calls use.
//!
//! Files: `routes/` (one per resource), `run_request.rs` (run options → `CreateRunRequest`),
//! `stream.rs` (Antler events → SSE frames per stream mode), `messages.rs` and `convert.rs` (JSON
//! shapes), `paging.rs` (offset windows over page tokens).

pub mod convert;
pub mod messages;
pub mod paging;
pub mod routes;
pub mod run_request;
pub mod stream;
