//! The `edge` section: the HTTP listener that serves the LangGraph Agent Server API (and DeerFlow's
//! gateway routes), off unless `listen` is set. Until this crate existed the same keys lived under
//! `runs.langgraph_api`; that block is refused with a hint naming this section.

use std::net::SocketAddr;

use antler_kit::config::{Config, ConfigError, check_range};
use serde::{Deserialize, Serialize};

/// Settings of the HTTP + SSE edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
    /// `host:port` to serve the LangGraph Agent Server API on, e.g. `127.0.0.1:2024` (port 0 picks a
    /// free one). Empty: the edge is off. A non-loopback address needs `server.auth` (or
    /// `server.allow_insecure`), exactly like the gRPC listener.
    pub listen: String,
    /// Largest request body, in bytes; a larger one is refused with 413 naming this setting. A run's
    /// request is also bounded by `runs.max_request_bytes` once translated.
    pub max_body_bytes: u64,
    /// Requests handled at once, open SSE streams and waits included; beyond it the edge answers
    /// 429 with `Retry-After` instead of queueing.
    pub max_concurrent_requests: u32,
    /// Largest `limit` of `/threads/search`, `/threads/{id}/history`, `/threads/{id}/runs` and
    /// `/assistants/search`; a larger one is refused with 422.
    pub max_page: u32,
    /// Largest `offset` of those listings (an offset is paged through, so it costs reads).
    pub max_offset: u32,
    /// Browser origins allowed to call the edge (CORS), e.g. `["http://localhost:3000"]` for DeerFlow's
    /// web UI, or `["*"]` for any. Each is `scheme://host[:port]`. Empty (the default): no CORS headers,
    /// so browsers refuse cross-origin calls; other clients are not affected either way.
    pub cors_origins: Vec<String>,
    /// How long a browser may cache a preflight answer, in seconds.
    pub cors_max_age_secs: u64,
    /// DeerFlow's gateway routes (`/api/*`, `/api/v1/auth/*`): see [`GatewayConfig`].
    pub gateway: GatewayConfig,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            listen: String::new(),
            max_body_bytes: 8 * 1024 * 1024,
            max_concurrent_requests: 1024,
            max_page: 1000,
            max_offset: 10_000,
            cors_origins: Vec::new(),
            cors_max_age_secs: 600,
            gateway: GatewayConfig::default(),
        }
    }
}

impl EdgeConfig {
    /// The address to listen on; None when the edge is off.
    pub fn listen_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.listen.trim().is_empty() {
            return Ok(None);
        }
        self.listen.trim().parse().map(Some).map_err(|_| ConfigError::Invalid {
            path: "edge.listen".to_owned(),
            message: format!("`{}` is not host:port with an IP address, e.g. 127.0.0.1:2024", self.listen),
        })
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        check_range("edge.max_body_bytes", self.max_body_bytes, 1024, 1 << 30)?;
        check_range("edge.max_concurrent_requests", self.max_concurrent_requests.into(), 1, 100_000)?;
        check_range("edge.max_page", self.max_page.into(), 1, 10_000)?;
        check_range("edge.max_offset", self.max_offset.into(), 0, 1_000_000)?;
        check_range("edge.cors_max_age_secs", self.cors_max_age_secs, 0, 86_400)?;
        self.gateway.validate()?;
        for (i, origin) in self.cors_origins.iter().enumerate() {
            check_origin(origin).map_err(|message| ConfigError::Invalid { path: format!("edge.cors_origins[{i}]"), message })?;
        }
        if self.cors_origins.len() > 1 && self.cors_origins.iter().any(|o| o == "*") {
            return Err(ConfigError::Invalid {
                path: "edge.cors_origins".to_owned(),
                message: "\"*\" allows every origin; list it alone".to_owned(),
            });
        }
        Ok(())
    }

    /// The CORS layer for `cors_origins` (None when the list is empty).
    pub fn cors(&self) -> Option<tower_http::cors::CorsLayer> {
        use axum::http::{HeaderName, HeaderValue, Method, header};
        use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
        if self.cors_origins.is_empty() {
            return None;
        }
        let any = self.cors_origins.iter().any(|o| o == "*");
        let origin = if any {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(self.cors_origins.iter().filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok()))
        };
        // Listed origins may send the gateway's session cookies (DeerFlow's UI fetches with
        // `credentials: "include"`); browsers never allow credentials with a wildcard origin.
        let layer = if any { CorsLayer::new() } else { CorsLayer::new().allow_credentials(true) };
        Some(
            layer
                .allow_origin(origin)
                .allow_methods([Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::OPTIONS])
                // Mirrored rather than `*`: browsers never let a wildcard cover Authorization.
                .allow_headers(AllowHeaders::mirror_request())
                // The SDKs read the run id from Content-Location and resume streams with Last-Event-ID.
                .expose_headers([header::CONTENT_LOCATION, header::LOCATION, HeaderName::from_static("retry-after")])
                .max_age(std::time::Duration::from_secs(self.cors_max_age_secs)),
        )
    }
}

