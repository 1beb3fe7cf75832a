//! The direct fetcher: Antler GETs the page itself. Redirects are followed here, one hop at a time,
//! so that every hop's URL goes through [`Policy::check_url`] and every host name through the
//! [`GuardedResolver`] (an address written in a redirect's Location never reaches a resolver, so the
//! URL check is the only thing that can stop it). No proxy from the environment: a proxy would
//! resolve and connect on our behalf, past both checks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Url;
use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};

use super::config::FetchConfig;
use super::http::chain;
use super::ssrf::{GuardedResolver, Policy, Refusal, find_refusal};

/// What `Accept` says: pages first, then the other types the fetcher reads.
const ACCEPT_VALUE: &str = "text/html,application/xhtml+xml;q=0.9,text/plain;q=0.8,application/json;q=0.8,*/*;q=0.5";

/// The body of a successful fetch.
#[derive(Debug, Clone)]
pub struct Body {
    /// The URL after redirects.
    pub url: Url,
    /// The media type, lowercase, without parameters (sniffed when the server sent none).
    pub media_type: String,
    pub charset: Option<String>,
    pub bytes: Vec<u8>,
    /// True when the body went on past `max_bytes` and was cut there.
    pub truncated: bool,
}

/// Why a fetch gave no body. The text is what the model reads after `Error: `.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("refused {url}: {refusal}")]
    Refused { url: String, refusal: Refusal },
    #[error("`{url}` is not a URL: {detail}")]
    BadUrl { url: String, detail: String },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: String },
    #[error("{url}: more than {max} redirects (runs.lead.web.fetch.max_redirects)")]
    TooManyRedirects { url: String, max: u32 },
    #[error("{url} is {media_type}, which web_fetch does not read (runs.lead.web.fetch.allowed_content_types: {allowed})")]
    ContentType { url: String, media_type: String, allowed: String },
    #[error("{url} is {size} bytes of {media_type}, over the {max}-byte limit (runs.lead.web.fetch.max_bytes)")]
    TooLarge { url: String, media_type: String, size: u64, max: u64 },
    #[error("{url} did not finish within {ms} ms (runs.lead.web.fetch.timeout_ms)")]
    Timeout { url: String, ms: u128 },
    #[error("cannot fetch {url}: {detail}")]
    Connect { url: String, detail: String },
}

impl FetchError {
    /// The rule a refusal broke (for the `rule` metric label), None for other failures.
    pub fn rule(&self) -> Option<&'static str> {
        match self {
            FetchError::Refused { refusal, .. } => Some(refusal.rule.name()),
            _ => None,
        }
    }
}

/// Fetches pages under one `fetch` configuration.
#[derive(Debug, Clone)]
pub struct DirectFetcher {
    client: reqwest::Client,
    policy: Arc<Policy>,
    timeout: Duration,
    max_bytes: u64,
    max_redirects: u32,
    allowed: Vec<String>,
}

/// A media type is readable when it is "text-like" and can be converted, or one of the binary types
/// the tool knows what to do with (images for view_image, PDFs).
pub fn is_binary(media_type: &str) -> bool {
    media_type.starts_with("image/") || media_type == "application/pdf"
}

impl DirectFetcher {
    pub fn new(config: &FetchConfig) -> Result<Self, reqwest::Error> {
        let policy = Arc::new(Policy::new(&config.ports, &config.allow_hosts, &config.allow_cidrs));
        let user_agent = if config.user_agent.is_empty() {
            format!("Antler-web_fetch/{}", env!("CARGO_PKG_VERSION"))
        } else {
            config.user_agent.clone()
        };
        let client = reqwest::Client::builder()
            .user_agent(user_agent)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .referer(false)
            .dns_resolver(Arc::new(GuardedResolver { policy: policy.clone() }))
            .connect_timeout(Duration::from_millis(config.timeout_ms))
            .build()?;
        Ok(Self {
            client,
            policy,
            timeout: Duration::from_millis(config.timeout_ms),
            max_bytes: config.max_bytes,
            max_redirects: config.max_redirects,
            allowed: config.allowed_content_types.iter().map(|t| t.to_ascii_lowercase()).collect(),
        })
    }

    pub fn policy(&self) -> &Arc<Policy> {
        &self.policy
    }

    fn allows(&self, media_type: &str) -> bool {
        self.allowed.iter().any(|allowed| match allowed.strip_suffix("/*") {
            Some(kind) => media_type.split('/').next() == Some(kind),
            None => allowed == media_type,
        })
    }

    /// GETs `url`, following redirects, within the time and size limits.
    pub async fn get(&self, url: &str) -> Result<Body, FetchError> {
        let started = Instant::now();
        let mut url = Url::parse(url.trim()).map_err(|e| FetchError::BadUrl { url: url.to_owned(), detail: e.to_string() })?;
        let mut hops = 0;
        loop {
            self.policy.check_url(&url).map_err(|refusal| FetchError::Refused { url: url_text(&url), refusal })?;
            let remaining = self.timeout.checked_sub(started.elapsed()).ok_or_else(|| self.timed_out(&url))?;
            let send = self.client.get(url.clone()).header(ACCEPT, ACCEPT_VALUE).send();
            let response = match tokio::time::timeout(remaining, send).await {
                Err(_) => return Err(self.timed_out(&url)),
                Ok(Err(error)) => return Err(self.transport(&url, &error)),
                Ok(Ok(response)) => response,
            };
            let status = response.status();
            if status.is_redirection()
                && let Some(location) = response.headers().get(LOCATION)
            {
                hops += 1;
                if hops > self.max_redirects {
                    return Err(FetchError::TooManyRedirects { url: url_text(&url), max: self.max_redirects });
                }
                let location = String::from_utf8_lossy(location.as_bytes()).into_owned();
                url = url.join(&location).map_err(|e| FetchError::BadUrl { url: location.clone(), detail: e.to_string() })?;
                tracing::debug!(hop = hops, to = %url_text(&url), "web_fetch redirect");
                continue;
            }
            if !status.is_success() {
                return Err(FetchError::Status { url: url_text(&url), status: status.to_string() });
            }
            return self.read(url.clone(), response, started).await;
        }
    }

