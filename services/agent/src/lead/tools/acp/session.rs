//! One ACP call, start to end: start the agent's process (its own process group, cwd the ACP
//! workspace, confined as [`super::isolation`] built it), `initialize`, `session/new`, one
//! `session/prompt`, then stop the process group. Under bwrap the group's leader is bwrap: killing it
//! ends the sandbox's pid namespace and everything in it.
//!
//! The `agent-client-protocol` crate's futures are not `Send` (its connection lives in `Rc`s and
//! spawns with `spawn_local`), so each call runs on a thread of its own with a current-thread tokio
//! runtime and a `LocalSet`; the run's side talks to it through channels only. A call that times out
//! or is cancelled sends `session/cancel`, gives the agent a moment to end its turn, and then the
//! process group is killed (children the agent started included). The group is killed at every end:
//! an ACP agent does not exit on its own while its stdin is open, and nothing of a call outlives it.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use agent_client_protocol::{self as acp, Agent as _};
use tokio::sync::{mpsc, oneshot};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;

use super::config::AcpAgentConfig;
use super::fs::Workspace;
use super::policy::{PermissionPolicy, choose, kind_name};

/// How long an agent has to end its turn after `session/cancel` before its process group is killed.
const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// How long a finished agent has to exit after SIGTERM before SIGKILL.
const EXIT_GRACE: Duration = Duration::from_millis(500);
/// Progress items one call may queue; beyond this they are counted, not sent (a chatty agent must not
/// grow the run's memory without bound).
const MAX_PROGRESS: usize = 10_000;
/// The tail of the agent's stderr kept for an error message.
const STDERR_TAIL: usize = 2_000;

/// What one call needs.
#[derive(Debug)]
pub struct Call {
    pub agent: AcpAgentConfig,
    /// The agent's process as [`super::isolation::command`] built it (stdio set here).
    pub command: tokio::process::Command,
    pub workspace: Workspace,
    pub prompt: String,
    pub policy: PermissionPolicy,
    pub timeout: Duration,
    /// Agent text kept for the result (more is dropped and marked).
    pub max_chars: usize,
}

/// Something the agent did, streamed to the run as it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Message(String),
    Thought(String),
    ToolCall { id: String, title: Option<String>, kind: Option<String>, status: Option<String> },
    Permission { title: String, kind: String, granted: bool },
    FileRead { path: String, error: Option<String> },
    FileWrite { path: String, error: Option<String> },
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The prompt turn ended (`end_turn`, `max_tokens`, `refusal`, …).
    Finished {
        stop_reason: String,
    },
    /// It could not start, broke the protocol or exited early.
    Failed(String),
    TimedOut,
    Cancelled,
}

/// What a call gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub ending: Ending,
    /// The agent's message text (at most `max_chars`).
    pub text: String,
    /// Whether text beyond `max_chars` was dropped.
    pub cut: bool,
    /// Files written through `fs/write_text_file`, as `/mnt/acp-workspace/…`.
    pub written: Vec<String>,
    /// Writes and reads refused (their paths as the agent gave them).
    pub refused: Vec<String>,
    pub permissions_granted: u32,
    pub permissions_denied: u32,
    /// The end of the agent's stderr.
    pub stderr: String,
}

/// Starts the call on its own thread. Progress arrives on `progress`; the report on the returned
/// receiver. Cancelling `cancel` ends the session (and the process).
pub fn start(call: Call, progress: mpsc::UnboundedSender<Progress>, cancel: CancellationToken) -> oneshot::Receiver<Report> {
    let (done, report) = oneshot::channel();
    let spawned = std::thread::Builder::new().name("acp-call".to_owned()).spawn(move || {
        let report = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => tokio::task::LocalSet::new().block_on(&runtime, run(call, progress, cancel)),
            Err(e) => Report::failed(format!("cannot start a runtime for the call: {e}")),
        };
        let _ = done.send(report);
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start a thread for an ACP call");
    }
    report
}

impl Report {
    /// A call that ended with `why` and nothing else to show.
    pub fn failed(why: String) -> Self {
        Self {
            ending: Ending::Failed(why),
            text: String::new(),
            cut: false,
            written: Vec::new(),
            refused: Vec::new(),
            permissions_granted: 0,
            permissions_denied: 0,
            stderr: String::new(),
        }
    }
}

/// The client side the agent talks to; shared state in `Rc`s (one thread).
struct Client {
    workspace: Workspace,
    policy: PermissionPolicy,
    progress: mpsc::UnboundedSender<Progress>,
    sent: RefCell<usize>,
    state: Rc<RefCell<Report>>,
    max_chars: usize,
}

