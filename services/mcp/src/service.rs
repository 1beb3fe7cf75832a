//! The domain entry point: servers in force, discovery, tool calls, reloads and pool statistics. The gRPC
//! layer ([`crate::api`]) only converts.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use antler_sandbox::workspace::Layout;
use futures::{FutureExt, StreamExt};
use rmcp::model::CallToolRequestParams;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::catalog::{self, ToolEntry};
use crate::config::McpConfig;
use crate::discovery::{Flight, Tools};
use crate::error::{McpError, Result};
use crate::extensions::EntryProblem;
use crate::loader::{self, Loaded};
use crate::oauth::TokenSource;
use crate::pool::breaker::{Breaker, CircuitState};
use crate::pool::counters::{Counters, Event};
use crate::pool::{Lease, Pool, PoolKey, PoolSettings, ServerRef, SessionCounts};
use crate::redact::redact;
use crate::servers::{ServerRuntime, Status};
use crate::spec::TransportKind;
use crate::transports::{self, Target};

/// The scope of calls that name no thread (DeerFlow's "default").
pub const DEFAULT_THREAD: &str = "default";

/// The configuration in force.
#[derive(Debug)]
pub struct Snapshot {
    pub servers: BTreeMap<String, Arc<ServerRuntime>>,
    pub problems: Vec<EntryProblem>,
    pub hash: String,
    pub loaded_at: SystemTime,
    pub file: Option<PathBuf>,
}

/// What ReloadConfig reports.
#[derive(Debug, Clone, Default)]
pub struct ReloadReport {
    pub changed: bool,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed_servers: Vec<String>,
    pub problems: Vec<EntryProblem>,
    pub sessions_closed: u32,
    pub hash: String,
}

/// A CallTool request after validation of its own fields.
#[derive(Debug, Clone)]
pub struct CallInput {
    pub tool_name: String,
    pub arguments: Map<String, Value>,
    pub thread_id: Option<String>,
    pub timeout: Option<Duration>,
    pub run_id: String,
    pub tool_call_id: String,
}

/// A finished call.
#[derive(Debug)]
pub struct CallOutput {
    pub result: rmcp::model::CallToolResult,
    pub server: String,
    pub original_name: String,
    pub duration: Duration,
    pub session_reused: bool,
    pub session_reinitialized: bool,
    /// Host → virtual path rewrites of the call's thread.
    pub rewrites: Vec<(String, String)>,
}

/// A listing.
#[derive(Debug)]
pub struct ToolListing {
    /// The tools of the servers that were ready, sorted by exposed name.
    pub tools: Vec<Arc<ToolEntry>>,
    /// The enabled servers left out, by name, and why.
    pub not_ready: Vec<(String, NotReady)>,
    pub catalog_hash: String,
}

/// Why a server's tools are missing from a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Its start has been under way this long.
    Starting(Duration),
    /// Its last attempt failed with this (redacted) error; retried in the background.
    Failed(String),
    /// Its breaker is open; the last error.
    BreakerOpen(String),
}

/// One server's part of a listing.
enum Readiness {
    Ready(Tools),
    NotReady(NotReady),
}

/// What an exposed name of `server` starts with when the server prefixes its tools.
fn server_prefix(server: &str) -> String {
    format!("{}_", catalog::sanitize(server))
}

/// Whether `runtime` could expose a tool named `name`: any name when it does not prefix, else only
/// names under its prefix.
fn could_own(runtime: &ServerRuntime, name: &str) -> bool {
    !runtime.spec.tool_name_prefix || name.starts_with(&server_prefix(&runtime.spec.name))
}

