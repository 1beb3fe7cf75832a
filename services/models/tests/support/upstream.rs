//! The LLM upstream double: a small HTTP/1.1 server on loopback that answers each request with a scripted
//! reply — a JSON error with any status and headers, or a server-sent-event stream written as chunked
//! transfer-encoding, byte for byte from a recorded-style fixture, with optional pauses and a cut
//! connection. It records every request (path, headers, JSON body) and notices when a client hangs up
//! before the reply is complete. It is the only test double in the project.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// How a reply's body is written.
#[derive(Debug, Clone)]
pub enum Body {
    /// `Content-Length` body (error answers, JSON).
    Plain { content_type: String, text: String },
    /// `Transfer-Encoding: chunked` SSE body: each piece is one HTTP chunk, written after its pause.
    Stream { pieces: Vec<(Duration, String)>, cut: bool },
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body,
    /// Pause before the status line is written.
    pub delay: Duration,
}

impl Reply {
    /// A 200 SSE stream from fixture text, one HTTP chunk per event (split at blank lines).
    pub fn sse(text: &str) -> Self {
        let pieces = split_events(text).into_iter().map(|e| (Duration::ZERO, e)).collect();
        Self {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: Body::Stream { pieces, cut: false },
            delay: Duration::ZERO,
        }
    }

    /// A 200 SSE stream cut into `n`-byte chunks regardless of event boundaries.
    pub fn sse_bytes(text: &str, n: usize) -> Self {
        let bytes = text.as_bytes();
        let pieces = bytes.chunks(n.max(1)).map(|c| (Duration::ZERO, String::from_utf8_lossy(c).into_owned())).collect();
        Self { body: Body::Stream { pieces, cut: false }, ..Self::sse("") }
    }

