//! Web doubles for the lead agent's web tools: search and reader APIs that cannot run here (Tavily,
//! Brave, Serper, Exa, Firecrawl, Jina Reader, and SearXNG, which could but needs Python and a
//! network) served on 127.0.0.1:0 in their real wire formats — request shape and auth header checked
//! as the real API checks them, JSON answers and error bodies as the real API sends them — plus a
//! page server for `web_fetch` and a listener that only counts connections (for the SSRF corpus).
//!
//! Queries that steer a search double: `__429__` (rate limited), `__500__` (an outage), `__slow__`
//! (no answer for 10 s). Every request is recorded for assertions.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Which API a [`SearchDouble`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Searxng,
    Tavily,
    Brave,
    Serper,
    Exa,
    Firecrawl,
    Jina,
}

/// One result the double returns (for every query).
#[derive(Debug, Clone)]
pub struct Hit {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

pub fn hit(title: &str, url: &str, snippet: &str) -> Hit {
    Hit { title: title.to_owned(), url: url.to_owned(), snippet: snippet.to_owned() }
}

/// One request as the double received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// Lowercase header names.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    /// A query parameter, decoded.
    pub fn param(&self, name: &str) -> Option<String> {
        let query = self.target.split_once('?')?.1;
        form_pairs(query).into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

fn form_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Wait this long before answering.
    pub delay: Duration,
}

impl Answer {
    pub fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
            delay: Duration::ZERO,
        }
    }

    pub fn bytes(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Self { status, headers: vec![("content-type".into(), content_type.into())], body: body.into(), delay: Duration::ZERO }
    }

    pub fn redirect(status: u16, location: &str) -> Self {
        Self { status, headers: vec![("location".into(), location.into())], body: Vec::new(), delay: Duration::ZERO }
    }
}

type Handler = Arc<dyn Fn(&Recorded) -> Answer + Send + Sync>;

/// A tiny HTTP/1.1 server: one request per connection (`Connection: close`), every request recorded.
struct Server {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(bind: &str, handler: Handler) -> Result<Self> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (handler, seen) = (handler.clone(), seen.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, handler, seen).await;
                });
            }
        });
        Ok(Self { addr, requests, task })
    }
}

async fn serve(mut stream: TcpStream, handler: Handler, seen: Arc<Mutex<Vec<Recorded>>>) -> Result<()> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        anyhow::ensure!(buffer.len() < 1 << 20, "request head too large");
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let method = request_line.next().unwrap_or_default().to_owned();
    let target = request_line.next().unwrap_or_default().to_owned();
    let headers: HashMap<String, String> =
        lines.filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))).collect();
    let length: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let request = Recorded { method, target, headers, body };
    let answer = handler(&request);
    seen.lock().unwrap_or_else(|p| p.into_inner()).push(request);
    if !answer.delay.is_zero() {
        tokio::time::sleep(answer.delay).await;
    }
    let reason = match answer.status {
        200 => "OK",
        301 => "Moved Permanently",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let mut out = format!("HTTP/1.1 {} {reason}\r\ncontent-length: {}\r\nconnection: close\r\n", answer.status, answer.body.len());
    for (k, v) in &answer.headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    stream.write_all(out.as_bytes()).await?;
    stream.write_all(&answer.body).await?;
    stream.shutdown().await?;
    Ok(())
}

/// A search or reader API double.
pub struct SearchDouble {
    server: Server,
}

