//! A configured server at run time: its entry, its discovered tools and status, its breaker, counters and
//! OAuth token source.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::catalog::ToolEntry;
use crate::discovery::DiscoverySlot;
use crate::oauth::TokenSource;
use crate::pool::breaker::Breaker;
use crate::pool::counters::Counters;
use crate::spec::ServerSpec;

/// Connection state, as ListServers reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Disabled,
    Pending,
    Ready,
    Error,
}

#[derive(Debug)]
struct State {
    status: Status,
    tools: Arc<Vec<Arc<ToolEntry>>>,
    discovered_at: Option<SystemTime>,
    /// When a cacheable listing (2026-07-28 `ttlMs`) goes stale.
    tools_expire: Option<Instant>,
    /// Raised by the session that listed the tools when the server announces a change.
    changed: Option<Arc<AtomicBool>>,
    last_error: Option<(String, SystemTime)>,
    protocol_version: String,
}

/// What ListServers shows of a server.
#[derive(Debug, Clone)]
pub struct View {
    pub status: Status,
    pub tool_count: usize,
    pub discovered_at: Option<SystemTime>,
    pub last_error: Option<(String, SystemTime)>,
    pub protocol_version: String,
}

#[derive(Debug)]
pub struct ServerRuntime {
    pub spec: ServerSpec,
    pub counters: Arc<Counters>,
    pub breaker: Arc<Breaker>,
    pub oauth: Option<Arc<TokenSource>>,
    /// One HTTP client per server: its connection pool is what 2026-07-28 stateless calls reuse.
    pub http: reqwest::Client,
    /// The discovery of this server under way, if any (concurrent callers share it).
    pub discovery: DiscoverySlot,
    state: Mutex<State>,
}

impl ServerRuntime {
    pub fn new(
        spec: ServerSpec,
        counters: Arc<Counters>,
        breaker: Arc<Breaker>,
        oauth: Option<Arc<TokenSource>>,
        http: reqwest::Client,
    ) -> Self {
        let status = if spec.enabled { Status::Pending } else { Status::Disabled };
        Self {
            spec,
            counters,
            breaker,
            oauth,
            http,
            discovery: DiscoverySlot::default(),
            state: Mutex::new(State {
                status,
                tools: Arc::new(Vec::new()),
                discovered_at: None,
                tools_expire: None,
                changed: None,
                last_error: None,
                protocol_version: String::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The discovered tools if they are still current.
    pub fn fresh_tools(&self) -> Option<Arc<Vec<Arc<ToolEntry>>>> {
        let state = self.lock();
        let current = state.status == Status::Ready
            && state.tools_expire.is_none_or(|at| Instant::now() < at)
            && !state.changed.as_ref().is_some_and(|c| c.load(Ordering::Relaxed));
        current.then(|| state.tools.clone())
    }

    pub fn set_tools(&self, tools: Vec<Arc<ToolEntry>>, ttl: Option<Duration>, changed: Arc<AtomicBool>, protocol_version: String) {
        changed.store(false, Ordering::Relaxed);
        let mut state = self.lock();
        state.status = Status::Ready;
        state.tools = Arc::new(tools);
        state.discovered_at = Some(SystemTime::now());
        state.tools_expire = ttl.map(|ttl| Instant::now() + ttl);
        state.changed = Some(changed);
        state.protocol_version = protocol_version;
    }

    /// Records a failure (already redacted); a server with no usable tool list turns ERROR.
    pub fn set_error(&self, message: String) {
        let mut state = self.lock();
        if state.status != Status::Ready {
            state.status = Status::Error;
        }
        state.last_error = Some((message, SystemTime::now()));
    }

    /// Discovery failed: the server is ERROR even if it listed tools before.
    pub fn set_discovery_failed(&self, message: String) {
        let mut state = self.lock();
        state.status = Status::Error;
        state.last_error = Some((message, SystemTime::now()));
    }

    pub fn set_protocol_version(&self, version: &str) {
        if !version.is_empty() {
            self.lock().protocol_version = version.to_owned();
        }
    }

    pub fn view(&self) -> View {
        let state = self.lock();
        View {
            status: state.status,
            tool_count: state.tools.len(),
            discovered_at: state.discovered_at,
            last_error: state.last_error.clone(),
            protocol_version: state.protocol_version.clone(),
        }
    }

    /// The last tool list, current or not.
    pub fn tools(&self) -> Arc<Vec<Arc<ToolEntry>>> {
        self.lock().tools.clone()
    }
}
