//! One MCP server as Antler runs it: the validated form of an `mcpServers` entry.

use std::collections::BTreeMap;
use std::time::Duration;

/// How Antler talks to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransportKind {
    /// A child process speaking JSON-RPC on stdin/stdout.
    Stdio,
    /// Legacy HTTP + Server-Sent Events (GET an event stream, POST to the endpoint it names).
    Sse,
    /// Streamable HTTP.
    Http,
}

impl TransportKind {
    pub fn label(self) -> &'static str {
        match self {
            Self::Stdio => "stdio",
            Self::Sse => "sse",
            Self::Http => "http",
        }
    }

    pub fn is_remote(self) -> bool {
        !matches!(self, Self::Stdio)
    }
}

/// Which OAuth grant fetches the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    ClientCredentials,
    RefreshToken,
}

/// `oauth` of a server entry (DeerFlow's `McpOAuthConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthSpec {
    pub token_url: String,
    pub grant: Grant,
    pub client_id: String,
    pub client_secret: String,
    pub refresh_token: String,
    pub scope: String,
    pub audience: String,
    pub token_field: String,
    pub token_type_field: String,
    pub expires_in_field: String,
    pub default_token_type: String,
    /// A token is refreshed this long before it expires.
    pub refresh_skew: Duration,
    pub extra_token_params: BTreeMap<String, String>,
}

/// How a server's protocol lifecycle is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Probe with `server/discover` (2026-07-28, stateless) and fall back to `initialize` (2025-11-25).
    Auto,
    /// Only the `initialize` handshake (sessions).
    Initialize,
    /// Only `server/discover` (stateless servers).
    Stateless,
}

/// A validated server entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSpec {
    /// The key under `mcpServers`.
    pub name: String,
    pub enabled: bool,
    pub transport: TransportKind,
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub url: String,
    pub headers: BTreeMap<String, String>,
    pub oauth: Option<OAuthSpec>,
    pub description: String,
    pub tool_name_prefix: bool,
    /// Per-call time limit; None = the service default.
    pub tool_call_timeout: Option<Duration>,
    /// Bound on starting a session and listing its tools.
    pub session_init_timeout: Duration,
    pub lifecycle: Lifecycle,
    /// Antler extension: only these users see the server. None = every user.
    pub users: Option<Vec<String>>,
    /// Keys of the entry that Antler does not use (kept for the change fingerprint, logged once).
    pub ignored_keys: Vec<String>,
    /// SHA-256 of the entry as written (after `$VAR` resolution): a reload compares it to tell a changed
    /// server from an unchanged one.
    pub fingerprint: [u8; 32],
}

impl ServerSpec {
    /// Whether `user` may see and call this server.
    pub fn visible_to(&self, user: &str) -> bool {
        self.users.as_ref().is_none_or(|users| users.iter().any(|u| u == user))
    }
}
