//! ExecuteCommand: the process runner shared by every provider.
//!
//! The provider builds the process ([`crate::providers::Provider::command`]); the runner gives it
//! stdin = /dev/null, piped stdout/stderr and a process group of its own, then supervises it in one task:
//! output flows through the [`output::OutputShaper`] to the client as it is produced; the timeout, a
//! Release/Reset/shutdown kill, or the client cancelling the call sends SIGKILL to the whole process group
//! (for bwrap the group leader is bwrap itself, whose death takes the command's pid namespace — every
//! grandchild — down with it). When the foreground process exits, output is read for
//! `sandbox.commands.drain_grace_ms` more and the call ends even if a background process (`cmd &`) still
//! holds the pipes open.

pub mod env;
pub mod output;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::process::Child;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::CommandsConfig;
use crate::error::{Result, SandboxError};
use crate::files;
use crate::mask::Masker;
use crate::paths::VirtualPath;
use crate::providers::{Launch, Provider};
use crate::registry::{CommandSlot, KillReason, Sandbox};
use crate::resolve;
use output::{OutputShaper, Stream, Totals};

/// A checked command request.
#[derive(Debug, Clone)]
pub struct ExecSpec {
    pub command: String,
    pub timeout: Duration,
    pub env: HashMap<String, String>,
    pub cwd: VirtualPath,
    pub max_output_bytes: u64,
    /// The run attempt the command is run for (see `crate::fence`); set by the caller after `check`.
    pub fence: Option<crate::fence::Fence>,
}

/// What the runner reports, in order: one `Started`, any number of `Output`, one `Exit`.
#[derive(Debug, Clone)]
pub enum ExecEvent {
    Started { pid: u32, cwd: String, timeout: Duration },
    Output { stream: Stream, text: String },
    Exit(ExitInfo),
}

#[derive(Debug, Clone)]
pub struct ExitInfo {
    /// Exit code, or -1 when a signal ended the process.
    pub exit_code: i32,
    /// The signal that ended the process, 0 when it exited by itself.
    pub signal: i32,
    pub timed_out: bool,
    pub kill_reason: Option<KillReason>,
    pub totals: Totals,
    pub duration: Duration,
}

/// Starts and supervises commands.
#[derive(Debug, Clone)]
pub struct Runner {
    provider: Arc<dyn Provider>,
    config: CommandsConfig,
    shutdown: CancellationToken,
}

impl Runner {
    pub fn new(provider: Arc<dyn Provider>, config: CommandsConfig, shutdown: CancellationToken) -> Self {
        Self { provider, config, shutdown }
    }

    /// Validates the request fields; returns the spec with defaults applied and caps clamped.
    pub fn check(
        &self,
        command: String,
        timeout: Option<Duration>,
        env: HashMap<String, String>,
        cwd: VirtualPath,
        max_output_bytes: u64,
    ) -> Result<ExecSpec> {
        let c = &self.config;
        if command.trim().is_empty() {
            return Err(SandboxError::invalid("command", "is required"));
        }
        if command.len() as u64 > c.max_command_bytes {
            return Err(SandboxError::invalid(
                "command",
                format!(
                    "is {} bytes, at most {} allowed (sandbox.commands.max_command_bytes)\nhint: write a script with WriteFile and run it",
                    command.len(),
                    c.max_command_bytes
                ),
            ));
        }
        if command.contains('\0') {
            return Err(SandboxError::invalid("command", "contains a NUL byte"));
        }
        let timeout = match timeout {
            None => c.default_timeout(),
            Some(t) if t.is_zero() || t > c.max_timeout() => {
                return Err(SandboxError::invalid(
                    "timeout",
                    format!(
                        "{:.3}s is out of range: must be more than 0 and at most {}s (sandbox.commands.max_timeout_secs)",
                        t.as_secs_f64(),
                        c.max_timeout_secs
                    ),
                ));
            }
            Some(t) => t,
        };
        env::check_injected(&env, c.max_env_vars, c.max_env_value_bytes)?;
        let cap = if max_output_bytes == 0 { c.max_output_bytes_per_stream } else { max_output_bytes.min(c.max_output_bytes_per_stream) };
        Ok(ExecSpec { command, timeout, env, cwd, max_output_bytes: cap, fence: None })
    }

