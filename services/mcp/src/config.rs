//! The `mcp` section of `antler.yaml`: where the server list comes from, the stdio policy, the pool's
//! limits and the per-call limits. Every limit is a setting, checked at load time with its range.
//!
//! ```yaml
//! mcp:
//!   extensions_config: ./extensions_config.json   # else $DEER_FLOW_EXTENSIONS_CONFIG_PATH, else ./extensions_config.json
//!   servers:                                       # inline entries, DeerFlow shape; win over the file's
//!     everything: { command: npx, args: ["-y", "@modelcontextprotocol/server-everything"] }
//!   stdio: { command_allowlist: [npx, uvx, node, python3] }
//!   pool: { max_sessions: 256, session_ttl_secs: 300, idle_evict_secs: 600 }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use antler_kit::Config;
use antler_kit::config::{ConfigError, check_range};
use serde::Deserialize;

use crate::extensions::{self, EntryContext};
use crate::hardening::{self, StdioPolicy};

const MIB: u64 = 1024 * 1024;

/// Settings of the mcp service.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// DeerFlow's `extensions_config.json`. Relative paths are taken from the directory of antler.yaml.
    /// Unset: `$DEER_FLOW_EXTENSIONS_CONFIG_PATH`, then `extensions_config.json` / `mcp_config.json` in the
    /// working directory, then none.
    pub extensions_config: Option<PathBuf>,
    /// Server entries in DeerFlow's `mcpServers` shape; an inline entry wins over a file entry of the same
    /// name. Unlike the file, unknown keys are refused (antler.yaml is strict everywhere).
    pub servers: BTreeMap<String, serde_json::Value>,
    /// What stdio servers may run.
    pub stdio: StdioConfig,
    /// The session pool.
    pub pool: PoolConfig,
    /// Tool calls.
    pub calls: CallsConfig,
    /// Token requests of OAuth-protected servers.
    pub oauth: OAuthConfig,
    /// Deferred tools (DeerFlow's `tool_search`).
    pub tool_search: ToolSearchConfig,
    /// How often the extensions file is checked for changes, in milliseconds (0 = only on ReloadConfig).
    pub reload_interval_ms: u64,
    /// How long ListTools / SearchTools (and so a lead agent's run start) wait for a server that is still
    /// starting, in milliseconds, counted from when that server's start began (0..600000). A server not
    /// ready by then is named in `not_ready` and keeps starting in the background. Servers whose last
    /// attempt failed or whose breaker is open are never waited for.
    pub listing_wait_ms: u64,
    /// Users who may call ReloadConfig, GetConfig and UpdateConfig. Empty: every caller may.
    pub operators: Vec<String>,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            extensions_config: None,
            servers: BTreeMap::new(),
            stdio: StdioConfig::default(),
            pool: PoolConfig::default(),
            calls: CallsConfig::default(),
            oauth: OAuthConfig::default(),
            tool_search: ToolSearchConfig::default(),
            reload_interval_ms: 2_000,
            listing_wait_ms: 5_000,
            operators: Vec::new(),
        }
    }
}

/// `mcp.stdio`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StdioConfig {
    /// Commands a stdio server may be (bare names looked up on PATH, or absolute paths listed verbatim).
    /// Unset: npx, uvx, node, python3. `$DEER_FLOW_MCP_STDIO_COMMAND_ALLOWLIST` (comma-separated) adds to it.
    pub command_allowlist: Option<Vec<String>>,
}

/// `mcp.pool`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Sessions kept open at once, all servers and scopes; the least recently used idle one is closed to
    /// make room (1..100000).
    pub max_sessions: u64,
    /// Calls in flight at once on one pooled session (the per-key cap); further calls wait (1..10000).
    pub max_calls_per_session: u64,
    /// A remote (sse/http) session older than this is not reused, in seconds (0 = no limit).
    pub session_ttl_secs: u64,
    /// The same for stdio sessions. Default 0: a stdio server holds its thread's state, so it lives until
    /// idle eviction.
    pub stdio_session_ttl_secs: u64,
    /// A session unused for this long is closed, in seconds (0 = never).
    pub idle_evict_secs: u64,
    /// A session unused for this long is pinged before it serves a call, in seconds (0 = never).
    pub health_check_idle_secs: u64,
    /// Bound on that ping, in milliseconds.
    pub health_check_timeout_ms: u64,
    /// Consecutive session-start failures of one server that open its circuit breaker (1..1000).
    pub breaker_failures: u64,
    /// How long an open breaker refuses calls before one trial, in seconds (1..86400).
    pub breaker_reset_secs: u64,
    /// How often idle and expired sessions are swept, in seconds (1..3600).
    pub sweep_interval_secs: u64,
    /// Open the optional GET stream of each streamable HTTP session, on which a server sends messages
    /// unrelated to a call (`tools/list_changed`, its own requests). Off by default: Antler answers no
    /// server request, and each stream holds a connection per pooled session.
    pub http_listen_stream: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            max_sessions: 256,
            max_calls_per_session: 32,
            session_ttl_secs: 300,
            stdio_session_ttl_secs: 0,
            idle_evict_secs: 600,
            health_check_idle_secs: 60,
            health_check_timeout_ms: 5_000,
            breaker_failures: 5,
            breaker_reset_secs: 60,
            sweep_interval_secs: 15,
            http_listen_stream: false,
        }
    }
}

