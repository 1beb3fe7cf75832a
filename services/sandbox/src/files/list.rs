//! ListDir: a directory tree one or two levels deep, sorted, without the ignore list, capped by entry
//! count and by the total characters of the paths (so the listing fits an agent's context).
//!
//! The walk is descriptor-relative all the way down (`readdir` on an open directory, `fstatat` and
//! `openat(O_NOFOLLOW)` on single names): no path string is re-resolved, so nothing can be swapped under
//! it. Symbolic links are shown only when they resolve inside the root, and never descended into.

use std::os::fd::{AsFd, OwnedFd};
use std::time::SystemTime;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Result, SandboxError};
use crate::files::{self, ignore_list};
use crate::paths::{Root, VirtualPath};
use crate::resolve;
use crate::workspace::Workspace;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Virtual path; directories end with "/".
    pub path: String,
    pub kind: EntryKind,
    pub size_bytes: u64,
    pub modified_at: SystemTime,
    pub depth: u32,
    pub read_only: bool,
}

#[derive(Debug, Clone)]
pub struct ListRequest {
    pub path: VirtualPath,
    /// 1 or 2.
    pub max_depth: u32,
    pub include_ignored: bool,
    pub max_entries: usize,
    pub max_chars: usize,
}

#[derive(Debug, Clone, Default)]
pub struct ListOutcome {
    pub entries: Vec<Entry>,
    pub truncated: bool,
}

/// Entries gathered before sorting; beyond it the listing is cut and flagged (a directory of millions of
/// files must not take the service's memory).
const GATHER_CAP: usize = 100_000;

struct Walk<'a> {
    root: Root,
    root_fd: &'a OwnedFd,
    request: &'a ListRequest,
    found: Vec<Entry>,
    overflow: bool,
}

pub fn list(workspace: &Workspace, request: &ListRequest) -> Result<ListOutcome> {
    let mut outcome_entries = Vec::new();
    let mut overflow = false;
    match &request.path {
        VirtualPath::UserData => {
            for root in Root::USER_DATA {
                let root_fd = workspace.open_root(root)?;
                let stat = rustix::fs::fstat(&root_fd).map_err(|e| SandboxError::from_errno(root.virtual_path(), e))?;
                outcome_entries.push(Entry {
                    path: format!("{}/", root.virtual_path()),
                    kind: EntryKind::Directory,
                    size_bytes: 0,
                    modified_at: files::modified(&stat),
                    depth: 1,
                    read_only: false,
                });
                if request.max_depth >= 2 {
                    let (entries, cut) = walk_root(root, &root_fd, "", request, 2)?;
                    outcome_entries.extend(entries);
                    overflow |= cut;
                }
            }
        }
        VirtualPath::In { root, rel } => {
            let root_fd = workspace.open_root(*root)?;
            let (entries, cut) = walk_root(*root, &root_fd, rel, request, 1)?;
            outcome_entries = entries;
            overflow = cut;
        }
    }
    outcome_entries.sort_by(|a, b| a.path.cmp(&b.path));
    let mut chars = 0usize;
    let mut kept = Vec::new();
    let mut truncated = overflow;
    for entry in outcome_entries {
        chars += entry.path.chars().count() + 1;
        if kept.len() >= request.max_entries || chars > request.max_chars {
            truncated = true;
            break;
        }
        kept.push(entry);
    }
    Ok(ListOutcome { entries: kept, truncated })
}

fn walk_root(root: Root, root_fd: &OwnedFd, rel: &str, request: &ListRequest, first_depth: u32) -> Result<(Vec<Entry>, bool)> {
    let display = VirtualPath::In { root, rel: rel.to_owned() }.display();
    let dir = resolve::open_dir_for_listing(root_fd, rel).map_err(|e| match e {
        Errno::NOTDIR => SandboxError::wrong_kind(&display, "is not a directory"),
        other => SandboxError::from_errno(&display, other),
    })?;
    let max_depth = if first_depth == 2 { 2 } else { request.max_depth };
    let mut walk = Walk { root, root_fd, request, found: Vec::new(), overflow: false };
    walk.level(dir, rel, first_depth, max_depth).map_err(|e| SandboxError::from_errno(&display, e))?;
    Ok((walk.found, walk.overflow))
}