impl SearchDouble {
    /// Starts a double of `api` that accepts `key` (for Jina, requests without a key are accepted too,
    /// as the real service does at a lower rate limit) and answers every query with `hits`.
    pub async fn start(api: Api, key: &str, hits: Vec<Hit>) -> Result<Self> {
        let key = key.to_owned();
        let handler: Handler = Arc::new(move |request| respond(api, &key, &hits, request));
        Ok(Self { server: Server::start("127.0.0.1:0", handler).await? })
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.server.requests.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn brave_error(status: u16, code: &str, detail: &str) -> Answer {
    Answer::json(
        status,
        json!({"type": "ErrorResponse", "error": {"id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "status": status, "code": code, "detail": detail, "meta": {}}, "time": 1_767_225_600}),
    )
}

/// The error body `api` sends for `status`.
fn api_error(api: Api, status: u16, message: &str) -> Answer {
    match api {
        Api::Searxng => Answer::bytes(status, "text/html", format!("<html><body><h1>{status}</h1>{message}</body></html>")),
        Api::Tavily => Answer::json(status, json!({"detail": {"error": message}})),
        Api::Brave => {
            let code = match status {
                401 => "SUBSCRIPTION_TOKEN_INVALID",
                429 => "RATE_LIMITED",
                422 => "VALIDATION",
                _ => "UNKNOWN",
            };
            brave_error(status, code, message)
        }
        Api::Serper => Answer::json(status, json!({"message": message, "statusCode": status})),
        Api::Exa => Answer::json(status, json!({"requestId": "b7c1d2e3f4a5", "error": message, "tag": "ERROR"})),
        Api::Firecrawl => Answer::json(status, json!({"success": false, "error": message})),
        Api::Jina => Answer::json(
            status,
            json!({"data": null, "code": status, "name": "AssertionFailureError", "status": u32::from(status) * 100 + 3, "message": message, "readableMessage": format!("AssertionFailureError: {message}")}),
        ),
    }
}

/// The API's answer to `request`: auth first (401/403 as the API does), then the request's shape
/// (400/422), then the steering queries, then results.
fn respond(api: Api, key: &str, hits: &[Hit], request: &Recorded) -> Answer {
    let body = request.json();
    let (method, path, auth) = match api {
        Api::Searxng => ("GET", request.path(), None),
        Api::Tavily => ("POST", request.path(), request.header("authorization").map(|a| a == format!("Bearer {key}"))),
        Api::Brave => ("GET", request.path(), Some(request.header("x-subscription-token") == Some(key))),
        Api::Serper => ("POST", request.path(), Some(request.header("x-api-key") == Some(key))),
        Api::Exa => ("POST", request.path(), Some(request.header("x-api-key") == Some(key))),
        Api::Firecrawl => ("POST", request.path(), Some(request.header("authorization") == Some(format!("Bearer {key}").as_str()))),
        Api::Jina => ("POST", request.path(), request.header("authorization").map(|a| a == format!("Bearer {key}"))),
    };
    if request.method != method {
        return api_error(api, 405, &format!("method {} not allowed", request.method));
    }
    match (api, auth) {
        (Api::Tavily, None | Some(false)) => return api_error(api, 401, "Unauthorized: missing or invalid API key."),
        (Api::Serper, Some(false)) => return api_error(api, 403, "Unauthorized."),
        (Api::Brave, Some(false)) => return api_error(api, 401, "The provided subscription token is invalid."),
        (Api::Exa, Some(false)) => return api_error(api, 401, "Invalid API key"),
        (Api::Firecrawl, Some(false)) => return api_error(api, 401, "Unauthorized: Invalid token"),
        (Api::Jina, Some(false)) => return api_error(api, 401, "Invalid API key, please get a new one from https://jina.ai"),
        _ => {}
    }
    // The query and count each API takes, where it takes them.
    let (query, count): (Option<String>, Option<u64>) = match (api, path) {
        (Api::Searxng, "/search") => {
            if request.param("format").as_deref() != Some("json") {
                return api_error(api, 403, "Forbidden");
            }
            (request.param("q"), Some(10))
        }
        (Api::Tavily, "/search") => (body["query"].as_str().map(str::to_owned), body["max_results"].as_u64()),
        (Api::Brave, "/res/v1/web/search" | "/res/v1/images/search") => {
            let count = request.param("count").and_then(|c| c.parse::<u64>().ok());
            let cap = if path.contains("images") { 200 } else { 20 };
            if count.is_some_and(|c| c == 0 || c > cap) {
                return api_error(api, 422, "Unable to validate request parameter(s)");
            }
            (request.param("q"), count)
        }
        (Api::Serper, "/search" | "/images") => (body["q"].as_str().map(str::to_owned), body["num"].as_u64()),
        (Api::Exa, "/search") => {
            if body["contents"]["highlights"]["maxCharacters"].as_u64().is_none() {
                return api_error(api, 400, "contents.highlights.maxCharacters: expected a number");
            }
            (body["query"].as_str().map(str::to_owned), body["numResults"].as_u64())
        }
        (Api::Firecrawl, "/v2/search") => (body["query"].as_str().map(str::to_owned), body["limit"].as_u64()),
        (Api::Firecrawl, "/v2/scrape") | (Api::Jina, "/") => return reader(api, request, &body),
        _ => return api_error(api, 404, &format!("no route {path}")),
    };
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return api_error(api, 400, "query is required");
    };
    let Some(count) = count else {
        return api_error(api, 400, "the result count is required");
    };
    match query.as_str() {
        "__429__" => return api_error(api, 429, "Rate limit exceeded"),
        "__500__" => return api_error(api, 500, "Internal error"),
        "__slow__" => return Answer { delay: Duration::from_secs(10), ..Answer::json(200, json!({})) },
        _ => {}
    }
    let hits: Vec<&Hit> = hits.iter().take(count as usize).collect();
    let images = path.contains("images") || request.param("categories").as_deref() == Some("images");
    Answer::json(200, results(api, &query, &hits, images))
}

fn results(api: Api, query: &str, hits: &[&Hit], images: bool) -> Value {
    let image = |i: usize| format!("https://images.example/{i}.jpg");
    let thumb = |i: usize| format!("https://thumbs.example/{i}.jpg");
    match (api, images) {
        (Api::Searxng, false) => {
            json!({"query": query, "number_of_results": hits.len(), "results": hits.iter().map(|h| json!({"url": h.url, "title": h.title, "content": h.snippet, "engine": "duckduckgo", "score": 1.0, "category": "general"})).collect::<Vec<_>>(), "answers": [], "suggestions": [], "unresponsive_engines": []})
        }
        (Api::Searxng, true) => {
            json!({"query": query, "results": hits.iter().enumerate().map(|(i, h)| json!({"url": h.url, "title": h.title, "content": "", "img_src": image(i), "thumbnail_src": thumb(i), "resolution": "1280 x 720", "img_format": "jpeg", "template": "images.html"})).collect::<Vec<_>>()})
        }
        (Api::Tavily, _) => {
            json!({"query": query, "answer": null, "images": [], "results": hits.iter().map(|h| json!({"title": h.title, "url": h.url, "content": h.snippet, "score": 0.9, "raw_content": null})).collect::<Vec<_>>(), "response_time": 0.42})
        }
        (Api::Brave, false) => {
            json!({"type": "search", "query": {"original": query}, "web": {"type": "search", "results": hits.iter().map(|h| json!({"title": h.title, "url": h.url, "description": h.snippet, "is_source_local": false, "language": "en"})).collect::<Vec<_>>()}})
        }
        (Api::Brave, true) => {
            json!({"type": "images", "query": {"original": query}, "results": hits.iter().enumerate().map(|(i, h)| json!({"type": "image_result", "title": h.title, "url": h.url, "source": "example.org", "thumbnail": {"src": thumb(i), "width": 200, "height": 113}, "properties": {"url": image(i), "placeholder": thumb(i), "width": 1280, "height": 720}})).collect::<Vec<_>>()})
        }
        (Api::Serper, false) => {
            json!({"searchParameters": {"q": query, "type": "search", "engine": "google"}, "organic": hits.iter().enumerate().map(|(i, h)| json!({"title": h.title, "link": h.url, "snippet": h.snippet, "position": i + 1})).collect::<Vec<_>>(), "credits": 1})
        }
        (Api::Serper, true) => {
            json!({"searchParameters": {"q": query, "type": "images"}, "images": hits.iter().enumerate().map(|(i, h)| json!({"title": h.title, "imageUrl": image(i), "imageWidth": 1280, "imageHeight": 720, "thumbnailUrl": thumb(i), "thumbnailWidth": 200, "thumbnailHeight": 113, "source": "Example", "domain": "example.org", "link": h.url, "position": i + 1})).collect::<Vec<_>>()})
        }
        (Api::Exa, _) => {
            json!({"requestId": "4e5f6a7b", "resolvedSearchType": "neural", "results": hits.iter().map(|h| json!({"id": h.url, "title": h.title, "url": h.url, "publishedDate": null, "author": null, "highlights": [h.snippet], "highlightScores": [0.5]})).collect::<Vec<_>>(), "costDollars": {"total": 0.005}})
        }
        (Api::Firecrawl, _) => {
            json!({"success": true, "data": {"web": hits.iter().enumerate().map(|(i, h)| json!({"url": h.url, "title": h.title, "description": h.snippet, "position": i + 1})).collect::<Vec<_>>()}, "creditsUsed": 1})
        }
        (Api::Jina, _) => json!({}),
    }
}

/// A reader's answer: the page it was asked for, as Markdown that names the URL.
fn reader(api: Api, request: &Recorded, body: &Value) -> Answer {
    let Some(url) = body["url"].as_str() else { return api_error(api, 400, "url is required") };
    match api {
        Api::Jina => {
            if request.header("x-return-format") != Some("markdown") || request.header("accept") != Some("application/json") {
                return api_error(api, 422, "expected Accept: application/json and X-Return-Format: markdown");
            }
            Answer::json(
                200,
                json!({"code": 200, "status": 20000, "data": {"title": "Read by Jina", "description": "", "url": url, "content": format!("Jina read {url} for you.\n\n## Section\n\nBody text."), "usage": {"tokens": 12}}}),
            )
        }
        _ => {
            if body["formats"] != json!(["markdown"]) {
                return api_error(api, 400, "formats must include markdown");
            }
            Answer::json(
                200,
                json!({"success": true, "data": {"markdown": format!("Firecrawl scraped {url}.\n\n## Section\n\nBody text."), "metadata": {"title": "Scraped by Firecrawl", "sourceURL": url, "url": url, "statusCode": 200}}}),
            )
        }
    }
}

/// A web server of fixed pages for `web_fetch` (paths to answers; anything else is 404).
pub struct PageServer {
    server: Server,
}

impl PageServer {
    pub async fn start(pages: Vec<(&str, Answer)>) -> Result<Self> {
        Self::start_on("127.0.0.1:0", pages).await
    }

    pub async fn start_on(bind: &str, pages: Vec<(&str, Answer)>) -> Result<Self> {
        let pages: HashMap<String, Answer> = pages.into_iter().map(|(p, a)| (p.to_owned(), a)).collect();
        let handler: Handler =
            Arc::new(move |request| pages.get(request.path()).cloned().unwrap_or_else(|| Answer::bytes(404, "text/plain", "not found")));
        Ok(Self { server: Server::start(bind, handler).await? })
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.server.requests.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A listener that accepts and counts connections and never answers: a fetch that reaches it shows
/// up in [`connections`](Self::connections) whatever the fetcher did next.
pub struct ConnectionCounter {
    pub addr: SocketAddr,
    count: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ConnectionCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ConnectionCounter {
    pub async fn start(bind: &str) -> Result<Self> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                seen.fetch_add(1, Ordering::SeqCst);
                held.push(stream);
            }
        });
        Ok(Self { addr, count, task })
    }

    pub fn connections(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

/// A page of `paragraphs` paragraphs inside `<main>`, with menus and a footer around it: what
/// `web_fetch` should reduce to the paragraphs.
pub fn article_page(title: &str, paragraphs: &[&str]) -> String {
    let mut html = format!(
        "<!doctype html><html><head><meta charset=utf-8><title>{title}</title><style>body {{ font: 14px serif }}</style>\
         <script>window.analytics = 'tracking-code';</script></head><body>\
         <header><nav><ul><li><a href=\"/\">Home menu</a></li><li><a href=\"/about\">About menu</a></li></ul></nav></header>\
         <main><article><h1>{title}</h1>"
    );
    for paragraph in paragraphs {
        html.push_str(&format!("<p>{paragraph}</p>"));
    }
    html.push_str("</article></main><footer>Footer links and cookie settings</footer></body></html>");
    html
}

/// A one-page PDF whose text is `lines` (Helvetica; an uncompressed content stream), as a server
/// would send a paper or a report.
pub fn simple_pdf(lines: &[&str]) -> Vec<u8> {
    let mut text = String::from("BT /F1 12 Tf 72 720 Td 16 TL\n");
    for line in lines {
        let escaped = line.replace('\\', "\\\\").replace('(', "\\(").replace(')', "\\)");
        text.push_str(&format!("({escaped}) Tj T*\n"));
    }
    text.push_str("ET");
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_owned(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_owned(),
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>".to_owned(),
        format!("<< /Length {} >>\nstream\n{text}\nendstream", text.len()),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>".to_owned(),
    ];
    let mut pdf = String::from("%PDF-1.4\n");
    let mut offsets = Vec::new();
    for (number, body) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.push_str(&format!("{} 0 obj\n{body}\nendobj\n", number + 1));
    }
    let xref = pdf.len();
    pdf.push_str(&format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1));
    for offset in offsets {
        pdf.push_str(&format!("{offset:010} 00000 n \n"));
    }
    pdf.push_str(&format!("trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1));
    pdf.into_bytes()
}

/// A 1×1 PNG.
pub const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d, 0x49, 0x48, 0x44, 0x52, 0, 0, 0, 1, 0, 0, 0, 1, 8, 6, 0, 0, 0, 0x1f,
    0x15, 0xc4, 0x89, 0, 0, 0, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0, 0x1f, 0, 0x05, 0x00, 0x01, 0xff,
    0x89, 0x99, 0x3d, 0x1d, 0, 0, 0, 0, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];
