//! The `edge` section: the HTTP listener that serves the LangGraph Agent Server API (and DeerFlow's
//! gateway routes), off unless `listen` is set. Until this crate existed the same keys lived under
//! `runs.langgraph_api`; that block is refused with a hint naming this section.

use std::net::SocketAddr;

use antler_kit::config::{Config, ConfigError, check_range};
use serde::{Deserialize, Serialize};

/// Settings of the HTTP + SSE edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
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
    /// Browser origins allowed to call the edge (CORS), e.g. `["http://localhost:3000"]` for DeerFlow's
    /// web UI, or `["*"]` for any. Each is `scheme://host[:port]`. Empty (the default): no CORS headers,
    /// so browsers refuse cross-origin calls; other clients are not affected either way.
    pub cors_origins: Vec<String>,
    /// How long a browser may cache a preflight answer, in seconds.
    pub cors_max_age_secs: u64,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            listen: String::new(),
            max_body_bytes: 8 * 1024 * 1024,
            max_concurrent_requests: 1024,
            max_page: 1000,
            max_offset: 10_000,
            cors_origins: Vec::new(),
            cors_max_age_secs: 600,
        }
    }
}

impl EdgeConfig {
    /// The address to listen on; None when the edge is off.
    pub fn listen_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.listen.trim().is_empty() {
            return Ok(None);
        }
        self.listen.trim().parse().map(Some).map_err(|_| ConfigError::Invalid {
            path: "edge.listen".to_owned(),
            message: format!("`{}` is not host:port with an IP address, e.g. 127.0.0.1:2024", self.listen),
        })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        check_range("edge.max_body_bytes", self.max_body_bytes, 1024, 1 << 30)?;
        check_range("edge.max_concurrent_requests", self.max_concurrent_requests.into(), 1, 100_000)?;
        check_range("edge.max_page", self.max_page.into(), 1, 10_000)?;
        check_range("edge.max_offset", self.max_offset.into(), 0, 1_000_000)?;
        check_range("edge.cors_max_age_secs", self.cors_max_age_secs, 0, 86_400)?;
        for (i, origin) in self.cors_origins.iter().enumerate() {
            check_origin(origin).map_err(|message| ConfigError::Invalid { path: format!("edge.cors_origins[{i}]"), message })?;
        }
        if self.cors_origins.len() > 1 && self.cors_origins.iter().any(|o| o == "*") {
            return Err(ConfigError::Invalid {
                path: "edge.cors_origins".to_owned(),
                message: "\"*\" allows every origin; list it alone".to_owned(),
            });
        }
        Ok(())
    }

    /// The CORS layer for `cors_origins` (None when the list is empty).
    pub fn cors(&self) -> Option<tower_http::cors::CorsLayer> {
        use axum::http::{HeaderName, HeaderValue, Method, header};
        use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
        if self.cors_origins.is_empty() {
            return None;
        }
        let origin = if self.cors_origins.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(self.cors_origins.iter().filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok()))
        };
        Some(
            CorsLayer::new()
                .allow_origin(origin)
                .allow_methods([Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::OPTIONS])
                // Mirrored rather than `*`: browsers never let a wildcard cover Authorization.
                .allow_headers(AllowHeaders::mirror_request())
                // The SDKs read the run id from Content-Location and resume streams with Last-Event-ID.
                .expose_headers([header::CONTENT_LOCATION, header::LOCATION, HeaderName::from_static("retry-after")])
                .max_age(std::time::Duration::from_secs(self.cors_max_age_secs)),
        )
    }
}

/// `*`, or `scheme://host[:port]` with an http(s) scheme and nothing after the authority.
fn check_origin(origin: &str) -> Result<(), String> {
    if origin == "*" {
        return Ok(());
    }
    let trimmed = origin.trim_end_matches('/');
    let rest = trimmed.strip_prefix("http://").or_else(|| trimmed.strip_prefix("https://"));
    match rest {
        Some(authority) if !authority.is_empty() && !authority.contains(['/', '?', '#', ' ', '*']) => {
            axum::http::HeaderValue::from_str(trimmed).map(|_| ()).map_err(|_| format!("`{origin}` holds characters a header cannot carry"))
        }
        _ => Err(format!("`{origin}` is not an origin: write scheme://host[:port], e.g. http://localhost:3000, or \"*\"")),
    }
}

/// The edge's section of `config`, checked. The run options it translates are the runs service's
/// (`runs.agent`, `runs.context_keys`), so that section is read and checked too.
pub fn load(config: &Config) -> Result<(EdgeConfig, antler_runs::config::RunsConfig), ConfigError> {
    let edge: EdgeConfig = config.section("edge")?;
    edge.validate()?;
    Ok((edge, antler_runs::config::load(config)?))
}

/// Checks the section (for start-up, reloads and `antler config check`).
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    load(config).map(|_| ())
}
