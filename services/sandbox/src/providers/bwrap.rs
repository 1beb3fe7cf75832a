//! The `bwrap` provider: each command runs under bubblewrap in fresh user, pid, ipc, uts, cgroup and
//! (unless `sandbox.bwrap.network`) network namespaces, with
//!
//! * a read-only system view (`sandbox.bwrap.system_paths`: /usr, /bin, the loader's and the resolver's
//!   files under /etc — not /etc as a whole, so /etc/shadow and host keys stay out), a fresh /proc and
//!   /dev, a private /tmp, and a read-only root;
//! * only this thread's directories mounted, at their virtual paths, and the skills view and the
//!   thread's ACP workspace (`/mnt/acp-workspace`) read-only;
//! * `--die-with-parent` and `--new-session` (no terminal injection), all capabilities dropped, no nested
//!   user namespaces;
//! * the seccomp filter of [`crate::seccomp`] (`sandbox.seccomp: strict`, the default), handed to bwrap
//!   with `--seccomp FD`;
//! * an environment cleared to the allowlist plus the injected variables — passed through the process
//!   environment, never on the command line where other host users could read them;
//! * resource limits applied by `prlimit` inside the sandbox: processes (RLIMIT_NPROC, counted per
//!   command because each command has its own user namespace), CPU seconds, address space, file size and
//!   open files. Hard limits cannot be raised again from inside: the namespace's "root" has no
//!   capability in the host namespace.
//!
//! The kernel never applies RLIMIT_NPROC to host root, so a service running as root starts bwrap as an
//! unprivileged user (`sandbox.bwrap.run_as_uid`/`run_as_gid`, default 65534) and hands the thread's
//! directories to it (see [`crate::resolve::Ownership`]).

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::config::BwrapConfig;
use crate::paths::{ACP_WORKSPACE, Root, SKILLS};
use crate::providers::{Launch, Provider, ProviderKind};
use crate::resolve::Ownership;
use crate::seccomp::Filter;
use crate::workspace::{Layout, Workspace};

/// How long the start-up probe may take before it counts as a failure.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug)]
pub struct BwrapProvider {
    bwrap: PathBuf,
    config: BwrapConfig,
    /// Arguments shared by every command: namespaces, system view, /proc, /dev, /tmp.
    prefix: Vec<OsString>,
    run_as: Option<(u32, u32)>,
    /// The compiled filter (None: `sandbox.seccomp: off`).
    seccomp: Option<Filter>,
}

impl BwrapProvider {
    /// Finds the binary and prepares the fixed arguments. Err says why bwrap cannot be used.
    pub fn new(config: &BwrapConfig, seccomp: Option<Filter>) -> Result<Self, String> {
        let bwrap = if config.path.is_empty() {
            find_on_path("bwrap").ok_or_else(|| "bwrap is not installed (Debian package `bubblewrap`) or not on PATH".to_owned())?
        } else {
            PathBuf::from(&config.path)
        };
        if !is_executable(&bwrap) {
            return Err(format!("{} is not an executable file", bwrap.display()));
        }
        let run_as = rustix::process::geteuid().is_root().then_some((config.run_as_uid, config.run_as_gid));
        Ok(Self { prefix: prefix_args(config), bwrap, config: config.clone(), run_as, seccomp })
    }

    /// Who owns the thread directories so the sandboxed user can write them.
    pub fn ownership(&self) -> Ownership {
        match self.run_as {
            Some((uid, gid)) => Ownership { uid: Some(uid), gid: Some(gid) },
            None => Ownership::default(),
        }
    }

