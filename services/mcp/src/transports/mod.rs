//! Opening a session to a server over its transport: stdio ([`stdio`]), streamable HTTP ([`http`]) or
//! legacy SSE ([`sse`]), then the protocol lifecycle — `server/discover` for 2026-07-28 servers (no
//! session id; every request carries its own metadata), falling back to the `initialize` handshake of
//! 2025-11-25 sessions. rmcp does both; this module only picks and wires.

pub mod handler;
pub mod http;
pub mod sse;
pub mod stdio;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use rmcp::model::ProtocolVersion;
use rmcp::service::{ClientLifecycleMode, RoleClient, RunningService, serve_client_with_lifecycle};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::spec::{Lifecycle, ServerSpec, TransportKind};
use handler::Handler;

/// A running MCP client session.
pub type Service = RunningService<RoleClient, Handler>;

/// What a session needs besides the server entry.
#[derive(Debug, Clone)]
pub struct Target {
    /// stdio: the working directory (the thread's workspace) and its scratch directory.
    pub cwd: Option<PathBuf>,
    pub tmp: Option<PathBuf>,
    /// Remote: every header to send (the entry's, plus Authorization from OAuth).
    pub headers: BTreeMap<String, String>,
    /// Remote: the server's shared HTTP client.
    pub http: reqwest::Client,
    /// Largest response accepted.
    pub max_response_bytes: usize,
    /// Streamable HTTP: open the session's standalone listen stream.
    pub listen_stream: bool,
}

/// An open session.
pub struct Connection {
    pub service: Service,
    /// The protocol version agreed ("2026-07-28" for a stateless server).
    pub protocol_version: String,
    /// Session-expired answers seen (streamable HTTP; rmcp re-initialised after each).
    pub expired: Arc<AtomicU64>,
    /// Raised by a `tools/list_changed` notification.
    pub tools_changed: Arc<AtomicBool>,
    /// stdio: what the server last wrote to stderr.
    pub stderr: Option<stdio::StderrTail>,
    /// stdio: kills the server's process group when the session is dropped (after `service`, by field order).
    pub _group: Option<stdio::ProcessGroupGuard>,
}

fn lifecycle(spec: &ServerSpec) -> ClientLifecycleMode {
    match (spec.transport, spec.lifecycle) {
        // Legacy SSE predates discovery.
        (TransportKind::Sse, _) | (_, Lifecycle::Initialize) => ClientLifecycleMode::Initialize,
        (_, Lifecycle::Stateless) => ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
        (_, Lifecycle::Auto) => ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::V_2025_11_25),
        },
    }
}

fn header_map(headers: &BTreeMap<String, String>) -> Result<HashMap<::http::HeaderName, ::http::HeaderValue>, String> {
    headers
        .iter()
        .map(|(k, v)| {
            let name = ::http::HeaderName::from_bytes(k.as_bytes()).map_err(|_| format!("invalid header name `{k}`"))?;
            let value = ::http::HeaderValue::from_str(v).map_err(|_| format!("invalid value for header `{k}`"))?;
            Ok((name, value))
        })
        .collect()
}

/// Opens a session. Errors are plain messages (the caller redacts and classifies them).
pub async fn connect(spec: &ServerSpec, target: &Target) -> Result<Connection, String> {
    let handler = Handler::new(ProtocolVersion::V_2025_11_25);
    let tools_changed = handler.tools_changed.clone();
    let expired = Arc::new(AtomicU64::new(0));
    let mode = lifecycle(spec);
    let (service, stdio) = match spec.transport {
        TransportKind::Stdio => {
            let cwd = target.cwd.clone().ok_or("no working directory for the stdio server")?;
            let tmp = target.tmp.clone().unwrap_or_else(|| cwd.clone());
            let (transport, tail, group) = stdio::spawn(spec, &cwd, &tmp).map_err(|e| format!("cannot start `{}`: {e}", spec.command))?;
            match serve_client_with_lifecycle(handler, transport, mode).await {
                Ok(service) => (service, Some((tail, group))),
                Err(error) => {
                    // Give the server's own last words a moment to arrive: they say why it failed.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    let said = tail.text();
                    let said = if said.is_empty() { String::new() } else { format!("; the server wrote: {said}") };
                    return Err(format!("session start failed: {error}{said}"));
                }
            }
        }
        TransportKind::Http => {
            let mut config = StreamableHttpClientTransportConfig::with_uri(spec.url.clone())
                .custom_headers(header_map(&target.headers)?)
                .max_json_response_size(target.max_response_bytes)
                .max_sse_event_size(target.max_response_bytes)
                .reinit_on_expired_session(true);
            config.allow_stateless = true;
            let client = http::Observed { inner: target.http.clone(), expired: expired.clone(), listen_stream: target.listen_stream };
            let transport = StreamableHttpClientTransport::with_client(client, config);
            let service = serve_client_with_lifecycle(handler, transport, mode).await.map_err(|e| format!("session start failed: {e}"))?;
            (service, None)
        }
        TransportKind::Sse => {
            let headers: reqwest::header::HeaderMap = header_map(&target.headers)?.into_iter().collect();
            let transport = sse::connect(target.http.clone(), &spec.url, headers, target.max_response_bytes)
                .await
                .map_err(|e| format!("cannot open the event stream: {e}"))?;
            let service = serve_client_with_lifecycle(handler, transport, mode).await.map_err(|e| format!("session start failed: {e}"))?;
            (service, None)
        }
    };
    let protocol_version = service.peer_info().map(|info| info.protocol_version.to_string()).unwrap_or_default();
    let (stderr, group) = match stdio {
        Some((tail, group)) => (Some(tail), Some(group)),
        None => (None, None),
    };
    Ok(Connection { service, protocol_version, expired, tools_changed, stderr, _group: group })
}
