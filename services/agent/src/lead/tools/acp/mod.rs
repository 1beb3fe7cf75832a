//! `invoke_acp_agent` (DeerFlow's ACP agents, `runs.lead.acp_agents`): hands a task to an external
//! coding agent that speaks the Agent Client Protocol (JSON-RPC on its stdio), through the
//! `agent-client-protocol` crate.
//!
//! By file: the settings (`config.rs`), the answers to permission requests (`policy.rs`), the
//! `fs/*` requests confined to the ACP workspace (`fs.rs`), how the agent's process is confined
//! (`isolation.rs`: bwrap by default), one call's process and protocol conversation (`session.rs`).
//! Here: the tool, which finds the thread's ACP workspace on the host, streams what the agent does as
//! `acp_agent` custom events and answers the agent's final text.
//!
//! The workspace is the sandbox service's `users/{user}/threads/{thread}/acp-workspace`: the agent's
//! cwd, the only place the client side writes for it and, under bwrap, the only place the agent's
//! own process can write; the lead agent's sandbox mounts it read-only at `/mnt/acp-workspace`.
//! One process per call, never pooled: a call's process, cwd and
//! permissions belong to one thread, and an agent keeps conversation state that must not leak into
//! another thread's call. The tool is side-effecting, so the journal keeps a resumed run from calling
//! the agent twice.

pub mod config;
pub mod fs;
pub mod isolation;
pub mod policy;
pub mod session;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use antler_proto::common::{ToolCall, ToolSpec};
use antler_proto::runs::CustomEvent;
use antler_proto::runs::run_event::Kind;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use sha2::Digest;
use tokio_util::sync::CancellationToken;

use self::config::{AcpAgentConfig, AcpConfig};
use self::policy::PermissionPolicy;
use self::session::{Call, Ending, Progress, Report};
use super::{Args, Tool, ToolError, ToolOutput};
use crate::lead::run_env::RunEnv;

/// The custom event's name.
pub const EVENT: &str = "acp_agent";
pub const NAME: &str = "invoke_acp_agent";

#[derive(Debug)]
pub struct InvokeAcpAgent {
    agents: BTreeMap<String, AcpAgentConfig>,
    config: AcpConfig,
    policy: PermissionPolicy,
    spec: Arc<ToolSpec>,
}

impl InvokeAcpAgent {
    /// The tool over the configured agents (None when there are none). `config` is checked already.
    pub fn new(agents: &BTreeMap<String, AcpAgentConfig>, config: &AcpConfig) -> Option<Self> {
        if agents.is_empty() {
            return None;
        }
        let policy = PermissionPolicy::parse(&config.permissions).unwrap_or_default();
        let mut description = String::from(
            "Hand a self-contained coding task to an external coding agent (Agent Client Protocol) and get its final answer. \
             The agent works in its own workspace, /mnt/acp-workspace, which you can read (read_file, ls, bash) but not \
             write: copy what you need into /mnt/user-data. It cannot see your files, so put everything it needs into the \
             prompt. Available agents:",
        );
        for (name, agent) in agents {
            let what = if agent.description.is_empty() { "a coding agent" } else { agent.description.as_str() };
            description.push_str(&format!("\n- {name}: {what}"));
        }
        let parameters = json!({
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": agents.keys().collect::<Vec<_>>(), "description": "Which agent to use."},
                "prompt": {"type": "string", "description": "The complete task for the agent: what to build or change, and how to check it."}
            },
            "required": ["agent", "prompt"]
        });
        let spec = Arc::new(super::spec_with_schema(NAME.to_owned(), description, &parameters));
        Some(Self { agents: agents.clone(), config: config.clone(), policy, spec })
    }
}

/// `users/{user}/threads/{thread}/acp-workspace` under the sandbox directory: the sandbox service's
/// layout (`antler_sandbox::workspace`), whose user directory naming this repeats (a test holds the
/// two together).
pub fn workspace_dir(root: &Path, user_id: &str, thread_id: &str) -> Option<PathBuf> {
    let plain = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0');
    plain(thread_id).then(|| root.join("users").join(user_dir_name(user_id)).join("threads").join(thread_id).join("acp-workspace"))
}

/// The sandbox service's `ids::user_dir_name`: a safe id as it is, else its safe characters and a hash.
pub fn user_dir_name(user_id: &str) -> String {
    let safe = !user_id.is_empty() && user_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if safe {
        return user_id.to_owned();
    }
    let replaced: String = user_id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '-' }).collect();
    let digest = hex::encode(sha2::Sha256::digest(user_id.as_bytes()));
    format!("{replaced}.{}", &digest[..16])
}

fn event(call_id: &str, agent: &str, data: Value) -> Kind {
    let mut data = data;
    if let Value::Object(map) = &mut data {
        map.insert("tool_call_id".to_owned(), json!(call_id));
        map.insert("agent".to_owned(), json!(agent));
    }
    Kind::Custom(CustomEvent { name: EVENT.to_owned(), data: Some(antler_kit::json::json_to_value(&data)) })
}