pub struct Hub {
    config: RwLock<Arc<McpConfig>>,
    antler_yaml: Option<PathBuf>,
    cwd: PathBuf,
    data_dir: PathBuf,
    layout: Layout,
    snapshot: RwLock<Arc<Snapshot>>,
    pool: Arc<Pool>,
    counters: Mutex<HashMap<String, Arc<Counters>>>,
    reload_lock: tokio::sync::Mutex<()>,
    /// Serialises UpdateConfig's read-modify-write of the extensions file.
    edit_lock: tokio::sync::Mutex<()>,
    /// Cancelled at shutdown: ends the discoveries still running.
    stop: CancellationToken,
    pub started: SystemTime,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

fn secs(value: u64) -> Option<Duration> {
    (value > 0).then(|| Duration::from_secs(value))
}

impl Hub {
    /// Builds the hub and loads the servers. An unreadable extensions file at start-up is an error.
    pub fn new(mcp: McpConfig, antler_yaml: Option<&Path>, data_dir: &Path, cwd: PathBuf) -> std::result::Result<Arc<Self>, String> {
        let layout = Layout::new(data_dir, &Default::default(), antler_sandbox::resolve::Ownership::default())
            .map_err(|e| format!("cannot prepare the workspace directories under {}: {e}", data_dir.display()))?;
        let p = &mcp.pool;
        let pool = Pool::new(PoolSettings {
            max_sessions: p.max_sessions as usize,
            max_calls_per_session: p.max_calls_per_session as usize,
            idle_evict: secs(p.idle_evict_secs),
            health_check_idle: secs(p.health_check_idle_secs),
            health_check_timeout: Duration::from_millis(p.health_check_timeout_ms),
        });
        let loaded = loader::load(&mcp, antler_yaml, &cwd).map_err(|e| e.to_string())?;
        let hub = Arc::new(Self {
            config: RwLock::new(Arc::new(mcp)),
            antler_yaml: antler_yaml.map(Path::to_path_buf),
            cwd,
            data_dir: std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf()),
            layout,
            snapshot: RwLock::new(Arc::new(Snapshot {
                servers: BTreeMap::new(),
                problems: Vec::new(),
                hash: String::new(),
                loaded_at: SystemTime::now(),
                file: None,
            })),
            pool,
            counters: Mutex::new(HashMap::new()),
            reload_lock: tokio::sync::Mutex::new(()),
            edit_lock: tokio::sync::Mutex::new(()),
            stop: CancellationToken::new(),
            started: SystemTime::now(),
        });
        hub.apply(loaded, true);
        Ok(hub)
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn config(&self) -> Arc<McpConfig> {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The extensions file in force, for the watcher.
    pub fn watched_file(&self) -> Option<PathBuf> {
        self.snapshot().file.clone()
    }

    fn counters_for(&self, server: &str) -> Arc<Counters> {
        self.counters.lock().unwrap_or_else(|p| p.into_inner()).entry(server.to_owned()).or_default().clone()
    }

    fn runtime(&self, spec: crate::spec::ServerSpec, config: &McpConfig) -> Arc<ServerRuntime> {
        let timeout = Duration::from_secs(config.oauth.token_timeout_secs);
        // One client per server; rustls, HTTP/2 when the server offers it, keep-alive connections reused.
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build().unwrap_or_default();
        crate::redact::register_spec(&spec);
        let oauth = spec.oauth.clone().map(|o| Arc::new(TokenSource::new(o, http.clone(), timeout)));
        let breaker = Arc::new(Breaker::new(config.pool.breaker_failures as u32, Duration::from_secs(config.pool.breaker_reset_secs)));
        Arc::new(ServerRuntime::new(spec.clone(), self.counters_for(&spec.name), breaker, oauth, http))
    }

    /// Applies a loaded configuration: unchanged servers keep their runtime and sessions, changed and
    /// removed ones are closed.
    fn apply(&self, loaded: Loaded, force: bool) -> ReloadReport {
        let config = self.config();
        let old = self.snapshot();
        let mut report = ReloadReport { problems: loaded.problems.clone(), hash: loaded.hash.clone(), ..ReloadReport::default() };
        if !force && old.hash == loaded.hash {
            return report;
        }
        report.changed = true;
        let mut servers = BTreeMap::new();
        for (name, spec) in loaded.servers {
            match old.servers.get(&name) {
                Some(runtime) if !force && runtime.spec.fingerprint == spec.fingerprint => {
                    servers.insert(name, runtime.clone());
                }
                Some(_) => {
                    report.sessions_closed += self.pool.close_server(&name);
                    report.changed_servers.push(name.clone());
                    servers.insert(name, self.runtime(spec, &config));
                }
                None => {
                    report.added.push(name.clone());
                    servers.insert(name, self.runtime(spec, &config));
                }
            }
        }
        for name in old.servers.keys().filter(|n| !servers.contains_key(*n)) {
            report.sessions_closed += self.pool.close_server(name);
            report.removed.push(name.clone());
        }
        let snapshot = Snapshot { servers, problems: loaded.problems, hash: loaded.hash, loaded_at: SystemTime::now(), file: loaded.file };
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snapshot);
        tracing::info!(
            hash = %report.hash, added = ?report.added, removed = ?report.removed, changed = ?report.changed_servers,
            problems = report.problems.len(), sessions_closed = report.sessions_closed, "MCP servers loaded"
        );
        metrics::counter!("antler_mcp_config_reloads_total", "outcome" => "applied").increment(1);
        report
    }

