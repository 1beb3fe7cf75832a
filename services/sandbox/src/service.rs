//! The sandbox domain behind the gRPC handlers: lifecycle (acquire, get, release, reset, idle reaping),
//! file tools and command execution for one caller's sandboxes. Every entry point takes the caller's
//! user id, so a sandbox is only ever looked up under its owner.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::SandboxConfig;
use crate::convert::launch::{ConvertError, Converter};
use crate::convert::{Detected, Format};
use crate::error::{Result, SandboxError};
use crate::exec::{ExecEvent, ExecSpec, Runner};
use crate::fence::{Admitted, Fence, Fences};
use crate::files;
use crate::files::companion::Companion;
use crate::ids;
use crate::mask::Masker;
use crate::paths::{Root, VirtualPath};
use crate::providers::{Provider, Selection};
use crate::registry::{KillReason, Registry, Sandbox};

/// The service's state: live sandboxes, the provider, the limits.
#[derive(Debug)]
pub struct Sandboxes {
    registry: Registry,
    runner: Runner,
    provider: Arc<dyn Provider>,
    unusable: Option<String>,
    config: SandboxConfig,
    /// The highest attempt seen per run (see [`crate::fence`]).
    fences: Fences,
    skills: Arc<crate::skills::library::Library>,
    /// Document conversion (uploads and ConvertDocument).
    converter: Arc<Converter>,
}

/// Runs blocking filesystem work on the blocking pool.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| SandboxError::Internal(format!("a filesystem task failed: {e}")))?
}

impl Sandboxes {
    pub fn new(config: SandboxConfig, selection: Selection, shutdown: CancellationToken) -> Self {
        let runner = Runner::new(selection.provider.clone(), config.commands.clone(), shutdown);
        let capacity = usize::try_from(config.max_live_sandboxes).unwrap_or(usize::MAX);
        let skills = selection.layout.skills().clone();
        Self {
            skills,
            registry: Registry::new(selection.layout, capacity),
            runner,
            provider: selection.provider,
            unusable: selection.unusable,
            fences: Fences::new(
                Duration::from_secs(config.fence_retention_secs),
                usize::try_from(config.fence_max_runs).unwrap_or(usize::MAX),
            ),
            converter: Arc::new(Converter::disabled(&config.uploads.convert, "document conversion was not started in this process")),
            config,
        }
    }

    /// Uses `converter` for uploads and ConvertDocument (see [`crate::build`]).
    pub fn with_converter(mut self, converter: Converter) -> Self {
        self.converter = Arc::new(converter);
        self
    }