    /// Runs `true` in a sandbox built exactly like a real one (on a probe workspace) and reports why it
    /// failed: missing namespaces support, an unreachable data directory, a missing prlimit.
    pub fn probe(&self, layout: &Layout) -> Result<(), String> {
        let workspace = layout.probe_workspace();
        workspace.ensure().map_err(|e| format!("cannot create the probe workspace: {e}"))?;
        let mut command = std::process::Command::new(&self.bwrap);
        if let Some(filter) = &self.seccomp {
            let args = filter.attach(&mut command).map_err(|e| format!("cannot hand the seccomp filter to bwrap: {e}"))?;
            command.args(args);
        }
        command
            .args(self.args(&workspace, Root::Workspace.virtual_path(), "true"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .current_dir("/");
        if let Some((uid, gid)) = self.run_as {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(gid);
        }
        let mut child = command.spawn().map_err(|e| format!("cannot start {}: {e}", self.bwrap.display()))?;
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() < PROBE_TIMEOUT => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("the probe did not finish within {}s", PROBE_TIMEOUT.as_secs()));
                }
                Err(e) => return Err(format!("waiting for the probe failed: {e}")),
            }
        };
        if status.success() {
            return Ok(());
        }
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            use std::io::Read;
            let _ = pipe.read_to_string(&mut stderr);
        }
        let mut why = format!("the probe `bwrap ... true` failed ({status}): {}", stderr.trim());
        if self.seccomp.is_some() && stderr.contains("seccomp") {
            why.push_str("\nhint: bwrap or this kernel refused the seccomp filter (sandbox.seccomp: strict); sandbox.seccomp: off runs commands without it");
        }
        if self.run_as.is_some() && stderr.contains("Permission denied") {
            why.push_str(&format!(
                "\nhint: bwrap runs as uid {} (sandbox.bwrap.run_as_uid); every directory above the data directory must be searchable by it (chmod o+x)",
                self.config.run_as_uid
            ));
        }
        Err(why)
    }

    /// The full bwrap argument list for one command.
    fn args(&self, workspace: &Workspace, cwd_virtual: &str, command: &str) -> Vec<OsString> {
        let mut args = self.prefix.clone();
        for root in Root::USER_DATA {
            args.extend(["--bind".into(), workspace.host_root(root).into_os_string(), root.virtual_path().into()]);
        }
        args.extend(["--ro-bind".into(), workspace.host_root(Root::Skills).into_os_string(), SKILLS.into()]);
        // What ACP agents wrote for the lead agent: readable, never writable, from inside (DeerFlow's
        // /mnt/acp-workspace is read-only to the lead agent too).
        args.extend(["--ro-bind".into(), workspace.host_root(Root::AcpWorkspace).into_os_string(), ACP_WORKSPACE.into()]);
        // Last, so the mount points above could be created first: the root itself becomes read-only.
        args.extend(["--remount-ro".into(), "/".into(), "--chdir".into(), cwd_virtual.into(), "--".into()]);
        let c = &self.config;
        args.push(c.prlimit_path.clone().into_os_string());
        for (name, value) in [
            ("nproc", c.max_processes),
            ("cpu", c.cpu_secs),
            ("as", c.max_memory_bytes),
            ("fsize", c.max_file_bytes),
            ("nofile", c.max_open_files),
        ] {
            args.push(format!("--{name}={value}:{value}").into());
        }
        args.extend(["--".into(), "/bin/sh".into(), "-c".into(), command.into()]);
        args
    }
}

impl Provider for BwrapProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Bwrap
    }

    fn exec_refusal(&self) -> Option<String> {
        None
    }

    fn network_enabled(&self) -> bool {
        self.config.network
    }

    fn command(&self, launch: &Launch<'_>) -> std::io::Result<Command> {
        let env = crate::exec::env::build(launch.allowlist, launch.injected, Root::Workspace.virtual_path());
        let mut command = Command::new(&self.bwrap);
        if let Some(filter) = &self.seccomp {
            let args = filter.attach(&mut command)?;
            command.args(args);
        }
        // bwrap itself starts in /; the command starts in --chdir inside the sandbox.
        command.args(self.args(launch.workspace, launch.cwd_virtual, launch.command)).env_clear().envs(env).current_dir("/");
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        Ok(command)
    }
}

/// The isolation every bwrap this crate starts gets (the provider's commands and `confine`'s programs):
/// new namespaces of every kind, no nested user namespaces, gone with its parent, no terminal to
/// inject into, no capabilities.
pub(crate) const ISOLATION: [&str; 7] =
    ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL"];

fn prefix_args(config: &BwrapConfig) -> Vec<OsString> {
    let mut args: Vec<OsString> = ISOLATION.iter().chain(&["--hostname", "sandbox"]).map(OsString::from).collect();
    if config.network {
        args.push("--share-net".into());
    }
    for path in &config.system_paths {
        match std::fs::symlink_metadata(path) {
            // Merged-/usr systems have /bin -> usr/bin: recreate the link rather than mount its target twice.
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    args.extend(["--symlink".into(), target.into_os_string(), path.clone().into_os_string()]);
                }
            }
            Ok(_) => args.extend(["--ro-bind".into(), path.clone().into_os_string(), path.clone().into_os_string()]),
            Err(_) => {}
        }
    }
    args.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/mnt/user-data"].iter().map(OsString::from));
    args
}

pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_isolate_by_default_and_share_the_network_only_when_asked() {
        let args = prefix_args(&BwrapConfig::default());
        let text: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        for flag in ["--unshare-all", "--die-with-parent", "--new-session", "--disable-userns"] {
            assert!(text.iter().any(|a| a == flag), "{flag}");
        }
        assert!(!text.iter().any(|a| a == "--share-net"));
        assert!(!text.iter().any(|a| a == "/etc"), "/etc is never mounted whole");
        let shared = prefix_args(&BwrapConfig { network: true, ..BwrapConfig::default() });
        assert!(shared.iter().any(|a| a == "--share-net"));
    }
}