/// `mcp.calls`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallsConfig {
    /// Time allowed for a call whose request and server entry give none, in seconds.
    pub default_timeout_secs: u64,
    /// Largest timeout a request or an entry may ask for, in seconds (1..86400).
    pub max_timeout_secs: u64,
    /// Largest CallTool result, in bytes (also the largest HTTP response accepted from a server).
    pub max_result_bytes: u64,
    /// Largest `arguments` object, in bytes of JSON.
    pub max_argument_bytes: u64,
}

impl Default for CallsConfig {
    fn default() -> Self {
        Self { default_timeout_secs: 120, max_timeout_secs: 1_800, max_result_bytes: 16 * MIB, max_argument_bytes: MIB }
    }
}

/// `mcp.oauth`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OAuthConfig {
    /// Bound on one token request, in seconds (DeerFlow: 15).
    pub token_timeout_secs: u64,
}

impl Default for OAuthConfig {
    fn default() -> Self {
        Self { token_timeout_secs: 15 }
    }
}

/// `mcp.tool_search`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolSearchConfig {
    /// Mark every MCP tool deferred (hidden from the model until `tool_search` promotes it) and publish the
    /// catalog hash.
    pub enabled: bool,
}

impl McpConfig {
    pub fn policy(&self) -> StdioPolicy {
        StdioPolicy::new(self.stdio.command_allowlist.as_deref(), std::env::var(hardening::ALLOWLIST_ENV).ok().as_deref())
    }

    pub fn listing_wait(&self) -> Duration {
        Duration::from_millis(self.listing_wait_ms)
    }

    pub fn max_call_timeout(&self) -> Duration {
        Duration::from_secs(self.calls.max_timeout_secs)
    }

    /// The configured extensions file, made absolute against antler.yaml's directory.
    pub fn configured_file(&self, antler_yaml: Option<&Path>) -> Option<PathBuf> {
        let path = self.extensions_config.as_ref()?;
        if path.is_absolute() {
            return Some(path.clone());
        }
        let base = antler_yaml.and_then(Path::parent).filter(|p| !p.as_os_str().is_empty());
        Some(base.map_or_else(|| path.clone(), |dir| dir.join(path)))
    }

    fn check(&self) -> Result<(), ConfigError> {
        let p = &self.pool;
        check_range("mcp.pool.max_sessions", p.max_sessions, 1, 100_000)?;
        check_range("mcp.pool.max_calls_per_session", p.max_calls_per_session, 1, 10_000)?;
        check_range("mcp.pool.session_ttl_secs", p.session_ttl_secs, 0, 86_400 * 30)?;
        check_range("mcp.pool.stdio_session_ttl_secs", p.stdio_session_ttl_secs, 0, 86_400 * 30)?;
        check_range("mcp.pool.idle_evict_secs", p.idle_evict_secs, 0, 86_400 * 30)?;
        check_range("mcp.pool.health_check_idle_secs", p.health_check_idle_secs, 0, 86_400)?;
        check_range("mcp.pool.health_check_timeout_ms", p.health_check_timeout_ms, 1, 600_000)?;
        check_range("mcp.pool.breaker_failures", p.breaker_failures, 1, 1_000)?;
        check_range("mcp.pool.breaker_reset_secs", p.breaker_reset_secs, 1, 86_400)?;
        check_range("mcp.pool.sweep_interval_secs", p.sweep_interval_secs, 1, 3_600)?;
        let c = &self.calls;
        check_range("mcp.calls.max_timeout_secs", c.max_timeout_secs, 1, 86_400)?;
        check_range("mcp.calls.default_timeout_secs", c.default_timeout_secs, 1, c.max_timeout_secs)?;
        check_range("mcp.calls.max_result_bytes", c.max_result_bytes, 1024, 1 << 30)?;
        check_range("mcp.calls.max_argument_bytes", c.max_argument_bytes, 16, 1 << 30)?;
        check_range("mcp.oauth.token_timeout_secs", self.oauth.token_timeout_secs, 1, 600)?;
        check_range("mcp.reload_interval_ms", self.reload_interval_ms, 0, 3_600_000)?;
        check_range("mcp.listing_wait_ms", self.listing_wait_ms, 0, 600_000)?;
        if let Some(bad) = self.operators.iter().find(|u| !antler_kit::auth::valid_user_id(u)) {
            return Err(ConfigError::Invalid { path: "mcp.operators".to_owned(), message: format!("`{bad}` is not a valid user id") });
        }
        Ok(())
    }
}

