//! `runs.langgraph_api`: the LangGraph-compatible HTTP edge (off unless `listen` is set).

use std::net::SocketAddr;

use antler_kit::config::{ConfigError, check_range};
use serde::{Deserialize, Serialize};

/// Settings of the LangGraph-compatible HTTP + SSE edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LangGraphApiConfig {
    /// `host:port` to serve the LangGraph Agent Server API on, e.g. `127.0.0.1:2024` (port 0 picks a
    /// free one). Empty: the edge is off. A non-loopback address needs `server.auth` (or
    /// `server.allow_insecure`), exactly like the gRPC listener.
    pub listen: String,
    /// Largest request body, in bytes; a larger one is refused with 413 naming this setting. A run's
    /// request is also bounded by `runs.max_request_bytes` once translated.
    pub max_body_bytes: u64,
    /// Requests handled at once, open SSE streams and waits included; beyond it the edge answers
    /// 429 with `Retry-After` instead of queueing.
    pub max_concurrent_requests: u32,
    /// Largest `limit` of `/threads/search`, `/threads/{id}/history`, `/threads/{id}/runs` and
    /// `/assistants/search`; a larger one is refused with 422.
    pub max_page: u32,
    /// Largest `offset` of those listings (an offset is paged through, so it costs reads).
    pub max_offset: u32,
}

impl Default for LangGraphApiConfig {
    fn default() -> Self {
        Self { listen: String::new(), max_body_bytes: 8 * 1024 * 1024, max_concurrent_requests: 1024, max_page: 1000, max_offset: 10_000 }
    }
}

impl LangGraphApiConfig {
    /// The address to listen on; None when the edge is off.
    pub fn listen_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.listen.trim().is_empty() {
            return Ok(None);
        }
        self.listen.trim().parse().map(Some).map_err(|_| ConfigError::Invalid {
            path: "runs.langgraph_api.listen".to_owned(),
            message: format!("`{}` is not host:port with an IP address, e.g. 127.0.0.1:2024", self.listen),
        })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        check_range("runs.langgraph_api.max_body_bytes", self.max_body_bytes, 1024, 1 << 30)?;
        check_range("runs.langgraph_api.max_concurrent_requests", self.max_concurrent_requests.into(), 1, 100_000)?;
        check_range("runs.langgraph_api.max_page", self.max_page.into(), 1, 10_000)?;
        check_range("runs.langgraph_api.max_offset", self.max_offset.into(), 0, 1_000_000)?;
        Ok(())
    }
}
