//! Runs one host program under bubblewrap with one writable directory: the runs service's external ACP
//! agents (`runs.lead.acp.isolation: bwrap`). Unlike the [`bwrap`](crate::providers::bwrap) provider,
//! which builds a small system view for commands the model writes, the program here is someone's coding
//! agent with its own runtime (node, python, a binary under /usr/local or a home directory), so the host
//! filesystem is visible, read-only, minus the hidden paths:
//!
//! 1. `--ro-bind / /`: the whole host, read-only (submounts included);
//! 2. `--dev /dev --proc /proc --tmpfs /tmp`: fresh devices, a /proc of its own pid namespace, a private
//!    /tmp (memory, discarded at the end);
//! 3. an empty tmpfs over each hidden directory (`/dev/null` over a hidden file) — the Antler data
//!    directory holds the database and every other thread's files;
//! 4. `--bind DIR DIR`: the one writable directory, at its host path (created on the tmpfs when it lies
//!    under a hidden directory), and `--chdir DIR`;
//! 5. the hidden tmpfs mounts remounted read-only, so nothing can be written anywhere but DIR, /tmp and
//!    /dev (the last two are the sandbox's own and vanish with it);
//! 6. fresh user, pid, ipc, uts and cgroup namespaces (network too unless `network`), no nested user
//!    namespaces, `--die-with-parent`, `--new-session`, every capability dropped, and the seccomp filter
//!    of [`crate::seccomp`] when one is given.
//!
//! Killing bwrap kills the whole sandbox: the program runs in bwrap's pid namespace, whose init dies
//! with bwrap (`--die-with-parent`), and the kernel kills everything in a pid namespace with its init.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::seccomp::Filter;

/// Why a confined command cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("bwrap is not installed (Debian package `bubblewrap`) or not on PATH")]
    NoBwrap,
    #[error("the writable directory {0} must be an absolute path")]
    NotAbsolute(PathBuf),
    #[error("cannot hand the seccomp filter to bwrap: {0}")]
    Seccomp(std::io::Error),
}

/// What one confined program may see and change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confinement {
    /// The only host directory it may write (absolute; it is also its working directory).
    pub writable: PathBuf,
    /// Host paths it must not see. Missing ones are skipped (nothing to hide); relative ones are taken
    /// from the current directory.
    pub hidden: Vec<PathBuf>,
    /// Whether it shares the host's network (a coding agent calls its model's API).
    pub network: bool,
}

/// The bwrap binary on PATH.
pub fn find_bwrap() -> Result<PathBuf, ConfineError> {
    crate::providers::bwrap::find_on_path("bwrap").ok_or(ConfineError::NoBwrap)
}

impl Confinement {
    /// bwrap running `program` with `args` under this confinement, with `filter` when given. The caller
    /// adds the environment (bwrap passes its own on) and the stdio.
    pub fn command(
        &self,
        bwrap: &Path,
        filter: Option<&Filter>,
        program: &OsStr,
        args: &[String],
    ) -> Result<tokio::process::Command, ConfineError> {
        if !self.writable.is_absolute() {
            return Err(ConfineError::NotAbsolute(self.writable.clone()));
        }
        let mut command = tokio::process::Command::new(bwrap);
        if let Some(filter) = filter {
            let seccomp = filter.attach(&mut command).map_err(ConfineError::Seccomp)?;
            command.args(seccomp);
        }
        command.args(self.args()).arg("--").arg(program).args(args);
        Ok(command)
    }

    /// The bwrap options (everything before `--` and the program).
    pub fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = crate::providers::bwrap::ISOLATION
            .iter()
            .chain(&["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"])
            .map(OsString::from)
            .collect();
        if self.network {
            args.push("--share-net".into());
        }
        let hidden = self.hidden_paths();
        let (inside, around): (Vec<_>, Vec<_>) = hidden.into_iter().partition(|h| h.path.starts_with(&self.writable));
        // Hidden paths around the writable directory first, so that its bind lands on top of them; any
        // inside it after, or the bind would uncover them.
        for h in &around {
            args.extend(h.mount());
        }
        let writable = self.writable.as_os_str();
        args.extend(["--bind".into(), writable.to_owned(), writable.to_owned()]);
        for h in &inside {
            args.extend(h.mount());
        }
        for h in around.iter().chain(&inside).filter(|h| h.directory) {
            args.extend(["--remount-ro".into(), h.path.clone().into_os_string()]);
        }
        args.extend(["--chdir".into(), writable.to_owned()]);
        args
    }

    /// The hidden paths that exist, canonical, without the writable directory itself and without any
    /// inside another hidden directory (hidden already), parents first.
    fn hidden_paths(&self) -> Vec<Hidden> {
        let mut found: Vec<Hidden> = self
            .hidden
            .iter()
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .filter(|p| p != &self.writable && p.parent().is_some())
            .filter_map(|path| std::fs::metadata(&path).ok().map(|m| Hidden { directory: m.is_dir(), path }))
            .collect();
        found.sort_by(|a, b| a.path.cmp(&b.path));
        found.dedup_by(|a, b| a.path == b.path);
        let mut kept: Vec<Hidden> = Vec::with_capacity(found.len());
        for h in found {
            // Inside a hidden directory, unless the writable directory's bind between them uncovers it.
            let uncovered = |k: &Hidden| h.path.starts_with(&self.writable) && !k.path.starts_with(&self.writable);
            let covered = kept.iter().any(|k| k.directory && h.path.starts_with(&k.path) && !uncovered(k));
            if !covered {
                kept.push(h);
            }
        }
        kept
    }
}

