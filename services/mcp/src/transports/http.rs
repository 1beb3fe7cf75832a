//! Streamable HTTP through rmcp's client transport, on a reqwest client shared by every session of the
//! server (so sessions and 2026-07-28 stateless calls reuse pooled HTTP/2 and keep-alive connections).
//!
//! rmcp re-initialises a session that answers 404 and retries the request once (rust-sdk #743); it does
//! not say that it did. [`Observed`] wraps the reqwest client to count those 404s, which is how
//! CallTool reports `session_reinitialized` and the pool counts re-initialisations, and to leave out the
//! optional standalone GET stream of a session unless `mcp.pool.http_listen_stream` asks for it: Antler
//! answers no server-initiated request, and the stream holds a connection and its buffers per pooled
//! session (responses to calls, with their progress notifications, come on the call's own stream).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::Sse;

/// A reqwest client that counts session-expired (404) answers, and opens the session's optional listen
/// stream only when asked to.
#[derive(Debug, Clone)]
pub struct Observed {
    pub inner: reqwest::Client,
    pub expired: Arc<AtomicU64>,
    /// Open the standalone GET stream a session may use for server-initiated messages.
    pub listen_stream: bool,
}

impl StreamableHttpClient for Observed {
    type Error = reqwest::Error;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>>> + Send + '_ {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let result = self.inner.post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits).await;
        if matches!(result, Err(StreamableHttpError::SessionExpired)) {
            self.expired.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<(), StreamableHttpError<Self::Error>>> + Send + '_ {
        self.inner.delete_session(uri, session_id, auth_header, custom_headers)
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>>> + Send + '_ {
        self.inner.get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
    }

    fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>>> + Send + '_ {
        // rmcp opens the standalone stream right after `initialize` (a session id, nothing to resume).
        // Saying the server has none makes rmcp skip it; resuming a call's own stream is unaffected.
        let standalone = session_id.is_some() && last_event_id.is_none();
        async move {
            if standalone && !self.listen_stream {
                return Err(StreamableHttpError::ServerDoesNotSupportSse);
            }
            self.inner
                .get_stream_with_max_sse_event_size(uri, session_id, last_event_id, auth_header, custom_headers, max_sse_event_size)
                .await
        }
    }
}
