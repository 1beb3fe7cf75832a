//! Live sandboxes: one per (user, thread), kept in a bounded least-recently-used map, with their
//! lifecycle state, running commands and file locks.
//!
//! The map is a cache of state, not of files: a sandbox dropped from it (LRU eviction, restart) still has
//! its directories, and the next lookup brings it back as RELEASED (files intact, writes refused until
//! AcquireSandbox). Lookups are keyed by the caller's user id and the thread id, so another user's
//! sandbox is simply never found.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::error::{Result, SandboxError};
use crate::fence::Fence;
use crate::ids;
use crate::locks::PathLocks;
use crate::workspace::{Layout, Workspace};

/// Lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Active,
    Released,
}

/// Why the service killed a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    Timeout,
    Release,
    Reset,
    Shutdown,
    /// The client cancelled the ExecuteCommand call (nobody is left to read the exit).
    Cancelled,
    /// A higher attempt of the command's run called (see `crate::fence`).
    Fenced,
}

impl KillReason {
    /// The `reason` label of `antler_sandbox_exec_kills_total`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Release => "release",
            Self::Reset => "reset",
            Self::Shutdown => "shutdown",
            Self::Cancelled => "cancelled",
            Self::Fenced => "fenced",
        }
    }
}

/// Timestamps and status, copied out under the lock.
#[derive(Debug, Clone)]
pub struct State {
    pub status: Status,
    pub created_at: SystemTime,
    pub acquired_at: Option<SystemTime>,
    pub last_used_at: SystemTime,
    pub released_at: Option<SystemTime>,
}

/// A command in flight: the handle ReleaseSandbox, ResetSandbox and shutdown use to kill it.
#[derive(Debug, Default)]
pub struct RunningCommand {
    kill: CancellationToken,
    reason: Mutex<Option<KillReason>>,
    /// The run attempt that started it, when the call carried a fencing token.
    fence: Option<Fence>,
}

impl RunningCommand {
    /// Asks the command's runner to kill its process group; the first reason wins.
    pub fn kill(&self, reason: KillReason) {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(reason);
        self.kill.cancel();
    }

    pub fn killed(&self) -> &CancellationToken {
        &self.kill
    }

