//! Sandbox providers: how a command is turned into a host process. One provider per file, behind
//! [`Provider`]; the rest of the service (paths, file tools, the process runner in [`crate::exec`]) is the
//! same for all of them.
//!
//! [`select`] picks the provider from `sandbox.provider` and says why: `auto` takes bwrap when the binary
//! exists and a probe command actually runs in a fresh sandbox here (a container may forbid user
//! namespaces), else `local`.

pub mod bwrap;
pub mod local;
pub mod read_only_guard;

use std::path::Path;
use std::sync::Arc;

use crate::config::{ProviderChoice, SandboxConfig};
use crate::resolve::Ownership;
use crate::seccomp::Filter;
use crate::workspace::{Layout, Workspace};

/// Which provider runs commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    Local,
    Bwrap,
}

impl ProviderKind {
    pub fn label(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::Bwrap => "bwrap",
        }
    }
}

/// Everything a provider needs to build one command's process.
#[derive(Debug)]
pub struct Launch<'a> {
    pub workspace: &'a Workspace,
    /// The shell command line as the client sent it (virtual paths included).
    pub command: &'a str,
    /// Working directory as a virtual path, and its host path (resolved beneath its root).
    pub cwd_virtual: &'a str,
    pub cwd_host: &'a Path,
    /// Injected variables (already checked).
    pub injected: &'a std::collections::HashMap<String, String>,
    /// Host variables passed through.
    pub allowlist: &'a [String],
}

/// A way to run a sandbox's commands.
pub trait Provider: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> ProviderKind;
    /// Why commands are refused, when they are.
    fn exec_refusal(&self) -> Option<String>;
    /// Why this particular command is refused before it starts (the `local` provider's guard of the
    /// read-only `/mnt/skills`, see [`read_only_guard`]); `cwd_in_skills` when its working directory is
    /// under `/mnt/skills`.
    fn command_refusal(&self, _command: &str, _cwd_in_skills: bool) -> Option<String> {
        None
    }
    /// Whether commands can reach the network.
    fn network_enabled(&self) -> bool;
    /// The process for one command. The runner adds stdio, its own process group and kill-on-drop.
    /// Err: a resource it needs could not be made (the seccomp filter's descriptor).
    fn command(&self, launch: &Launch<'_>) -> std::io::Result<tokio::process::Command>;
}

/// The outcome of provider selection at start-up.
#[derive(Debug, Clone)]
pub struct Selection {
    pub provider: Arc<dyn Provider>,
    pub layout: Layout,
    /// Set when the configured provider cannot work on this host: AcquireSandbox then answers
    /// FAILED_PRECONDITION with this reason.
    pub unusable: Option<String>,
    /// Why this provider is active, for the start-up log.
    pub reason: String,
    /// `auto` wanted bwrap and fell back to local (logged as a warning).
    pub fell_back: bool,
}

/// Picks the provider (see the module comment). Creates `{data_dir}/sandbox`. `seccomp` is the compiled
/// filter bwrap commands get (None: `sandbox.seccomp: off`); the probe runs with it.
pub fn select(config: &SandboxConfig, data_dir: &Path, seccomp: Option<Filter>) -> std::io::Result<Selection> {
    let skills = &config.skills;
    let local = |layout: Layout, reason: String| Selection {
        provider: Arc::new(local::LocalProvider::new(config.allow_host_bash)),
        layout,
        unusable: None,
        reason,
        fell_back: false,
    };
    if config.provider == ProviderChoice::Local {
        return Ok(local(Layout::new(data_dir, skills, Ownership::default())?, "sandbox.provider is local".to_owned()));
    }
    let attempt = bwrap::BwrapProvider::new(&config.bwrap, seccomp).and_then(|provider| {
        let layout =
            Layout::new(data_dir, skills, provider.ownership()).map_err(|e| format!("cannot create the sandbox directory: {e}"))?;
        provider.probe(&layout)?;
        Ok((provider, layout))
    });
    match (attempt, config.provider) {
        (Ok((provider, layout)), choice) => {
            let how = if choice == ProviderChoice::Auto { "sandbox.provider is auto and" } else { "sandbox.provider is bwrap and" };
            let mut reason = format!("{how} a probe command ran in fresh user, pid, ipc, uts and network namespaces");
            if let Some(uid) = provider.ownership().uid {
                reason.push_str(&format!("; commands run as host uid {uid} because the service runs as root (sandbox.bwrap.run_as_uid)"));
            }
            Ok(Selection { provider: Arc::new(provider), layout, unusable: None, reason, fell_back: false })
        }
        (Err(why), ProviderChoice::Bwrap) => {
            let layout = Layout::new(data_dir, skills, Ownership::default())?;
            let mut selection = local(layout, format!("sandbox.provider is bwrap but bwrap cannot run here: {why}"));
            selection.unusable = Some(why);
            Ok(selection)
        }
        (Err(why), _) => {
            let layout = Layout::new(data_dir, skills, Ownership::default())?;
            let exec = if config.allow_host_bash {
                "host commands allowed (sandbox.allow_host_bash)"
            } else {
                "commands disabled (set sandbox.allow_host_bash to allow host commands)"
            };
            let mut selection =
                local(layout, format!("sandbox.provider is auto and bwrap is unusable ({why}); falling back to local, {exec}"));
            selection.fell_back = true;
            Ok(selection)
        }
    }
}