impl Client {
    fn send(&self, item: Progress) {
        let mut sent = self.sent.borrow_mut();
        if *sent < MAX_PROGRESS {
            *sent += 1;
            let _ = self.progress.send(item);
        }
    }

    fn keep_text(&self, text: &str) {
        let mut state = self.state.borrow_mut();
        let have = state.text.chars().count();
        if have + text.chars().count() <= self.max_chars {
            state.text.push_str(text);
        } else {
            let room = self.max_chars.saturating_sub(have);
            let head: String = text.chars().take(room).collect();
            state.text.push_str(&head);
            state.cut = true;
        }
    }
}

fn text_of(block: &acp::ContentBlock) -> String {
    match block {
        acp::ContentBlock::Text(text) => text.text.clone(),
        acp::ContentBlock::ResourceLink(link) => link.uri.clone(),
        acp::ContentBlock::Image(_) => "[image]".to_owned(),
        acp::ContentBlock::Audio(_) => "[audio]".to_owned(),
        _ => "[resource]".to_owned(),
    }
}

fn wire<T: serde::Serialize>(value: &T) -> Option<String> {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_owned))
}

fn refusal(error: &super::fs::FsError) -> acp::Error {
    acp::Error::new(-32602, error.to_string())
}

#[async_trait::async_trait(?Send)]
impl acp::Client for Client {
    async fn request_permission(&self, args: acp::RequestPermissionRequest) -> acp::Result<acp::RequestPermissionResponse> {
        let fields = &args.tool_call.fields;
        let title = fields.title.clone().unwrap_or_default();
        let granted = self.policy.allows(fields.kind.as_ref(), &title);
        {
            let mut state = self.state.borrow_mut();
            if granted {
                state.permissions_granted += 1;
            } else {
                state.permissions_denied += 1;
            }
        }
        self.send(Progress::Permission { title, kind: kind_name(fields.kind.as_ref()), granted });
        Ok(acp::RequestPermissionResponse::new(choose(&args.options, granted)))
    }

    async fn session_notification(&self, args: acp::SessionNotification) -> acp::Result<()> {
        match args.update {
            acp::SessionUpdate::AgentMessageChunk(chunk) => {
                let text = text_of(&chunk.content);
                self.keep_text(&text);
                self.send(Progress::Message(text));
            }
            acp::SessionUpdate::AgentThoughtChunk(chunk) => self.send(Progress::Thought(text_of(&chunk.content))),
            acp::SessionUpdate::ToolCall(call) => self.send(Progress::ToolCall {
                id: call.tool_call_id.to_string(),
                title: Some(call.title),
                kind: wire(&call.kind),
                status: wire(&call.status),
            }),
            acp::SessionUpdate::ToolCallUpdate(update) => self.send(Progress::ToolCall {
                id: update.tool_call_id.to_string(),
                title: update.fields.title,
                kind: update.fields.kind.as_ref().and_then(wire),
                status: update.fields.status.as_ref().and_then(wire),
            }),
            _ => {}
        }
        Ok(())
    }

    async fn write_text_file(&self, args: acp::WriteTextFileRequest) -> acp::Result<acp::WriteTextFileResponse> {
        match self.workspace.write(&args.path, &args.content) {
            Ok(shown) => {
                self.state.borrow_mut().written.push(shown.clone());
                self.send(Progress::FileWrite { path: shown, error: None });
                Ok(acp::WriteTextFileResponse::new())
            }
            Err(error) => {
                let path = args.path.display().to_string();
                self.state.borrow_mut().refused.push(path.clone());
                self.send(Progress::FileWrite { path, error: Some(error.to_string()) });
                Err(refusal(&error))
            }
        }
    }

    async fn read_text_file(&self, args: acp::ReadTextFileRequest) -> acp::Result<acp::ReadTextFileResponse> {
        let path = args.path.display().to_string();
        match self.workspace.read(&args.path, args.line, args.limit) {
            Ok(content) => {
                self.send(Progress::FileRead { path, error: None });
                Ok(acp::ReadTextFileResponse::new(content))
            }
            Err(error) => {
                self.state.borrow_mut().refused.push(path.clone());
                self.send(Progress::FileRead { path, error: Some(error.to_string()) });
                Err(refusal(&error))
            }
        }
    }
}

