//! DeerFlow's `extensions_config.json`, read as it is, and the server entries it (or `mcp.servers` in
//! antler.yaml) holds.
//!
//! Each entry is resolved (`$VAR` as in antler.yaml) and checked on its own, so one bad entry is skipped
//! and reported while the others load. Keys Antler does not use (`routing`, `tools`, `task_toolsets`, and
//! anything else) are kept in the entry's fingerprint and ignored with one log line, as DeerFlow allows
//! extra keys. Top-level keys other than `mcpServers` (`skills`, `middlewares`, `mcpInterceptors`) are
//! DeerFlow's own and ignored likewise.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::hardening::{self, StdioPolicy};
use crate::spec::{Grant, Lifecycle, OAuthSpec, ServerSpec, TransportKind};

/// DeerFlow's variable naming the file.
pub const PATH_ENV: &str = "DEER_FLOW_EXTENSIONS_CONFIG_PATH";

/// DeerFlow's default session start-up bound (`DEFAULT_MCP_SESSION_INIT_TIMEOUT`), in seconds.
pub const DEFAULT_SESSION_INIT_TIMEOUT_SECS: f64 = 60.0;

/// Longest per-call and start-up time an entry may ask for, in seconds.
pub const MAX_ENTRY_TIMEOUT_SECS: f64 = 86_400.0;

/// A problem with one entry (or with the file, when `server` is empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryProblem {
    pub server: String,
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for EntryProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.server.is_empty(), self.field.is_empty()) {
            (true, _) => write!(f, "{}", self.message),
            (false, true) => write!(f, "server `{}`: {}", self.server, self.message),
            (false, false) => write!(f, "server `{}`: {}: {}", self.server, self.field, self.message),
        }
    }
}

/// What parsing an entry needs besides the entry.
#[derive(Clone, Copy)]
pub struct EntryContext<'a> {
    pub policy: &'a StdioPolicy,
    /// Resolves `$VAR` references.
    pub lookup: &'a dyn Fn(&str) -> Option<String>,
    /// Longest `tool_call_timeout` accepted.
    pub max_call_timeout: Duration,
    /// Refuse keys Antler does not know (inline entries in antler.yaml, which is strict everywhere).
    pub strict: bool,
}

/// A scalar where DeerFlow's pydantic would coerce one to a string (`"PORT": 8080`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Number(serde_json::Number),
    Bool(bool),
}