    /// Re-reads the configuration (ReloadConfig, the file watcher, and antler.yaml changes).
    pub async fn reload(&self, new_config: Option<McpConfig>, force: bool) -> Result<ReloadReport> {
        let _guard = self.reload_lock.lock().await;
        let config = new_config.map(Arc::new).unwrap_or_else(|| self.config());
        let loaded = loader::load(&config, self.antler_yaml.as_deref(), &self.cwd).map_err(|e| {
            metrics::counter!("antler_mcp_config_reloads_total", "outcome" => "rejected").increment(1);
            McpError::FailedPrecondition(format!("{e}\nhint: the last good configuration stays in effect"))
        })?;
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
        Ok(self.apply(loaded, force))
    }

    /// The extensions file GetConfig reads and UpdateConfig writes: the one in force, else where
    /// `mcp.extensions_config` says (created by the first write).
    fn editable_file(&self) -> Result<PathBuf> {
        let config = self.config();
        let env_path = std::env::var(crate::extensions::PATH_ENV).ok();
        crate::extensions::locate(config.configured_file(self.antler_yaml.as_deref()).as_deref(), env_path.as_deref(), &self.cwd)
            .map_err(|e| McpError::FailedPrecondition(e.to_string()))?
            .ok_or_else(|| {
                McpError::FailedPrecondition(
                    "no extensions file is configured or found\nhint: set mcp.extensions_config (a new file is created there)".to_owned(),
                )
            })
    }

    fn require_operator(&self, user: &str, what: &str) -> Result<()> {
        if self.may_reload(user) {
            return Ok(());
        }
        Err(McpError::PermissionDenied(format!("user `{user}` may not {what} the MCP config (mcp.operators)")))
    }

    /// GetConfig: the file's entries (secrets masked), the inline servers' names, the hash in force.
    pub async fn get_config(&self, user: &str) -> Result<(Map<String, Value>, Vec<String>, String)> {
        self.require_operator(user, "read")?;
        let servers = match self.editable_file() {
            Ok(path) => {
                let root = tokio::task::spawn_blocking(move || crate::editor::read_root(&path))
                    .await
                    .map_err(|e| McpError::Internal(format!("reading the extensions file failed: {e}")))??;
                crate::editor::mask_all(&crate::editor::servers_of(&root))
            }
            Err(_) => Map::new(),
        };
        let inline = self.config().servers.keys().cloned().collect();
        Ok((servers, inline, self.snapshot().hash.clone()))
    }

    /// UpdateConfig: computes the new `mcpServers` (replace or merge, masked secrets restored), checks
    /// every entry as a reload would, writes the file atomically and applies it.
    pub async fn update_config(
        &self,
        user: &str,
        servers: Map<String, Value>,
        replace: bool,
    ) -> Result<(Map<String, Value>, ReloadReport)> {
        self.require_operator(user, "change")?;
        let _edit = self.edit_lock.lock().await;
        let path = self.editable_file()?;
        let read = path.clone();
        let mut root = tokio::task::spawn_blocking(move || crate::editor::read_root(&read))
            .await
            .map_err(|e| McpError::Internal(format!("reading the extensions file failed: {e}")))??;
        let next = crate::editor::apply(&crate::editor::servers_of(&root), servers, replace)?;
        let config = self.config();
        let policy = config.policy();
        let lookup = |name: &str| std::env::var(name).ok();
        let ctx = crate::extensions::EntryContext {
            policy: &policy,
            lookup: &lookup,
            max_call_timeout: config.max_call_timeout(),
            strict: false,
        };
        for (name, raw) in &next {
            crate::extensions::parse_entry(name, raw, ctx).map_err(|p| {
                let field = if p.field.is_empty() { format!("servers.{name}") } else { format!("servers.{name}.{}", p.field) };
                McpError::invalid(field, p.message)
            })?;
        }
        root.remove("mcp_servers");
        root.insert("mcpServers".to_owned(), Value::Object(next.clone()));
        let write = path.clone();
        tokio::task::spawn_blocking(move || crate::editor::write_root(&write, &root))
            .await
            .map_err(|e| McpError::Internal(format!("writing the extensions file failed: {e}")))??;
        tracing::info!(user, file = %path.display(), servers = next.len(), replace, "extensions config written");
        let report = self.reload(None, false).await?;
        Ok((crate::editor::mask_all(&next), report))
    }

