//! WriteFile: create, replace or append, creating missing parent directories. The caller holds the
//! path's lock (see [`crate::locks`]).
//!
//! A create or replace is atomic ([`files::replace`]): the content goes to a temporary file beside the
//! name and is renamed over it, so a reader (DownloadFile behind the gateway's artifact route, ReadFile,
//! a command) sees the old content or the new, never an empty or half-written file, and two writers
//! leave one of their versions whole. Two cases are written in place instead: an append (it only adds
//! bytes) and a name that is a symbolic link inside the root (written through, so the link stays one).

use std::io::Write;

use rustix::fs::{FileType, Mode, OFlags};

use crate::error::{Result, SandboxError};
use crate::files;
use crate::paths::VirtualPath;
use crate::resolve;
use crate::workspace::Workspace;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOutcome {
    pub path: String,
    pub bytes_written: u64,
    pub size_bytes: u64,
    pub created: bool,
}

/// Checks the single-write cap (appends are exempt: that is how a large file is written in parts).
pub fn check_size(len: usize, append: bool, max_bytes: u64) -> Result<()> {
    if !append && max_bytes > 0 && len as u64 > max_bytes {
        return Err(SandboxError::ResourceExhausted(format!(
            "the content is {len} bytes, above the single-write cap of {max_bytes} bytes (sandbox.files.write_max_bytes)\nhint: write the first part, then add the rest with append: true"
        )));
    }
    Ok(())
}

pub fn write(workspace: &Workspace, path: &VirtualPath, content: &[u8], append: bool) -> Result<WriteOutcome> {
    let display = path.display();
    let (_, root, rel) = files::open_writable(workspace, path)?;
    let errno = |e| SandboxError::from_errno(&display, e);
    let owner = workspace.ownership();
    let parent_dir = match path.split_last() {
        Some((parent, _)) => {
            let (_, parent_rel) = parent.within_root()?;
            Some(resolve::create_dirs(&root, parent_rel, owner).map_err(|e| match e {
                rustix::io::Errno::NOTDIR | rustix::io::Errno::EXIST => {
                    SandboxError::wrong_kind(&parent.display(), "is not a directory, so it cannot hold a file")
                }
                other => SandboxError::from_errno(&parent.display(), other),
            })?)
        }
        None => None,
    };
    if !append && let (Some(dir), Some((_, name))) = (parent_dir, path.split_last()) {
        let attributes = match resolve::lstat_at(&dir, name) {
            Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
                FileType::RegularFile => {
                    files::refuse_hard_links(path, &stat)?;
                    let owner = resolve::Ownership { uid: Some(stat.st_uid), gid: Some(stat.st_gid) };
                    Some((files::replace::Attributes { mode: stat.st_mode & 0o7777, owner, owner_required: false }, false))
                }
                FileType::Symlink => None,
                FileType::Directory => return Err(SandboxError::wrong_kind(&display, "is a directory")),
                _ => return Err(SandboxError::wrong_kind(&display, "is not a regular file")),
            },
            Err(rustix::io::Errno::NOENT) => Some((files::replace::Attributes { mode: 0o644, owner, owner_required: true }, true)),
            Err(e) => return Err(errno(e)),
        };
        if let Some((attributes, created)) = attributes {
            files::replace::replace(&dir, name, content, attributes, "write").map_err(errno)?;
            let size = content.len() as u64;
            return Ok(WriteOutcome { path: display, bytes_written: size, size_bytes: size, created });
        }
    }
    write_in_place(workspace, path, &root, &rel, content, append)
}