/// `edge.gateway`: the settings of DeerFlow's gateway routes that are the edge's own (everything else
/// they serve is the owning service's: upload limits are the sandbox's, models the models service's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Follow-up suggestions (`GET /api/suggestions/config`, `POST /api/threads/{id}/suggestions`).
    pub suggestions: SuggestionsConfig,
    /// How long a browser session (the `access_token` and `csrf_token` cookies set by
    /// `POST /api/v1/auth/login/local`) lasts, in seconds, when the login asked to be remembered;
    /// otherwise the cookies end with the browser session.
    pub session_max_age_secs: u64,
    /// Directory where a multipart upload is spooled while it arrives (UploadFiles declares every
    /// file's size before its bytes, and browsers do not send part sizes). Empty: the system's
    /// temporary directory. Each spooled file is removed when the request ends.
    pub upload_spool_dir: String,
    /// Largest `.skill` archive the artifacts route opens to preview a member
    /// (`GET …/artifacts/…/x.skill/SKILL.md`), in bytes; the member itself is capped at 16 MiB.
    pub skill_preview_max_bytes: u64,
    /// Bounds on failed browser sign-ins: see [`GatewayAuthConfig`].
    pub auth: GatewayAuthConfig,
}

/// `edge.gateway.auth`: how many failed sign-ins (`POST /api/v1/auth/login/local` answered 401) one
/// username and one client address may have within a sliding window before further sign-ins are
/// refused 429 with `Retry-After`, unchecked. Counted per edge replica, in memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayAuthConfig {
    /// Failed sign-ins per username (the form's `username`, trimmed, any case) within the window; 0: no
    /// bound. The username does not choose the user (the credential does), so this bounds guessing
    /// aimed at one name; the per-address bound is what holds against rotating names.
    pub max_failed_logins_per_username: u32,
    /// Failed sign-ins per client address within the window; 0: no bound.
    pub max_failed_logins_per_address: u32,
    /// The sliding window, in seconds: a failure stops counting this long after it happened.
    pub failed_login_window_secs: u64,
    /// A header the proxy in front sets to the client's address (`x-forwarded-for`: its last entry, the
    /// one that proxy appended; `x-real-ip`). Empty (the default): the TCP peer's address. Set it only
    /// behind a proxy that overwrites or appends it, or clients choose their own address.
    pub client_address_header: String,
    /// Most usernames and addresses remembered at once (each map); past it the entry idle the longest
    /// is forgotten first, so the memory stays bounded however many names an attacker tries.
    pub max_tracked: u32,
}

impl Default for GatewayAuthConfig {
    fn default() -> Self {
        Self {
            max_failed_logins_per_username: 10,
            max_failed_logins_per_address: 50,
            failed_login_window_secs: 900,
            client_address_header: String::new(),
            max_tracked: 10_000,
        }
    }
}

impl GatewayAuthConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("edge.gateway.auth.max_failed_logins_per_username", self.max_failed_logins_per_username.into(), 0, 10_000)?;
        check_range("edge.gateway.auth.max_failed_logins_per_address", self.max_failed_logins_per_address.into(), 0, 100_000)?;
        check_range("edge.gateway.auth.failed_login_window_secs", self.failed_login_window_secs, 1, 86_400)?;
        check_range("edge.gateway.auth.max_tracked", self.max_tracked.into(), 16, 10_000_000)?;
        let header = self.client_address_header.trim();
        if !header.is_empty() && axum::http::HeaderName::from_bytes(header.as_bytes()).is_err() {
            return Err(ConfigError::Invalid {
                path: "edge.gateway.auth.client_address_header".to_owned(),
                message: format!("`{header}` is not a header name (e.g. x-forwarded-for)"),
            });
        }
        Ok(())
    }
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            suggestions: SuggestionsConfig::default(),
            session_max_age_secs: 7 * 86_400,
            upload_spool_dir: String::new(),
            skill_preview_max_bytes: 64 * 1024 * 1024,
            auth: GatewayAuthConfig::default(),
        }
    }
}

