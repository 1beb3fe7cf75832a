//! The session pool: one open session per key (server, identity scope, transport), shared by every call of
//! that key (JSON-RPC multiplexes them, up to `max_calls_per_session` at once).
//!
//! * LRU with a cap: when full, the least recently used idle session is closed to make room.
//! * In-flight creation dedup: the first call for a key spawns the session start; every concurrent call
//!   for the key awaits that one start (the spawned task finishes it even if the first caller goes away).
//! * A session that closed (the server crashed or dropped the stream) is replaced on the next call; one
//!   unused for `health_check_idle_secs` is pinged first; one older than its TTL is not reused.
//! * A per-server [`breaker::Breaker`] refuses new sessions after repeated start failures.
//!
//! Closing a session is dropping it: rmcp's `RunningService` cancels its task on drop, which closes the
//! transport and kills a stdio server's process group.

pub mod breaker;
pub mod counters;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use rmcp::model::{ClientRequest, PingRequest};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::McpError;
use crate::spec::TransportKind;
use crate::transports::Connection;
use breaker::{Admit, Breaker};
use counters::{Counters, Event};

/// What a session is shared by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub server: String,
    pub transport: TransportKind,
    /// stdio: "{user}\0{thread}"; remote: hex SHA-256 of the user and the credentials sent.
    pub scope: String,
}

/// The pool's limits.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub max_sessions: usize,
    pub max_calls_per_session: usize,
    pub idle_evict: Option<Duration>,
    pub health_check_idle: Option<Duration>,
    pub health_check_timeout: Duration,
}

/// The server-level things a session start needs.
#[derive(Debug, Clone)]
pub struct ServerRef {
    pub name: String,
    pub counters: Arc<Counters>,
    pub breaker: Arc<Breaker>,
    /// Sessions older than this are not reused; None = no limit.
    pub ttl: Option<Duration>,
    pub init_timeout: Duration,
}

/// An open, pooled session.
pub struct Session {
    pub conn: Connection,
    pub server: String,
    pub created: Instant,
    last_used: Mutex<Instant>,
    permits: Arc<Semaphore>,
    max_calls: usize,
    ttl: Option<Duration>,
    counters: Arc<Counters>,
}

impl Session {
    pub fn is_closed(&self) -> bool {
        self.conn.service.is_closed() || self.conn.service.is_transport_closed()
    }

    /// A 2026-07-28 server keeps no session state: nothing to ping or expire.
    pub fn stateless(&self) -> bool {
        self.conn.protocol_version.as_str() >= "2026-07-28"
    }