impl Walk<'_> {
    fn level(&mut self, dir: OwnedFd, rel: &str, depth: u32, max_depth: u32) -> std::result::Result<(), Errno> {
        let mut names = Vec::new();
        let mut reader = Dir::read_from(&dir)?;
        while let Some(entry) = reader.read() {
            let entry = entry?;
            let Ok(name) = entry.file_name().to_str() else { continue };
            if name == "." || name == ".." {
                continue;
            }
            if !self.request.include_ignored && ignore_list::is_ignored(name) {
                continue;
            }
            names.push(name.to_owned());
        }
        names.sort();
        for name in names {
            if self.found.len() >= GATHER_CAP {
                self.overflow = true;
                return Ok(());
            }
            let Ok(stat) = rustix::fs::statat(dir.as_fd(), name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else { continue };
            let child_rel = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
            let kind = match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => EntryKind::File,
                FileType::Directory => EntryKind::Directory,
                FileType::Symlink => {
                    // Shown only when it resolves beneath the root; an escaping link is omitted entirely.
                    if resolve::open_beneath(self.root_fd, &child_rel, OFlags::PATH, Mode::empty()).is_err() {
                        continue;
                    }
                    EntryKind::Symlink
                }
                _ => EntryKind::Other,
            };
            let mut path = VirtualPath::In { root: self.root, rel: child_rel.clone() }.display();
            if kind == EntryKind::Directory {
                path.push('/');
            }
            self.found.push(Entry {
                path,
                kind,
                size_bytes: if kind == EntryKind::File { u64::try_from(stat.st_size).unwrap_or(0) } else { 0 },
                modified_at: files::modified(&stat),
                depth,
                read_only: self.root.read_only(),
            });
            if kind == EntryKind::Directory && depth < max_depth {
                let child = rustix::fs::openat(
                    dir.as_fd(),
                    name.as_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                );
                if let Ok(child) = child {
                    self.level(child, &child_rel, depth + 1, max_depth)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Ownership;
    use crate::workspace::Layout;

    fn setup() -> anyhow::Result<(tempfile::TempDir, Workspace)> {
        let dir = tempfile::tempdir()?;
        let ws = Layout::new(dir.path(), &Default::default(), Ownership::default())?.workspace("u", "t");
        ws.ensure()?;
        let root = ws.host_root(Root::Workspace);
        std::fs::create_dir_all(root.join("a/b/c"))?;
        std::fs::create_dir_all(root.join(".git"))?;
        std::fs::write(root.join("a/f.txt"), "12345")?;
        std::fs::write(root.join("a/b/c/deep.txt"), "x")?;
        std::os::unix::fs::symlink("a/f.txt", root.join("inside"))?;
        std::os::unix::fs::symlink("/etc", root.join("outside"))?;
        Ok((dir, ws))
    }

    fn request(path: VirtualPath, depth: u32) -> ListRequest {
        ListRequest { path, max_depth: depth, include_ignored: false, max_entries: 1000, max_chars: 20_000 }
    }

    #[test]
    fn two_levels_sorted_without_ignored_or_escaping_entries() -> anyhow::Result<()> {
        let (_d, ws) = setup()?;
        let out = list(&ws, &request(VirtualPath::root(Root::Workspace), 2))?;
        let paths: Vec<&str> = out.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/mnt/user-data/workspace/a/",
                "/mnt/user-data/workspace/a/b/",
                "/mnt/user-data/workspace/a/f.txt",
                "/mnt/user-data/workspace/inside"
            ]
        );
        assert_eq!(out.entries[2].size_bytes, 5);
        assert_eq!(out.entries[3].kind, EntryKind::Symlink);
        let shallow = list(&ws, &request(VirtualPath::root(Root::Workspace), 1))?;
        assert_eq!(shallow.entries.len(), 2);
        let all = list(&ws, &ListRequest { include_ignored: true, ..request(VirtualPath::root(Root::Workspace), 1) })?;
        assert!(all.entries.iter().any(|e| e.path.ends_with("/.git/")));
        Ok(())
    }

    #[test]
    fn caps_flag_truncation_and_user_data_lists_the_roots() -> anyhow::Result<()> {
        let (_d, ws) = setup()?;
        let out = list(&ws, &ListRequest { max_entries: 1, ..request(VirtualPath::root(Root::Workspace), 2) })?;
        assert!(out.truncated && out.entries.len() == 1);
        let out = list(&ws, &ListRequest { max_chars: 40, ..request(VirtualPath::root(Root::Workspace), 2) })?;
        assert!(out.truncated && out.entries.len() == 1);
        let roots = list(&ws, &request(VirtualPath::UserData, 1))?;
        let paths: Vec<&str> = roots.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/mnt/user-data/outputs/", "/mnt/user-data/uploads/", "/mnt/user-data/workspace/"]);
        assert!(matches!(list(&ws, &request(crate::paths::parse("a/f.txt", "p", None)?, 1)), Err(SandboxError::WrongKind { .. })));
        Ok(())
    }
}