    /// Starts the command and returns its event stream. The receiver is unbounded on purpose: what can be
    /// queued is bounded by the output caps (at most `max_output_bytes` per stream), and a slow client
    /// must never delay the timeout or a kill.
    ///
    /// `still_current` is asked once the command is registered and before its process exists: a
    /// refusal there (its run attempt was fenced meanwhile) ends the call with that error. A fencing
    /// after that point finds the registered command and kills it.
    pub async fn start(
        &self,
        sandbox: Arc<Sandbox>,
        spec: ExecSpec,
        still_current: impl FnOnce() -> Result<()>,
    ) -> Result<mpsc::UnboundedReceiver<ExecEvent>> {
        sandbox.require_active()?;
        if let Some(why) = self.provider.exec_refusal() {
            return Err(SandboxError::FailedPrecondition(why));
        }
        let cwd_in_skills = matches!(spec.cwd, crate::paths::VirtualPath::In { root: crate::paths::Root::Skills, .. });
        if let Some(why) = self.provider.command_refusal(&spec.command, cwd_in_skills) {
            return Err(SandboxError::denied(crate::paths::SKILLS, why));
        }
        let slot = sandbox.start_command(self.config.max_concurrent, spec.fence.clone())?;
        still_current()?;
        let cwd_display = spec.cwd.display();
        let workspace = sandbox.workspace.clone();
        let cwd = spec.cwd.clone();
        let cwd_host = tokio::task::spawn_blocking(move || -> Result<std::path::PathBuf> {
            let (_, root_fd, rel) = files::open(&workspace, &cwd)?;
            let display = cwd.display();
            let dir = resolve::open_dir(&root_fd, &rel).map_err(|e| match e {
                rustix::io::Errno::NOTDIR => SandboxError::wrong_kind(&display, "is not a directory"),
                other => SandboxError::from_errno(&display, other),
            })?;
            resolve::host_path_of(&dir).map_err(|e| SandboxError::from_errno(&display, e))
        })
        .await
        .map_err(|e| SandboxError::Internal(format!("cwd resolution failed: {e}")))??;

        let launch = Launch {
            workspace: &sandbox.workspace,
            command: &spec.command,
            cwd_virtual: &cwd_display,
            cwd_host: &cwd_host,
            injected: &spec.env,
            allowlist: &self.config.env_allowlist,
        };
        let mut command = self.provider.command(&launch).map_err(|e| {
            tracing::error!(sandbox_id = %sandbox.id, error = %e, "cannot prepare a command");
            SandboxError::Unavailable(format!("the command could not be started ({})", e.kind()))
        })?;
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).kill_on_drop(true);
        let child = command.spawn().map_err(|e| {
            tracing::error!(sandbox_id = %sandbox.id, error = %e, "cannot start a command");
            SandboxError::Unavailable(format!("the command could not be started ({})", e.kind()))
        })?;
        let pid = child.id().unwrap_or(0);

        let masker = Masker::for_output(&sandbox.workspace.masks(), spec.env.values().cloned());
        let shaper = OutputShaper::new(masker, spec.max_output_bytes, self.config.output_max_chars);
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(ExecEvent::Started { pid, cwd: cwd_display, timeout: spec.timeout });
        let span = tracing::info_span!("command", sandbox_id = %sandbox.id, thread_id = %sandbox.thread_id, pid, provider = self.provider.kind().label());
        let supervisor = Supervisor {
            child,
            slot,
            tx,
            shaper,
            timeout: spec.timeout,
            grace: Duration::from_millis(self.config.drain_grace_ms),
            shutdown: self.shutdown.clone(),
            provider: self.provider.kind().label(),
        };
        tokio::spawn(supervisor.run().instrument(span));
        Ok(rx)
    }
}

/// Owns one running command until it has exited and its exit has been reported.
struct Supervisor {
    child: Child,
    slot: CommandSlot,
    tx: mpsc::UnboundedSender<ExecEvent>,
    shaper: OutputShaper,
    timeout: Duration,
    grace: Duration,
    shutdown: CancellationToken,
    provider: &'static str,
}