    fn idle_for(&self) -> Duration {
        self.last_used.lock().unwrap_or_else(|p| p.into_inner()).elapsed()
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    pub fn busy(&self) -> bool {
        self.permits.available_permits() < self.max_calls
    }

    fn expired(&self) -> bool {
        self.ttl.is_some_and(|ttl| self.created.elapsed() > ttl)
    }

    /// Session-expired (404) answers seen so far.
    pub fn expirations_seen(&self) -> u64 {
        self.conn.expired.load(Ordering::Relaxed)
    }
}

/// A session held for one call; releases its slot (and marks the session used) when dropped.
pub struct Lease {
    pub session: Arc<Session>,
    /// True when an already-open session served the call.
    pub reused: bool,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.session.touch();
        self.session.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

type Creation = Shared<BoxFuture<'static, Result<Arc<Session>, McpError>>>;

enum Slot {
    Ready(Arc<Session>),
    Creating { generation: u64, done: Creation },
}

#[derive(Default)]
struct State {
    entries: HashMap<PoolKey, Slot>,
    next_generation: u64,
}

/// Sessions of one server, by state, for GetPoolStats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounts {
    pub idle: u32,
    pub busy: u32,
    pub creating: u32,
}

impl SessionCounts {
    pub fn open(&self) -> u32 {
        self.idle + self.busy
    }
}

pub struct Pool {
    settings: PoolSettings,
    state: Mutex<State>,
}

enum Next {
    Use(Arc<Session>),
    Check(Arc<Session>),
    Wait(Creation),
}

impl Pool {
    pub fn new(settings: PoolSettings) -> Arc<Self> {
        Arc::new(Self { settings, state: Mutex::new(State::default()) })
    }

    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A session for `key`: the pooled one, or a new one from `connect` (started at most once per key at a
    /// time, whoever else is waiting for it).
    pub async fn acquire<F>(self: &Arc<Self>, server: &ServerRef, key: PoolKey, connect: F) -> Result<Lease, McpError>
    where
        F: FnOnce() -> BoxFuture<'static, Result<Connection, McpError>>,
    {
        let mut connect = Some(connect);
        for _ in 0..3 {
            let next = {
                let mut state = self.lock();
                let mut create = false;
                let next = match state.entries.get(&key) {
                    Some(Slot::Ready(session)) if session.is_closed() => {
                        tracing::info!(server = %key.server, "pooled session closed (server exited or dropped it); restarting");
                        server.counters.record(&server.name, Event::Restart, 1);
                        state.entries.remove(&key);
                        create = true;
                        None
                    }
                    Some(Slot::Ready(session)) if session.expired() => {
                        server.counters.record(&server.name, Event::Expiration, 1);
                        state.entries.remove(&key);
                        create = true;
                        None
                    }
                    Some(Slot::Ready(session)) => {
                        let check = !session.stateless()
                            && self.settings.health_check_idle.is_some_and(|idle| !session.busy() && session.idle_for() > idle);
                        Some(if check { Next::Check(session.clone()) } else { Next::Use(session.clone()) })
                    }
                    Some(Slot::Creating { done, .. }) => Some(Next::Wait(done.clone())),
                    None => {
                        create = true;
                        None
                    }
                };
                match next {
                    Some(next) => next,
                    None if create => {
                        let Some(connect) = connect.take() else {
                            return Err(McpError::unavailable(format!("server `{}`: no session could be kept open", key.server), 1));
                        };
                        self.start(&mut state, server, &key, connect)?
                    }
                    None => continue,
                }
            };
            match next {
                Next::Use(session) => {
                    server.counters.record(&server.name, Event::Hit, 1);
                    return Ok(self.lease(session, true).await);
                }
                Next::Check(session) => {
                    if self.healthy(&session).await {
                        server.counters.record(&server.name, Event::Hit, 1);
                        return Ok(self.lease(session, true).await);
                    }
                    tracing::info!(server = %key.server, "pooled session failed its health check; replacing it");
                    let mut state = self.lock();
                    if matches!(state.entries.get(&key), Some(Slot::Ready(s)) if Arc::ptr_eq(s, &session)) {
                        state.entries.remove(&key);
                        server.counters.record(&server.name, Event::Restart, 1);
                    }
                }
                Next::Wait(done) => {
                    server.counters.record(&server.name, Event::Miss, 1);
                    let session = done.await?;
                    return Ok(self.lease(session, false).await);
                }
            }
        }
        Err(McpError::unavailable(format!("server `{}`: its session kept failing; retry", key.server), 1))
    }

    async fn lease(&self, session: Arc<Session>, reused: bool) -> Lease {
        session.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        // Waiting here is bounded by the caller's timeout; the semaphore is never closed.
        let permit = match session.permits.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => unreachable_permit(),
        };
        Lease { session, reused, _permit: permit }
    }

    async fn healthy(&self, session: &Session) -> bool {
        let ping = session.conn.service.send_request(ClientRequest::PingRequest(PingRequest::default()));
        // Any answer, even an error for an unknown method, proves the session is alive.
        matches!(tokio::time::timeout(self.settings.health_check_timeout, ping).await, Ok(Ok(_) | Err(rmcp::ServiceError::McpError(_))))
    }

    /// Starts a session for `key` (the caller holds the lock and found no slot).
    fn start(
        self: &Arc<Self>,
        state: &mut State,
        server: &ServerRef,
        key: &PoolKey,
        connect: impl FnOnce() -> BoxFuture<'static, Result<Connection, McpError>>,
    ) -> Result<Next, McpError> {
        if let Admit::Refused { retry_after } = server.breaker.admit() {
            let secs = retry_after.as_secs().max(1);
            return Err(McpError::unavailable(
                format!("server `{}`: circuit breaker open after repeated session-start failures; retry in {secs}s", server.name),
                secs,
            ));
        }
        if state.entries.len() >= self.settings.max_sessions && !evict_one(state) {
            // The trial admitted above did not run; let the next caller have it.
            server.breaker.success_if_trial_unused();
            return Err(McpError::ResourceExhausted(format!(
                "the MCP session pool is full ({} sessions starting at once, mcp.pool.max_sessions)",
                self.settings.max_sessions
            )));
        }
        state.next_generation += 1;
        let generation = state.next_generation;
        let pool = self.clone();
        let server = server.clone();
        let task_key = key.clone();
        let connecting = connect();
        let task = tokio::spawn(async move {
            let result = match tokio::time::timeout(server.init_timeout, connecting).await {
                Ok(result) => result,
                Err(_) => Err(McpError::unavailable(
                    format!(
                        "server `{}`: session start timed out after {}s (session_init_timeout)",
                        server.name,
                        server.init_timeout.as_secs_f64()
                    ),
                    5,
                )),
            };
            pool.settle(&server, &task_key, generation, result)
        });
        let done: Creation = async move {
            match task.await {
                Ok(result) => result,
                Err(error) => Err(McpError::Internal(format!("the session start task failed: {error}"))),
            }
        }
        .boxed()
        .shared();
        state.entries.insert(key.clone(), Slot::Creating { generation, done: done.clone() });
        Ok(Next::Wait(done))
    }

