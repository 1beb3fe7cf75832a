//! OAuth tokens for HTTP/SSE servers (DeerFlow's `OAuthTokenManager`): the client_credentials and
//! refresh_token grants against the entry's `token_url`, one cached token per server, refreshed
//! `refresh_skew_seconds` before it expires, a rotated refresh token kept (in memory only), every request
//! bounded by `mcp.oauth.token_timeout_secs` (15 s).
//!
//! Hand-written rather than rmcp's `auth` feature: that one implements the interactive authorization-code
//! flow with dynamic client registration (and pulls in the `oauth2` crate); what DeerFlow configs need is a
//! single form POST for these two grants. Tokens never reach a log line, an error or a response: errors
//! carry the status and a redacted excerpt of the body only.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Mutex;

use crate::redact::redact;
use crate::spec::{Grant, OAuthSpec};

/// Used when the response has no `expires_in` (DeerFlow's default).
const DEFAULT_EXPIRES_IN_SECS: f64 = 3600.0;

/// Longest excerpt of an error body kept in a message.
const BODY_EXCERPT: usize = 200;

#[derive(Debug)]
struct Token {
    header: String,
    expires_at: Instant,
    /// Keeps the access token registered with the kit's redactor while it is cached.
    _registered: antler_kit::redact::Secret,
}

#[derive(Debug, Default)]
struct State {
    token: Option<Token>,
    /// The refresh token in force: the configured one until the server rotates it.
    refresh_token: Option<String>,
}

/// A failed token request.
#[derive(Debug, Clone, thiserror::Error)]
#[error("OAuth token request to {url} failed: {message}")]
pub struct OAuthError {
    pub url: String,
    pub message: String,
}

/// Token source of one server.
#[derive(Debug)]
pub struct TokenSource {
    spec: OAuthSpec,
    http: reqwest::Client,
    timeout: Duration,
    state: Mutex<State>,
}

impl TokenSource {
    pub fn new(spec: OAuthSpec, http: reqwest::Client, timeout: Duration) -> Self {
        let refresh_token = (!spec.refresh_token.is_empty()).then(|| spec.refresh_token.clone());
        Self { spec, http, timeout, state: Mutex::new(State { token: None, refresh_token }) }
    }

    /// The `Authorization` value to send now, fetching or refreshing the token when it is missing or
    /// within the skew of its expiry. Concurrent callers share one request (the lock is held across it).
    pub async fn authorization(&self) -> Result<String, OAuthError> {
        let mut state = self.state.lock().await;
        if let Some(token) = &state.token
            && Instant::now() + self.spec.refresh_skew < token.expires_at
        {
            return Ok(token.header.clone());
        }
        let token = self.request(&mut state).await?;
        let header = token.header.clone();
        state.token = Some(token);
        Ok(header)
    }

    async fn request(&self, state: &mut State) -> Result<Token, OAuthError> {
        let spec = &self.spec;
        let url = display_url(&spec.token_url);
        let fail = |message: String| OAuthError { url: url.clone(), message };
        // DeerFlow's order: extra params first, then the reserved keys overwrite them.
        let mut form: Vec<(String, String)> = spec.extra_token_params.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut set = |key: &str, value: &str| {
            form.retain(|(k, _)| k != key);
            if !value.is_empty() {
                form.push((key.to_owned(), value.to_owned()));
            }
        };
        match spec.grant {
            Grant::ClientCredentials => set("grant_type", "client_credentials"),
            Grant::RefreshToken => {
                set("grant_type", "refresh_token");
                set("refresh_token", state.refresh_token.as_deref().unwrap_or_default());
            }
        }
        set("scope", &spec.scope);
        set("audience", &spec.audience);
        set("client_id", &spec.client_id);
        set("client_secret", &spec.client_secret);

        let response = self.http.post(&spec.token_url).form(&form).timeout(self.timeout).send().await.map_err(|e| {
            if e.is_timeout() { fail(format!("timed out after {}s", self.timeout.as_secs())) } else { fail(e.without_url().to_string()) }
        })?;
        let status = response.status();
        let body = response.text().await.map_err(|e| fail(e.without_url().to_string()))?;
        if !status.is_success() {
            let excerpt: String = redact(&body).chars().take(BODY_EXCERPT).collect();
            return Err(fail(format!("HTTP {}: {excerpt}", status.as_u16())));
        }
        let json: Value = serde_json::from_str(&body).map_err(|_| fail("the response is not JSON".to_owned()))?;
        let access = json
            .get(&spec.token_field)
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| fail(format!("the response has no `{}`", spec.token_field)))?
            .to_owned();
        let token_type =
            json.get(&spec.token_type_field).and_then(Value::as_str).filter(|t| !t.is_empty()).unwrap_or(&spec.default_token_type);
        // "bearer" from some servers; the header scheme is case-insensitive but Bearer is the norm.
        let token_type = if token_type.eq_ignore_ascii_case("bearer") { "Bearer" } else { token_type };
        let expires_in = json
            .get(&spec.expires_in_field)
            .and_then(|v| v.as_f64().or_else(|| v.as_str().and_then(|s| s.parse().ok())))
            .unwrap_or(DEFAULT_EXPIRES_IN_SECS)
            .clamp(1.0, 10.0 * 365.0 * 86_400.0);
        if let Some(rotated) = json.get("refresh_token").and_then(Value::as_str).filter(|t| !t.is_empty()) {
            antler_kit::redact::register_static(rotated);
            state.refresh_token = Some(rotated.to_owned());
        }
        let registered = antler_kit::redact::register(&access);
        tracing::info!(token_url = %url, grant = ?spec.grant, expires_in_secs = expires_in, "OAuth token obtained");
        Ok(Token {
            header: format!("{token_type} {access}"),
            expires_at: Instant::now() + Duration::from_secs_f64(expires_in),
            _registered: registered,
        })
    }
}

/// The URL without its query (which may hold a key) for messages.
fn display_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) => {
            parsed.set_query(None);
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => "the token URL".to_owned(),
    }
}