    /// Whether `user` may call ReloadConfig.
    pub fn may_reload(&self, user: &str) -> bool {
        let config = self.config();
        config.operators.is_empty() || config.operators.iter().any(|o| o == user)
    }

    /// Servers `user` sees.
    pub fn visible(&self, snapshot: &Snapshot, user: &str) -> Vec<Arc<ServerRuntime>> {
        snapshot.servers.values().filter(|s| s.spec.visible_to(user)).cloned().collect()
    }

    fn redact_for(&self, text: &str) -> String {
        let text = redact(text);
        let data_dir = self.data_dir.to_string_lossy();
        if data_dir.len() > 1 { text.replace(data_dir.as_ref(), "<data_dir>") } else { text }
    }

    /// A pooled session of `runtime` for `user` (and `thread`, for stdio servers).
    async fn lease(&self, runtime: &Arc<ServerRuntime>, user: &str, thread: &str) -> Result<(Lease, PoolKey)> {
        let spec = &runtime.spec;
        // Only what the key needs is computed per call; the session's target is built when one starts.
        let mut authorization = None;
        let scope = match spec.transport {
            TransportKind::Stdio => format!("{user}\u{0}{thread}"),
            TransportKind::Sse | TransportKind::Http => {
                if let Some(oauth) = &runtime.oauth {
                    authorization = Some(oauth.authorization().await.map_err(|e| {
                        let message = format!("server `{}`: {e}", spec.name);
                        runtime.set_error(message.clone());
                        McpError::unavailable(message, 5)
                    })?);
                }
                // Two users never share a session, and a changed credential (a refreshed token) is a new key.
                let mut hasher = Sha256::new();
                hasher.update(user.as_bytes());
                let oauth_header = authorization.as_ref().map(|h| ("authorization", h));
                for (k, v) in spec.headers.iter().map(|(k, v)| (k.as_str(), v)).chain(oauth_header) {
                    hasher.update([0]);
                    hasher.update(k.to_ascii_lowercase().as_bytes());
                    hasher.update([0]);
                    hasher.update(v.as_bytes());
                }
                hex::encode(hasher.finalize())
            }
        };
        let key = PoolKey { server: spec.name.clone(), transport: spec.transport, scope };
        let config = self.config();
        let server = ServerRef {
            name: spec.name.clone(),
            counters: runtime.counters.clone(),
            breaker: runtime.breaker.clone(),
            ttl: secs(if spec.transport == TransportKind::Stdio {
                config.pool.stdio_session_ttl_secs
            } else {
                config.pool.session_ttl_secs
            }),
            init_timeout: spec.session_init_timeout,
        };
        let connect = || {
            let runtime = runtime.clone();
            let workspace = (spec.transport == TransportKind::Stdio)
                .then(|| self.layout.workspace(user, thread).host_root(antler_sandbox::paths::Root::Workspace));
            let data_dir = self.data_dir.to_string_lossy().into_owned();
            async move {
                let spec = &runtime.spec;
                let mut headers = spec.headers.clone();
                if let Some(value) = authorization {
                    headers.insert("Authorization".to_owned(), value);
                }
                let tmp = workspace.as_ref().map(|cwd| cwd.join(".mcp").join("tmp"));
                if let (Some(cwd), Some(tmp)) = (&workspace, &tmp) {
                    std::fs::create_dir_all(cwd).and_then(|()| std::fs::create_dir_all(tmp)).map_err(|e| {
                        McpError::unavailable(format!("server `{}`: cannot create its working directory: {}", spec.name, e.kind()), 5)
                    })?;
                }
                let target = Target {
                    cwd: workspace,
                    tmp,
                    headers,
                    http: runtime.http.clone(),
                    max_response_bytes: config.calls.max_result_bytes as usize,
                    listen_stream: config.pool.http_listen_stream,
                };
                transports::connect(spec, &target).await.map_err(|message| {
                    let message = redact(&message).replace(&data_dir, "<data_dir>");
                    McpError::unavailable(format!("server `{}`: {message}", spec.name), 5)
                })
            }
            .boxed()
        };
        match self.pool.acquire(&server, key.clone(), connect).await {
            Ok(lease) => {
                if !lease.reused {
                    runtime.set_protocol_version(&lease.session.conn.protocol_version);
                }
                Ok((lease, key))
            }
            Err(error) => {
                runtime.set_error(error.to_string());
                Err(error)
            }
        }
    }

