//! The file tools. Each one resolves its virtual path with [`crate::paths::parse`] and then opens
//! everything beneath the root's directory descriptor ([`crate::resolve`]); none of them builds a host
//! path from client input. They are blocking code: the API layer runs them on the blocking pool.

pub mod clear;
pub mod companion;
pub mod delete;
pub mod download;
pub mod edit;
pub mod glob;
pub mod grep;
pub mod ignore_list;
pub mod list;
pub mod mime;
pub mod read;
pub mod replace;
pub mod snapshot;
pub mod upload;
pub mod walk;
pub mod write;

use std::os::fd::OwnedFd;
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::Stat;

use crate::error::{Result, SandboxError};
use crate::paths::{Root, VirtualPath};
use crate::workspace::Workspace;

/// Opens the root directory of `path` and returns it with the path's remainder.
pub fn open(workspace: &Workspace, path: &VirtualPath) -> Result<(Root, OwnedFd, String)> {
    let (root, rel) = path.within_root()?;
    Ok((root, workspace.open_root(root)?, rel.to_owned()))
}

/// Like [`open`] for a path that will be written: refuses `/mnt/skills` and the roots themselves.
pub fn open_writable(workspace: &Workspace, path: &VirtualPath) -> Result<(Root, OwnedFd, String)> {
    let (root, rel) = path.writable()?;
    if rel.is_empty() {
        return Err(SandboxError::wrong_kind(&path.display(), "is a directory"));
    }
    Ok((root, workspace.open_root(root)?, rel.to_owned()))
}

/// Modification time of a stat result.
pub fn modified(stat: &Stat) -> SystemTime {
    let secs = u64::try_from(stat.st_mtime).unwrap_or(0);
    let nanos = u32::try_from(stat.st_mtime_nsec).unwrap_or(0);
    UNIX_EPOCH + std::time::Duration::new(secs, nanos)
}

/// A file with more than one hard link may share its content with a file outside the sandbox (a link made
/// by a host command, or by whoever else can write the data directory). bwrap commands cannot make such a
/// link (their mounts are separate, and link(2) refuses to cross mounts), but the file tools cannot tell
/// where the other names are, so they neither read nor write through one: reads, writes, edits and
/// downloads are refused, Grep skips the file and SnapshotOutputs leaves it out.
pub fn refuse_hard_links(path: &VirtualPath, stat: &Stat) -> Result<()> {
    if stat.st_nlink > 1 {
        return Err(SandboxError::denied(
            &path.display(),
            format!(
                "has {} hard links; files with more than one link are not read or written (copy it to a new file first)",
                stat.st_nlink
            ),
        ));
    }
    Ok(())
}

/// Whether bytes look like text: no NUL in the first 8192 bytes (the same test as DeerFlow and ripgrep).
pub fn looks_binary(head: &[u8]) -> bool {
    head[..head.len().min(8192)].contains(&0)
}