/// Parses and checks the section, including the inline servers (strictly) and the named file's existence.
pub fn load(config: &Config) -> Result<McpConfig, ConfigError> {
    let mcp: McpConfig = config.section("mcp")?;
    mcp.check()?;
    let policy = mcp.policy();
    // antler.yaml's variables are already resolved by the kit; a literal `$` left in an inline entry is
    // resolved again from the environment, the same as a file entry.
    let lookup = |name: &str| std::env::var(name).ok();
    let ctx = EntryContext { policy: &policy, lookup: &lookup, max_call_timeout: mcp.max_call_timeout(), strict: true };
    for (name, raw) in &mcp.servers {
        extensions::parse_entry(name, raw, ctx).map_err(|p| ConfigError::Invalid {
            path: if p.field.is_empty() { format!("mcp.servers.{name}") } else { format!("mcp.servers.{name}.{}", p.field) },
            message: p.message,
        })?;
    }
    if let Some(path) = mcp.configured_file(config.path.as_deref())
        && !path.is_file()
    {
        return Err(ConfigError::Invalid {
            path: "mcp.extensions_config".to_owned(),
            message: format!("{} does not exist", path.display()),
        });
    }
    Ok(mcp)
}

/// The kit's validation hook.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    load(config).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<McpConfig, ConfigError> {
        let config = Config::parse(yaml, "antler.yaml", &|_| None)?;
        load(&config)
    }

    #[test]
    fn defaults_match_the_documented_values() -> Result<(), ConfigError> {
        let config = parse("")?;
        assert_eq!(config.pool.max_sessions, 256);
        assert_eq!(config.pool.session_ttl_secs, 300);
        assert_eq!(config.pool.idle_evict_secs, 600);
        assert_eq!(config.pool.breaker_failures, 5);
        assert_eq!(config.calls.default_timeout_secs, 120);
        assert_eq!(config.listing_wait_ms, 5_000);
        assert_eq!(config.policy().allowlist, vec!["npx", "uvx", "node", "python3"]);
        Ok(())
    }

    #[test]
    fn the_example_lists_the_defaults() -> Result<(), ConfigError> {
        let text = include_str!("../../../examples/antler.yaml");
        let example = load(&Config::parse(text, "examples/antler.yaml", &|_| None)?)?;
        let defaults = McpConfig::default();
        assert_eq!(format!("{:?}", example.pool), format!("{:?}", defaults.pool));
        assert_eq!(format!("{:?}", example.calls), format!("{:?}", defaults.calls));
        assert_eq!(example.reload_interval_ms, defaults.reload_interval_ms);
        assert_eq!(example.listing_wait_ms, defaults.listing_wait_ms);
        Ok(())
    }

    #[test]
    fn limits_and_inline_entries_are_checked_with_their_paths() {
        let text = parse("mcp:\n  pool:\n    max_sessions: 0\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("mcp.pool.max_sessions"), "{text}");
        let text = parse("mcp:\n  servers:\n    evil:\n      command: bash\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("mcp.servers.evil.command") && text.contains("allowlist"), "{text}");
        let text = parse("mcp:\n  servers:\n    s:\n      command: npx\n      argz: []\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("mcp.servers.s.argz"), "{text}");
        let text = parse("mcp:\n  listing_wait_ms: 600001\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("mcp.listing_wait_ms"), "{text}");
        let text = parse("mcp:\n  extensions_config: /nonexistent/e.json\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("mcp.extensions_config"), "{text}");
    }
}