/// One hidden host path.
#[derive(Debug)]
struct Hidden {
    path: PathBuf,
    directory: bool,
}

impl Hidden {
    fn mount(&self) -> Vec<OsString> {
        let path = self.path.clone().into_os_string();
        if self.directory { vec!["--tmpfs".into(), path] } else { vec!["--ro-bind".into(), "/dev/null".into(), path] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(args: &[OsString]) -> Vec<String> {
        args.iter().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    fn position(args: &[String], window: &[&str]) -> Option<usize> {
        args.windows(window.len()).position(|w| w.iter().zip(window).all(|(a, b)| a == b))
    }

    #[test]
    fn confine_isolates_shows_the_host_read_only_and_binds_one_directory() -> Result<(), Box<dyn std::error::Error>> {
        let root = tempfile::tempdir()?;
        let root = std::fs::canonicalize(root.path())?;
        let ws = root.join("data/sandbox/ws");
        std::fs::create_dir_all(&ws)?;
        let ws_s = ws.to_string_lossy().into_owned();
        let plain = Confinement { writable: ws.clone(), hidden: Vec::new(), network: false };
        let args = text(&plain.args());
        for flag in ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"] {
            assert!(args.iter().any(|a| a == flag), "{flag}: {args:?}");
        }
        assert!(position(&args, &["--cap-drop", "ALL"]).is_some(), "{args:?}");
        assert!(!args.iter().any(|a| a == "--share-net"), "no network unless asked: {args:?}");
        let root_view = position(&args, &["--ro-bind", "/", "/"]);
        let bind = position(&args, &["--bind", &ws_s, &ws_s]);
        assert!(root_view.is_some() && bind.is_some() && root_view < bind, "{args:?}");
        assert!(position(&args, &["--tmpfs", "/tmp"]).is_some() && position(&args, &["--proc", "/proc"]).is_some(), "{args:?}");
        assert_eq!(position(&args, &["--chdir", &ws_s]), Some(args.len() - 2), "{args:?}");
        assert_eq!(args.iter().filter(|a| *a == "--bind").count(), 1, "one writable directory: {args:?}");

        let networked = Confinement { network: true, ..plain };
        assert!(networked.args().iter().any(|a| a == "--share-net"));
        Ok(())
    }

    #[test]
    fn confine_hides_paths_under_read_only_tmpfs_and_keeps_the_workspace_on_top() -> Result<(), Box<dyn std::error::Error>> {
        let root = tempfile::tempdir()?;
        let root = std::fs::canonicalize(root.path())?;
        let data = root.join("data");
        let ws = data.join("sandbox/users/u/threads/t/acp-workspace");
        let inside = ws.join("secret");
        std::fs::create_dir_all(&inside)?;
        let file = root.join("key.pem");
        std::fs::write(&file, "k")?;
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let confinement = Confinement {
            writable: ws.clone(),
            // The data directory, one inside it (covered), a file, a missing path, the workspace itself,
            // a path inside the workspace, and a duplicate.
            hidden: vec![data.join("sandbox"), data.clone(), file.clone(), root.join("missing"), ws.clone(), inside.clone(), data.clone()],
            network: true,
        };
        let args = text(&confinement.args());
        let tmpfs_data = position(&args, &["--tmpfs", &s(&data)]);
        let bind = position(&args, &["--bind", &s(&ws), &s(&ws)]);
        let tmpfs_inside = position(&args, &["--tmpfs", &s(&inside)]);
        assert!(tmpfs_data.is_some() && tmpfs_data < bind && bind < tmpfs_inside, "{args:?}");
        assert!(position(&args, &["--ro-bind", "/dev/null", &s(&file)]).is_some(), "a file is covered by /dev/null: {args:?}");
        assert!(position(&args, &["--remount-ro", &s(&data)]) > bind, "the hidden tmpfs is read-only after the bind: {args:?}");
        assert!(position(&args, &["--remount-ro", &s(&inside)]).is_some(), "{args:?}");
        assert!(!args.iter().any(|a| *a == s(&data.join("sandbox"))), "covered by the data directory: {args:?}");
        assert!(!args.iter().any(|a| a.contains("missing")), "{args:?}");
        assert!(position(&args, &["--remount-ro", &s(&file)]).is_none(), "a file is read-only already: {args:?}");
        assert_eq!(args.iter().filter(|a| *a == "--tmpfs").count(), 3, "/tmp, the data directory, the one inside: {args:?}");
        Ok(())
    }

    #[test]
    fn confine_refuses_a_relative_workspace() {
        let relative = Confinement { writable: PathBuf::from("ws"), hidden: Vec::new(), network: false };
        let refused = relative.command(Path::new("/usr/bin/bwrap"), None, OsStr::new("true"), &[]);
        assert!(matches!(refused, Err(ConfineError::NotAbsolute(_))));
    }
}