impl Scalar {
    fn into_string(self) -> String {
        match self {
            Scalar::Text(s) => s,
            Scalar::Number(n) => n.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawServer {
    enabled: Option<bool>,
    #[serde(rename = "type")]
    kind: Option<String>,
    transport: Option<String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<Scalar>,
    #[serde(default)]
    env: Option<BTreeMap<String, Scalar>>,
    url: Option<String>,
    #[serde(default)]
    headers: Option<BTreeMap<String, Scalar>>,
    oauth: Option<RawOAuth>,
    description: Option<String>,
    tool_name_prefix: Option<bool>,
    tool_call_timeout: Option<f64>,
    session_init_timeout: Option<f64>,
    /// Antler: `auto` (default), `initialize` (sessions only) or `stateless` (2026-07-28 only).
    protocol: Option<String>,
    /// Antler: users who see the server (absent = all).
    users: Option<Vec<String>>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
struct RawOAuth {
    enabled: Option<bool>,
    token_url: Option<String>,
    grant_type: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    refresh_token: Option<String>,
    scope: Option<String>,
    audience: Option<String>,
    token_field: Option<String>,
    token_type_field: Option<String>,
    expires_in_field: Option<String>,
    default_token_type: Option<String>,
    refresh_skew_seconds: Option<f64>,
    #[serde(default)]
    extra_token_params: BTreeMap<String, Scalar>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

/// Parses one entry. `raw` is the entry as written (variables not yet resolved).
pub fn parse_entry(name: &str, raw: &Value, ctx: EntryContext<'_>) -> Result<ServerSpec, EntryProblem> {
    let problem = |field: &str, message: String| EntryProblem { server: name.to_owned(), field: field.to_owned(), message };
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(problem("", "a server name must be 1 to 128 printable characters".to_owned()));
    }
    let mut resolved: serde_yaml_ng::Value =
        serde_yaml_ng::to_value(raw).map_err(|e| problem("", format!("cannot read the entry: {e}")))?;
    if let Err(error) = antler_kit::config::substitute_env(&mut resolved.clone(), "", ctx.lookup) {
        // A disabled entry may name variables nobody set (DeerFlow substitutes ""); an enabled one may not.
        if raw.get("enabled") != Some(&Value::Bool(false)) {
            return Err(problem("", error.to_string()));
        }
        antler_kit::config::substitute_env(&mut resolved, "", &|name| Some((ctx.lookup)(name).unwrap_or_default()))
            .map_err(|e| problem("", e.to_string()))?;
    } else {
        antler_kit::config::substitute_env(&mut resolved, "", ctx.lookup).map_err(|e| problem("", e.to_string()))?;
    }
    let resolved: Value = serde_json::to_value(&resolved).map_err(|e| problem("", format!("cannot read the entry: {e}")))?;
    if !resolved.is_object() {
        return Err(problem("", "an entry must be an object".to_owned()));
    }
    let fingerprint: [u8; 32] = Sha256::digest(canonical(&resolved).as_bytes()).into();
    let entry: RawServer = serde_path_to_error::deserialize(resolved).map_err(|e| {
        let path = e.path().to_string();
        problem(if path == "." { "" } else { &path }, e.into_inner().to_string())
    })?;

    let mut ignored_keys: Vec<String> = entry.extra.keys().cloned().collect();
    if let Some(oauth) = &entry.oauth {
        ignored_keys.extend(oauth.extra.keys().map(|k| format!("oauth.{k}")));
    }
    if ctx.strict && !ignored_keys.is_empty() {
        return Err(problem(
            &ignored_keys[0],
            "unknown key\nhint: the keys are enabled, type, command, args, env, url, headers, oauth, description, tool_name_prefix, tool_call_timeout, session_init_timeout, protocol, users".to_owned(),
        ));
    }

    // DeerFlow: `type` wins; the MCP-spec `transport` is its alias.
    let kind = entry.kind.clone().or(entry.transport.clone()).unwrap_or_else(|| "stdio".to_owned());
    let transport = match kind.as_str() {
        "stdio" => TransportKind::Stdio,
        "sse" => TransportKind::Sse,
        "http" | "streamable_http" | "streamable-http" | "streamableHttp" => TransportKind::Http,
        other => {
            let field = if entry.kind.is_some() { "type" } else { "transport" };
            return Err(problem(field, format!("unsupported transport type `{other}` (expected stdio, sse or http)")));
        }
    };

    let args: Vec<String> = entry.args.into_iter().map(Scalar::into_string).collect();
    let env: BTreeMap<String, String> = entry.env.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_string())).collect();
    let headers: BTreeMap<String, String> = entry.headers.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_string())).collect();
    let command = entry.command.unwrap_or_default();
    let url = entry.url.unwrap_or_default();

    match transport {
        TransportKind::Stdio => {
            if command.is_empty() {
                return Err(problem("command", "stdio server requires 'command' field".to_owned()));
            }
            hardening::check(&command, &args, &env, ctx.policy).map_err(|r| problem(&r.field, r.message))?;
        }
        TransportKind::Sse | TransportKind::Http => {
            if url.is_empty() {
                return Err(problem("url", format!("{} server requires 'url' field", transport.label())));
            }
            check_http_url(&url).map_err(|m| problem("url", m))?;
            for (key, value) in &headers {
                check_header(key, value).map_err(|m| problem(&format!("headers.{key}"), m))?;
            }
        }
    }

