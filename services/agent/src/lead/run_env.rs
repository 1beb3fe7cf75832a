//! What one run of the lead agent shares between its loop, middlewares and tools: the run's
//! context, the lazily acquired sandbox, presented files and the stop reason.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use antler_kit::client::ServiceClient;
use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
use antler_proto::sandbox::{AcquireSandboxRequest, ReleaseSandboxRequest, SnapshotOutputsRequest};
use tokio::sync::OnceCell;

use super::state::{Promoted, Todo};
use super::tools::error::ToolError;
use crate::AgentContext;

/// Shared by everything inside one run attempt.
#[derive(Debug)]
pub struct RunEnv {
    pub ctx: AgentContext,
    /// The sandbox id and whether it runs commands, once acquired (lazily: a run that never touches
    /// a file never acquires one).
    sandbox: OnceCell<(String, bool)>,
    /// Paths passed to `present_files`, in order, without duplicates.
    presented: Mutex<Vec<String>>,
    /// Set by a middleware that ends the run early (`loop_capped`, `clarification`, …).
    stop_reason: Mutex<Option<String>>,
    /// A plan written by `write_todos` and not yet moved into the state.
    todos: Mutex<Option<Vec<Todo>>>,
    /// Set by an after_model hook that wants another model turn although the last one had no tool
    /// calls (the Todo layer's completion reminder).
    jump_to_model: AtomicBool,
    /// The outputs directory when the run started (path → SHA-256); see `ThreadState::outputs_before`.
    outputs_before: Mutex<Option<BTreeMap<String, String>>>,
    /// The MCP service's hash of this attempt's deferred tools (empty: none deferred).
    catalog_hash: String,
    /// Deferred tools `tool_search` promoted, under the catalog hash they were found in.
    promoted: Mutex<Promoted>,
    /// Images `view_image` accepted, (path, media type), shown with the next model call only.
    images: Mutex<Vec<(String, String)>>,
    /// The user's enabled skills for this attempt (see `lead::skills`).
    skills: std::sync::OnceLock<Vec<super::skills::SkillInfo>>,
}

impl RunEnv {
    pub fn new(ctx: AgentContext) -> Self {
        Self::with_catalog(ctx, String::new())
    }

    /// An attempt whose deferred MCP tools have the catalog hash `catalog_hash`.
    pub fn with_catalog(ctx: AgentContext, catalog_hash: String) -> Self {
        Self {
            catalog_hash,
            promoted: Mutex::new(Promoted::default()),
            images: Mutex::new(Vec::new()),
            skills: std::sync::OnceLock::new(),
            ctx,
            sandbox: OnceCell::new(),
            presented: Mutex::new(Vec::new()),
            stop_reason: Mutex::new(None),
            todos: Mutex::new(None),
            jump_to_model: AtomicBool::new(false),
            outputs_before: Mutex::new(None),
        }
    }

    /// Sets this attempt's enabled skills (once, before the loop starts).
    pub fn set_skills(&self, skills: Vec<super::skills::SkillInfo>) {
        let _ = self.skills.set(skills);
    }

    /// This attempt's enabled skills (empty when skills are off or none are enabled).
    pub fn skills(&self) -> &[super::skills::SkillInfo] {
        self.skills.get().map_or(&[], Vec::as_slice)
    }

    /// The thread whose sandbox this run works in: its own, or for a subagent run its parent's (the
    /// lead agent and its subagents share one workspace).
    pub fn thread_id(&self) -> &str {
        match self.ctx.spec.request.subagent.as_ref() {
            Some(task) if !task.parent_thread_id.is_empty() => &task.parent_thread_id,
            _ => &self.ctx.spec.thread_id,
        }
    }

    /// Whether this run is a subagent's child run.
    pub fn is_subagent(&self) -> bool {
        self.ctx.spec.request.subagent.is_some()
    }

    /// The sandbox service client, acquiring the thread's sandbox on first use.
    pub async fn sandbox(&self) -> Result<(SandboxServiceClient<antler_kit::transport::Transport>, &ServiceClient), ToolError> {
        let client = self.ctx.clients().get("sandbox").ok_or(ToolError::NoSandboxClient)?;
        let mut grpc = SandboxServiceClient::new(client.channel());
        self.sandbox
            .get_or_try_init(|| async {
                let request = client.request(&self.ctx.call_context(), AcquireSandboxRequest { thread_id: self.thread_id().to_owned() });
                let response = grpc.acquire_sandbox(request).await.map_err(ToolError::Sandbox)?.into_inner();
                let (id, exec_enabled) = response.sandbox.map(|s| (s.sandbox_id, s.exec_enabled)).unwrap_or_default();
                tracing::debug!(run_id = %self.ctx.spec.run_id, sandbox_id = %id, exec_enabled, "sandbox acquired");
                Ok::<_, ToolError>((id, exec_enabled))
            })
            .await?;
        Ok((grpc, client))
    }

    /// The sandbox id if one was acquired during this attempt.
    pub fn sandbox_id(&self) -> Option<String> {
        self.sandbox.get().map(|(id, _)| id.clone())
    }

    /// Whether the thread's sandbox runs commands (acquiring it on first use): false for the `local`
    /// provider without `sandbox.allow_host_bash`.
    pub async fn exec_enabled(&self) -> Result<bool, ToolError> {
        self.sandbox().await?;
        Ok(self.sandbox.get().is_some_and(|(_, enabled)| *enabled))
    }

