//! The state one runs replica shares between its handlers, its dispatcher and its workers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use antler_agent::{Agent, AgentFactory, RunSpec};
use antler_kit::Clients;
use antler_proto::runs::RunError;
use tokio::sync::futures::Notified;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::config::RunsConfig;
use crate::hub::EventHub;
use crate::lifecycle::backlog::Backlog;
use crate::lifecycle::user_caps::UserRuns;
use crate::secret_vault::Vault;
use crate::store::Store;
use crate::stream_limits::StreamLimits;

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

/// What one replica shares between its handlers, its dispatcher and its workers. Its state is private:
/// callers say what they do (`wake_dispatcher`, `take_slot`, `track`, …) rather than reach into it.
pub struct Engine {
    store: Store,
    config: RunsConfig,
    hub: Arc<EventHub>,
    /// This replica's identity in `runs.owner_worker_id`.
    worker_id: String,
    clients: Clients,
    agents: Arc<dyn AgentFactory>,
    /// Runs executing here.
    local: Mutex<HashMap<String, LocalRun>>,
    /// Wakes the dispatcher when a run may be startable.
    wake: Notify,
    /// Bounds the runs executing at once on this replica (`runs.max_concurrent_runs`).
    slots: Arc<Semaphore>,
    shutdown: CancellationToken,
    /// Agents built so far (logged with each construction).
    constructed: AtomicU64,
    /// The request-scoped secrets of runs admitted here (never stored).
    secrets: Vault,
    /// The estimate of PENDING runs that `runs.max_pending_runs` is checked against.
    backlog: Backlog,
    /// Per-user run counts that `runs.max_active_runs_per_user` / `max_pending_runs_per_user` are
    /// checked against.
    user_runs: UserRuns,
    /// Open event streams (`runs.max_streams`, `runs.max_streams_per_user`).
    streams: StreamLimits,
    /// The last takeover pass left expired runs for lack of free slots (see `lease::take_over`).
    takeovers_waiting: AtomicBool,
    /// Dead replicas (no heartbeat) that own PENDING runs, as of the last sweep: the dispatcher
    /// starts their runs before this replica's own PENDING ones (see `lifecycle/liveness.rs`).
    dead_owners: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("worker_id", &self.worker_id).finish_non_exhaustive()
    }
}

impl Engine {
    /// A replica's engine over `store`, identified as `worker_id`, stopping with `shutdown`.
    pub fn new(
        store: Store,
        config: RunsConfig,
        worker_id: String,
        clients: Clients,
        agents: Arc<dyn AgentFactory>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            hub: Arc::new(EventHub::new(config.event_buffer as usize)),
            worker_id,
            clients,
            agents,
            local: Mutex::default(),
            wake: Notify::default(),
            slots: Arc::new(Semaphore::new(config.max_concurrent_runs as usize)),
            shutdown,
            constructed: AtomicU64::new(0),
            secrets: Vault::default(),
            backlog: Backlog::default(),
            user_runs: UserRuns::default(),
            streams: StreamLimits::new(config.max_streams, config.max_streams_per_user),
            takeovers_waiting: AtomicBool::default(),
            dead_owners: Mutex::default(),
            config,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn config(&self) -> &RunsConfig {
        &self.config
    }

    /// Live fan-out of events to this replica's watchers.
    pub fn hub(&self) -> &Arc<EventHub> {
        &self.hub
    }

    /// This replica's identity in `runs.owner_worker_id`.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The clients of the other services (models, sandbox, …).
    pub fn clients(&self) -> &Clients {
        &self.clients
    }

    /// The request-scoped secrets of runs admitted here (never stored).
    pub fn secrets(&self) -> &Vault {
        &self.secrets
    }

    pub fn backlog(&self) -> &Backlog {
        &self.backlog
    }

    pub fn user_runs(&self) -> &UserRuns {
        &self.user_runs
    }

    pub fn streams(&self) -> &StreamLimits {
        &self.streams
    }

    /// Builds an agent for `spec`; returns it with how many this replica has built so far.
    pub fn build_agent(&self, spec: &RunSpec) -> Result<(Box<dyn Agent>, u64), RunError> {
        let agent = self.agents.build(spec)?;
        Ok((agent, self.constructed.fetch_add(1, Ordering::SeqCst) + 1))
    }

    /// Tells the dispatcher that a run may be startable.
    pub fn wake_dispatcher(&self) {
        self.wake.notify_one();
    }

    /// Completes when [`Engine::wake_dispatcher`] is called (the dispatcher waits on it).
    pub fn dispatcher_woken(&self) -> Notified<'_> {
        self.wake.notified()
    }

    /// Whether this replica is shutting down.
    pub fn shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    /// Completes when this replica starts shutting down.
    pub fn until_shutdown(&self) -> WaitForCancellationFuture<'_> {
        self.shutdown.cancelled()
    }

    /// How many more runs may execute here now.
    pub fn free_slots(&self) -> usize {
        self.slots.available_permits()
    }

    /// One of this replica's run slots, if one is free (held as long as the permit lives).
    pub fn take_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// The local handle of a run executing here.
    pub fn local_run(&self, run_id: &str) -> Option<LocalRun> {
        self.local_runs_guard().get(run_id).cloned()
    }

    /// Records `run_id` as executing here.
    pub fn track(&self, run_id: &str, local: LocalRun) {
        self.local_runs_guard().insert(run_id.to_owned(), local);
    }

    /// `run_id` no longer executes here.
    pub fn untrack(&self, run_id: &str) {
        self.local_runs_guard().remove(run_id);
    }

    /// The runs executing here.
    pub fn local_runs(&self) -> Vec<(String, LocalRun)> {
        self.local_runs_guard().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    fn local_runs_guard(&self) -> std::sync::MutexGuard<'_, HashMap<String, LocalRun>> {
        self.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the last takeover pass left expired runs for lack of free slots.
    pub fn takeovers_waiting(&self) -> bool {
        self.takeovers_waiting.load(Ordering::Relaxed)
    }

    pub fn set_takeovers_waiting(&self, waiting: bool) {
        self.takeovers_waiting.store(waiting, Ordering::Relaxed);
    }

    /// Dead replicas that own PENDING runs, as of the last sweep.
    pub fn dead_owners(&self) -> Vec<String> {
        self.dead_owners.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_dead_owners(&self, dead: Vec<String>) {
        *self.dead_owners.lock().unwrap_or_else(|p| p.into_inner()) = dead;
    }
}
