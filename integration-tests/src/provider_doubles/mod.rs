//! Upstream doubles of the native model providers that are not OpenAI's (that one is
//! [`crate::llm_double`]): [`gemini`] speaks Google's `streamGenerateContent?alt=sse` and [`azure`]
//! Azure OpenAI's deployment API, each in its real wire format — paths, query, credential header,
//! event shapes, usage, and error bodies — and checks what a real one checks before answering (the key,
//! the deployment, the api-version). Each answers requests in order from a script of [`Reply`]s and
//! records what it was sent.

pub mod azure;
pub mod gemini;

use std::sync::{Arc, Mutex};

use anyhow::Result;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub use crate::llm_double::{Call, call};

/// One scripted answer.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    /// Thinking streamed first (Gemini: thought-summary parts).
    pub thought: String,
    /// Answer text, streamed in small pieces.
    pub text: String,
    /// Tool calls after the text.
    pub calls: Vec<Call>,
    /// Gemini: the `thoughtSignature` of the first call (or of the last text part without calls).
    pub signature: Option<String>,
    /// The provider's own finish word (Gemini `SAFETY`, Azure `content_filter`); default: a normal stop.
    pub finish: Option<&'static str>,
    /// Answer this HTTP status with the provider's error body instead (`message` inside it).
    pub error: Option<(u16, String)>,
    /// Close the connection after this many events, with no finish (a dropped stream).
    pub break_after: Option<usize>,
}

impl Reply {
    pub fn text(text: &str) -> Self {
        Self { text: text.to_owned(), ..Self::default() }
    }

    pub fn tools(text: &str, calls: Vec<Call>) -> Self {
        Self { text: text.to_owned(), calls, ..Self::default() }
    }

    pub fn error(status: u16, message: &str) -> Self {
        Self { error: Some((status, message.to_owned())), ..Self::default() }
    }

    pub fn thinking(mut self, thought: &str) -> Self {
        self.thought = thought.to_owned();
        self
    }

    pub fn signed(mut self, signature: &str) -> Self {
        self.signature = Some(signature.to_owned());
        self
    }

    pub fn finish(mut self, reason: &'static str) -> Self {
        self.finish = Some(reason);
        self
    }

    pub fn broken_after(mut self, events: usize) -> Self {
        self.break_after = Some(events);
        self
    }
}

/// Prompt and output tokens every streamed reply reports (Gemini adds [`THOUGHT_TOKENS`] when it thinks).
pub const PROMPT_TOKENS: u64 = 40;
pub const OUTPUT_TOKENS: u64 = 12;
pub const THOUGHT_TOKENS: u64 = 25;
pub const CACHED_TOKENS: u64 = 8;

/// One request as the double received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Request target: path and query.
    pub target: String,
    /// Header lines, names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// What a protocol does with one request: check it as the real service would, then answer.
pub(crate) enum Answer {
    /// Status, JSON body and extra headers, in full.
    Plain { status: u16, body: String, headers: Vec<(&'static str, String)> },
    /// `data:` payloads (an SSE stream), cut after `cut` events when set.
    Stream { events: Vec<String>, cut: Option<usize> },
}

/// Answers `seen` with `reply` (None: the script is used up); true when the reply was used (a request
/// the checks refuse uses none).
pub(crate) type Respond = fn(&Seen, Option<&Reply>, &Config) -> (Answer, bool);

/// What the real service would check.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub key: String,
    /// Azure: the deployment the resource has.
    pub deployment: String,
}

#[derive(Debug, Default)]
struct Shared {
    seen: Vec<Seen>,
    /// Requests that used a script entry (checks that failed do not).
    answered: usize,
}

/// A running double; stops when dropped.
#[derive(Debug)]
pub struct Double {
    pub addr: std::net::SocketAddr,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Double {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Double {
    pub(crate) async fn start(replies: Vec<Reply>, config: Config, respond: Respond) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Mutex::new(Shared::default()));
        let state = shared.clone();
        let replies = Arc::new(replies);
        let config = Arc::new(config);
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (state, replies, config) = (state.clone(), replies.clone(), config.clone());
                tokio::spawn(async move {
                    if let Err(error) = serve(socket, &state, &replies, &config, respond).await {
                        eprintln!("provider double: connection failed: {error}");
                    }
                });
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.lock().map(|s| s.seen.clone()).unwrap_or_default()
    }
}

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

fn parse_head(head: &str, body: &[u8]) -> Seen {
    let mut lines = head.lines();
    let target = lines.next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or_default().to_owned();
    let headers =
        lines.filter_map(|l| l.split_once(':')).map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned())).collect();
    Seen { target, headers, body: serde_json::from_slice(body).unwrap_or(Value::Null) }
}

async fn serve(mut socket: TcpStream, state: &Mutex<Shared>, replies: &[Reply], config: &Config, respond: Respond) -> Result<()> {
    let Some((head, body)) = read_request(&mut socket).await? else { return Ok(()) };
    let seen = parse_head(&head, &body);
    let index = state.lock().map(|s| s.answered).unwrap_or_default();
    let (answer, used) = respond(&seen, replies.get(index), config);
    if let Ok(mut shared) = state.lock() {
        shared.seen.push(seen);
        if used {
            shared.answered += 1;
        }
    }
    match answer {
        Answer::Plain { status, body, headers } => {
            let extra: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
            let response = format!(
                "HTTP/1.1 {status} Status\r\ncontent-type: application/json; charset=UTF-8\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(response.as_bytes()).await?;
        }
        Answer::Stream { events, cut } => {
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n")
                .await?;
            for (i, event) in events.iter().enumerate() {
                if cut == Some(i) {
                    // Abruptly: no finish, no terminator.
                    return Ok(());
                }
                if socket.write_all(format!("data: {event}\r\n\r\n").as_bytes()).await.is_err() {
                    return Ok(());
                }
                let _ = socket.flush().await;
            }
        }
    }
    socket.shutdown().await?;
    Ok(())
}

/// Text in 6-character pieces, as a model streams it.
pub(crate) fn pieces(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(6).map(|c| c.iter().collect()).collect()
}