    let oauth = match entry.oauth {
        Some(raw) if raw.enabled.unwrap_or(true) => {
            if transport == TransportKind::Stdio {
                return Err(problem("oauth", "OAuth applies to sse and http servers only".to_owned()));
            }
            Some(parse_oauth(raw).map_err(|(field, m)| problem(&format!("oauth.{field}"), m))?)
        }
        _ => None,
    };

    let tool_call_timeout = match entry.tool_call_timeout {
        None => None,
        Some(secs) => Some(seconds(secs, ctx.max_call_timeout.as_secs_f64()).map_err(|m| problem("tool_call_timeout", m))?),
    };
    let session_init_timeout = seconds(entry.session_init_timeout.unwrap_or(DEFAULT_SESSION_INIT_TIMEOUT_SECS), 3_600.0)
        .map_err(|m| problem("session_init_timeout", m))?;
    let lifecycle = match entry.protocol.as_deref() {
        None | Some("auto") => Lifecycle::Auto,
        Some("initialize") | Some("2025-11-25") => Lifecycle::Initialize,
        Some("stateless") | Some("2026-07-28") => Lifecycle::Stateless,
        Some(other) => return Err(problem("protocol", format!("`{other}` is not auto, initialize or stateless"))),
    };
    if transport == TransportKind::Sse && lifecycle == Lifecycle::Stateless {
        return Err(problem("protocol", "legacy SSE servers have no stateless mode".to_owned()));
    }
    if let Some(bad) = entry.users.iter().flatten().find(|u| !antler_kit::auth::valid_user_id(u)) {
        return Err(problem("users", format!("`{bad}` is not a valid user id")));
    }

    Ok(ServerSpec {
        name: name.to_owned(),
        enabled: entry.enabled.unwrap_or(true),
        transport,
        command,
        args,
        env,
        url,
        headers,
        oauth,
        description: entry.description.unwrap_or_default(),
        tool_name_prefix: entry.tool_name_prefix.unwrap_or(true),
        tool_call_timeout,
        session_init_timeout,
        lifecycle,
        users: entry.users,
        ignored_keys,
        fingerprint,
    })
}

fn parse_oauth(raw: RawOAuth) -> Result<OAuthSpec, (String, String)> {
    let err = |field: &str, m: &str| (field.to_owned(), m.to_owned());
    let token_url = raw.token_url.unwrap_or_default();
    if token_url.is_empty() {
        return Err(err("token_url", "is required"));
    }
    check_http_url(&token_url).map_err(|m| ("token_url".to_owned(), m))?;
    let grant = match raw.grant_type.as_deref().unwrap_or("client_credentials") {
        "client_credentials" => Grant::ClientCredentials,
        "refresh_token" => Grant::RefreshToken,
        other => return Err(("grant_type".to_owned(), format!("`{other}` is not client_credentials or refresh_token"))),
    };
    let client_id = raw.client_id.unwrap_or_default();
    let client_secret = raw.client_secret.unwrap_or_default();
    let refresh_token = raw.refresh_token.unwrap_or_default();
    if grant == Grant::ClientCredentials && (client_id.is_empty() || client_secret.is_empty()) {
        return Err(err("client_id", "client_credentials requires client_id and client_secret"));
    }
    if grant == Grant::RefreshToken && refresh_token.is_empty() {
        return Err(err("refresh_token", "the refresh_token grant requires refresh_token"));
    }
    let skew = raw.refresh_skew_seconds.unwrap_or(60.0).max(0.0);
    if !skew.is_finite() || skew > 86_400.0 {
        return Err(err("refresh_skew_seconds", "must be between 0 and 86400"));
    }
    Ok(OAuthSpec {
        token_url,
        grant,
        client_id,
        client_secret,
        refresh_token,
        scope: raw.scope.unwrap_or_default(),
        audience: raw.audience.unwrap_or_default(),
        token_field: raw.token_field.unwrap_or_else(|| "access_token".to_owned()),
        token_type_field: raw.token_type_field.unwrap_or_else(|| "token_type".to_owned()),
        expires_in_field: raw.expires_in_field.unwrap_or_else(|| "expires_in".to_owned()),
        default_token_type: raw.default_token_type.unwrap_or_else(|| "Bearer".to_owned()),
        refresh_skew: Duration::from_secs_f64(skew),
        extra_token_params: raw.extra_token_params.into_iter().map(|(k, v)| (k, v.into_string())).collect(),
    })
}

