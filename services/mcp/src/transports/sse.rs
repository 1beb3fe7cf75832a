//! The legacy HTTP+SSE transport (MCP 2024-11-05): GET an event stream, whose first `endpoint` event
//! names the URL to POST JSON-RPC messages to; replies arrive as `message` events on the stream.
//!
//! Hand-written because rmcp 3 has no SSE client transport (it was removed with the 2025-03-26 spec),
//! while DeerFlow users still configure `type: "sse"` servers. It is small: the event parsing is
//! eventsource-stream's, the JSON-RPC session is rmcp's; this file only moves messages.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::service::RoleClient;
use rmcp::transport::Transport;
use tokio::sync::mpsc;

/// Messages buffered between the event stream and the session; when full, the stream is not read until the
/// session catches up (backpressure reaches the server through TCP).
const INBOX: usize = 64;

/// Why the transport failed.
#[derive(Debug, thiserror::Error)]
pub enum SseTransportError {
    #[error("{0}")]
    Http(String),
    #[error("the server answered HTTP {0}")]
    Status(u16),
    /// The server no longer knows the session (it restarted, or the session expired).
    #[error("the server no longer knows this session (HTTP 404)")]
    SessionExpired,
    #[error("the event stream ended before the server named its message endpoint")]
    NoEndpoint,
    #[error("{0}")]
    BadEndpoint(String),
}

fn http_error(error: reqwest::Error) -> SseTransportError {
    // reqwest's message names the URL without credentials; headers are never part of it.
    SseTransportError::Http(error.without_url().to_string())
}

/// A connected SSE session.
pub struct SseTransport {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    headers: HeaderMap,
    inbox: mpsc::Receiver<ServerJsonRpcMessage>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for SseTransport {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Opens the event stream and waits for the endpoint event. `max_message` bounds one event's data.
pub async fn connect(
    client: reqwest::Client,
    url: &str,
    headers: HeaderMap,
    max_message: usize,
) -> Result<SseTransport, SseTransportError> {
    let base = reqwest::Url::parse(url).map_err(|e| SseTransportError::BadEndpoint(format!("`{url}`: {e}")))?;
    let response =
        client.get(base.clone()).headers(headers.clone()).header(ACCEPT, "text/event-stream").send().await.map_err(http_error)?;
    if !response.status().is_success() {
        return Err(SseTransportError::Status(response.status().as_u16()));
    }
    let mut events = response.bytes_stream().eventsource();
    let endpoint = loop {
        match events.next().await {
            Some(Ok(event)) if event.event == "endpoint" => {
                break base
                    .join(event.data.trim())
                    .map_err(|e| SseTransportError::BadEndpoint(format!("endpoint `{}`: {e}", event.data)))?;
            }
            Some(Ok(_)) => continue,
            Some(Err(error)) => return Err(SseTransportError::Http(error.to_string())),
            None => return Err(SseTransportError::NoEndpoint),
        }
    };
    // The endpoint receives our headers (credentials included): it must be the server we were told to use.
    if endpoint.origin() != base.origin() {
        return Err(SseTransportError::BadEndpoint(format!(
            "the server named an endpoint on another origin ({})",
            endpoint.origin().ascii_serialization()
        )));
    }
    let (tx, inbox) = mpsc::channel(INBOX);
    let reader = tokio::spawn(async move {
        while let Some(event) = events.next().await {
            match event {
                Ok(event) if event.event == "message" || event.event.is_empty() => {
                    if event.data.len() > max_message {
                        tracing::warn!(
                            bytes = event.data.len(),
                            limit = max_message,
                            "SSE message over the size limit; closing the session"
                        );
                        return;
                    }
                    match serde_json::from_str::<ServerJsonRpcMessage>(&event.data) {
                        Ok(message) => {
                            if tx.send(message).await.is_err() {
                                return;
                            }
                        }
                        Err(error) => tracing::warn!(%error, "SSE message is not JSON-RPC; ignored"),
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "SSE stream broke");
                    return;
                }
            }
        }
    });
    Ok(SseTransport { client, endpoint, headers, inbox, reader })
}

/// Time allowed for one POST of a message (the reply itself comes on the stream).
const POST_TIMEOUT: Duration = Duration::from_secs(30);

impl Transport<RoleClient> for SseTransport {
    type Error = SseTransportError;

    fn send(&mut self, item: ClientJsonRpcMessage) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let (client, endpoint, headers) = (self.client.clone(), self.endpoint.clone(), self.headers.clone());
        async move {
            let body = serde_json::to_vec(&item).map_err(|e| SseTransportError::Http(e.to_string()))?;
            let response = client
                .post(endpoint)
                .headers(headers)
                .header(CONTENT_TYPE, "application/json")
                .timeout(POST_TIMEOUT)
                .body(body)
                .send()
                .await
                .map_err(http_error)?;
            match response.status() {
                s if s.is_success() => Ok(()),
                reqwest::StatusCode::NOT_FOUND => Err(SseTransportError::SessionExpired),
                s => Err(SseTransportError::Status(s.as_u16())),
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        self.inbox.recv()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.reader.abort();
        std::future::ready(Ok(()))
    }
}
