//! A model upstream double: a small HTTP server on 127.0.0.1:0 that speaks the OpenAI Chat
//! Completions streaming format (SSE `data: {…}` chunks, `delta.content`, `delta.tool_calls` pieces
//! keyed by `index`, a finish chunk, a usage-only chunk, `data: [DONE]`) and answers each request with
//! the next scripted turn. It is the only double the agent tests use: the models, runs and sandbox
//! services under test are the real ones.

use std::sync::{Arc, Mutex};

use anyhow::Result;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One tool call in a scripted turn.
#[derive(Debug, Clone)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// One scripted assistant turn.
#[derive(Debug, Clone, Default)]
pub struct Turn {
    pub text: String,
    pub calls: Vec<Call>,
    /// Pause before each chunk (a slow model).
    pub chunk_delay_ms: u64,
    /// Answer this HTTP status instead, with an error body that quotes the credentials the request
    /// presented (`Authorization: Bearer …` or `x-api-key`), as OpenAI does for a wrong key.
    pub refuse: Option<u16>,
    /// The finish reason sent (default: `tool_calls` with calls, else `stop`), e.g. `content_filter`.
    pub finish: Option<&'static str>,
}

impl Turn {
    /// A final answer.
    pub fn text(text: &str) -> Self {
        Self { text: text.to_owned(), ..Self::default() }
    }

    /// An HTTP `status` refusal that echoes the presented key (see [`Turn::refuse`]).
    pub fn refuse_echoing_key(status: u16) -> Self {
        Self { refuse: Some(status), ..Self::default() }
    }

    /// The same turn, streamed with `ms` before each chunk.
    pub fn slow(mut self, ms: u64) -> Self {
        self.chunk_delay_ms = ms;
        self
    }

    /// A turn that calls tools (optionally with some text first).
    pub fn tools(text: &str, calls: Vec<Call>) -> Self {
        Self { text: text.to_owned(), calls, ..Self::default() }
    }

    /// The same turn, finished with `reason` (e.g. `content_filter`, a provider's safety stop).
    pub fn finish(mut self, reason: &'static str) -> Self {
        self.finish = Some(reason);
        self
    }
}

/// One conversation's script in a routed double (see [`LlmDouble::start_routed`]): the requests
/// whose first user message contains `marker` follow `turns`, by the number of assistant messages.
#[derive(Debug, Clone)]
pub struct Route {
    pub marker: String,
    pub turns: Vec<Turn>,
}

/// A [`Route`] for conversations whose first user message contains `marker`.
pub fn route(marker: &str, turns: Vec<Turn>) -> Route {
    Route { marker: marker.to_owned(), turns }
}

/// A tool call `id` of `name` with `arguments`.
pub fn call(id: &str, name: &str, arguments: Value) -> Call {
    Call { id: id.to_owned(), name: name.to_owned(), arguments }
}

/// What the double does once the script is used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterLast {
    /// Answers every further request with the last turn again (with fresh tool call ids).
    Repeat,
    /// Answers HTTP 400.
    Refuse,
}

/// Which scripted turn answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    /// The n-th request gets the n-th turn (one conversation at a time).
    InOrder,
    /// A request with n assistant messages gets the n-th turn, so many conversations can follow the
    /// same script at once.
    ByHistory,
}

/// Tokens reported per turn in the usage-only chunk.
pub const PROMPT_TOKENS: u64 = 100;
pub const COMPLETION_TOKENS: u64 = 20;

#[derive(Debug, Default)]
struct Shared {
    requests: Vec<Value>,
    /// Streams the client closed before `[DONE]`.
    aborted: usize,
    /// TCP connections accepted.
    connections: usize,
}