    /// The discovery of `runtime` under way, or a new one started as `user` (in its own task: see
    /// [`crate::discovery`]).
    fn flight(self: &Arc<Self>, runtime: &Arc<ServerRuntime>, user: &str) -> Flight {
        let hub = self.clone();
        let server = runtime.clone();
        let user = user.to_owned();
        runtime.discovery.join_or_start(&runtime.spec.name, &self.stop, move || hub.discover_now(server, user).boxed())
    }

    /// Lists one server's tools (bounded by `session_init_timeout`) and records the outcome on it.
    async fn discover_now(self: Arc<Self>, runtime: Arc<ServerRuntime>, user: String) -> Result<Tools> {
        // The slot may have just been freed by a discovery that listed them.
        if let Some(tools) = runtime.fresh_tools() {
            return Ok(tools);
        }
        let spec = &runtime.spec;
        let listing = async {
            let (lease, key) = self.lease(&runtime, &user, DEFAULT_THREAD).await?;
            let listed = lease.session.conn.service.list_all_tools_with_cache_hint().await;
            match listed {
                Ok(list) => Ok((list, lease.session.conn.tools_changed.clone(), lease.session.conn.protocol_version.clone())),
                Err(error) => {
                    if lease.session.is_closed() {
                        self.pool.discard(&key, &lease.session);
                    }
                    Err(McpError::unavailable(format!("server `{}`: tools/list failed: {error}", spec.name), 5))
                }
            }
        };
        let result = match tokio::time::timeout(spec.session_init_timeout, listing).await {
            Ok(result) => result,
            Err(_) => Err(McpError::unavailable(
                format!(
                    "server `{}`: tool discovery timed out after {}s (session_init_timeout)",
                    spec.name,
                    spec.session_init_timeout.as_secs_f64()
                ),
                5,
            )),
        };
        match result {
            Ok((list, changed, version)) => {
                let mut tools: Vec<Arc<ToolEntry>> = Vec::new();
                for tool in &list.items {
                    match ToolEntry::from_mcp(&spec.name, spec.tool_name_prefix, tool) {
                        Some(entry) => tools.push(Arc::new(entry)),
                        None => tracing::warn!(server = %spec.name, tool = %tool.name, "tool dropped: empty name"),
                    }
                }
                tools.sort_by(|a, b| a.name.cmp(&b.name));
                let ttl = list.ttl_ms.map(Duration::from_millis);
                tracing::info!(server = %spec.name, tools = tools.len(), protocol = %version, ttl_ms = ?list.ttl_ms, "tools discovered");
                let tools = Arc::new(tools);
                runtime.set_tools(tools.as_ref().clone(), ttl, changed, version);
                Ok(tools)
            }
            Err(error) => {
                let message = self.redact_for(&error.to_string());
                tracing::warn!(server = %spec.name, error = %message, "tool discovery failed");
                runtime.set_discovery_failed(message.clone());
                Err(match error {
                    McpError::Unavailable { retry_after_secs, .. } => McpError::Unavailable { message, retry_after_secs },
                    other => other,
                })
            }
        }
    }