/// `edge.gateway.suggestions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SuggestionsConfig {
    /// Whether follow-up questions are generated (off: the config route says so and the route answers
    /// an empty list, as DeerFlow does).
    pub enabled: bool,
    /// Most questions one call returns (a request's `n` is clamped to it), 1–5 (DeerFlow's range).
    pub max_suggestions: u32,
    /// The model that writes them (a configured model name). Empty: the request's `model_name`, else
    /// the models service's default model.
    pub model: String,
}

impl Default for SuggestionsConfig {
    fn default() -> Self {
        Self { enabled: true, max_suggestions: 3, model: String::new() }
    }
}

impl GatewayConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("edge.gateway.suggestions.max_suggestions", self.suggestions.max_suggestions.into(), 1, 5)?;
        check_range("edge.gateway.session_max_age_secs", self.session_max_age_secs, 60, 366 * 86_400)?;
        check_range("edge.gateway.skill_preview_max_bytes", self.skill_preview_max_bytes, 1024, 1 << 30)?;
        self.auth.validate()?;
        if !self.upload_spool_dir.is_empty() && !std::path::Path::new(&self.upload_spool_dir).is_absolute() {
            return Err(ConfigError::Invalid {
                path: "edge.gateway.upload_spool_dir".to_owned(),
                message: format!("`{}` must be an absolute path (or empty for the system's temporary directory)", self.upload_spool_dir),
            });
        }
        Ok(())
    }
}

/// `*`, or `scheme://host[:port]` with an http(s) scheme and nothing after the authority.
fn check_origin(origin: &str) -> Result<(), String> {
    if origin == "*" {
        return Ok(());
    }
    let trimmed = origin.trim_end_matches('/');
    let rest = trimmed.strip_prefix("http://").or_else(|| trimmed.strip_prefix("https://"));
    match rest {
        Some(authority) if !authority.is_empty() && !authority.contains(['/', '?', '#', ' ', '*']) => {
            axum::http::HeaderValue::from_str(trimmed).map(|_| ()).map_err(|_| format!("`{origin}` holds characters a header cannot carry"))
        }
        _ => Err(format!("`{origin}` is not an origin: write scheme://host[:port], e.g. http://localhost:3000, or \"*\"")),
    }
}

/// The edge's section of `config`, checked. The run options it translates are the runs service's
/// (`runs.agent`, `runs.context_keys`), so that section is read and checked too.
pub fn load(config: &Config) -> Result<(EdgeConfig, antler_runs::config::RunsConfig), ConfigError> {
    let edge: EdgeConfig = config.section("edge")?;
    edge.validate()?;
    Ok((edge, antler_runs::config::load(config)?))
}