    /// Releases the sandbox if this attempt acquired one, killing commands still running in it (a
    /// tool call cut short by a cancel). Files stay; the next run on the thread reactivates it. Best
    /// effort: the sandbox service also releases idle sandboxes itself.
    pub async fn release_sandbox(&self) {
        // A subagent borrows its parent's sandbox, which the parent (still running) releases.
        if self.is_subagent() {
            return;
        }
        let (Some(_), Some(client)) = (self.sandbox.get(), self.ctx.clients().get("sandbox")) else { return };
        let request = client.request(
            &self.ctx.call_context(),
            ReleaseSandboxRequest { thread_id: self.thread_id().to_owned(), terminate_processes: true, ..Default::default() },
        );
        match SandboxServiceClient::new(client.channel()).release_sandbox(request).await {
            Ok(_) => tracing::debug!(run_id = %self.ctx.spec.run_id, "sandbox released"),
            Err(status) => {
                tracing::warn!(run_id = %self.ctx.spec.run_id, code = ?status.code(), "could not release the sandbox: {}", status.message())
            }
        }
    }

    /// Tells the sandbox service at once that this attempt has taken the run over: its fencing token
    /// (see `AgentContext::call_context`) on a GetSandbox makes the service kill the commands an
    /// earlier attempt still has running and refuse that attempt's further calls, without waiting for
    /// this attempt's first tool call. Best effort: a thread without a sandbox has nothing to kill.
    pub async fn announce_attempt(&self) {
        use antler_proto::sandbox::GetSandboxRequest;
        let Some(client) = self.ctx.clients().get("sandbox") else { return };
        let request = client.request(&self.ctx.call_context(), GetSandboxRequest { thread_id: self.thread_id().to_owned() });
        match SandboxServiceClient::new(client.channel()).get_sandbox(request).await {
            Ok(_) => {
                tracing::debug!(run_id = %self.ctx.spec.run_id, attempt = self.ctx.spec.attempt, "new attempt announced to the sandbox")
            }
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => {
                tracing::warn!(run_id = %self.ctx.spec.run_id, code = ?status.code(), "could not announce the attempt to the sandbox: {}", status.message())
            }
        }
    }

    /// Lists the thread's outputs directory (path → SHA-256) without acquiring the sandbox: a thread
    /// that never had one has no outputs.
    pub async fn snapshot_outputs(&self) -> Result<BTreeMap<String, String>, ToolError> {
        let client = self.ctx.clients().get("sandbox").ok_or(ToolError::NoSandboxClient)?;
        let request = client.request(&self.ctx.call_context(), SnapshotOutputsRequest { thread_id: self.thread_id().to_owned() });
        match SandboxServiceClient::new(client.channel()).snapshot_outputs(request).await {
            Ok(response) => Ok(response.into_inner().files.into_iter().map(|f| (f.path, f.sha256)).collect()),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(BTreeMap::new()),
            Err(status) => Err(ToolError::Sandbox(status)),
        }
    }

    pub fn set_outputs_before(&self, files: Option<BTreeMap<String, String>>) {
        *self.outputs_before.lock().unwrap_or_else(|p| p.into_inner()) = files;
    }

    pub fn outputs_before(&self) -> Option<BTreeMap<String, String>> {
        self.outputs_before.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Queues an image for the next model call.
    pub fn view_image(&self, path: &str, mime: &str) {
        let mut images = self.images.lock().unwrap_or_else(|p| p.into_inner());
        if !images.iter().any(|(p, _)| p == path) {
            images.push((path.to_owned(), mime.to_owned()));
        }
    }

    /// The images queued since the last model call (taken: each is shown once).
    pub fn take_images(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.images.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Records tools promoted by `tool_search` (see [`Promoted::merge`]).
    pub fn promote(&self, catalog_hash: &str, names: &[String]) {
        self.promoted.lock().unwrap_or_else(|p| p.into_inner()).merge(catalog_hash, names);
    }

    /// Whether a deferred tool may be offered and called: promoted under this attempt's catalog.
    pub fn is_promoted(&self, name: &str) -> bool {
        let promoted = self.promoted.lock().unwrap_or_else(|p| p.into_inner());
        promoted.catalog_hash == self.catalog_hash && promoted.names.iter().any(|n| n == name)
    }

    pub fn promoted(&self) -> Promoted {
        self.promoted.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Restores the promotions of a checkpoint.
    pub fn set_promoted(&self, promoted: Promoted) {
        *self.promoted.lock().unwrap_or_else(|p| p.into_inner()) = promoted;
    }

    pub fn present(&self, paths: &[String]) {
        let mut presented = self.presented.lock().unwrap_or_else(|p| p.into_inner());
        for path in paths {
            if !presented.contains(path) {
                presented.push(path.clone());
            }
        }
    }

    pub fn presented(&self) -> Vec<String> {
        self.presented.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sets the stop reason; the first one wins.
    pub fn stop(&self, reason: &str) {
        let mut current = self.stop_reason.lock().unwrap_or_else(|p| p.into_inner());
        if current.is_none() {
            *current = Some(reason.to_owned());
        }
    }

    pub fn stop_reason(&self) -> Option<String> {
        self.stop_reason.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records a new plan (moved into the state after the tool round).
    pub fn set_todos(&self, todos: Vec<Todo>) {
        *self.todos.lock().unwrap_or_else(|p| p.into_inner()) = Some(todos);
    }

    pub fn take_todos(&self) -> Option<Vec<Todo>> {
        self.todos.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Asks the loop for one more model turn.
    pub fn jump_to_model(&self) {
        self.jump_to_model.store(true, Ordering::SeqCst);
    }

    pub fn take_jump(&self) -> bool {
        self.jump_to_model.swap(false, Ordering::SeqCst)
    }
}
