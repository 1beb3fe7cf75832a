//! Per-server pool counters: what GetPoolStats returns and what the metrics say (each increment goes to
//! both, so they cannot disagree).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Counters of one server since the process started (kept across config reloads).
#[derive(Debug, Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub creations: AtomicU64,
    pub creation_failures: AtomicU64,
    pub evictions: AtomicU64,
    pub expirations: AtomicU64,
    pub reinitializations: AtomicU64,
    pub restarts: AtomicU64,
    pub in_flight: AtomicU32,
}

/// Which counter.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Hit,
    Miss,
    Creation,
    CreationFailure,
    Eviction,
    Expiration,
    Reinitialization,
    Restart,
}

impl Event {
    fn metric(self) -> &'static str {
        match self {
            Event::Hit => "antler_mcp_pool_hits_total",
            Event::Miss => "antler_mcp_pool_misses_total",
            Event::Creation => "antler_mcp_pool_creations_total",
            Event::CreationFailure => "antler_mcp_pool_creation_failures_total",
            Event::Eviction => "antler_mcp_pool_evictions_total",
            Event::Expiration => "antler_mcp_pool_expirations_total",
            Event::Reinitialization => "antler_mcp_session_reinitializations_total",
            Event::Restart => "antler_mcp_server_restarts_total",
        }
    }
}

impl Counters {
    /// Counts `event` for `server` here and in the metrics (label: the configured server name, a bounded set).
    pub fn record(&self, server: &str, event: Event, n: u64) {
        let counter = match event {
            Event::Hit => &self.hits,
            Event::Miss => &self.misses,
            Event::Creation => &self.creations,
            Event::CreationFailure => &self.creation_failures,
            Event::Eviction => &self.evictions,
            Event::Expiration => &self.expirations,
            Event::Reinitialization => &self.reinitializations,
            Event::Restart => &self.restarts,
        };
        counter.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(event.metric(), "server" => server.to_owned()).increment(n);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