    pub fn converter(&self) -> &Converter {
        &self.converter
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// The users' skills (SkillService).
    pub fn skills(&self) -> &Arc<crate::skills::library::Library> {
        &self.skills
    }

    pub fn provider(&self) -> &dyn Provider {
        self.provider.as_ref()
    }

    /// Releases idle sandboxes every `reap_interval_secs` and kills every command at shutdown. The task
    /// ends when `shutdown` is cancelled.
    pub fn spawn_background(self: &Arc<Self>, shutdown: CancellationToken) {
        let this = self.clone();
        let interval = Duration::from_secs(self.config.reap_interval_secs);
        let idle = Duration::from_secs(self.config.idle_release_secs);
        let task = async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => {
                        let killed = this.registry.kill_everything(KillReason::Shutdown);
                        if killed > 0 {
                            tracing::info!(killed, "shutdown: killed running sandbox commands");
                        }
                        return;
                    }
                    _ = ticker.tick() => {
                        if !idle.is_zero() {
                            this.registry.release_idle(idle);
                        }
                        this.fences.forget_stale();
                    }
                }
            }
        };
        tokio::spawn(tracing::Instrument::instrument(task, tracing::info_span!("sandbox_reaper")));
    }

    /// AcquireSandbox.
    pub async fn acquire(&self, user_id: &str, thread_id: &str) -> Result<(Arc<Sandbox>, bool)> {
        ids::check_thread_id(thread_id)?;
        if self.unusable.is_some() {
            // The reason (logged at start-up) can name host paths, so the client gets a generic message.
            return Err(SandboxError::FailedPrecondition(
                "sandbox.provider is bwrap, but bwrap cannot create sandboxes on this host\nhint: an operator can find the reason in the server's start-up log; sandbox.provider: auto falls back to local".to_owned(),
            ));
        }
        let (sandbox, created) = self.registry.acquire(user_id, thread_id).await?;
        // DEBUG, not INFO: at the default level a run logs one line, `run finished` (#32).
        tracing::debug!(sandbox_id = %sandbox.id, thread_id, created, "sandbox acquired");
        Ok((sandbox, created))
    }

    /// GetSandbox: no side effect, not even on last_used_at.
    pub fn get(&self, user_id: &str, thread_id: &str) -> Result<Arc<Sandbox>> {
        ids::check_thread_id(thread_id)?;
        self.registry.find(user_id, thread_id)
    }

    /// The sandbox for any other RPC (records the use).
    fn find(&self, user_id: &str, thread_id: &str) -> Result<Arc<Sandbox>> {
        let sandbox = self.get(user_id, thread_id)?;
        sandbox.touch();
        Ok(sandbox)
    }

    /// ReleaseSandbox; with `delete`, the sandbox is deleted (its commands killed, its directories
    /// removed, the registry entry forgotten), as DeleteThread needs.
    pub async fn release(&self, user_id: &str, thread_id: &str, terminate: bool, delete: bool) -> Result<(Arc<Sandbox>, u32)> {
        let sandbox = self.find(user_id, thread_id)?;
        let killed = sandbox.release(terminate || delete);
        if delete {
            // Let the killed commands finish dying, so nothing of theirs writes into the tree being removed.
            self.settle(&sandbox).await;
            let workspace = sandbox.workspace.clone();
            blocking(move || {
                workspace.remove().map_err(|e| SandboxError::Unavailable(format!("cannot remove the sandbox's directories: {e}")))
            })
            .await?;
            self.registry.forget(user_id, thread_id);
            tracing::info!(sandbox_id = %sandbox.id, thread_id, killed, "sandbox deleted");
        } else {
            tracing::info!(sandbox_id = %sandbox.id, thread_id, killed, "sandbox released");
        }
        Ok((sandbox, killed))
    }

    /// Waits (bounded: a process stuck in the kernel must not hang the call) until no command of
    /// `sandbox` runs.
    async fn settle(&self, sandbox: &Sandbox) {
        for _ in 0..100 {
            if sandbox.running_commands() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// ResetSandbox: kills commands, forgets locks, optionally empties directories.
    pub async fn reset(&self, user_id: &str, thread_id: &str, clear: &[Root]) -> Result<(Arc<Sandbox>, u32, u64)> {
        let sandbox = self.find(user_id, thread_id)?;
        sandbox.require_active()?;
        let killed = sandbox.kill_all(KillReason::Reset);
        // Let the killed commands finish dying before their directories are emptied.
        self.settle(&sandbox).await;
        sandbox.locks.clear();
        let workspace = sandbox.workspace.clone();
        let roots = clear.to_vec();
        let removed = blocking(move || {
            let mut removed = 0;
            for root in roots {
                let fd = workspace.open_root(root)?;
                let listing =
                    crate::resolve::open_dir_for_listing(&fd, "").map_err(|e| SandboxError::from_errno(root.virtual_path(), e))?;
                removed += files::clear::clear_dir(&listing).map_err(|e| SandboxError::from_errno(root.virtual_path(), e))?;
            }
            Ok(removed)
        })
        .await?;
        tracing::info!(sandbox_id = %sandbox.id, thread_id, killed, removed, "sandbox reset");
        Ok((sandbox, killed, removed))
    }

    /// Checks an ExecuteCommand request.
    pub fn check_command(
        &self,
        command: String,
        timeout: Option<Duration>,
        env: std::collections::HashMap<String, String>,
        cwd: &str,
        max_output_bytes: u64,
    ) -> Result<ExecSpec> {
        let cwd = crate::paths::parse(cwd, "cwd", Some(VirtualPath::root(Root::Workspace)))?;
        self.runner.check(command, timeout, env, cwd, max_output_bytes)
    }

    /// Admits a call carrying `fence` (see [`crate::fence`]): FAILED_PRECONDITION when a higher
    /// attempt of its run has called; when this is the first call of a higher attempt, the commands
    /// of the lower ones are killed before the call goes on. Calls without a fence always pass.
    pub fn admit_fence(&self, user_id: &str, fence: Option<&Fence>) -> Result<()> {
        let Some(fence) = fence else { return Ok(()) };
        if let Admitted::Advanced { previous } = self.fences.admit(user_id, fence)? {
            let killed = self.registry.kill_fenced(user_id, &fence.run_id, fence.attempt);
            tracing::info!(run_id = %fence.run_id, attempt = fence.attempt, previous, killed, "a run's new attempt called: earlier attempts fenced");
        }
        Ok(())
    }

    /// ExecuteCommand (its spec carries the call's fence, already admitted).
    pub async fn execute(&self, user_id: &str, thread_id: &str, spec: ExecSpec) -> Result<tokio::sync::mpsc::UnboundedReceiver<ExecEvent>> {
        let sandbox = self.find(user_id, thread_id)?;
        let fence = spec.fence.clone();
        // Re-checked once the command is registered: a takeover between the admission and the
        // registration would otherwise miss it.
        let still_current = || fence.as_ref().map_or(Ok(()), |f| self.fences.check(user_id, f));
        self.runner.start(sandbox, spec, still_current).await
    }

    /// ReadFile.
    pub async fn read_file(
        &self,
        user_id: &str,
        thread_id: &str,
        mut request: files::read::ReadRequest,
    ) -> Result<files::read::ReadOutcome> {
        let sandbox = self.find(user_id, thread_id)?;
        let cap = self.config.files.read_max_chars;
        request.max_chars = if request.max_chars == 0 { cap } else { request.max_chars.min(cap) };
        let workspace = sandbox.workspace.clone();
        let started = std::time::Instant::now();
        let result = blocking(move || files::read::read(&workspace, &request, &Masker::for_output(&workspace.masks(), []))).await;
        record("read", &result, started);
        result
    }

    /// WriteFile (serialised per path).
    pub async fn write_file(
        &self,
        user_id: &str,
        thread_id: &str,
        path: VirtualPath,
        content: Vec<u8>,
        append: bool,
    ) -> Result<files::write::WriteOutcome> {
        let sandbox = self.find(user_id, thread_id)?;
        sandbox.require_active()?;
        path.writable()?;
        files::write::check_size(content.len(), append, self.config.files.write_max_bytes)?;
        let _guard = sandbox.locks.lock(&path.display()).await;
        let workspace = sandbox.workspace.clone();
        let started = std::time::Instant::now();
        let result = blocking(move || files::write::write(&workspace, &path, &content, append)).await;
        record("write", &result, started);
        result
    }

    /// DeleteFile (under the path's lock, like a write).
    pub async fn delete_file(&self, user_id: &str, thread_id: &str, path: VirtualPath) -> Result<files::delete::Deleted> {
        let sandbox = self.find(user_id, thread_id)?;
        sandbox.require_active()?;
        path.writable()?;
        let _guard = sandbox.locks.lock(&path.display()).await;
        let workspace = sandbox.workspace.clone();
        let started = std::time::Instant::now();
        let result = blocking(move || files::delete::delete(&workspace, &path)).await;
        record("delete", &result, started);
        result
    }

    /// EditFile (read-modify-write under the path's lock).
    pub async fn edit_file(
        &self,
        user_id: &str,
        thread_id: &str,
        path: VirtualPath,
        old: String,
        new: String,
        replace_all: bool,
    ) -> Result<files::edit::EditOutcome> {
        let sandbox = self.find(user_id, thread_id)?;
        sandbox.require_active()?;
        path.writable()?;
        let _guard = sandbox.locks.lock(&path.display()).await;
        let workspace = sandbox.workspace.clone();
        let max = self.config.files.edit_max_bytes;
        let started = std::time::Instant::now();
        let result = blocking(move || files::edit::edit(&workspace, &path, &old, &new, replace_all, max)).await;
        record("edit", &result, started);
        result
    }

    /// ListDir.
    pub async fn list_dir(
        &self,
        user_id: &str,
        thread_id: &str,
        path: VirtualPath,
        max_depth: u32,
        include_ignored: bool,
        max_entries: u32,
    ) -> Result<files::list::ListOutcome> {
        if max_depth > 2 {
            return Err(SandboxError::invalid("max_depth", format!("{max_depth} is too deep: 1 or 2 (0 = 2)")));
        }
        let sandbox = self.find(user_id, thread_id)?;
        let f = &self.config.files;
        let max_entries = if max_entries == 0 { f.list_default_entries } else { u64::from(max_entries).min(f.list_max_entries) };
        let request = files::list::ListRequest {
            path,
            max_depth: if max_depth == 0 { 2 } else { max_depth },
            include_ignored,
            max_entries: usize::try_from(max_entries).unwrap_or(usize::MAX),
            max_chars: usize::try_from(f.list_max_chars).unwrap_or(usize::MAX),
        };
        let workspace = sandbox.workspace.clone();
        let started = std::time::Instant::now();
        let result = blocking(move || files::list::list(&workspace, &request)).await;
        record("list", &result, started);
        result
    }

    /// Glob.
    pub async fn glob(
        &self,
        user_id: &str,
        thread_id: &str,
        path: VirtualPath,
        pattern: String,
        include_dirs: bool,
        max_results: u32,
    ) -> Result<files::glob::GlobOutcome> {
        let sandbox = self.find(user_id, thread_id)?;
        let f = &self.config.files;
        let max = clamp(max_results, f.glob_default_results, f.glob_max_results);
        let workspace = sandbox.workspace.clone();
        let started = std::time::Instant::now();
        let result = blocking(move || files::glob::glob(&workspace, &path, &pattern, include_dirs, max)).await;
        record("glob", &result, started);
        result
    }

    /// Grep.
    pub async fn grep(
        &self,
        user_id: &str,
        thread_id: &str,
        mut request: files::grep::GrepRequest,
        max_results: u32,
    ) -> Result<files::grep::GrepOutcome> {
        let sandbox = self.find(user_id, thread_id)?;
        let f = &self.config.files;
        request.max_results = clamp(max_results, f.grep_default_results, f.grep_max_results);
        request.max_file_bytes = f.grep_max_file_bytes;
        request.max_line_chars = usize::try_from(f.grep_max_line_chars).unwrap_or(usize::MAX);
        request.display_chars = usize::try_from(f.grep_line_display_chars).unwrap_or(usize::MAX);
        let workspace = sandbox.workspace.clone();
        let started = std::time::Instant::now();
        let result = blocking(move || files::grep::grep(&workspace, &request, &Masker::for_output(&workspace.masks(), []))).await;
        record("grep", &result, started);
        result
    }

    /// DownloadFile: opens the file (the API layer streams it).
    pub async fn download(&self, user_id: &str, thread_id: &str, path: VirtualPath) -> Result<files::download::Download> {
        let sandbox = self.find(user_id, thread_id)?;
        let workspace = sandbox.workspace.clone();
        let max = self.config.files.download_max_bytes;
        let result = blocking(move || files::download::open(&workspace, &path, max)).await;
        record("download", &result, std::time::Instant::now());
        result
    }

    /// UploadFiles: checks the header and creates the staging files (the API layer feeds the chunks).
    pub async fn begin_upload(
        &self,
        user_id: &str,
        thread_id: &str,
        specs: Vec<files::upload::FileSpec>,
    ) -> Result<(Arc<Sandbox>, files::upload::Upload)> {
        let sandbox = self.find(user_id, thread_id)?;
        sandbox.require_active()?;
        let u = &self.config.uploads;
        let limits =
            files::upload::UploadLimits { max_files: u.max_files, max_file_bytes: u.max_file_bytes, max_total_bytes: u.max_total_bytes };
        let workspace = sandbox.workspace.clone();
        let upload = blocking(move || files::upload::Upload::begin(&workspace, specs, limits)).await?;
        Ok((sandbox, upload))
    }

    /// Converts the documents an upload just stored (with `convert_documents`): one entry per stored
    /// file, None for files that are not documents, else the companion or why there is none. Files
    /// convert concurrently, up to `sandbox.uploads.convert.max_concurrent` at once in this process.
    pub async fn convert_uploads(
        &self,
        sandbox: &Arc<Sandbox>,
        stored: &[files::upload::Stored],
    ) -> Vec<Option<std::result::Result<Companion, String>>> {
        if !self.config.uploads.auto_convert_documents {
            return vec![None; stored.len()];
        }
        let conversions = stored.iter().map(|file| async move {
            match crate::convert::detect(&file.filename) {
                Detected::NotADocument => None,
                Detected::Unsupported(why) => Some(Err(why.to_owned())),
                Detected::Convert(format) => {
                    let path = match crate::paths::parse(&file.virtual_path, "path", None) {
                        Ok(path) => path,
                        Err(e) => return Some(Err(e.to_string())),
                    };
                    let result = self.convert_at(sandbox, path, format).await;
                    if let Err(error) = &result {
                        tracing::info!(sandbox_id = %sandbox.id, format = format.label(), %error, "upload not converted");
                    }
                    Some(result.map_err(|e| e.to_string()))
                }
            }
        });
        futures::future::join_all(conversions).await
    }

    /// ConvertDocument: converts the file at `path` and writes its companion beside it.
    pub async fn convert_document(&self, user_id: &str, thread_id: &str, path: VirtualPath) -> Result<(Companion, Format)> {
        let sandbox = self.find(user_id, thread_id)?;
        sandbox.require_active()?;
        if !self.config.uploads.auto_convert_documents {
            return Err(SandboxError::FailedPrecondition(
                "document conversion is switched off (sandbox.uploads.auto_convert_documents: false)".to_owned(),
            ));
        }
        let display = path.display();
        let format = match crate::convert::detect(&display) {
            Detected::Convert(format) => format,
            Detected::Unsupported(why) => return Err(SandboxError::invalid("path", format!("{}: {why}", crate::error::echo(&display)))),
            Detected::NotADocument => {
                return Err(SandboxError::invalid(
                    "path",
                    format!("{} is not a document the converter reads ({})", crate::error::echo(&display), crate::convert::EXTENSIONS),
                ));
            }
        };
        match self.convert_at(&sandbox, path, format).await {
            Ok(companion) => Ok((companion, format)),
            Err(Failure::File(e)) => Err(e),
            Err(Failure::Convert(e)) => Err(match e {
                ConvertError::Unsupported(m) | ConvertError::Broken(m) => SandboxError::invalid("path", m),
                ConvertError::Encrypted(m) => SandboxError::FailedPrecondition(m),
                e @ (ConvertError::TooLarge(_) | ConvertError::TimedOut { .. } | ConvertError::OutOfMemory { .. }) => {
                    SandboxError::ResourceExhausted(e.to_string())
                }
                ConvertError::Unavailable(m) => SandboxError::FailedPrecondition(m),
                e @ ConvertError::Crashed(_) => SandboxError::Internal(e.to_string()),
            }),
        }
    }

    /// Opens, converts and writes the companion of one document.
    async fn convert_at(&self, sandbox: &Arc<Sandbox>, path: VirtualPath, format: Format) -> std::result::Result<Companion, Failure> {
        let workspace = sandbox.workspace.clone();
        let source = path.clone();
        let (file, size) = blocking(move || files::companion::open_source(&workspace, &source)).await.map_err(Failure::File)?;
        let markdown = self.converter.convert(file, size, format).await.map_err(Failure::Convert)?;
        let workspace = sandbox.workspace.clone();
        blocking(move || files::companion::write(&workspace, &path, &markdown)).await.map_err(Failure::File)
    }

    /// SnapshotOutputs.
    pub async fn snapshot(&self, user_id: &str, thread_id: &str) -> Result<files::snapshot::Snapshot> {
        let sandbox = self.find(user_id, thread_id)?;
        let workspace = sandbox.workspace.clone();
        let max = usize::try_from(self.config.files.snapshot_max_files).unwrap_or(usize::MAX);
        let started = std::time::Instant::now();
        let result = blocking(move || files::snapshot::snapshot(&workspace, max)).await;
        record("snapshot", &result, started);
        result
    }

    /// Whether this provider runs commands at all.
    pub fn exec_enabled(&self) -> bool {
        self.provider.exec_refusal().is_none()
    }
}

/// Why one document has no companion: the file could not be read or written, or the converter
/// refused it.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{0}")]
    File(SandboxError),
    #[error("{0}")]
    Convert(ConvertError),
}

fn clamp(requested: u32, default: u64, max: u64) -> usize {
    let value = if requested == 0 { default } else { u64::from(requested).min(max) };
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Counts a file operation by kind and outcome (both bounded label sets) and records its latency.
fn record<T>(op: &'static str, result: &Result<T>, started: std::time::Instant) {
    let outcome = match result {
        Ok(_) => "ok",
        Err(e) => e.label(),
    };
    metrics::counter!("antler_sandbox_file_ops_total", "op" => op, "outcome" => outcome).increment(1);
    metrics::histogram!("antler_sandbox_file_op_seconds", "op" => op).record(started.elapsed().as_secs_f64());
    if let Err(SandboxError::PermissionDenied { path, reason }) = result {
        tracing::info!(op, path = %path, reason = %reason, "path refused");
    }
}
