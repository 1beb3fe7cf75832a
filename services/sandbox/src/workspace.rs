//! Where a thread's files live on the host, and the reverse mapping that keeps host paths out of
//! every response.
//!
//! ```text
//! {data_dir}/sandbox/                          0711, the service's
//!   empty-skills/                              /mnt/skills of the bwrap start-up probe
//!   users/{user_dir}/skills/view/              the user's enabled skills, mounted at /mnt/skills
//!                                              (see skills::library)
//!   users/{user_dir}/threads/{thread_id}/      0711 (user_dir: see ids::user_dir_name)
//!     user-data/                               0711
//!       workspace/ uploads/ outputs/           0755, owned by the sandbox user (see resolve::Ownership)
//!     acp-workspace/                           0755, the service's: written by the ACP agents the lead
//!                                              agent starts on the runs host, mounted read-only at
//!                                              /mnt/acp-workspace
//! ```
//! Intermediate directories are searchable but not listable by others (0711), so the unprivileged user
//! bwrap runs as can reach its own thread's directories to mount them and nothing else.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::error::{Result, SandboxError};
use crate::ids;
use crate::paths::{Root, USER_DATA};
use crate::resolve::{self, Ownership};
use crate::skills::library::Library;

/// The on-disk layout shared by every sandbox of this server.
#[derive(Debug, Clone)]
pub struct Layout {
    base: PathBuf,
    skills: Arc<Library>,
    ownership: Ownership,
}

impl Layout {
    /// Creates `{data_dir}/sandbox` (and the probe's empty skills directory) if needed. Paths are made
    /// absolute and canonical, because that is how the kernel reports them in command output we must mask.
    pub fn new(data_dir: &Path, skills: &crate::config::SkillsConfig, ownership: Ownership) -> std::io::Result<Self> {
        let base = data_dir.join("sandbox");
        make_dir(&base, 0o711)?;
        let base = std::fs::canonicalize(&base)?;
        make_dir(&base.join("empty-skills"), 0o755)?;
        let skills = Arc::new(Library::new(&base, data_dir, skills)?);
        Ok(Self { base, skills, ownership })
    }

    /// The sandbox's directories, whether or not they exist yet.
    /// The agent's `invoke_acp_agent` finds `acp-workspace` by this layout (its `workspace_dir`).
    pub fn workspace(&self, user_id: &str, thread_id: &str) -> Workspace {
        let thread = self.base.join("users").join(ids::user_dir_name(user_id)).join("threads").join(thread_id);
        Workspace { user_data: thread.join("user-data"), thread, skills: self.skills.view_dir(user_id), ownership: self.ownership }
    }

    /// A workspace outside every user's tree, for the bwrap start-up probe.
    pub fn probe_workspace(&self) -> Workspace {
        let thread = self.base.join("probe").join("threads").join("probe");
        Workspace { user_data: thread.join("user-data"), thread, skills: self.base.join("empty-skills"), ownership: self.ownership }
    }

    /// The skills of this server's users.
    pub fn skills(&self) -> &Arc<Library> {
        &self.skills
    }

    pub fn base(&self) -> &Path {
        &self.base
    }

    pub fn ownership(&self) -> Ownership {
        self.ownership
    }
}

fn make_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(path)?;
    // `recursive` leaves an existing directory's mode alone and the umask may have trimmed a new one.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The ACP workspace's directory name in a thread's directory.
pub const ACP_DIR: &str = "acp-workspace";

/// One thread's directories.
#[derive(Debug, Clone)]
pub struct Workspace {
    thread: PathBuf,
    user_data: PathBuf,
    skills: PathBuf,
    ownership: Ownership,
}

impl Workspace {
    /// Host directory of a root.
    pub fn host_root(&self, root: Root) -> PathBuf {
        match (root, root.dir_name()) {
            (_, Some(name)) => self.user_data.join(name),
            (Root::AcpWorkspace, None) => self.thread.join(ACP_DIR),
            (_, None) => self.skills.clone(),
        }
    }

    /// Opens a root's directory (see [`resolve::open_root`]).
    pub fn open_root(&self, root: Root) -> Result<OwnedFd> {
        resolve::open_root(&self.host_root(root)).map_err(|errno| match errno {
            rustix::io::Errno::NOENT => SandboxError::Unavailable(format!(
                "the directory behind {} is missing on the host\nhint: call AcquireSandbox to recreate it",
                root.virtual_path()
            )),
            other => SandboxError::from_errno(root.virtual_path(), other),
        })
    }

