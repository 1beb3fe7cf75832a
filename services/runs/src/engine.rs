//! The state one runs replica shares between its handlers, its dispatcher and its workers.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use antler_kit::Clients;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::RunsConfig;
use crate::hub::EventHub;
use crate::store::Store;
use antler_agent::AgentFactory;

/// Why a local run's agent is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// A cancel request (or a newer run's INTERRUPT / ROLLBACK) — the run ends INTERRUPTED.
    Cancel,
    /// This worker lost its lease: it must write nothing more.
    Fenced,
    /// Shutdown: the lease is released for another worker to resume the run.
    Release,
    /// The run's `max_duration` passed — it ends TIMEOUT.
    Timeout,
}

/// A run executing on this replica.
#[derive(Debug, Clone)]
pub struct LocalRun {
    pub token: CancellationToken,
    pub cause: Arc<Mutex<Option<StopCause>>>,
}

impl LocalRun {
    pub fn new() -> Self {
        Self { token: CancellationToken::new(), cause: Arc::new(Mutex::new(None)) }
    }

    /// Stops the agent; the first cause wins, except that fencing overrides everything (a fenced
    /// worker must not write, whatever else was asked).
    pub fn stop(&self, cause: StopCause) {
        let mut current = self.cause.lock().unwrap_or_else(|p| p.into_inner());
        if current.is_none() || cause == StopCause::Fenced {
            *current = Some(cause);
        }
        drop(current);
        self.token.cancel();
    }

    pub fn cause(&self) -> Option<StopCause> {
        *self.cause.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for LocalRun {
    fn default() -> Self {
        Self::new()
    }
}

pub struct Engine {
    pub store: Store,
    pub config: RunsConfig,
    pub hub: Arc<EventHub>,
    /// This replica's identity in `runs.owner_worker_id`.
    pub worker_id: String,
    pub clients: Clients,
    pub agents: Arc<dyn AgentFactory>,
    /// Runs executing here.
    pub local: Mutex<HashMap<String, LocalRun>>,
    /// Wakes the dispatcher when a run may be startable.
    pub wake: Notify,
    /// Bounds the runs executing at once on this replica.
    pub permits: Arc<Semaphore>,
    pub shutdown: CancellationToken,
    /// Agents built so far (logged with each construction).
    pub constructed: AtomicU64,
    /// The request-scoped secrets of runs admitted here (never stored).
    pub secrets: crate::secrets::Vault,
    /// The estimate of PENDING runs that `runs.max_pending_runs` is checked against.
    pub backlog: crate::lifecycle::backlog::Backlog,
    /// Per-user run counts that `runs.max_active_runs_per_user` / `max_pending_runs_per_user` are
    /// checked against.
    pub user_runs: crate::lifecycle::user_caps::UserRuns,
    /// Open event streams (`runs.max_streams`, `runs.max_streams_per_user`).
    pub streams: crate::stream_limits::StreamLimits,
    /// The last takeover pass left expired runs for lack of free slots (see `lease::take_over`).
    pub takeovers_waiting: std::sync::atomic::AtomicBool,
    /// Dead replicas (no heartbeat) that own PENDING runs, as of the last sweep: the dispatcher
    /// starts their runs before this replica's own PENDING ones (see `lifecycle/liveness.rs`).
    pub dead_owners: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("worker_id", &self.worker_id).finish_non_exhaustive()
    }
}

impl Engine {
    /// The local handle of a run executing here.
    pub fn local_run(&self, run_id: &str) -> Option<LocalRun> {
        self.local.lock().unwrap_or_else(|p| p.into_inner()).get(run_id).cloned()
    }

    /// See [`Engine::dead_owners`].
    pub fn dead_owners(&self) -> Vec<String> {
        self.dead_owners.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
