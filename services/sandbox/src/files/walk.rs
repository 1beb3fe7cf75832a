//! Directory walks for Glob, Grep and SnapshotOutputs, on the `ignore` crate's walker.
//!
//! The walker works on host path strings, so it is given only a directory that was first opened beneath
//! its root ([`crate::resolve`]) and whose kernel-reported path lies inside the root's host directory; it
//! never follows symbolic links. A command racing the walk could still swap a directory for a link
//! between two `readdir`s, so every entry is re-opened beneath the root by the caller before its name or
//! content is used ([`verify`]), and an entry that now resolves elsewhere is dropped.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ignore::WalkBuilder;
use rustix::fs::{Mode, OFlags};

use crate::error::{Result, SandboxError};
use crate::files::ignore_list;
use crate::paths::{Root, VirtualPath};
use crate::resolve;
use crate::workspace::Workspace;

/// A directory to search: where it is on the host and how to name what is found in it.
#[derive(Debug, Clone)]
pub struct Base {
    pub root: Root,
    pub root_fd: Arc<OwnedFd>,
    /// The directory relative to its root ("" for the root).
    pub rel: String,
    /// Its host path, as the kernel reports it.
    pub host: PathBuf,
    /// What a match's path is relative to in the caller's terms (the searched directory). For
    /// `/mnt/user-data` the three roots are searched with prefixes "workspace/", "uploads/", "outputs/".
    pub prefix: String,
}

impl Base {
    /// Virtual path of an entry found `rel_in_base` below this base.
    pub fn virtual_path(&self, rel_in_base: &str) -> String {
        let rel = join(&self.rel, rel_in_base);
        VirtualPath::In { root: self.root, rel }.display()
    }

    /// Path of the entry relative to the root.
    pub fn rel_in_root(&self, rel_in_base: &str) -> String {
        join(&self.rel, rel_in_base)
    }
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_owned(),
        (false, true) => a.to_owned(),
        (false, false) => format!("{a}/{b}"),
    }
}

/// What a search of `path` covers: the directory itself, or the three roots for `/mnt/user-data`.
pub fn bases(workspace: &Workspace, path: &VirtualPath) -> Result<Vec<Base>> {
    match path {
        VirtualPath::UserData => Root::USER_DATA
            .iter()
            .map(|root| base(workspace, &VirtualPath::root(*root), root.dir_name().map(|n| format!("{n}/")).unwrap_or_default()))
            .collect(),
        other => Ok(vec![base(workspace, other, String::new())?]),
    }
}

fn base(workspace: &Workspace, path: &VirtualPath, prefix: String) -> Result<Base> {
    let display = path.display();
    let (root, rel) = path.within_root()?;
    let root_fd = workspace.open_root(root)?;
    let dir = resolve::open_dir(&root_fd, rel).map_err(|e| match e {
        rustix::io::Errno::NOTDIR => SandboxError::wrong_kind(&display, "is not a directory"),
        other => SandboxError::from_errno(&display, other),
    })?;
    let host = resolve::host_path_of(&dir).map_err(|e| SandboxError::from_errno(&display, e))?;
    let root_host = resolve::host_path_of(&root_fd).map_err(|e| SandboxError::from_errno(&display, e))?;
    if !host.starts_with(&root_host) {
        // openat2 already refused escapes; this is a second, independent check before a path-based walk.
        return Err(SandboxError::denied(&display, "resolves outside the sandbox roots"));
    }
    Ok(Base { root, root_fd: Arc::new(root_fd), rel: rel.to_owned(), host, prefix })
}

/// A walker over `base` that never follows links and, unless `include_ignored`, skips the ignore list.
/// Only DeerFlow's list applies: `.gitignore` files are not consulted.
pub fn builder(base: &Base, include_ignored: bool) -> WalkBuilder {
    let mut builder = WalkBuilder::new(&base.host);
    builder.standard_filters(false).follow_links(false).same_file_system(false);
    if !include_ignored {
        builder.filter_entry(|entry| entry.depth() == 0 || !entry.file_name().to_str().is_some_and(ignore_list::is_ignored));
    }
    builder
}

/// The entry's path relative to the base, with `/` separators; None for the base itself or a name that
/// is not UTF-8 (it could not be named in a response).
pub fn relative(base: &Base, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(&base.host).ok()?;
    let text = rel.to_str()?;
    if text.is_empty() { None } else { Some(text.to_owned()) }
}

/// Re-opens an entry beneath its root without following a final symlink; false when it now resolves
/// outside (or vanished).
pub fn verify(base: &Base, rel_in_base: &str) -> bool {
    resolve::open_beneath(&*base.root_fd, &base.rel_in_root(rel_in_base), OFlags::PATH | OFlags::NOFOLLOW, Mode::empty()).is_ok()
}