/// The events of a batch of progress, consecutive message (and thought) chunks joined into one.
fn progress_events(call_id: &str, agent: &str, items: Vec<Progress>) -> Vec<Kind> {
    let mut merged: Vec<Progress> = Vec::with_capacity(items.len());
    for item in items {
        match (merged.last_mut(), item) {
            (Some(Progress::Message(text)), Progress::Message(more)) | (Some(Progress::Thought(text)), Progress::Thought(more)) => {
                text.push_str(&more);
            }
            (_, item) => merged.push(item),
        }
    }
    merged
        .into_iter()
        .map(|item| {
            let data = match item {
                Progress::Message(text) => json!({"type": "message", "text": text}),
                Progress::Thought(text) => json!({"type": "thought", "text": text}),
                Progress::ToolCall { id, title, kind, status } => {
                    json!({"type": "tool_call", "id": id, "title": title, "kind": kind, "status": status})
                }
                Progress::Permission { title, kind, granted } => {
                    json!({"type": "permission", "title": title, "kind": kind, "granted": granted})
                }
                Progress::FileRead { path, error } => json!({"type": "file_read", "path": path, "error": error}),
                Progress::FileWrite { path, error } => json!({"type": "file_write", "path": path, "error": error}),
            };
            event(call_id, agent, data)
        })
        .collect()
}

impl InvokeAcpAgent {
    /// The model's answer for a finished call.
    fn answer(&self, name: &str, report: &Report) -> ToolOutput {
        let mut notes = String::new();
        if !report.written.is_empty() {
            notes.push_str(&format!("Files it wrote (read-only for you): {}.\n", report.written.join(", ")));
        }
        if !report.refused.is_empty() {
            notes.push_str(&format!("Refused, outside its workspace: {}.\n", report.refused.join(", ")));
        }
        if report.permissions_granted + report.permissions_denied > 0 {
            notes.push_str(&format!(
                "Permission requests: {} granted, {} denied (runs.lead.acp.permissions).\n",
                report.permissions_granted, report.permissions_denied
            ));
        }
        let mut text = report.text.clone();
        if report.cut {
            text.push_str(&format!(
                "\n[… cut: the agent's answer is longer than {} characters (runs.lead.acp.max_output_chars).]",
                self.config.max_output_chars
            ));
        }
        let mut stderr = if report.stderr.is_empty() { String::new() } else { format!("\nIts stderr ended with:\n{}", report.stderr) };
        if let Some(hint) = isolation::hint(&self.config, &report.stderr) {
            stderr.push_str(&format!("\n{hint}"));
        }
        match &report.ending {
            Ending::Finished { stop_reason } => ToolOutput::ok(format!(
                "ACP agent `{name}` finished (stop reason: {stop_reason}). Its workspace is /mnt/acp-workspace.\n{notes}\n{text}"
            )),
            Ending::TimedOut => ToolOutput::error(format!(
                "Error: ACP agent `{name}` did not finish within {} s (runs.lead.acp.timeout_seconds); its session was cancelled \
                 and its processes stopped. {notes}What it said so far:\n{text}",
                self.config.timeout_seconds
            )),
            Ending::Cancelled => ToolOutput::error(format!("Error: the call to ACP agent `{name}` was cancelled.")),
            Ending::Failed(why) => ToolOutput::error(format!("Error: ACP agent `{name}` failed: {why}.{stderr}")),
        }
    }

    fn root(&self) -> PathBuf {
        PathBuf::from(&self.config.workspace_root)
    }
}

fn outcome(ending: &Ending) -> &'static str {
    match ending {
        Ending::Finished { .. } => "ok",
        Ending::Failed(_) => "failed",
        Ending::TimedOut => "timeout",
        Ending::Cancelled => "cancelled",
    }
}

impl Tool for InvokeAcpAgent {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &str {
        &self.spec.description
    }

    fn parameters(&self) -> Value {
        json!({})
    }

    fn own_spec(&self) -> Option<Arc<ToolSpec>> {
        Some(self.spec.clone())
    }

    fn side_effect(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        self.invoke(env, String::new(), args)
    }

    /// The events name the call's id.
    fn call_for<'a>(&'a self, env: &'a RunEnv, call: &'a ToolCall, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        self.invoke(env, call.id.clone(), args)
    }
}