impl Supervisor {
    async fn run(self) {
        // Destructured so the select! arms below borrow disjoint parts (the child, the shaper, the channel).
        let Supervisor { mut child, slot, tx, mut shaper, timeout, grace, shutdown, provider } = self;
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let pgid = child.id();
        let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take()) else {
            kill_group(pgid);
            return;
        };
        let emit = |shaper: &mut OutputShaper, stream: Stream, bytes: &[u8]| {
            for (stream, text) in shaper.push(stream, bytes) {
                let _ = tx.send(ExecEvent::Output { stream, text });
            }
        };
        let mut out_buf = vec![0u8; 8192];
        let mut err_buf = vec![0u8; 8192];
        let (mut out_open, mut err_open) = (true, true);
        let mut status = None;
        let mut killed: Option<KillReason> = None;
        let mut drain_until = deadline;
        let command = slot.command.clone();
        loop {
            if status.is_some() && !out_open && !err_open {
                break;
            }
            tokio::select! {
                read = stdout.read(&mut out_buf), if out_open => match read {
                    Ok(n) if n > 0 => emit(&mut shaper, Stream::Stdout, &out_buf[..n]),
                    _ => out_open = false,
                },
                read = stderr.read(&mut err_buf), if err_open => match read {
                    Ok(n) if n > 0 => emit(&mut shaper, Stream::Stderr, &err_buf[..n]),
                    _ => err_open = false,
                },
                exit = child.wait(), if status.is_none() => {
                    status = Some(exit);
                    drain_until = tokio::time::Instant::now() + grace;
                }
                () = tokio::time::sleep_until(drain_until), if status.is_some() => break,
                () = tokio::time::sleep_until(deadline), if status.is_none() && killed.is_none() => {
                    killed = Some(KillReason::Timeout);
                    kill_group(pgid);
                }
                () = command.killed().cancelled(), if status.is_none() && killed.is_none() => {
                    killed = Some(command.reason().unwrap_or(KillReason::Reset));
                    kill_group(pgid);
                }
                () = shutdown.cancelled(), if status.is_none() && killed.is_none() => {
                    killed = Some(KillReason::Shutdown);
                    kill_group(pgid);
                }
                () = tx.closed(), if status.is_none() && killed.is_none() => {
                    killed = Some(KillReason::Cancelled);
                    kill_group(pgid);
                }
            }
        }
        for (stream, text) in shaper.finish() {
            let _ = tx.send(ExecEvent::Output { stream, text });
        }
        let (exit_code, signal) = match status {
            Some(Ok(status)) => {
                use std::os::unix::process::ExitStatusExt;
                match (status.code(), status.signal()) {
                    (Some(code), _) => (code, 0),
                    (None, Some(signal)) => (-1, signal),
                    (None, None) => (-1, 0),
                }
            }
            _ => (-1, 0),
        };
        let info = ExitInfo {
            exit_code,
            signal,
            timed_out: killed == Some(KillReason::Timeout),
            kill_reason: killed,
            totals: shaper.totals(),
            duration: started.elapsed(),
        };
        let outcome = match (killed, exit_code) {
            (Some(KillReason::Timeout), _) => "timeout",
            (Some(_), _) => "killed",
            (None, 0) => "ok",
            (None, _) => "nonzero",
        };
        metrics::histogram!("antler_sandbox_exec_seconds", "provider" => provider, "outcome" => outcome)
            .record(info.duration.as_secs_f64());
        if let Some(reason) = killed {
            metrics::counter!("antler_sandbox_exec_kills_total", "provider" => provider, "reason" => reason.label()).increment(1);
        }
        tracing::debug!(exit_code, signal, outcome, duration_ms = info.duration.as_millis() as u64, "command finished");
        let _ = tx.send(ExecEvent::Exit(info));
        // The slot is released (and the sandbox touched) only after the exit was reported.
        drop(slot);
    }
}

/// SIGKILL to the command's whole process group.
fn kill_group(pgid: Option<u32>) {
    let Some(pid) = pgid.and_then(|p| i32::try_from(p).ok()).and_then(rustix::process::Pid::from_raw) else { return };
    if let Err(e) = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL) {
        // ESRCH: already gone, which is what we wanted.
        if e != rustix::io::Errno::SRCH {
            tracing::warn!(error = %e, "could not kill a command's process group");
        }
    }
}