    fn settle(
        &self,
        server: &ServerRef,
        key: &PoolKey,
        generation: u64,
        result: Result<Connection, McpError>,
    ) -> Result<Arc<Session>, McpError> {
        let mut state = self.lock();
        let ours = matches!(state.entries.get(key), Some(Slot::Creating { generation: g, .. }) if *g == generation);
        match result {
            Ok(conn) => {
                server.breaker.success();
                server.counters.record(&server.name, Event::Creation, 1);
                let session = Arc::new(Session {
                    conn,
                    server: server.name.clone(),
                    created: Instant::now(),
                    last_used: Mutex::new(Instant::now()),
                    permits: Arc::new(Semaphore::new(self.settings.max_calls_per_session)),
                    max_calls: self.settings.max_calls_per_session,
                    ttl: server.ttl,
                    counters: server.counters.clone(),
                });
                if !ours {
                    // Closed by a reload while starting: not resurrected.
                    return Err(McpError::unavailable(
                        format!("server `{}` was reconfigured while its session was starting; retry", server.name),
                        1,
                    ));
                }
                state.entries.insert(key.clone(), Slot::Ready(session.clone()));
                Ok(session)
            }
            Err(error) => {
                server.counters.record(&server.name, Event::CreationFailure, 1);
                if server.breaker.failure() {
                    tracing::warn!(server = %server.name, "circuit breaker opened after repeated session-start failures");
                }
                if ours {
                    state.entries.remove(key);
                }
                Err(error)
            }
        }
    }

    /// Drops the session of `key` if it is still `session` (a call found it broken).
    pub fn discard(&self, key: &PoolKey, session: &Arc<Session>) {
        let mut state = self.lock();
        if matches!(state.entries.get(key), Some(Slot::Ready(s)) if Arc::ptr_eq(s, session)) {
            state.entries.remove(key);
        }
    }

    /// Closes every session of `server` (also ones starting); returns how many open ones were closed.
    pub fn close_server(&self, server: &str) -> u32 {
        let mut state = self.lock();
        let before = state.entries.len();
        let mut closed = 0;
        state.entries.retain(|key, slot| {
            let keep = key.server != server;
            if !keep && matches!(slot, Slot::Ready(_)) {
                closed += 1;
            }
            keep
        });
        tracing::debug!(server, removed = before - state.entries.len(), "pooled sessions closed");
        closed
    }

    /// Closes sessions unused for longer than `idle_evict_secs`, and expired idle ones.
    pub fn sweep(&self) {
        let mut state = self.lock();
        let idle_limit = self.settings.idle_evict;
        state.entries.retain(|_, slot| {
            let Slot::Ready(session) = slot else { return true };
            let stale = !session.busy() && (session.expired() || idle_limit.is_some_and(|limit| session.idle_for() > limit));
            if stale {
                session.counters.record(&session.server, Event::Expiration, 1);
            }
            !stale
        });
    }

    /// Sessions per server by state.
    pub fn counts(&self) -> HashMap<String, SessionCounts> {
        let state = self.lock();
        let mut counts: HashMap<String, SessionCounts> = HashMap::new();
        for (key, slot) in &state.entries {
            let entry = counts.entry(key.server.clone()).or_default();
            match slot {
                Slot::Ready(s) if s.busy() => entry.busy += 1,
                Slot::Ready(_) => entry.idle += 1,
                Slot::Creating { .. } => entry.creating += 1,
            }
        }
        counts
    }

    /// Every open session (for the benchmark's memory figure and for tests).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Closes the least recently used idle session (or, when every one is busy, the least recently used);
/// false when nothing can be closed (every slot is a session still starting).
fn evict_one(state: &mut State) -> bool {
    let victim = state
        .entries
        .iter()
        .filter_map(|(key, slot)| match slot {
            Slot::Ready(s) => Some((key, s.busy(), s.idle_for())),
            Slot::Creating { .. } => None,
        })
        .max_by_key(|(_, busy, idle)| (!busy, *idle))
        .map(|(key, _, _)| key.clone());
    let Some(key) = victim else { return false };
    if let Some(Slot::Ready(session)) = state.entries.remove(&key) {
        tracing::debug!(server = %key.server, "least recently used session closed to make room");
        session.counters.record(&session.server, Event::Eviction, 1);
    }
    true
}

fn unreachable_permit() -> ! {
    // Invariant: a session's semaphore is never closed (nothing calls `close` on it).
    panic!("a pooled session's call semaphore was closed")
}