/// An append, or a write through a symbolic link: opened (created if missing) and written where it is.
fn write_in_place(
    workspace: &Workspace,
    path: &VirtualPath,
    root: &std::os::fd::OwnedFd,
    rel: &str,
    content: &[u8],
    append: bool,
) -> Result<WriteOutcome> {
    let display = path.display();
    let errno = |e| SandboxError::from_errno(&display, e);
    let owner = workspace.ownership();
    // Never O_TRUNC at open: the file might be a hard link to something outside, which is only known
    // after fstat. O_NONBLOCK: a FIFO planted by a command must not block the call.
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK | OFlags::NOCTTY | if append { OFlags::APPEND } else { OFlags::empty() };
    let existed = resolve::open_beneath(root, rel, OFlags::PATH, Mode::empty()).is_ok();
    let fd = resolve::open_beneath(root, rel, flags, Mode::from_raw_mode(0o644)).map_err(errno)?;
    let stat = rustix::fs::fstat(&fd).map_err(errno)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(SandboxError::wrong_kind(&display, "is not a regular file"));
    }
    files::refuse_hard_links(path, &stat)?;
    resolve::clear_nonblock(&fd).map_err(errno)?;
    if !existed {
        owner.apply_fd(&fd).map_err(errno)?;
    }
    if !append {
        rustix::fs::ftruncate(&fd, 0).map_err(errno)?;
    }
    let mut file = std::fs::File::from(fd);
    file.write_all(content).map_err(|e| SandboxError::from_io(&display, &e))?;
    let size = file.metadata().map(|m| m.len()).map_err(|e| SandboxError::from_io(&display, &e))?;
    Ok(WriteOutcome { path: display, bytes_written: content.len() as u64, size_bytes: size, created: !existed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::{Root, parse};
    use crate::resolve::Ownership;
    use crate::workspace::Layout;

    fn setup() -> anyhow::Result<(tempfile::TempDir, Workspace)> {
        let dir = tempfile::tempdir()?;
        let ws = Layout::new(dir.path(), &Default::default(), Ownership::default())?.workspace("u", "t");
        ws.ensure()?;
        Ok((dir, ws))
    }

    #[test]
    fn creates_parents_replaces_and_appends() -> anyhow::Result<()> {
        let (_d, ws) = setup()?;
        let p = parse("a/b/c.txt", "path", None)?;
        let first = write(&ws, &p, b"hello", false)?;
        assert!(first.created);
        assert_eq!(first.size_bytes, 5);
        let second = write(&ws, &p, b"hi", false)?;
        assert!(!second.created);
        assert_eq!(second.size_bytes, 2);
        let third = write(&ws, &p, b"!!", true)?;
        assert_eq!(third.size_bytes, 4);
        assert_eq!(std::fs::read(ws.host_root(Root::Workspace).join("a/b/c.txt"))?, b"hi!!");
        Ok(())
    }

    /// Four writers replace one file with versions of their own while a reader reads it: every read is
    /// one version whole (in-place truncate-and-write shows empty and partial files here at once).
    #[test]
    fn concurrent_writers_and_a_reader_only_ever_see_whole_versions() -> anyhow::Result<()> {
        const SIZE: usize = 256 * 1024;
        const WRITES: usize = 40;
        let (_d, ws) = setup()?;
        let p = parse("/mnt/user-data/outputs/report.md", "path", None)?;
        write(&ws, &p, &[b'-'; SIZE], false)?;
        let host = ws.host_root(Root::Outputs).join("report.md");
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (host, done) = (host.clone(), done.clone());
            std::thread::spawn(move || -> Result<usize, String> {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) || reads < 10 {
                    let bytes = std::fs::read(&host).map_err(|e| e.to_string())?;
                    reads += 1;
                    let whole = bytes.len() == SIZE && bytes.iter().all(|b| *b == bytes[0]);
                    if !whole {
                        return Err(format!("read {reads} saw {} bytes, not one whole version", bytes.len()));
                    }
                }
                Ok(reads)
            })
        };
        let writers: Vec<_> = (0..4u8)
            .map(|w| {
                let (ws, p) = (ws.clone(), p.clone());
                std::thread::spawn(move || -> Result<(), String> {
                    for _ in 0..WRITES {
                        let outcome = write(&ws, &p, &[b'a' + w; SIZE], false).map_err(|e| e.to_string())?;
                        assert_eq!(outcome.size_bytes, SIZE as u64);
                    }
                    Ok(())
                })
            })
            .collect();
        for writer in writers {
            writer.join().map_err(|_| anyhow::anyhow!("a writer panicked"))?.map_err(anyhow::Error::msg)?;
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        let reads = reader.join().map_err(|_| anyhow::anyhow!("the reader panicked"))?.map_err(anyhow::Error::msg)?;
        assert!(reads >= 10, "{reads}");
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(ws.host_root(Root::Outputs))?.flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, ["report.md"]);
        Ok(())
    }

    #[test]
    fn a_replaced_file_keeps_its_mode_and_a_symlink_stays_a_link() -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let (_d, ws) = setup()?;
        let root = ws.host_root(Root::Workspace);
        std::fs::write(root.join("run.sh"), "#!/bin/sh\n")?;
        std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o750))?;
        write(&ws, &parse("run.sh", "path", None)?, b"#!/bin/sh\necho hi\n", false)?;
        assert_eq!(std::fs::metadata(root.join("run.sh"))?.permissions().mode() & 0o7777, 0o750);
        std::os::unix::fs::symlink("run.sh", root.join("link"))?;
        write(&ws, &parse("link", "path", None)?, b"through the link", false)?;
        assert!(std::fs::symlink_metadata(root.join("link"))?.file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(root.join("run.sh"))?, "through the link");
        Ok(())
    }

    #[test]
    fn refuses_directories_skills_hard_links_and_oversized_payloads() -> anyhow::Result<()> {
        let (dir, ws) = setup()?;
        std::fs::create_dir(ws.host_root(Root::Workspace).join("d"))?;
        assert!(matches!(write(&ws, &parse("d", "path", None)?, b"x", false), Err(SandboxError::WrongKind { .. })));
        assert!(matches!(write(&ws, &parse("/mnt/skills/x", "path", None)?, b"x", false), Err(SandboxError::PermissionDenied { .. })));
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "keep")?;
        std::fs::hard_link(&outside, ws.host_root(Root::Workspace).join("hl"))?;
        assert!(matches!(write(&ws, &parse("hl", "path", None)?, b"x", false), Err(SandboxError::PermissionDenied { .. })));
        assert_eq!(std::fs::read_to_string(&outside)?, "keep", "the linked file was not truncated");
        assert!(check_size(100, false, 10).is_err());
        assert!(check_size(100, true, 10).is_ok());
        assert!(check_size(100, false, 0).is_ok());
        Ok(())
    }
}