    pub fn reason(&self) -> Option<KillReason> {
        *self.reason.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One thread's sandbox.
#[derive(Debug)]
pub struct Sandbox {
    pub id: String,
    pub user_id: String,
    pub thread_id: String,
    pub workspace: Workspace,
    pub locks: PathLocks,
    state: Mutex<State>,
    commands: Mutex<HashMap<u64, Arc<RunningCommand>>>,
    next_command: AtomicU64,
}

/// Removes a command from its sandbox's table when its runner finishes, however it finishes.
#[derive(Debug)]
pub struct CommandSlot {
    sandbox: Arc<Sandbox>,
    id: u64,
    pub command: Arc<RunningCommand>,
}

impl Drop for CommandSlot {
    fn drop(&mut self) {
        self.sandbox.commands.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
        self.sandbox.touch();
    }
}

impl Sandbox {
    fn new(user_id: &str, thread_id: &str, workspace: Workspace, state: State) -> Self {
        Self {
            id: ids::sandbox_id(user_id, thread_id),
            user_id: user_id.to_owned(),
            thread_id: thread_id.to_owned(),
            workspace,
            locks: PathLocks::default(),
            state: Mutex::new(state),
            commands: Mutex::new(HashMap::new()),
            next_command: AtomicU64::new(0),
        }
    }

    fn state_mut(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> State {
        self.state_mut().clone()
    }

    pub fn running_commands(&self) -> usize {
        self.commands.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Records a use (every RPC but GetSandbox).
    pub fn touch(&self) {
        self.state_mut().last_used_at = SystemTime::now();
    }

    /// Refuses when RELEASED (writes and commands need an ACTIVE sandbox).
    pub fn require_active(&self) -> Result<()> {
        match self.state_mut().status {
            Status::Active => Ok(()),
            Status::Released => Err(SandboxError::Released { thread_id: self.thread_id.clone() }),
        }
    }

    fn activate(&self) {
        let mut state = self.state_mut();
        let now = SystemTime::now();
        if state.status == Status::Released || state.acquired_at.is_none() {
            state.status = Status::Active;
            state.acquired_at = Some(now);
        }
        state.last_used_at = now;
    }

    /// Marks the sandbox RELEASED; with `terminate`, kills its running commands. Returns how many.
    pub fn release(&self, terminate: bool) -> u32 {
        {
            let mut state = self.state_mut();
            let now = SystemTime::now();
            if state.status == Status::Active {
                state.status = Status::Released;
                state.released_at = Some(now);
            }
            state.last_used_at = now;
        }
        if terminate { self.kill_all(KillReason::Release) } else { 0 }
    }

    /// Registers a new command of `fence`'s attempt (if any), refusing beyond `max` at once in this
    /// sandbox.
    pub fn start_command(self: &Arc<Self>, max: u64, fence: Option<Fence>) -> Result<CommandSlot> {
        let mut commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        if commands.len() as u64 >= max {
            return Err(SandboxError::ResourceExhausted(format!(
                "{} commands are already running in this sandbox (sandbox.commands.max_concurrent = {max})\nhint: wait for one to finish",
                commands.len()
            )));
        }
        let id = self.next_command.fetch_add(1, Ordering::Relaxed);
        let command = Arc::new(RunningCommand { fence, ..RunningCommand::default() });
        commands.insert(id, command.clone());
        Ok(CommandSlot { sandbox: self.clone(), id, command })
    }

    /// Kills the running commands of attempts of `run_id` below `attempt`; returns how many.
    pub fn kill_fenced(&self, run_id: &str, attempt: u32) -> u32 {
        let commands: Vec<Arc<RunningCommand>> = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|c| c.fence.as_ref().is_some_and(|f| f.run_id == run_id && f.attempt < attempt))
            .cloned()
            .collect();
        for command in &commands {
            command.kill(KillReason::Fenced);
        }
        u32::try_from(commands.len()).unwrap_or(u32::MAX)
    }

    /// Kills every running command with `reason`; returns how many were asked to die.
    pub fn kill_all(&self, reason: KillReason) -> u32 {
        let commands: Vec<Arc<RunningCommand>> = self.commands.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        for command in &commands {
            command.kill(reason);
        }
        u32::try_from(commands.len()).unwrap_or(u32::MAX)
    }
}

struct Slot {
    sandbox: Arc<Sandbox>,
    last_use: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<(String, String), Slot>,
    tick: u64,
}

/// Every live sandbox of this server.
pub struct Registry {
    layout: Layout,
    capacity: usize,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl Registry {
    pub fn new(layout: Layout, capacity: usize) -> Self {
        Self { layout, capacity: capacity.max(1), inner: Mutex::new(Inner::default()) }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates the workspace if needed and marks the sandbox ACTIVE. True when this call created the
    /// workspace directories.
    pub async fn acquire(&self, user_id: &str, thread_id: &str) -> Result<(Arc<Sandbox>, bool)> {
        let workspace = self.layout.workspace(user_id, thread_id);
        // The skills view first: every acquire brings it up to date (and repairs a tampered copy).
        // Both in one blocking task: a task is a hand-off to another thread (and, under load, a
        // thread more in tokio's blocking pool), and every run's first acquire does both.
        let (skills, user, ensure) = (self.layout.skills().clone(), user_id.to_owned(), workspace.clone());
        let created = tokio::task::spawn_blocking(move || skills.refresh_view(&user).map(|()| ensure.ensure()))
            .await
            .map_err(|e| SandboxError::Internal(format!("workspace set-up task failed: {e}")))??
            .map_err(|e| {
                tracing::error!(error = %e, thread_id, "cannot create the workspace directories");
                match e.raw_os_error() {
                    Some(code) if code == libc_enospc() => SandboxError::Unavailable("no space left to create the workspace".to_owned()),
                    _ => SandboxError::Unavailable(format!("the workspace could not be created ({})", e.kind())),
                }
            })?;
        let now = SystemTime::now();
        let sandbox = self.get_or_insert(user_id, thread_id, || {
            let created_at = if created { now } else { workspace.created_at().unwrap_or(now) };
            let state = State { status: Status::Active, created_at, acquired_at: None, last_used_at: now, released_at: None };
            Sandbox::new(user_id, thread_id, workspace.clone(), state)
        });
        sandbox.activate();
        metrics::counter!("antler_sandbox_acquires_total", "created" => if created { "true" } else { "false" }).increment(1);
        Ok((sandbox, created))
    }

    /// The caller's sandbox of `thread_id`: live, or brought back RELEASED from disk. NOT_FOUND when it
    /// was never acquired (by this user).
    pub fn find(&self, user_id: &str, thread_id: &str) -> Result<Arc<Sandbox>> {
        {
            let mut inner = self.inner();
            inner.tick += 1;
            let tick = inner.tick;
            if let Some(slot) = inner.map.get_mut(&(user_id.to_owned(), thread_id.to_owned())) {
                slot.last_use = tick;
                return Ok(slot.sandbox.clone());
            }
        }
        let workspace = self.layout.workspace(user_id, thread_id);
        if !workspace.exists() {
            return Err(SandboxError::SandboxNotFound { thread_id: thread_id.to_owned() });
        }
        let now = SystemTime::now();
        Ok(self.get_or_insert(user_id, thread_id, || {
            let created_at = workspace.created_at().unwrap_or(now);
            let state = State { status: Status::Released, created_at, acquired_at: None, last_used_at: now, released_at: None };
            Sandbox::new(user_id, thread_id, workspace.clone(), state)
        }))
    }

    fn get_or_insert(&self, user_id: &str, thread_id: &str, make: impl FnOnce() -> Sandbox) -> Arc<Sandbox> {
        let mut inner = self.inner();
        inner.tick += 1;
        let tick = inner.tick;
        let key = (user_id.to_owned(), thread_id.to_owned());
        if let Some(slot) = inner.map.get_mut(&key) {
            slot.last_use = tick;
            return slot.sandbox.clone();
        }
        let sandbox = Arc::new(make());
        inner.map.insert(key, Slot { sandbox: sandbox.clone(), last_use: tick });
        while inner.map.len() > self.capacity {
            // Only a sandbox nobody is using (no request holds it, no command runs) may be dropped; if
            // every one is busy the map stays over capacity until one frees up.
            let victim = inner
                .map
                .iter()
                .filter(|(_, slot)| Arc::strong_count(&slot.sandbox) == 1)
                .min_by_key(|(_, slot)| slot.last_use)
                .map(|(key, _)| key.clone());
            match victim {
                Some(key) => {
                    inner.map.remove(&key);
                    metrics::counter!("antler_sandbox_evictions_total").increment(1);
                }
                None => break,
            }
        }
        metrics::gauge!("antler_sandbox_live").set(inner.map.len() as f64);
        sandbox
    }

    /// Releases ACTIVE sandboxes idle for longer than `idle` with no running command. Returns how many.
    /// Forgets the caller's sandbox of `thread_id` (after its directories were removed).
    pub fn forget(&self, user_id: &str, thread_id: &str) {
        let mut inner = self.inner();
        inner.map.remove(&(user_id.to_owned(), thread_id.to_owned()));
        metrics::gauge!("antler_sandbox_live").set(inner.map.len() as f64);
    }

    pub fn release_idle(&self, idle: Duration) -> usize {
        let sandboxes: Vec<Arc<Sandbox>> = self.inner().map.values().map(|slot| slot.sandbox.clone()).collect();
        let now = SystemTime::now();
        let mut released = 0;
        for sandbox in sandboxes {
            let state = sandbox.state();
            let idle_for = now.duration_since(state.last_used_at).unwrap_or_default();
            if state.status == Status::Active && idle_for >= idle && sandbox.running_commands() == 0 {
                sandbox.release(false);
                tracing::info!(sandbox_id = %sandbox.id, thread_id = %sandbox.thread_id, idle_secs = idle_for.as_secs(), "idle sandbox released");
                released += 1;
            }
        }
        released
    }

    /// Kills the running commands of `user_id`'s sandboxes that belong to attempts of `run_id` below
    /// `attempt` (a higher attempt called: see `crate::fence`). Returns how many.
    pub fn kill_fenced(&self, user_id: &str, run_id: &str, attempt: u32) -> u32 {
        let sandboxes: Vec<Arc<Sandbox>> =
            self.inner().map.values().filter(|slot| slot.sandbox.user_id == user_id).map(|slot| slot.sandbox.clone()).collect();
        sandboxes.iter().map(|s| s.kill_fenced(run_id, attempt)).sum()
    }

    /// Kills every running command of every sandbox (server shutdown).
    pub fn kill_everything(&self, reason: KillReason) -> u32 {
        let sandboxes: Vec<Arc<Sandbox>> = self.inner().map.values().map(|slot| slot.sandbox.clone()).collect();
        sandboxes.iter().map(|s| s.kill_all(reason)).sum()
    }

    pub fn len(&self) -> usize {
        self.inner().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Ownership;

    fn registry(capacity: usize) -> std::io::Result<(tempfile::TempDir, Registry)> {
        let dir = tempfile::tempdir()?;
        let layout = Layout::new(dir.path(), &Default::default(), Ownership::default())?;
        Ok((dir, Registry::new(layout, capacity)))
    }

    #[tokio::test]
    async fn acquire_is_idempotent_and_find_is_per_user() -> anyhow::Result<()> {
        let (_dir, registry) = registry(8)?;
        let (a, created) = registry.acquire("alice", "t").await?;
        assert!(created);
        let (again, created) = registry.acquire("alice", "t").await?;
        assert!(!created);
        assert!(Arc::ptr_eq(&a, &again));
        assert!(registry.find("alice", "t").is_ok());
        assert!(matches!(registry.find("bob", "t"), Err(SandboxError::SandboxNotFound { .. })));
        Ok(())
    }

    #[tokio::test]
    async fn evicted_sandboxes_come_back_released_with_their_files() -> anyhow::Result<()> {
        let (_dir, registry) = registry(2)?;
        for t in ["a", "b", "c"] {
            registry.acquire("u", t).await?;
        }
        assert_eq!(registry.len(), 2, "the least recently used one was dropped");
        let back = registry.find("u", "a")?;
        assert_eq!(back.state().status, Status::Released);
        assert!(back.require_active().is_err());
        let (active, created) = registry.acquire("u", "a").await?;
        assert!(!created);
        assert!(active.require_active().is_ok());
        Ok(())
    }

    #[tokio::test]
    async fn busy_sandboxes_are_not_evicted() -> anyhow::Result<()> {
        let (_dir, registry) = registry(1)?;
        let (held, _) = registry.acquire("u", "a").await?;
        registry.acquire("u", "b").await?;
        assert!(Arc::ptr_eq(&held, &registry.find("u", "a")?), "a request still holds `a`");
        Ok(())
    }

    #[tokio::test]
    async fn command_slots_are_capped_and_freed() -> anyhow::Result<()> {
        let (_dir, registry) = registry(4)?;
        let (sandbox, _) = registry.acquire("u", "t").await?;
        let first = sandbox.start_command(1, None)?;
        assert!(matches!(sandbox.start_command(1, None), Err(SandboxError::ResourceExhausted(_))));
        assert_eq!(sandbox.kill_all(KillReason::Reset), 1);
        assert_eq!(first.command.reason(), Some(KillReason::Reset));
        drop(first);
        assert!(sandbox.start_command(1, None).is_ok());
        Ok(())
    }

    #[tokio::test]
    async fn idle_sandboxes_are_released() -> anyhow::Result<()> {
        let (_dir, registry) = registry(4)?;
        let (sandbox, _) = registry.acquire("u", "t").await?;
        assert_eq!(registry.release_idle(Duration::from_secs(3600)), 0);
        assert_eq!(registry.release_idle(Duration::ZERO), 1);
        assert_eq!(sandbox.state().status, Status::Released);
        Ok(())
    }
}