    /// One server's tools for a listing, or why they are missing. Waits for a server that is starting
    /// until `wait` has passed since its start began; not at all for one whose last attempt failed (the
    /// retry goes on in the background) or whose breaker is open (nothing would be tried).
    async fn readiness(self: &Arc<Self>, runtime: &Arc<ServerRuntime>, user: &str, wait: Duration) -> Readiness {
        if let Some(tools) = runtime.fresh_tools() {
            return Readiness::Ready(tools);
        }
        let view = runtime.view();
        let last_error = || view.last_error.as_ref().map(|(message, _)| message.clone()).unwrap_or_default();
        if runtime.breaker.state() == CircuitState::Open {
            // Asking the pool would only be refused, and would replace the cause with the refusal.
            return Readiness::NotReady(NotReady::BreakerOpen(last_error()));
        }
        let flight = self.flight(runtime, user);
        // Otherwise a server that never answers would cost every listing the wait, one retry after another.
        let deadline = if view.status == Status::Error { Instant::now() } else { flight.started + wait };
        match flight.outcome_by(deadline).await {
            Some(Ok(tools)) => Readiness::Ready(tools),
            Some(Err(error)) => Readiness::NotReady(NotReady::Failed(self.redact_for(&error.to_string()))),
            // A stale listing being refreshed: the server's last word stands until the new one arrives.
            None if view.status == Status::Ready => Readiness::Ready(runtime.tools()),
            None if view.status == Status::Error => Readiness::NotReady(NotReady::Failed(last_error())),
            None => Readiness::NotReady(NotReady::Starting(flight.running_for())),
        }
    }

    /// The merged catalog of the servers `user` sees (optionally one server): each server is discovered
    /// on its own, and the listing returns what is ready within `mcp.listing_wait_ms` (see [`Self::readiness`]).
    pub async fn list_tools(self: &Arc<Self>, user: &str, only: Option<&str>) -> Result<ToolListing> {
        let snapshot = self.snapshot();
        let servers: Vec<Arc<ServerRuntime>> = self.visible(&snapshot, user);
        let servers: Vec<Arc<ServerRuntime>> = match only {
            Some(name) => {
                let found: Vec<_> = servers.into_iter().filter(|s| s.spec.name == name).collect();
                if found.is_empty() {
                    return Err(McpError::NotFound(format!(
                        "no MCP server named `{name}`\nhint: ListServers shows the configured servers"
                    )));
                }
                found
            }
            None => servers,
        };
        let enabled: Vec<Arc<ServerRuntime>> = servers.into_iter().filter(|s| s.spec.enabled).collect();
        let wait = self.config().listing_wait();
        let results = futures::future::join_all(enabled.iter().map(|s| self.readiness(s, user, wait))).await;
        let mut tools = Vec::new();
        let mut not_ready = Vec::new();
        for (server, result) in enabled.iter().zip(results) {
            match result {
                Readiness::Ready(list) => tools.extend(list.iter().cloned()),
                Readiness::NotReady(why) => {
                    tracing::debug!(server = %server.spec.name, why = ?why, "server left out of a listing");
                    not_ready.push((server.spec.name.clone(), why));
                }
            }
        }
        let tools = catalog::dedup(tools);
        let mut tools = tools;
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let catalog_hash =
            if self.config().tool_search.enabled && !tools.is_empty() { catalog::catalog_hash(&tools) } else { String::new() };
        Ok(ToolListing { tools, not_ready, catalog_hash })
    }

