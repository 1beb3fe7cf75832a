//! Stdio servers: a child process in its own process group, started in the thread's workspace with a
//! minimal environment.
//!
//! The child gets only HOME, LOGNAME, PATH, SHELL, TERM, USER and LANG from the service (as the Python MCP
//! SDK does), TMPDIR/TMP/TEMP under the workspace, then the entry's own `env` — never the service's other
//! variables, which hold API keys. It leads a new process group, so closing the session (or dropping it)
//! kills the server and everything it spawned (`npx` wraps the real server in a second process).

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::transport::TokioChildProcess;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::spec::ServerSpec;

/// Variables passed through from the service's environment.
const INHERITED: &[&str] = &["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG"];

/// Bytes of the server's stderr kept for error messages.
const STDERR_TAIL: usize = 2048;

/// How long a failed call waits for a closed server's last stderr lines (see [`StderrTail::settled`]).
const STDERR_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// The last lines a server wrote to stderr (its crash message, usually).
#[derive(Debug, Clone, Default)]
pub struct StderrTail {
    lines: Arc<Mutex<String>>,
    /// Cancelled when the reader reached the end of the pipe (the server exited).
    ended: tokio_util::sync::CancellationToken,
}

impl StderrTail {
    pub fn text(&self) -> String {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).trim().to_owned()
    }

    /// The tail once the reader has seen the end of the pipe, waiting at most [`STDERR_SETTLE`]. A
    /// crashing server writes its last words and exits; the session notices the closed stdout on one
    /// task while the stderr reader, on another, may not have read them yet (seen under load: the
    /// error named no cause). The wait is bounded because a child the server left behind can hold
    /// the pipe open.
    pub async fn settled(&self) -> String {
        let _ = tokio::time::timeout(STDERR_SETTLE, self.ended.cancelled()).await;
        self.text()
    }

    fn push(&self, line: &str) {
        let mut tail = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        tail.push_str(line);
        tail.push('\n');
        if tail.len() > STDERR_TAIL {
            let cut = tail.len() - STDERR_TAIL;
            let cut = (cut..tail.len()).find(|i| tail.is_char_boundary(*i)).unwrap_or(tail.len());
            tail.drain(..cut);
        }
    }
}

/// Kills the server's whole process group when dropped. rmcp's shutdown closes stdin and waits for the
/// server to exit, which a well-behaved server does — leaving behind whatever it spawned (`npx` children,
/// helper processes). The group dies with the session instead.
#[derive(Debug)]
pub struct ProcessGroupGuard(Option<rustix::process::Pid>);

impl Drop for ProcessGroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            // ESRCH (the group is already gone) is the common, fine outcome.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

/// Spawns the server. `cwd` is the thread's workspace, `tmp` its scratch directory.
pub fn spawn(spec: &ServerSpec, cwd: &Path, tmp: &Path) -> std::io::Result<(TokioChildProcess, StderrTail, ProcessGroupGuard)> {
    let mut command = tokio::process::Command::new(&spec.command);
    command.args(&spec.args).env_clear().current_dir(cwd);
    for key in INHERITED {
        if let Some(value) = std::env::var_os(key) {
            command.env(key, value);
        }
    }
    for key in ["TMPDIR", "TMP", "TEMP"] {
        command.env(key, tmp);
    }
    command.envs(&spec.env);
    let mut wrapped = CommandWrap::from(command);
    wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    let (transport, stderr) = TokioChildProcess::builder(wrapped).stderr(Stdio::piped()).spawn()?;
    // The child leads its group, so its pid is the group id.
    let group = ProcessGroupGuard(transport.id().and_then(|pid| rustix::process::Pid::from_raw(pid as i32)));
    let tail = StderrTail::default();
    if let Some(stderr) = stderr {
        let tail = tail.clone();
        let server = spec.name.clone();
        // Ends at EOF, which comes when the child exits: it lives no longer than the server process.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(server = %server, line = %line, "mcp server stderr");
                tail.push(&line);
            }
            tail.ended.cancel();
        });
    }
    Ok((transport, tail, group))
}
