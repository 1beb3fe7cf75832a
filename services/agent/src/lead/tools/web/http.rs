//! HTTP plumbing shared by the providers: one client per configuration, JSON calls with a deadline and
//! a size cap, and a provider's refusal turned into a message the model (and the operator) can act on.

use std::time::Duration;

use serde_json::Value;

/// Largest provider answer read (search results are a few KiB; a reader's page a few hundred).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// Characters of a provider's own error message kept.
const MAX_MESSAGE_CHARS: usize = 300;

/// What went wrong with a provider call. Its text is what the model reads after `Error: `.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("{provider} answered HTTP {status}{}{}", message_part(.message), hint_part(.hint))]
    Status { provider: &'static str, status: u16, message: String, hint: String },
    #[error("{provider} did not answer within {ms} ms ({setting}.timeout_ms)")]
    Timeout { provider: &'static str, ms: u128, setting: &'static str },
    #[error("cannot reach {provider}: {detail}")]
    Connect { provider: &'static str, detail: String },
    #[error("{provider} answered in an unexpected format: {detail}")]
    Malformed { provider: &'static str, detail: String },
    /// The page a reader provider was asked for failed the fetch checks.
    #[error("{0}")]
    Refused(String),
}

fn message_part(message: &str) -> String {
    if message.is_empty() { String::new() } else { format!(": {message}") }
}

fn hint_part(hint: &str) -> String {
    if hint.is_empty() { String::new() } else { format!("\nhint: {hint}") }
}

/// An error and its sources, `a: b: c`, without repeats (reqwest's and hyper's messages nest).
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current = Some(error);
    while let Some(e) = current {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        current = e.source();
    }
    parts.join(": ")
}

/// One provider's endpoint: the shared client, its address and key, and where its settings live.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub client: reqwest::Client,
    pub provider: &'static str,
    /// The API's address without a trailing slash.
    pub base_url: String,
    /// Never logged: the kit's redactor knows it (see `web::register_key`).
    pub key: Option<String>,
    pub timeout: Duration,
    /// `runs.lead.web.search` etc., for hints.
    pub setting: &'static str,
}

impl Endpoint {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// `path` with `params` as its query string (percent-encoded).
    pub fn url_with(&self, path: &str, params: &[(&str, &str)]) -> Result<reqwest::Url, ProviderError> {
        let mut url = reqwest::Url::parse(&self.url(path)).map_err(|e| self.malformed(format!("bad base_url: {e}")))?;
        url.query_pairs_mut().extend_pairs(params);
        Ok(url)
    }

    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or_default()
    }

    /// Sends `request` and reads its JSON answer; a non-2xx status becomes [`ProviderError::Status`]
    /// with the provider's own message (found by `message_of` in its error body) and a hint.
    pub async fn json(&self, request: reqwest::RequestBuilder, message_of: fn(&Value) -> Option<String>) -> Result<Value, ProviderError> {
        let (status, body) = self.send(request).await?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| message_of(&v))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).split_whitespace().collect::<Vec<_>>().join(" "));
            return Err(self.status_error(status, &message));
        }
        serde_json::from_slice(&body).map_err(|e| ProviderError::Malformed { provider: self.provider, detail: format!("not JSON ({e})") })
    }

    /// Sends `request` within the timeout and reads at most [`MAX_ANSWER_BYTES`] of its body.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<(u16, Vec<u8>), ProviderError> {
        let timeout = ProviderError::Timeout { provider: self.provider, ms: self.timeout.as_millis(), setting: self.setting };
        let read = async {
            let mut response = request.send().await.map_err(|e| self.transport(&e))?;
            let status = response.status().as_u16();
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(|e| self.transport(&e))? {
                if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(ProviderError::Malformed {
                        provider: self.provider,
                        detail: format!("the answer is larger than {MAX_ANSWER_BYTES} bytes"),
                    });
                }
                body.extend_from_slice(&chunk);
            }
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, read).await.map_err(|_| timeout)?
    }

    fn transport(&self, error: &reqwest::Error) -> ProviderError {
        if error.is_timeout() {
            return ProviderError::Timeout { provider: self.provider, ms: self.timeout.as_millis(), setting: self.setting };
        }
        // The URL is the configured base URL (no secret: keys travel in headers or bodies only).
        ProviderError::Connect { provider: self.provider, detail: chain(error) }
    }

    pub fn status_error(&self, status: u16, message: &str) -> ProviderError {
        let mut message: String = message.trim().chars().take(MAX_MESSAGE_CHARS).collect();
        // A provider that echoes the key it was given (some do, in 401 bodies) must not put it in
        // front of the model; the redactor would catch it later, this catches it here.
        if let Some(key) = self.key.as_deref().filter(|k| !k.is_empty()) {
            message = message.replace(key, "[redacted]");
        }
        let hint = match status {
            401 | 403 if self.key.is_some() => format!("the API key was refused; check {}.api_key", self.setting),
            401 | 403 => format!("{} refused the call; check {}", self.provider, self.setting),
            402 | 432 | 433 => "the account's credits or plan limit are used up".to_owned(),
            429 => "rate limited: wait before searching again, or search less often".to_owned(),
            500..=599 => format!("{} is failing; try again later", self.provider),
            _ => String::new(),
        };
        ProviderError::Status { provider: self.provider, status, message, hint }
    }

    pub fn malformed(&self, detail: impl Into<String>) -> ProviderError {
        ProviderError::Malformed { provider: self.provider, detail: detail.into() }
    }
}

/// A JSON string field, or "".
pub fn text(value: &Value, key: &str) -> String {
    value.get(key).and_then(Value::as_str).map(str::trim).unwrap_or_default().to_owned()
}

/// A JSON number field that fits in u32 (numbers as strings too: some APIs send `"1080"`).
pub fn number(value: &Value, key: &str) -> Option<u32> {
    match value.get(key)? {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The array under `path` (e.g. `["web", "results"]`); a missing or null one is an empty list, any
/// other shape is malformed.
pub fn array<'a>(value: &'a Value, path: &[&str]) -> Result<&'a [Value], String> {
    let mut current = value;
    for key in path {
        match current.get(key) {
            None | Some(Value::Null) => return Ok(&[]),
            Some(next) => current = next,
        }
    }
    current.as_array().map(Vec::as_slice).ok_or_else(|| format!("`{}` is not a list", path.join(".")))
}