/// The running double; stops when dropped.
#[derive(Debug)]
pub struct LlmDouble {
    pub addr: std::net::SocketAddr,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LlmDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LlmDouble {
    /// Starts the double with `turns`, answered in order.
    pub async fn start(turns: Vec<Turn>, after_last: AfterLast) -> Result<Self> {
        Self::start_with(turns, after_last, Select::InOrder).await
    }

    /// Starts the double with `turns`, chosen by `select`.
    pub async fn start_with(turns: Vec<Turn>, after_last: AfterLast, select: Select) -> Result<Self> {
        Self::listen(vec![route("", turns)], after_last, select, Protocol::Http1).await
    }

    /// Starts the double with one script per conversation: a request follows the first route whose
    /// marker its first user message contains, at the turn given by its number of assistant
    /// messages. So a lead agent and the subagents it starts (whose first user message is their
    /// task) each follow their own script, in any interleaving. A request no route matches is
    /// refused (HTTP 400).
    pub async fn start_routed(routes: Vec<Route>, after_last: AfterLast) -> Result<Self> {
        Self::listen(routes, after_last, Select::ByHistory, Protocol::Http1).await
    }

    /// Starts the double speaking HTTP/2 without TLS (h2c, the client must know it beforehand): every
    /// request of a client is a stream on one connection, as with a production upstream that negotiates
    /// HTTP/2 over TLS. It accepts up to `max_streams` streams at once per connection.
    pub async fn start_h2(turns: Vec<Turn>, after_last: AfterLast, select: Select, max_streams: u32) -> Result<Self> {
        Self::listen(vec![route("", turns)], after_last, select, Protocol::Http2 { max_streams }).await
    }

    async fn listen(routes: Vec<Route>, after_last: AfterLast, select: Select, protocol: Protocol) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let script = Arc::new(Script { routes, after_last, select, state: shared.clone() });
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                if let Ok(mut shared) = script.state.lock() {
                    shared.connections += 1;
                }
                let script = script.clone();
                tokio::spawn(async move {
                    let served = match protocol {
                        Protocol::Http1 => serve(socket, &script).await,
                        Protocol::Http2 { max_streams } => h2::serve(socket, script, max_streams).await,
                    };
                    if let Err(error) = served {
                        eprintln!("llm double: connection failed: {error}");
                    }
                });
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// TCP connections accepted so far (HTTP/1.1: one per request; HTTP/2: one per client).
    pub fn connections(&self) -> usize {
        self.shared.lock().map(|s| s.connections).unwrap_or_default()
    }

    /// `http://addr/v1`, the `base_url` of a model entry.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The request bodies received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.shared.lock().map(|s| s.requests.clone()).unwrap_or_default()
    }

    /// The requests of one conversation: those whose first user message contains `marker`.
    pub fn requests_of(&self, marker: &str) -> Vec<Value> {
        self.requests().into_iter().filter(|r| first_user_text(r).contains(marker)).collect()
    }

    /// How many streams the client abandoned before the end (the connection closed under a write).
    pub fn aborted(&self) -> usize {
        self.shared.lock().map(|s| s.aborted).unwrap_or_default()
    }

    /// A `models:` section (list form) with one model `double` pointing here.
    pub fn models_yaml(&self) -> String {
        format!(
            "models:\n  - name: double\n    provider: openai\n    model: double-1\n    base_url: {}\n    api_key: sk-double\n    max_retries: 0\n",
            self.base_url()
        )
    }

    /// [`LlmDouble::models_yaml`] for a double started with [`LlmDouble::start_h2`]: the models service
    /// speaks HTTP/2 to it from the first byte.
    pub fn models_yaml_h2(&self) -> String {
        format!("{}    http2_prior_knowledge: true\n", self.models_yaml())
    }
}

/// Reads one HTTP request: its head and its Content-Length body.
async fn read_request(socket: &mut TcpStream) -> Result<Option<(String, Vec<u8>)>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).into_owned();
    let length: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0);
    while buffer.len() < header_end + length {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    Ok(Some((head, buffer[header_end..].to_vec())))
}

/// The credential a request presented, as the upstream saw it.
fn presented_key(head: &str) -> String {
    head.lines()
        .find_map(|line| {
            let lower = line.to_ascii_lowercase();
            ["authorization: bearer ", "x-api-key: "].iter().find(|p| lower.starts_with(*p)).map(|p| line[p.len()..].trim().to_owned())
        })
        .unwrap_or_default()
}