    /// Finds the server and tool behind an exposed name. An unknown name waits only for the servers
    /// that could own it, and only until one of them lists it.
    async fn find_tool(self: &Arc<Self>, user: &str, name: &str) -> Result<(Arc<ServerRuntime>, Arc<ToolEntry>)> {
        let snapshot = self.snapshot();
        let visible = self.visible(&snapshot, user);
        // A name that can only belong to a disabled server is refused as such, without discovery.
        let disabled =
            visible.iter().find(|s| !s.spec.enabled && s.spec.tool_name_prefix && name.starts_with(&server_prefix(&s.spec.name)));
        // The last listing resolves the name even when it is past its `ttlMs` (a 2026-07-28 server may send
        // 0, "immediately stale"): the server judges the call itself, so re-listing before every call would
        // only double its latency. Listings are refreshed by ListTools / SearchTools and for unknown names.
        // Servers in name order, as the catalog's dedup keeps the earlier server's tool.
        let resolve = || {
            visible
                .iter()
                .filter(|s| s.spec.enabled)
                .find_map(|runtime| runtime.tools().iter().find(|t| t.name == name).map(|tool| (runtime.clone(), tool.clone())))
        };
        if let Some(found) = resolve() {
            return Ok(found);
        }
        let mut pending: futures::stream::FuturesUnordered<_> = visible
            .iter()
            .filter(|s| s.spec.enabled && could_own(s, name) && s.fresh_tools().is_none())
            .map(|runtime| {
                let flight = self.flight(runtime, user);
                let runtime = runtime.clone();
                async move { (runtime, flight.outcome().await) }
            })
            .collect();
        let mut failed = Vec::new();
        while let Some((runtime, outcome)) = pending.next().await {
            if let Some(found) = resolve() {
                return Ok(found);
            }
            if let Err(error) = outcome {
                failed.push((runtime.spec.name.clone(), error));
            }
        }
        if let Some(found) = resolve() {
            return Ok(found);
        }
        if let Some(server) = disabled {
            return Err(McpError::FailedPrecondition(format!(
                "tool `{name}` belongs to MCP server `{}`, which is disabled in the config\nhint: set \"enabled\": true for it",
                server.spec.name
            )));
        }
        if !failed.is_empty() {
            // The tool may be one of theirs: the caller can retry, so this is UNAVAILABLE, not NOT_FOUND.
            let retry_after = failed
                .iter()
                .map(|(_, e)| match e {
                    McpError::Unavailable { retry_after_secs, .. } => *retry_after_secs,
                    _ => 5,
                })
                .min()
                .unwrap_or(5);
            let causes: Vec<String> = failed.iter().map(|(_, e)| self.redact_for(&e.to_string())).collect();
            return Err(McpError::unavailable(
                format!(
                    "MCP tool `{name}` is unknown for now: {}\nhint: the tool may be one of that server's; retry once it is back (ListServers shows its state)",
                    causes.join("; ")
                ),
                retry_after,
            ));
        }
        Err(McpError::NotFound(format!("no MCP tool named `{name}`\nhint: ListTools shows the tools")))
    }

    /// Calls a tool (see the CallTool contract in mcp.proto).
    pub async fn call(self: &Arc<Self>, user: &str, input: CallInput) -> Result<CallOutput> {
        let started = Instant::now();
        let config = self.config();
        let (runtime, tool) = self.find_tool(user, &input.tool_name).await?;
        crate::schema::check(&tool, &input.arguments, config.calls.max_argument_bytes as usize)?;
        let timeout = input.timeout.or(runtime.spec.tool_call_timeout).unwrap_or(Duration::from_secs(config.calls.default_timeout_secs));
        let thread = input.thread_id.clone().unwrap_or_else(|| DEFAULT_THREAD.to_owned());
        let rewrites = self.layout.workspace(user, &thread).masks();
        let server = runtime.spec.name.clone();
        let span = tracing::debug_span!("mcp_call", server = %server, tool = %tool.original, run_id = %input.run_id, tool_call_id = %input.tool_call_id);
        let work = tracing::Instrument::instrument(self.call_once(&runtime, &tool, user, &thread, &input.arguments), span);
        let outcome = match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(McpError::DeadlineExceeded(format!(
                "MCP tool `{}` on server `{server}` did not answer within {}s; the call was cancelled on the server but may still have taken effect",
                tool.name,
                timeout.as_secs_f64()
            ))),
        };
        let duration = started.elapsed();
        let label = match &outcome {
            Ok((result, _, _)) if result.is_error == Some(true) => "tool_error",
            Ok(_) => "ok",
            Err(e) => e.label(),
        };
        metrics::histogram!("antler_mcp_call_duration_seconds", "server" => server.clone(), "outcome" => label)
            .record(duration.as_secs_f64());
        let (result, reused, reinitialized) = outcome.map_err(|e| match e {
            McpError::Unavailable { message, retry_after_secs } => {
                McpError::Unavailable { message: self.redact_for(&message), retry_after_secs }
            }
            other => other,
        })?;
        Ok(CallOutput {
            result,
            server,
            original_name: tool.original.clone(),
            duration,
            session_reused: reused,
            session_reinitialized: reinitialized,
            rewrites,
        })
    }