/// Checks the section (for start-up, reloads and `antler config check`).
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    load(config).map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use serde_json::Value;

    use super::*;

    /// Every key path of a section's defaults: each object walked, a leaf, list or null ends a path
    /// (so `server.auth.jwt`, unset by default, is a key too).
    fn key_paths(prefix: &str, value: &Value, out: &mut BTreeSet<String>) {
        out.insert(prefix.to_owned());
        if let Value::Object(map) = value {
            for (key, value) in map {
                key_paths(&format!("{prefix}.{key}"), value, out);
            }
        }
    }

    /// The settings this crate can know: its own section, the runs section it reads, and the shared
    /// `server` and `clients` sections. Other services' keys (`sandbox.*`, `memory.*`) are theirs to check.
    fn known_settings() -> BTreeSet<String> {
        let mut known = BTreeSet::new();
        let sections = [
            ("edge", serde_json::to_value(EdgeConfig::default())),
            ("runs", serde_json::to_value(antler_runs::config::RunsConfig::default())),
            ("server", serde_json::to_value(antler_kit::config::ServerConfig::default())),
            ("clients", serde_json::to_value(antler_kit::config::ClientsConfig::default())),
        ];
        for (name, value) in sections {
            key_paths(name, &value.expect("a config section serialises to JSON"), &mut known);
        }
        known
    }

    /// The text of each string literal of a Rust source (comments, char literals and lifetimes are
    /// skipped; raw strings read to their closing quote and hashes).
    fn string_literals(source: &str) -> Vec<String> {
        let chars: Vec<char> = source.chars().collect();
        let (mut out, mut i) = (Vec::new(), 0);
        while i < chars.len() {
            match chars[i] {
                '/' if chars.get(i + 1) == Some(&'/') => {
                    while i < chars.len() && chars[i] != '\n' {
                        i += 1;
                    }
                }
                '/' if chars.get(i + 1) == Some(&'*') => {
                    i += 2;
                    while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                        i += 1;
                    }
                    i += 2;
                }
                // A char literal ('"', '\'', 'x'); anything else after a quote is a lifetime.
                '\'' if chars.get(i + 1) == Some(&'\\') => {
                    i += 2;
                    while i < chars.len() && chars[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                }
                '\'' if chars.get(i + 2) == Some(&'\'') => i += 3,
                'r' if matches!(chars.get(i + 1), Some('"' | '#'))
                    && (i == 0 || !chars[i - 1].is_alphanumeric() && chars[i - 1] != '_') =>
                {
                    let mut j = i + 1;
                    let mut hashes = 0;
                    while chars.get(j) == Some(&'#') {
                        hashes += 1;
                        j += 1;
                    }
                    if chars.get(j) != Some(&'"') {
                        i += 1;
                        continue;
                    }
                    let start = j + 1;
                    let mut end = start;
                    while end < chars.len() && !(chars[end] == '"' && (0..hashes).all(|h| chars.get(end + 1 + h) == Some(&'#'))) {
                        end += 1;
                    }
                    out.push(chars[start..end.min(chars.len())].iter().collect());
                    i = end + 1 + hashes;
                }
                '"' => {
                    let mut text = String::new();
                    i += 1;
                    while i < chars.len() && chars[i] != '"' {
                        if chars[i] == '\\' {
                            i += 1;
                        }
                        if let Some(c) = chars.get(i) {
                            text.push(*c);
                        }
                        i += 1;
                    }
                    out.push(text);
                    i += 1;
                }
                _ => i += 1,
            }
        }
        out
    }

    /// The setting names (`edge.…`, `runs.…`, `server.…`, `clients.…`) a text mentions, a trailing
    /// `.*` (a whole block) dropped.
    fn settings_named(text: &str) -> Vec<String> {
        let mut found = Vec::new();
        for section in ["edge.", "runs.", "server.", "clients."] {
            for (at, _) in text.match_indices(section) {
                let before = text[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':')) {
                    continue;
                }
                let name: String =
                    text[at..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.')).collect();
                let name = name.trim_end_matches('.');
                // A file name (`edge.rs`, `memory.json`), not a setting.
                let file = name.rsplit_once('.').is_some_and(|(_, ext)| matches!(ext, "rs" | "md" | "json" | "yaml" | "yml" | "py" | "js"));
                if name.len() > section.len() && !file {
                    found.push(name.to_owned());
                }
            }
        }
        found
    }

    fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).expect("the crate's src directory is readable").flatten().collect();
        entries.sort_by_key(|e| e.path());
        for entry in entries {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file is UTF-8");
                // The code before its tests: messages live there; tests hold deliberately wrong names.
                let code = text.split("#[cfg(test)]").next().unwrap_or_default().to_owned();
                out.push((path.display().to_string(), code));
            }
        }
    }

    /// The names in `text` that no configuration section defines.
    fn unknown_settings(text: &str, known: &BTreeSet<String>) -> Vec<String> {
        settings_named(text).into_iter().filter(|name| !known.contains(name)).collect()
    }

    #[test]
    fn every_message_names_a_setting_that_exists() {
        let known = known_settings();
        assert!(known.contains("edge.max_body_bytes") && known.contains("edge.gateway.suggestions.max_suggestions"), "{known:?}");
        // The checker itself: the old section's keys are not settings any more.
        assert_eq!(
            unknown_settings("larger than 5 bytes (runs.langgraph_api.max_body_bytes)", &known),
            ["runs.langgraph_api.max_body_bytes"]
        );
        assert!(unknown_settings("see edge.rs and http://edge.example/ (edge.max_page)", &known).is_empty());

        let mut files = Vec::new();
        sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
        let mut named = BTreeSet::new();
        let mut wrong = Vec::new();
        for (path, text) in &files {
            for literal in string_literals(text) {
                named.extend(settings_named(&literal));
                wrong.extend(unknown_settings(&literal, &known).into_iter().map(|name| format!("{path}: {name} in {literal:?}")));
            }
        }
        assert!(
            wrong.is_empty(),
            "messages name settings that config.rs (or the runs/server/clients sections) do not define:\n{}",
            wrong.join("\n")
        );
        // The scan saw the messages it guards (a broken scanner must not pass by finding nothing).
        for expected in ["edge.max_body_bytes", "edge.max_concurrent_requests", "edge.max_page", "edge.listen"] {
            assert!(named.contains(expected), "no message names {expected}; scanned {} files, found {named:?}", files.len());
        }
    }

    #[test]
    fn string_literals_are_read_past_comments_chars_and_raw_strings() {
        let source = "// \"edge.commented\"\nlet a = '\"'; let b: &'static str = \"x \\\" edge.max_page\"; let c = r#\"raw \"edge.listen\"#; /* \"no\" */";
        assert_eq!(string_literals(source), ["x \" edge.max_page", "raw \"edge.listen"]);
    }
}