impl InvokeAcpAgent {
    fn invoke<'a>(&'a self, env: &'a RunEnv, call_id: String, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let name = args.required("agent")?;
            let prompt = args.required("prompt")?;
            let Some(agent) = self.agents.get(&name) else {
                let names: Vec<&str> = self.agents.keys().map(String::as_str).collect();
                return Ok(ToolOutput::error(format!("Error: there is no ACP agent `{name}`; configured: {}", names.join(", "))));
            };
            // The sandbox service creates the thread's directories, acp-workspace among them.
            env.sandbox().await?;
            let Some(dir) = workspace_dir(&self.root(), &env.ctx.spec.user_id, env.thread_id()) else {
                return Ok(ToolOutput::error(format!("Error: the thread id `{}` cannot name a directory", env.thread_id())));
            };
            if let Err(e) = std::fs::create_dir_all(&dir) {
                return Ok(ToolOutput::error(format!("Error: the ACP workspace cannot be created (runs.lead.acp.workspace_root): {e}")));
            }
            let workspace = match fs::Workspace::open(&dir) {
                Ok(workspace) => workspace,
                Err(e) => return Ok(ToolOutput::error(format!("Error: the ACP workspace cannot be opened: {e}"))),
            };
            let command = match isolation::command(agent, &self.config, workspace.root()) {
                Ok(command) => command,
                Err(why) => return Ok(ToolOutput::error(format!("Error: ACP agent `{name}` cannot be started: {why}"))),
            };
            let ctx = &env.ctx;
            let stopping = |_| ToolError::Stopping;
            ctx.emit(event(&call_id, &name, json!({"type": "started", "prompt": prompt}))).await.map_err(stopping)?;
            let (progress, mut updates) = tokio::sync::mpsc::unbounded_channel();
            let cancel = CancellationToken::new();
            // Dropping this future (the run's task aborted) ends the session too.
            let _ends_session = cancel.clone().drop_guard();
            let request = Call {
                agent: agent.clone(),
                command,
                workspace,
                prompt,
                policy: self.policy.clone(),
                timeout: Duration::from_secs(self.config.timeout_seconds),
                max_chars: self.config.max_output_chars,
            };
            let mut done = session::start(request, progress, cancel.clone());
            let stopped = ctx.cancelled();
            let mut run_cancelled = false;
            let report = loop {
                tokio::select! {
                    biased;
                    Some(first) = updates.recv() => {
                        let mut batch = vec![first];
                        while let Ok(more) = updates.try_recv() {
                            batch.push(more);
                        }
                        ctx.emit_many(progress_events(&call_id, &name, batch)).await.map_err(stopping)?;
                    }
                    report = &mut done => break report.unwrap_or_else(|_| Report::failed("the call's thread ended without a report".to_owned())),
                    () = stopped.cancelled(), if !run_cancelled => {
                        run_cancelled = true;
                        cancel.cancel();
                    }
                }
            };
            let mut rest = Vec::new();
            while let Ok(more) = updates.try_recv() {
                rest.push(more);
            }
            metrics::counter!("antler_agent_acp_calls_total", "outcome" => outcome(&report.ending)).increment(1);
            tracing::info!(run_id = %ctx.spec.run_id, agent = %name, outcome = outcome(&report.ending), "ACP call ended");
            if run_cancelled {
                // The run is stopping: its events can no longer be written; the intent stays (unknown outcome).
                return Err(ToolError::Stopping);
            }
            let mut events = progress_events(&call_id, &name, rest);
            let (stop_reason, failure) = match &report.ending {
                Ending::Finished { stop_reason } => (stop_reason.clone(), String::new()),
                Ending::Failed(why) => (String::new(), why.clone()),
                _ => (String::new(), String::new()),
            };
            events.push(event(
                &call_id,
                &name,
                json!({"type": "finished", "outcome": outcome(&report.ending), "stop_reason": stop_reason, "error": failure, "written": report.written}),
            ));
            ctx.emit_many(events).await.map_err(stopping)?;
            Ok(self.answer(&name, &report))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_is_where_the_sandbox_service_keeps_it() {
        for user in ["alice", "a.b@example.com", "", "ü"] {
            assert_eq!(user_dir_name(user), antler_sandbox::ids::user_dir_name(user), "{user:?}");
        }
        let dir = workspace_dir(Path::new("/data/sandbox"), "alice", "t1");
        assert_eq!(dir, Some(PathBuf::from("/data/sandbox/users/alice/threads/t1/acp-workspace")));
        assert_eq!(workspace_dir(Path::new("/d"), "alice", "../x"), None);
        assert_eq!(workspace_dir(Path::new("/d"), "alice", ".."), None);
    }

    #[test]
    fn chunks_are_joined_and_every_event_names_its_call() {
        let events = progress_events(
            "c1",
            "double",
            vec![
                Progress::Message("Hel".to_owned()),
                Progress::Message("lo".to_owned()),
                Progress::Permission { title: "t".to_owned(), kind: "edit".to_owned(), granted: false },
                Progress::Message("!".to_owned()),
            ],
        );
        assert_eq!(events.len(), 3);
        let Kind::Custom(first) = &events[0] else { panic!("not custom") };
        let data = antler_kit::json::value_to_json(&first.data.clone().unwrap_or_default());
        assert_eq!(data["text"], "Hello");
        assert_eq!(data["tool_call_id"], "c1");
        assert_eq!(data["agent"], "double");
    }

    #[test]
    fn no_agents_no_tool_and_the_description_lists_them() {
        assert!(InvokeAcpAgent::new(&BTreeMap::new(), &AcpConfig::default()).is_none());
        let agents = BTreeMap::from([(
            "codex".to_owned(),
            AcpAgentConfig { command: "codex-acp".to_owned(), description: "Writes Rust.".to_owned(), ..Default::default() },
        )]);
        let tool = InvokeAcpAgent::new(&agents, &AcpConfig::default());
        assert!(tool.is_some_and(|t| t.description().contains("- codex: Writes Rust.") && t.side_effect()));
    }
}