fn seconds(value: f64, max: f64) -> Result<Duration, String> {
    if value.is_finite() && value > 0.0 && value <= max {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(format!("{value} is out of range: must be > 0 and <= {max} seconds"))
    }
}

fn check_http_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(format!("`{url}` must be an http:// or https:// URL with a host"));
    }
    Ok(())
}

/// Headers the MCP transport itself owns; a configured value would break or hijack the session.
const PROTOCOL_HEADERS: &[&str] =
    &["mcp-session-id", "mcp-protocol-version", "last-event-id", "accept", "content-type", "content-length", "host", "transfer-encoding"];

fn check_header(name: &str, value: &str) -> Result<(), String> {
    http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("`{name}` is not a valid header name"))?;
    if PROTOCOL_HEADERS.iter().any(|h| h.eq_ignore_ascii_case(name)) {
        return Err(format!("`{name}` is set by the MCP transport and may not be configured"));
    }
    http::HeaderValue::from_str(value).map_err(|_| "the value is not a valid header value".to_owned())?;
    Ok(())
}

/// JSON with object keys sorted, so two entries that differ only in key order have one fingerprint.
fn canonical(value: &Value) -> String {
    fn sort(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let sorted: BTreeMap<&String, Value> = map.iter().map(|(k, v)| (k, sort(v))).collect();
                Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect::<Map<_, _>>())
            }
            Value::Array(items) => Value::Array(items.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(value).to_string()
}

/// A parsed file: its servers (raw, by name) and its hash.
#[derive(Debug, Clone)]
pub struct ExtensionsFile {
    pub path: PathBuf,
    pub servers: Vec<(String, Value)>,
    pub sha256: [u8; 32],
    /// Top-level keys Antler does not use.
    pub ignored_keys: Vec<String>,
}

/// Why the file as a whole cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{path} is not valid JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Shape { path: PathBuf, message: String },
}

/// Reads and parses the file (the entries are checked later, one by one).
pub fn read_file(path: &Path) -> Result<ExtensionsFile, FileError> {
    let bytes = std::fs::read(path).map_err(|e| FileError::Read { path: path.to_owned(), message: e.kind().to_string() })?;
    parse_file(path, &bytes)
}

/// Parses file contents.
pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<ExtensionsFile, FileError> {
    let sha256: [u8; 32] = Sha256::digest(bytes).into();
    let root: Value = serde_json::from_slice(bytes).map_err(|e| FileError::Json { path: path.to_owned(), message: e.to_string() })?;
    let Value::Object(mut root) = root else {
        return Err(FileError::Shape { path: path.to_owned(), message: "the top level must be a JSON object".to_owned() });
    };
    let servers = match root.remove("mcpServers").or_else(|| root.remove("mcp_servers")) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(FileError::Shape { path: path.to_owned(), message: "`mcpServers` must be an object".to_owned() }),
    };
    Ok(ExtensionsFile {
        path: path.to_owned(),
        servers: servers.into_iter().collect(),
        sha256,
        ignored_keys: root.keys().cloned().collect(),
    })
}