#[derive(Debug, Clone, Copy)]
enum Protocol {
    Http1,
    Http2 { max_streams: u32 },
}

/// What the double answers with, and what it has seen.
#[derive(Debug)]
struct Script {
    routes: Vec<Route>,
    after_last: AfterLast,
    select: Select,
    state: Arc<Mutex<Shared>>,
}

/// The answer to one request, whatever the protocol.
#[derive(Debug)]
enum Answer {
    /// An error status with a JSON body.
    Refuse { status: u16, body: String },
    /// `data:` payloads, each after `delay_ms`, then `[DONE]`.
    Stream { events: Vec<String>, delay_ms: u64 },
}

impl Script {
    /// Records the request (its JSON body and the key it presented) and picks the answer.
    fn answer(&self, body: &[u8], key: &str) -> Result<Answer> {
        let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let answered = request["messages"].as_array().map(|m| m.iter().filter(|m| m["role"] == "assistant").count()).unwrap_or(0);
        let first_user = first_user_text(&request);
        let turns: &[Turn] = self.routes.iter().find(|r| first_user.contains(&r.marker)).map(|r| r.turns.as_slice()).unwrap_or(&[]);
        let index = {
            let mut shared = self.state.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            shared.requests.push(request);
            match self.select {
                Select::InOrder => shared.requests.len() - 1,
                Select::ByHistory => answered,
            }
        };
        let turn = match turns.get(index) {
            Some(turn) => turn.clone(),
            None if self.after_last == AfterLast::Repeat && !turns.is_empty() => {
                let mut turn = turns[turns.len() - 1].clone();
                for call in &mut turn.calls {
                    call.id = format!("{}-r{index}", call.id);
                }
                turn
            }
            None => {
                let body = r#"{"error":{"message":"the double's script is used up","type":"invalid_request_error"}}"#;
                return Ok(Answer::Refuse { status: 400, body: body.to_owned() });
            }
        };
        if let Some(status) = turn.refuse {
            // One body both providers parse: Anthropic's envelope with OpenAI's wording.
            let body = json!({"type": "error", "error": {"type": "authentication_error", "code": "invalid_api_key",
                "message": format!("Incorrect API key provided: {key}. You can find your API key in your account settings.")}})
            .to_string();
            return Ok(Answer::Refuse { status, body });
        }
        Ok(Answer::Stream { events: events(&turn, index), delay_ms: turn.chunk_delay_ms })
    }

    fn aborted(&self) {
        if let Ok(mut shared) = self.state.lock() {
            shared.aborted += 1;
        }
    }
}

/// The content of a request's first user message, as JSON text (string or parts).
fn first_user_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .and_then(|messages| messages.iter().find(|m| m["role"] == "user"))
        .map(|m| m["content"].to_string())
        .unwrap_or_default()
}

async fn serve(mut socket: TcpStream, script: &Script) -> Result<()> {
    let Some((head, body)) = read_request(&mut socket).await? else { return Ok(()) };
    let (events, delay_ms) = match script.answer(&body, &presented_key(&head))? {
        Answer::Refuse { status, body } => {
            let reason = if status == 400 { "Bad Request" } else { "Refused" };
            let response = format!(
                "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(response.as_bytes()).await?;
            return Ok(());
        }
        Answer::Stream { events, delay_ms } => (events, delay_ms),
    };
    socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n").await?;
    for event in events {
        if delay_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        }
        let written = socket.write_all(format!("data: {event}\n\n").as_bytes()).await;
        if written.is_err() || socket.flush().await.is_err() {
            script.aborted();
            return Ok(());
        }
    }
    socket.write_all(b"data: [DONE]\n\n").await?;
    socket.shutdown().await?;
    Ok(())
}

/// The HTTP/2 side, on hyper's server (the HTTP/1.1 side above is hand-written so that tests control
/// every byte of it; HTTP/2 framing is not worth writing by hand).
mod h2 {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::time::Duration;