    pub fn ownership(&self) -> Ownership {
        self.ownership
    }

    /// Removes the thread's directories from the host (symlinks inside are removed, never followed).
    pub fn remove(&self) -> std::io::Result<()> {
        match std::fs::remove_dir_all(&self.thread) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    /// Whether the workspace was ever created (an acquire happened, maybe before a restart).
    pub fn exists(&self) -> bool {
        self.user_data.is_dir()
    }

    /// When the workspace was created (its directory's modification time is the best the host keeps).
    pub fn created_at(&self) -> Option<SystemTime> {
        let meta = std::fs::metadata(&self.thread).ok()?;
        meta.created().or_else(|_| meta.modified()).ok()
    }

    /// Creates the directories that are missing; true when this call created the workspace.
    pub fn ensure(&self) -> std::io::Result<bool> {
        // users/, users/{u}/, users/{u}/threads/: outermost first, each searchable but not listable.
        let mut parents: Vec<&Path> = self.thread.ancestors().skip(1).take(3).collect();
        parents.reverse();
        for dir in parents {
            make_dir(dir, 0o711)?;
        }
        let created = match std::fs::DirBuilder::new().mode(0o711).create(&self.thread) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(e),
        };
        make_dir(&self.user_data, 0o711)?;
        for root in Root::USER_DATA {
            let dir = self.host_root(root);
            let meta = std::fs::symlink_metadata(&dir);
            if meta.as_ref().is_ok_and(|m| !m.is_dir()) {
                return Err(std::io::Error::other(format!("{} is not a directory on the host", root.virtual_path())));
            }
            if meta.is_err() {
                make_dir(&dir, 0o755)?;
            }
            self.ownership.apply_path(&dir).map_err(std::io::Error::from)?;
        }
        // Not handed to the sandbox user: only the ACP agents (processes of the service's own user)
        // write here, and the sandbox reads it.
        let acp = self.host_root(Root::AcpWorkspace);
        if std::fs::symlink_metadata(&acp).is_err() {
            make_dir(&acp, 0o755)?;
        }
        Ok(created)
    }

    /// Pairs of (host prefix, virtual prefix) for masking output, longest host prefix first.
    pub fn masks(&self) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> =
            Root::ALL.iter().map(|root| (self.host_root(*root).to_string_lossy().into_owned(), root.virtual_path().to_owned())).collect();
        pairs.push((self.user_data.to_string_lossy().into_owned(), USER_DATA.to_owned()));
        pairs.sort_by_key(|pair| std::cmp::Reverse(pair.0.len()));
        pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_creates_the_layout_once() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let layout = Layout::new(dir.path(), &Default::default(), Ownership::default())?;
        let ws = layout.workspace("a.b", "t1");
        assert!(!ws.exists());
        assert!(ws.ensure()?);
        assert!(!ws.ensure()?);
        for root in Root::USER_DATA {
            assert!(ws.host_root(root).is_dir());
        }
        assert!(ws.host_root(Root::AcpWorkspace).ends_with(format!("users/{}/threads/t1/acp-workspace", ids::user_dir_name("a.b"))));
        assert!(ws.host_root(Root::AcpWorkspace).is_dir());
        layout.skills().refresh_view("a.b").map_err(std::io::Error::other)?;
        assert!(ws.host_root(Root::Skills).is_dir());
        let mode = std::fs::metadata(layout.base())?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o711);
        Ok(())
    }

    #[test]
    fn two_users_with_one_thread_id_get_two_directories() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let layout = Layout::new(dir.path(), &Default::default(), Ownership::default())?;
        let a = layout.workspace("alice", "t");
        let b = layout.workspace("bob", "t");
        assert_ne!(a.host_root(Root::Workspace), b.host_root(Root::Workspace));
        Ok(())
    }

    #[test]
    fn masks_put_the_longest_host_prefix_first() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let layout = Layout::new(dir.path(), &Default::default(), Ownership::default())?;
        let masks = layout.workspace("u", "t").masks();
        assert!(masks.windows(2).all(|w| w[0].0.len() >= w[1].0.len()));
        assert!(masks.iter().any(|(_, v)| v == "/mnt/user-data"));
        Ok(())
    }
}