/// Where the file is, in DeerFlow's order: `configured` (from antler.yaml), then
/// `DEER_FLOW_EXTENSIONS_CONFIG_PATH` (which must exist), then `extensions_config.json` and the legacy
/// `mcp_config.json` in the working directory. None: no file (only inline servers, if any).
pub fn locate(configured: Option<&Path>, env_path: Option<&str>, cwd: &Path) -> Result<Option<PathBuf>, FileError> {
    if let Some(path) = configured {
        return Ok(Some(path.to_owned()));
    }
    if let Some(path) = env_path.filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(FileError::Read { path, message: format!("{PATH_ENV} names a file that does not exist") });
        }
        return Ok(Some(path));
    }
    Ok(["extensions_config.json", "mcp_config.json"].iter().map(|name| cwd.join(name)).find(|p| p.is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx<'a>(policy: &'a StdioPolicy, lookup: &'a dyn Fn(&str) -> Option<String>) -> EntryContext<'a> {
        EntryContext { policy, lookup, max_call_timeout: Duration::from_secs(1800), strict: false }
    }

    fn parse(name: &str, raw: Value) -> Result<ServerSpec, EntryProblem> {
        let policy = StdioPolicy::new(None, None);
        let lookup = |v: &str| (v == "GITHUB_TOKEN").then(|| "ghp-secret".to_owned());
        parse_entry(name, &raw, ctx(&policy, &lookup))
    }

    #[test]
    fn a_deerflow_stdio_entry_reads_with_defaults() -> Result<(), EntryProblem> {
        let spec = parse(
            "github",
            json!({"enabled": true, "type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                   "env": {"GITHUB_TOKEN": "$GITHUB_TOKEN"}, "description": "GitHub", "routing": {"mode": "prefer"}}),
        )?;
        assert_eq!(spec.transport, TransportKind::Stdio);
        assert_eq!(spec.env.get("GITHUB_TOKEN").map(String::as_str), Some("ghp-secret"));
        assert!(spec.tool_name_prefix && spec.enabled);
        assert_eq!(spec.session_init_timeout, Duration::from_secs(60));
        assert_eq!(spec.ignored_keys, vec!["routing".to_owned()]);
        Ok(())
    }

    #[test]
    fn type_wins_over_transport_and_http_aliases_are_accepted() -> Result<(), EntryProblem> {
        let spec = parse("a", json!({"type": "sse", "transport": "http", "url": "http://127.0.0.1:1/sse"}))?;
        assert_eq!(spec.transport, TransportKind::Sse);
        let spec = parse("b", json!({"transport": "streamable_http", "url": "http://127.0.0.1:1/mcp"}))?;
        assert_eq!(spec.transport, TransportKind::Http);
        Ok(())
    }

    #[test]
    fn problems_name_the_server_and_the_field() {
        let cases = [
            (json!({"type": "stdio"}), "command"),
            (json!({"type": "ws", "url": "x"}), "type"),
            (json!({"type": "http"}), "url"),
            (json!({"type": "http", "url": "ftp://x"}), "url"),
            (json!({"command": "bash"}), "command"),
            (json!({"command": "python3", "args": ["-c", "print(1)"]}), "args[0]"),
            (json!({"command": "python3", "env": {"PYTHONPATH": "/tmp"}}), "env.PYTHONPATH"),
            (json!({"type": "http", "url": "http://h/mcp", "headers": {"Mcp-Session-Id": "x"}}), "headers.Mcp-Session-Id"),
            (json!({"type": "http", "url": "http://h/mcp", "oauth": {"token_url": "http://h/t"}}), "oauth.client_id"),
            (json!({"command": "npx", "tool_call_timeout": -1}), "tool_call_timeout"),
            (json!({"command": "npx", "env": {"X": "$MISSING_VAR"}}), ""),
            (json!({"command": "npx", "args": "not-a-list"}), "args"),
        ];
        for (raw, field) in cases {
            let problem = parse("srv", raw.clone()).err();
            let Some(problem) = problem else { panic!("{raw} was accepted") };
            assert_eq!(problem.server, "srv");
            assert_eq!(problem.field, field, "{raw}: {problem}");
            assert!(problem.to_string().starts_with("server `srv`"), "{problem}");
        }
    }

    #[test]
    fn a_disabled_entry_may_name_unset_variables() -> Result<(), EntryProblem> {
        let spec = parse("off", json!({"enabled": false, "command": "npx", "env": {"TOKEN": "$NOT_SET_ANYWHERE"}}))?;
        assert!(!spec.enabled);
        assert_eq!(spec.env.get("TOKEN").map(String::as_str), Some(""));
        Ok(())
    }

    #[test]
    fn the_example_file_loads() -> Result<(), Box<dyn std::error::Error>> {
        let text = include_str!("../../../examples/extensions_config.json");
        let file = parse_file(Path::new("examples/extensions_config.json"), text.as_bytes())?;
        let policy = StdioPolicy::new(None, None);
        // As for a user who exported the variables the example names.
        let lookup = |name: &str| Some(format!("value-of-{name}"));
        for (name, raw) in &file.servers {
            let spec = parse_entry(name, raw, ctx(&policy, &lookup)).map_err(|p| p.to_string())?;
            assert!(spec.ignored_keys.is_empty(), "{name}: {:?}", spec.ignored_keys);
        }
        assert!(file.servers.len() >= 4);
        Ok(())
    }

    #[test]
    fn strict_entries_refuse_unknown_keys() {
        let policy = StdioPolicy::new(None, None);
        let lookup = |_: &str| None;
        let strict = EntryContext { strict: true, ..ctx(&policy, &lookup) };
        let problem = parse_entry("s", &json!({"command": "npx", "comand": "x"}), strict).err();
        assert_eq!(problem.map(|p| p.field), Some("comand".to_owned()));
    }

    #[test]
    fn fingerprints_ignore_key_order_but_not_values() -> Result<(), EntryProblem> {
        let a = parse("s", json!({"command": "npx", "args": ["a"]}))?;
        let b = parse("s", json!({"args": ["a"], "command": "npx"}))?;
        let c = parse("s", json!({"args": ["b"], "command": "npx"}))?;
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_ne!(a.fingerprint, c.fingerprint);
        Ok(())
    }

    #[test]
    fn the_file_yields_its_servers_and_reports_bad_json_with_a_position() {
        let file = parse_file(Path::new("e.json"), br#"{"mcpServers": {"b": {}, "a": {}}, "skills": {}}"#);
        let file = file.ok();
        assert_eq!(file.as_ref().map(|f| f.servers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()), Some(vec!["a", "b"]));
        assert_eq!(file.map(|f| f.ignored_keys), Some(vec!["skills".to_owned()]));
        let err = parse_file(Path::new("e.json"), b"{\"mcpServers\": {").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("not valid JSON") && err.contains("line 1"), "{err}");
    }

    #[test]
    fn the_file_is_found_the_way_deerflow_finds_it() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        assert_eq!(locate(None, None, dir.path())?, None);
        std::fs::write(dir.path().join("mcp_config.json"), "{}")?;
        assert_eq!(locate(None, None, dir.path())?, Some(dir.path().join("mcp_config.json")));
        std::fs::write(dir.path().join("extensions_config.json"), "{}")?;
        assert_eq!(locate(None, None, dir.path())?, Some(dir.path().join("extensions_config.json")));
        let named = dir.path().join("other.json");
        assert!(locate(None, Some(named.to_str().unwrap_or_default()), dir.path()).is_err(), "a missing env file is an error");
        std::fs::write(&named, "{}")?;
        assert_eq!(locate(None, Some(named.to_str().unwrap_or_default()), dir.path())?, Some(named.clone()));
        assert_eq!(
            locate(Some(Path::new("/x.json")), Some(named.to_str().unwrap_or_default()), dir.path())?,
            Some(PathBuf::from("/x.json"))
        );
        Ok(())
    }
}