/// Sends `sig` to the agent's process group (the agent is its leader).
fn signal_group(pid: Option<u32>, sig: rustix::process::Signal) {
    let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()).and_then(rustix::process::Pid::from_raw) else {
        return;
    };
    // ESRCH: the group is gone already.
    let _ = rustix::process::kill_process_group(pid, sig);
}

async fn run(call: Call, progress: mpsc::UnboundedSender<Progress>, cancel: CancellationToken) -> Report {
    let Call { agent, mut command, workspace, prompt, policy, timeout, max_chars } = call;
    let cwd: PathBuf = workspace.root().to_path_buf();
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return Report::failed(format!("cannot start `{}`: {e}", agent.command)),
    };
    let pid = child.id();
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        signal_group(pid, rustix::process::Signal::KILL);
        return Report::failed("the agent's stdio could not be attached".to_owned());
    };
    let stderr_tail = Rc::new(RefCell::new(String::new()));
    if let Some(stderr) = child.stderr.take() {
        let tail = stderr_tail.clone();
        tokio::task::spawn_local(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut tail = tail.borrow_mut();
                tail.push_str(&line);
                tail.push('\n');
                if tail.len() > STDERR_TAIL * 2 {
                    let cut = tail.len() - STDERR_TAIL;
                    let at = (cut..tail.len()).find(|i| tail.is_char_boundary(*i)).unwrap_or(tail.len());
                    tail.drain(..at);
                }
            }
        });
    }
    let state = Rc::new(RefCell::new(Report::failed(String::new())));
    let client = Client { workspace, policy, progress, sent: RefCell::new(0), state: state.clone(), max_chars };
    let (conn, io) = acp::ClientSideConnection::new(client, stdin.compat_write(), stdout.compat(), |fut| {
        tokio::task::spawn_local(fut);
    });
    let io = tokio::task::spawn_local(io);
    let session_id: RefCell<Option<acp::SessionId>> = RefCell::new(None);
    let conversation = async {
        let capabilities = acp::ClientCapabilities::new()
            .fs(acp::FileSystemCapabilities::new().read_text_file(true).write_text_file(true))
            .terminal(false);
        conn.initialize(
            acp::InitializeRequest::new(acp::ProtocolVersion::V1)
                .client_capabilities(capabilities)
                .client_info(acp::Implementation::new("antler", env!("CARGO_PKG_VERSION"))),
        )
        .await
        .map_err(|e| format!("initialize failed: {e}"))?;
        let session = conn.new_session(acp::NewSessionRequest::new(cwd.clone())).await.map_err(|e| format!("session/new failed: {e}"))?;
        *session_id.borrow_mut() = Some(session.session_id.clone());
        let answer = conn
            .prompt(acp::PromptRequest::new(session.session_id, vec![prompt.as_str().into()]))
            .await
            .map_err(|e| format!("session/prompt failed: {e}"))?;
        Ok::<_, String>(wire(&answer.stop_reason).unwrap_or_else(|| "unknown".to_owned()))
    };
    let mut conversation = std::pin::pin!(conversation);
    let stop_early = |ending: Ending| async {
        let id = session_id.borrow().clone();
        if let Some(id) = id {
            let _ = conn.cancel(acp::CancelNotification::new(id)).await;
        }
        ending
    };
    let ending = tokio::select! {
        outcome = &mut conversation => match outcome {
            Ok(stop_reason) => Ending::Finished { stop_reason },
            Err(why) => Ending::Failed(why),
        },
        status = child.wait() => {
            let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
            Ending::Failed(format!("the agent exited ({status}) before its turn ended"))
        }
        () = tokio::time::sleep(timeout) => stop_early(Ending::TimedOut).await,
        () = cancel.cancelled() => stop_early(Ending::Cancelled).await,
    };
    if matches!(ending, Ending::TimedOut | Ending::Cancelled) {
        // Let the turn end with `cancelled` so the agent can tidy up; the process goes either way.
        let _ = tokio::time::timeout(CANCEL_GRACE, &mut conversation).await;
    }
    signal_group(pid, rustix::process::Signal::TERM);
    if tokio::time::timeout(EXIT_GRACE, child.wait()).await.is_err() {
        tracing::debug!(pid, "the ACP agent did not exit on SIGTERM");
    }
    signal_group(pid, rustix::process::Signal::KILL);
    let _ = child.wait().await;
    io.abort();
    let mut report = state.replace(Report::failed(String::new()));
    report.ending = ending;
    report.stderr = stderr_tail.borrow().trim().to_owned();
    report
}
