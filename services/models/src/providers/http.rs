//! The HTTP side shared by the OpenAI and Anthropic providers: POST a JSON body, classify an error answer,
//! and read a successful one as server-sent events.
//!
//! Nothing here trusts the upstream: error bodies are read up to a cap, lines longer than a cap end the
//! stream as malformed (a server that never sends a newline cannot make us buffer without end), and bytes
//! that are not UTF-8 or not SSE are reported, never unwrapped.

use std::collections::VecDeque;
use std::error::Error as _;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

use crate::error::{UpstreamError, UpstreamKind, truncate};
use crate::events::Event;
use crate::providers::EventStream;
use crate::retry;
use crate::spec::ModelSpec;

/// Longest SSE line accepted (a whole non-streamed answer on one line fits comfortably).
const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;
/// Largest error body read.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long reading an error body may take once the status is known.
const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` field; `message` when absent.
    pub event: String,
    pub data: String,
}

/// Events of a response body.
pub type SseStream = BoxStream<'static, Result<SseEvent, UpstreamError>>;

/// A configured endpoint.
#[derive(Debug, Clone)]
pub struct Http {
    client: reqwest::Client,
    /// Parsed once: parsing a URL string per request shows up in profiles.
    url: reqwest::Url,
    headers: HeaderMap,
    first_byte: Duration,
    /// The provider's reading of an error body: the status it stands for and the retry delay it
    /// names (see [`Http::with_error_reader`]).
    error_reader: Option<ErrorReader>,
}

/// Reads an error answer's status and body into the status to classify it by and a retry delay (for
/// providers that put either in the body rather than the status line and headers).
pub type ErrorReader = fn(status: u16, body: &str) -> (u16, Option<Duration>);

impl Http {
    /// `url` is the full endpoint; `headers` are the provider's own (auth, version) before the model's
    /// `default_headers`.
    pub fn new(spec: &ModelSpec, url: String, mut headers: HeaderMap) -> Result<Self, String> {
        for (name, value) in &spec.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("header {name}: {e}"))?;
            let value = HeaderValue::from_str(value).map_err(|e| format!("header {name}: {e}"))?;
            headers.insert(name, value);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(reqwest::header::ACCEPT, HeaderValue::from_static("text/event-stream"));
        let mut client = reqwest::Client::builder()
            .connect_timeout(spec.timeouts.connect)
            .tcp_nodelay(true)
            // Idle pooled connections are cheap to keep and save a handshake per call.
            .pool_idle_timeout(Duration::from_secs(90));
        if spec.http2_prior_knowledge {
            // Every call is then a stream on one shared connection instead of a connection of its own
            // (with HTTP/1.1, 27 KiB of hyper buffers per call in flight).
            client = client.http2_prior_knowledge();
        }
        let client = client.build().map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let url = reqwest::Url::parse(&url).map_err(|e| format!("endpoint `{url}`: {e}"))?;
        Ok(Self { client, url, headers, first_byte: spec.timeouts.first_byte, error_reader: None })
    }

    /// Classifies error answers with `reader` (a `Retry-After` header still wins over its delay).
    pub fn with_error_reader(mut self, reader: ErrorReader) -> Self {
        self.error_reader = Some(reader);
        self
    }

    /// A header value that must stay secret in `Debug` output.
    pub fn secret(value: &str) -> Result<HeaderValue, String> {
        let mut value = HeaderValue::from_str(value).map_err(|_| "the API key is not a valid HTTP header value".to_owned())?;
        value.set_sensitive(true);
        Ok(value)
    }

    /// Sends `body` and returns the provider's request id and the event stream.
    pub async fn open(&self, body: Bytes) -> Result<(String, SseStream), UpstreamError> {
        let send = self.client.post(self.url.clone()).headers(self.headers.clone()).body(body).send();
        let response = match tokio::time::timeout(self.first_byte, send).await {
            Err(_) => {
                return Err(UpstreamError::new(
                    UpstreamKind::FirstByteTimeout,
                    format!("no response within {} ms (first_byte_timeout_ms)", self.first_byte.as_millis()),
                ));
            }
            Ok(Err(error)) => return Err(classify(&error)),
            Ok(Ok(response)) => response,
        };
        let request_id = ["x-request-id", "request-id", "x-amzn-requestid"]
            .iter()
            .find_map(|name| response.headers().get(*name).and_then(|v| v.to_str().ok()))
            .unwrap_or_default()
            .to_owned();
        let status = response.status();
        if !status.is_success() {
            let retry_after = retry::retry_after(response.headers());
            let body = read_capped(response).await;
            let (status, in_body) = match self.error_reader {
                Some(reader) => reader(status.as_u16(), &body),
                None => (status.as_u16(), None),
            };
            return Err(UpstreamError::from_status(status, error_message(&body), retry_after.or(in_body)));
        }
        let content_type = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_ascii_lowercase();
        if content_type.starts_with("application/json") {
            // Some gateways answer a streaming request with a plain JSON error and status 200.
            let body = read_capped(response).await;
            return Err(UpstreamError::malformed("expected an event stream, got application/json", &body));
        }
        Ok((request_id, sse(response)))
    }
}

/// The body as events, with the line-length guard in front of the SSE parser.
fn sse(response: reqwest::Response) -> SseStream {
    let mut line = 0usize;
    let mut failed = false;
    let guarded = response.bytes_stream().map(move |chunk| {
        if failed {
            return Err(UpstreamError::new(UpstreamKind::Malformed, "stream already failed"));
        }
        let chunk = chunk.map_err(|e| UpstreamError::new(UpstreamKind::Broken, chain(&e)))?;
        match chunk.iter().rposition(|b| *b == b'\n') {
            Some(last) => line = chunk.len() - last - 1,
            None => line += chunk.len(),
        }
        if line > MAX_LINE_BYTES {
            failed = true;
            return Err(UpstreamError::new(UpstreamKind::Malformed, format!("a line longer than {MAX_LINE_BYTES} bytes")));
        }
        Ok(chunk)
    });
    guarded
        .eventsource()
        .map(|item| match item {
            Ok(event) => Ok(SseEvent { event: event.event, data: event.data }),
            Err(EventStreamError::Transport(e)) => Err(e),
            Err(EventStreamError::Utf8(e)) => Err(UpstreamError::new(UpstreamKind::Malformed, format!("the stream is not UTF-8: {e}"))),
            Err(EventStreamError::Parser(e)) => Err(UpstreamError::malformed("not a server-sent event", &e.input)),
        })
        .boxed()
}

async fn read_capped(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    let read = async {
        while let Ok(Some(chunk)) = response.chunk().await {
            let room = MAX_ERROR_BODY.saturating_sub(body.len());
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() >= MAX_ERROR_BODY {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(ERROR_BODY_TIMEOUT, read).await;
    String::from_utf8_lossy(&body).into_owned()
}

/// The human part of an error body: OpenAI and Anthropic put it in `error.message`; others use `message`,
/// `detail` or a bare `error` string. Falls back to the body itself.
pub fn error_message(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let found = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .or_else(|| v.get("error"))
            .and_then(|m| m.as_str())
            .map(str::to_owned)
    });
    let mut message = found.unwrap_or_else(|| body.trim().to_owned());
    truncate(&mut message, 500);
    if message.is_empty() { "no error message".to_owned() } else { message }
}

/// Classifies a failure to get a response.
fn classify(error: &reqwest::Error) -> UpstreamError {
    let kind = if error.is_connect() {
        UpstreamKind::Connect
    } else if error.is_timeout() {
        UpstreamKind::FirstByteTimeout
    } else {
        UpstreamKind::Broken
    };
    UpstreamError::new(kind, chain(error))
}

/// An error with its causes, which is where reqwest keeps the useful part ("connection refused").
fn chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A provider's reading of its own event stream.
pub trait SseParser: Send + 'static {
    /// The events one SSE event stands for.
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<Event>, UpstreamError>;
    /// The body ended; an answer that was not complete is an error here.
    fn on_eof(&mut self) -> Result<Vec<Event>, UpstreamError>;
}

/// How long to wait for the body's end after the provider's end marker, so the connection can go back to
/// the pool; a server that keeps it open longer just loses the connection.
const DRAIN_AFTER_DONE: Duration = Duration::from_millis(100);

struct Parsing<P> {
    sse: SseStream,
    parser: P,
    pending: VecDeque<Event>,
    done: bool,
    finished: bool,
}

/// Runs `parser` over `sse`. Events after the end marker are ignored.
pub fn parse<P: SseParser>(sse: SseStream, parser: P) -> EventStream {
    let state = Parsing { sse, parser, pending: VecDeque::new(), done: false, finished: false };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.pending.pop_front() {
                return Some((Ok(event), s));
            }
            if s.finished {
                return None;
            }
            if s.done {
                // Read the rest of the body (the chunked terminator) briefly, then stop either way.
                while let Ok(Some(Ok(_))) = tokio::time::timeout(DRAIN_AFTER_DONE, s.sse.next()).await {}
                s.finished = true;
                continue;
            }
            let step = match s.sse.next().await {
                Some(Ok(event)) => s.parser.on_event(&event),
                Some(Err(error)) => Err(error),
                None => {
                    s.finished = true;
                    s.parser.on_eof()
                }
            };
            match step {
                Ok(events) => {
                    s.done = events.iter().any(|e| matches!(e, Event::Done));
                    s.pending.extend(events);
                }
                Err(error) => {
                    s.finished = true;
                    return Some((Err(error), s));
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_found_in_every_usual_place() {
        assert_eq!(error_message(r#"{"error":{"message":"bad key","type":"x"}}"#), "bad key");
        assert_eq!(error_message(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#), "Overloaded");
        assert_eq!(error_message(r#"{"detail":"nope"}"#), "nope");
        assert_eq!(error_message("plain text"), "plain text");
        assert_eq!(error_message(""), "no error message");
    }
}