    /// An error answer with a JSON body.
    pub fn error(status: u16, json: &str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Body::Plain { content_type: "application/json".into(), text: json.to_owned() },
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Pause before every event after the first one.
    pub fn pace(mut self, gap: Duration) -> Self {
        if let Body::Stream { pieces, .. } = &mut self.body {
            for (i, (delay, _)) in pieces.iter_mut().enumerate() {
                if i > 0 {
                    *delay = gap;
                }
            }
        }
        self
    }

    /// Pause before event `index`.
    pub fn pause_before(mut self, index: usize, gap: Duration) -> Self {
        if let Body::Stream { pieces, .. } = &mut self.body
            && let Some(piece) = pieces.get_mut(index)
        {
            piece.0 = gap;
        }
        self
    }

    /// Keep only the first `n` events, then drop the connection without ending the body.
    pub fn cut_after(mut self, n: usize) -> Self {
        if let Body::Stream { pieces, cut } = &mut self.body {
            pieces.truncate(n);
            *cut = true;
        }
        self
    }

    /// Replace event `index` with raw text.
    pub fn replace_event(mut self, index: usize, raw: &str) -> Self {
        if let Body::Stream { pieces, .. } = &mut self.body
            && let Some(piece) = pieces.get_mut(index)
        {
            piece.1 = raw.to_owned();
        }
        self
    }

    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

/// Splits SSE text into events, each keeping its terminating blank line.
pub fn split_events(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(end) = rest.find("\n\n") {
        out.push(rest[..end + 2].to_owned());
        rest = &rest[end + 2..];
    }
    if !rest.is_empty() {
        out.push(rest.to_owned());
    }
    out
}

/// A request as the double saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: serde_json::Value,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Reply>,
    always: Option<Reply>,
    seen: Vec<Seen>,
    /// Keep requests (tests); a benchmark turns it off so the double's memory stays flat.
    forget: bool,
    disconnects: usize,
    completed: usize,
}

/// A running double.
#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl Upstream {
    /// Starts a double on 127.0.0.1 with an ephemeral port; it runs until the test's runtime ends.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let upstream = Self { addr, state: Arc::default(), changed: Arc::default() };
        let server = upstream.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let _ = socket.set_nodelay(true);
                tokio::spawn(server.clone().connection(socket));
            }
        });
        Ok(upstream)
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a reply for the next request.
    pub fn push(&self, reply: Reply) -> &Self {
        self.lock().queue.push_back(reply);
        self
    }

    /// Answers every request with `reply` once the queue is empty.
    pub fn always(&self, reply: Reply) {
        self.lock().always = Some(reply);
    }

    /// Stop recording requests (for long runs).
    pub fn forget_requests(&self) {
        self.lock().forget = true;
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// Replies a client hung up on before they were complete.
    pub fn disconnects(&self) -> usize {
        self.lock().disconnects
    }

    /// Waits until `check` holds, at most `limit`.
    pub async fn wait_for(&self, limit: Duration, check: impl Fn(&Upstream) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            if check(self) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return check(self);
            }
        }
    }

    async fn connection(self, socket: TcpStream) {
        let (mut reader, mut writer) = socket.into_split();
        let mut buffer = Vec::new();
        loop {
            let Some(request) = read_request(&mut reader, &mut buffer).await else { return };
            let reply = {
                let mut state = self.lock();
                if !state.forget {
                    state.seen.push(request);
                }
                state.queue.pop_front().or_else(|| state.always.clone())
            };
            self.changed.notify_waiters();
            let reply = reply.unwrap_or_else(|| Reply::error(500, r#"{"error":{"message":"the test double has no scripted reply"}}"#));
            // While the reply is written, a read that returns means the client hung up.
            let outcome = tokio::select! {
                written = write_reply(&mut writer, &reply) => written,
                () = hang_up(&mut reader) => Outcome::ClientGone,
            };
            {
                let mut state = self.lock();
                match outcome {
                    Outcome::ClientGone => state.disconnects += 1,
                    Outcome::Complete => state.completed += 1,
                    Outcome::Cut => {}
                }
            }
            self.changed.notify_waiters();
            if !matches!(outcome, Outcome::Complete) {
                return;
            }
        }
    }
}

enum Outcome {
    Complete,
    Cut,
    ClientGone,
}

async fn hang_up(reader: &mut tokio::net::tcp::OwnedReadHalf) {
    let mut byte = [0u8; 1];
    // A pipelined next request would also wake this; reqwest does not pipeline.
    let _ = reader.read(&mut byte).await;
}

async fn read_request(reader: &mut tokio::net::tcp::OwnedReadHalf, buffer: &mut Vec<u8>) -> Option<Seen> {
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        if let Some(pos) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        let n = reader.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned())).collect();
    let length: usize = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let body_start = header_end + 4;
    while buffer.len() < body_start + length {
        let n = reader.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buffer[body_start..body_start + length]).unwrap_or(serde_json::Value::Null);
    buffer.drain(..body_start + length);
    Some(Seen { method, path, headers, body })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Site Overloaded",
        _ => "Status",
    }
}

async fn write_reply(writer: &mut tokio::net::tcp::OwnedWriteHalf, reply: &Reply) -> Outcome {
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut head = format!("HTTP/1.1 {} {}\r\n", reply.status, reason(reply.status));
    for (name, value) in &reply.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    match &reply.body {
        Body::Plain { content_type, text } => {
            head.push_str(&format!("content-type: {content_type}\r\ncontent-length: {}\r\n\r\n{text}", text.len()));
            if writer.write_all(head.as_bytes()).await.is_err() {
                return Outcome::ClientGone;
            }
            Outcome::Complete
        }
        Body::Stream { pieces, cut } => {
            head.push_str("cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n");
            if writer.write_all(head.as_bytes()).await.is_err() {
                return Outcome::ClientGone;
            }
            for (delay, piece) in pieces {
                if !delay.is_zero() {
                    tokio::time::sleep(*delay).await;
                }
                if piece.is_empty() {
                    continue;
                }
                let chunk = format!("{:x}\r\n{piece}\r\n", piece.len());
                if writer.write_all(chunk.as_bytes()).await.is_err() {
                    return Outcome::ClientGone;
                }
            }
            if *cut {
                let _ = writer.shutdown().await;
                return Outcome::Cut;
            }
            if writer.write_all(b"0\r\n\r\n").await.is_err() {
                return Outcome::ClientGone;
            }
            Outcome::Complete
        }
    }
}