    async fn read(&self, url: Url, mut response: reqwest::Response, started: Instant) -> Result<Body, FetchError> {
        let header = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let mut params = header.split(';');
        let declared = params.next().unwrap_or_default().trim().to_ascii_lowercase();
        let charset = params.find_map(|p| p.trim().strip_prefix("charset=").map(|c| c.trim_matches('"').to_owned()));
        if !declared.is_empty() && !self.allows(&declared) {
            return Err(self.content_type_error(&url, &declared));
        }
        let length = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if let Some(size) = length.filter(|size| *size > self.max_bytes && is_binary(&declared)) {
            return Err(FetchError::TooLarge { url: url_text(&url), media_type: declared, size, max: self.max_bytes });
        }
        let mut bytes = Vec::with_capacity(length.unwrap_or(64 * 1024).min(self.max_bytes) as usize);
        let mut truncated = false;
        loop {
            let remaining = self.timeout.checked_sub(started.elapsed()).ok_or_else(|| self.timed_out(&url))?;
            let chunk = match tokio::time::timeout(remaining, response.chunk()).await {
                Err(_) => return Err(self.timed_out(&url)),
                Ok(Err(error)) => return Err(self.transport(&url, &error)),
                Ok(Ok(None)) => break,
                Ok(Ok(Some(chunk))) => chunk,
            };
            let room = (self.max_bytes as usize).saturating_sub(bytes.len());
            if chunk.len() > room {
                bytes.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            bytes.extend_from_slice(&chunk);
        }
        let media_type = if declared.is_empty() { sniff(&bytes).to_owned() } else { declared };
        if !self.allows(&media_type) {
            return Err(self.content_type_error(&url, &media_type));
        }
        if truncated && is_binary(&media_type) {
            return Err(FetchError::TooLarge { url: url_text(&url), media_type, size: self.max_bytes + 1, max: self.max_bytes });
        }
        Ok(Body { url, media_type, charset, bytes, truncated })
    }

    fn timed_out(&self, url: &Url) -> FetchError {
        FetchError::Timeout { url: url_text(url), ms: self.timeout.as_millis() }
    }

    fn content_type_error(&self, url: &Url, media_type: &str) -> FetchError {
        FetchError::ContentType { url: url_text(url), media_type: media_type.to_owned(), allowed: self.allowed.join(", ") }
    }

    fn transport(&self, url: &Url, error: &reqwest::Error) -> FetchError {
        if let Some(refusal) = find_refusal(error) {
            return FetchError::Refused { url: url_text(url), refusal: refusal.clone() };
        }
        if error.is_timeout() {
            return self.timed_out(url);
        }
        FetchError::Connect { url: url_text(url), detail: chain(error) }
    }
}

/// A URL for messages: without its user:password part, which may hold credentials.
pub fn url_text(url: &Url) -> String {
    if url.password().is_none() && url.username().is_empty() {
        return url.to_string();
    }
    let mut shown = url.clone();
    let _ = shown.set_password(None);
    let _ = shown.set_username("");
    shown.to_string()
}

/// The media type of a body sent without one, from its first bytes.
pub fn sniff(bytes: &[u8]) -> &'static str {
    let head = &bytes[..bytes.len().min(512)];
    let text_start = head.iter().position(|b| !b.is_ascii_whitespace()).map_or(&head[..0], |i| &head[i..]);
    if head.starts_with(b"%PDF-") {
        "application/pdf"
    } else if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if head.starts_with(b"\xff\xd8\xff") {
        "image/jpeg"
    } else if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        "image/gif"
    } else if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        "image/webp"
    } else if text_start.starts_with(b"{") || text_start.starts_with(b"[") {
        "application/json"
    } else if text_start.first() == Some(&b'<') {
        "text/html"
    } else if !head.contains(&0) && std::str::from_utf8(head).map_or_else(|e| e.error_len().is_none(), |_| true) {
        // Valid UTF-8 (a character cut at the 512th byte is incomplete, not invalid) without NULs.
        "text/plain"
    } else {
        "application/octet-stream"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_without_a_content_type_are_sniffed() {
        assert_eq!(sniff(b"%PDF-1.7 ..."), "application/pdf");
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n...."), "image/png");
        assert_eq!(sniff(b"  <!doctype html><p>x"), "text/html");
        assert_eq!(sniff(b"{\"a\": 1}"), "application/json");
        assert_eq!(sniff(b"plain words"), "text/plain");
        assert_eq!(sniff(b"\x00\x01\x02\xff\xfe"), "application/octet-stream");
    }

    #[test]
    fn credentials_in_urls_stay_out_of_messages() {
        let url = Url::parse("https://user:hunter2@example.com/x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(url_text(&url), "https://example.com/x");
    }
}
