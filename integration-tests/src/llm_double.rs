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
        Self::serve_routes(vec![route("", turns)], after_last, select).await
    }

    /// Starts the double with one script per conversation: a request follows the first route whose
    /// marker its first user message contains, at the turn given by its number of assistant
    /// messages. So a lead agent and the subagents it starts (whose first user message is their
    /// task) each follow their own script, in any interleaving. A request no route matches is
    /// refused (HTTP 400).
    pub async fn start_routed(routes: Vec<Route>, after_last: AfterLast) -> Result<Self> {
        Self::serve_routes(routes, after_last, Select::ByHistory).await
    }

    async fn serve_routes(routes: Vec<Route>, after_last: AfterLast, select: Select) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let routes = Arc::new(routes);
        let state = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (routes, state) = (routes.clone(), state.clone());
                tokio::spawn(async move {
                    if let Err(error) = serve(socket, &routes, after_last, select, &state).await {
                        eprintln!("llm double: connection failed: {error}");
                    }
                });
            }
        });
        Ok(Self { addr, shared, task })
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

/// The content of a request's first user message, as JSON text (string or parts).
fn first_user_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .and_then(|messages| messages.iter().find(|m| m["role"] == "user"))
        .map(|m| m["content"].to_string())
        .unwrap_or_default()
}

async fn serve(mut socket: TcpStream, routes: &[Route], after_last: AfterLast, select: Select, state: &Mutex<Shared>) -> Result<()> {
    let Some((head, body)) = read_request(&mut socket).await? else { return Ok(()) };
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let answered = request["messages"].as_array().map(|m| m.iter().filter(|m| m["role"] == "assistant").count()).unwrap_or(0);
    let first_user = first_user_text(&request);
    let turns: &[Turn] = routes.iter().find(|r| first_user.contains(&r.marker)).map(|r| r.turns.as_slice()).unwrap_or(&[]);
    let index = {
        let mut shared = state.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        shared.requests.push(request);
        match select {
            Select::InOrder => shared.requests.len() - 1,
            Select::ByHistory => answered,
        }
    };
    let turn = match turns.get(index) {
        Some(turn) => turn.clone(),
        None if after_last == AfterLast::Repeat && !turns.is_empty() => {
            let mut turn = turns[turns.len() - 1].clone();
            for call in &mut turn.calls {
                call.id = format!("{}-r{index}", call.id);
            }
            turn
        }
        None => {
            let body = r#"{"error":{"message":"the double's script is used up","type":"invalid_request_error"}}"#;
            let response = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(response.as_bytes()).await?;
            return Ok(());
        }
    };
    if let Some(status) = turn.refuse {
        // One body both providers parse: Anthropic's envelope with OpenAI's wording.
        let body = json!({"type": "error", "error": {"type": "authentication_error", "code": "invalid_api_key",
            "message": format!("Incorrect API key provided: {}. You can find your API key in your account settings.", presented_key(&head))}})
        .to_string();
        let response = format!(
            "HTTP/1.1 {status} Refused\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(response.as_bytes()).await?;
        return Ok(());
    }
    socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n").await?;
    for event in events(&turn, index) {
        if turn.chunk_delay_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(turn.chunk_delay_ms)).await;
        }
        let written = socket.write_all(format!("data: {event}\n\n").as_bytes()).await;
        if written.is_err() || socket.flush().await.is_err() {
            if let Ok(mut shared) = state.lock() {
                shared.aborted += 1;
            }
            return Ok(());
        }
    }
    socket.write_all(b"data: [DONE]\n\n").await?;
    socket.shutdown().await?;
    Ok(())
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