    use anyhow::Result;
    use bytes::Bytes;
    use futures::StreamExt;
    use http_body_util::combinators::UnsyncBoxBody;
    use http_body_util::{BodyExt, Full, StreamBody};
    use hyper::body::{Frame, Incoming};
    use hyper::{Request, Response};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::net::TcpStream;

    use super::{Answer, Script};

    type Body = UnsyncBoxBody<Bytes, Infallible>;

    /// Counts the stream as aborted if it is dropped before its last event (the client reset it).
    struct Abandoned {
        script: Arc<Script>,
        finished: bool,
    }

    impl Drop for Abandoned {
        fn drop(&mut self) {
            if !self.finished {
                self.script.aborted();
            }
        }
    }

    pub(super) async fn serve(socket: TcpStream, script: Arc<Script>, max_streams: u32) -> Result<()> {
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let script = script.clone();
            async move { respond(request, script).await }
        });
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .max_concurrent_streams(max_streams)
            .serve_connection(TokioIo::new(socket), service)
            .await?;
        Ok(())
    }

    async fn respond(request: Request<Incoming>, script: Arc<Script>) -> Result<Response<Body>> {
        let headers = request.headers();
        let key = match (headers.get("authorization"), headers.get("x-api-key")) {
            (Some(v), _) => v.to_str().unwrap_or_default().trim_start_matches("Bearer ").to_owned(),
            (None, Some(v)) => v.to_str().unwrap_or_default().to_owned(),
            (None, None) => String::new(),
        };
        let body = request.into_body().collect().await?.to_bytes();
        match script.answer(&body, &key)? {
            Answer::Refuse { status, body } => Ok(Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)).boxed_unsync())?),
            Answer::Stream { events, delay_ms } => {
                let guard = Abandoned { script, finished: false };
                let frames = futures::stream::unfold((events.into_iter(), Some(guard)), move |(mut events, mut guard)| async move {
                    let next = match events.next() {
                        Some(event) => format!("data: {event}\n\n"),
                        None => {
                            let mut guard = guard.take()?;
                            guard.finished = true;
                            "data: [DONE]\n\n".to_owned()
                        }
                    };
                    if delay_ms > 0 && guard.is_some() {
                        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    }
                    Some((Ok::<_, Infallible>(Frame::data(Bytes::from(next))), (events, guard)))
                });
                Ok(Response::builder()
                    .status(200)
                    .header("content-type", "text/event-stream")
                    .header("cache-control", "no-cache")
                    .body(StreamBody::new(frames.boxed()).boxed_unsync())?)
            }
        }
    }
}

fn chunk(index: usize, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": format!("chatcmpl-{index}"),
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "double-1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

/// The SSE `data` payloads of one turn.
fn events(turn: &Turn, index: usize) -> Vec<String> {
    let mut out = vec![chunk(index, json!({"role": "assistant", "content": ""}), None)];
    // Text in small pieces, as a real model streams it.
    let chars: Vec<char> = turn.text.chars().collect();
    for piece in chars.chunks(8) {
        out.push(chunk(index, json!({"content": piece.iter().collect::<String>()}), None));
    }
    for (i, call) in turn.calls.iter().enumerate() {
        out.push(chunk(
            index,
            json!({"tool_calls": [{"index": i, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}]}),
            None,
        ));
        let arguments = call.arguments.to_string();
        let chars: Vec<char> = arguments.chars().collect();
        for piece in chars.chunks(10) {
            out.push(chunk(
                index,
                json!({"tool_calls": [{"index": i, "function": {"arguments": piece.iter().collect::<String>()}}]}),
                None,
            ));
        }
    }
    let finish = turn.finish.unwrap_or(if turn.calls.is_empty() { "stop" } else { "tool_calls" });
    out.push(chunk(index, json!({}), Some(finish)));
    out.push(json!({
        "id": format!("chatcmpl-{index}"),
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "double-1",
        "choices": [],
        "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS, "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS},
    }));
    out.into_iter().map(|v| v.to_string()).collect()
}