    async fn call_once(
        &self,
        runtime: &Arc<ServerRuntime>,
        tool: &ToolEntry,
        user: &str,
        thread: &str,
        arguments: &Map<String, Value>,
    ) -> Result<(rmcp::model::CallToolResult, bool, bool)> {
        let name = &runtime.spec.name;
        let mut reinitialized = false;
        // At most two attempts: the second only after the server said it no longer knows the session (SSE
        // 404; streamable HTTP is re-initialised inside rmcp), where the first request was not processed.
        for attempt in 0..2 {
            let (lease, key) = self.lease(runtime, user, thread).await?;
            let before = lease.session.expirations_seen();
            let params = CallToolRequestParams::new(tool.original.clone()).with_arguments(arguments.clone());
            let result = lease.session.conn.service.call_tool(params).await;
            if lease.session.expirations_seen() > before {
                reinitialized = true;
                runtime.counters.record(name, Event::Reinitialization, 1);
            }
            match result {
                Ok(result) => return Ok((result, lease.reused, reinitialized)),
                Err(rmcp::ServiceError::McpError(error)) => {
                    let code = error.code.0;
                    let message =
                        format!("server `{name}` refused the call to `{}` (JSON-RPC error {code}): {}", tool.original, error.message);
                    return Err(if code == -32602 {
                        McpError::invalid("arguments", message)
                    } else {
                        McpError::FailedPrecondition(message)
                    });
                }
                Err(rmcp::ServiceError::TransportSend(error)) if sse_expired(&error) && attempt == 0 => {
                    self.pool.discard(&key, &lease.session);
                    reinitialized = true;
                    runtime.counters.record(name, Event::Reinitialization, 1);
                    tracing::info!(server = %name, "SSE session expired (404); re-initialising and retrying once");
                    continue;
                }
                Err(error) => {
                    let closed = lease.session.is_closed();
                    // A transport failure leaves the session in doubt: the next call starts a fresh one
                    // (which is also what feeds the breaker when the server stays down).
                    if closed || matches!(error, rmcp::ServiceError::TransportSend(_) | rmcp::ServiceError::TransportClosed) {
                        self.pool.discard(&key, &lease.session);
                    }
                    let tail = match &lease.session.conn.stderr {
                        Some(tail) if closed => Some(tail.settled().await),
                        Some(tail) => Some(tail.text()),
                        None => None,
                    }
                    .filter(|t| !t.is_empty());
                    let said = tail.map(|t| format!("; the server wrote: {t}")).unwrap_or_default();
                    let message = if closed {
                        format!(
                            "server `{name}` closed the session during the call ({error}){said}; the call may have taken effect; the next call starts the server again"
                        )
                    } else {
                        format!("server `{name}`: the call failed: {error}")
                    };
                    runtime.set_error(self.redact_for(&message));
                    return Err(McpError::unavailable(message, 1));
                }
            }
        }
        Err(McpError::unavailable(format!("server `{name}`: the session expired again after re-initialisation"), 1))
    }

    /// Pool counters (`only`: one server) for the servers `user` sees.
    pub fn stats(&self, user: &str, only: Option<&str>) -> Result<Vec<ServerStats>> {
        let snapshot = self.snapshot();
        let mut visible = self.visible(&snapshot, user);
        if let Some(name) = only {
            visible.retain(|s| s.spec.name == name);
            if visible.is_empty() {
                return Err(McpError::NotFound(format!("no MCP server named `{name}`")));
            }
        }
        let counts = self.pool.counts();
        Ok(visible
            .iter()
            .map(|s| ServerStats { runtime: s.clone(), sessions: counts.get(&s.spec.name).copied().unwrap_or_default() })
            .collect())
    }

    /// Starts the background pool sweeper; at `shutdown` it stops, and so do the discoveries still running.
    pub fn spawn_background(self: &Arc<Self>, shutdown: CancellationToken) {
        let hub = self.clone();
        let every = Duration::from_secs(self.config().pool.sweep_interval_secs);
        let stop = shutdown.clone();
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                let mut ticker = tokio::time::interval(every);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => {
                            hub.stop.cancel();
                            return;
                        }
                        _ = ticker.tick() => hub.pool.sweep(),
                    }
                }
            },
            tracing::info_span!("mcp_pool_sweeper"),
        ));
    }
}

/// One server's line in GetPoolStats.
#[derive(Debug)]
pub struct ServerStats {
    pub runtime: Arc<ServerRuntime>,
    pub sessions: SessionCounts,
}

fn sse_expired(error: &rmcp::transport::DynamicTransportError) -> bool {
    matches!(error.error.downcast_ref::<transports::sse::SseTransportError>(), Some(transports::sse::SseTransportError::SessionExpired))
}
