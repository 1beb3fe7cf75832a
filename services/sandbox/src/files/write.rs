//! WriteFile: create, replace or append, creating missing parent directories. The caller holds the
//! path's lock (see [`crate::locks`]).

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
    if let Some((parent, _)) = path.split_last() {
        let (_, parent_rel) = parent.within_root()?;
        resolve::create_dirs(&root, parent_rel, owner).map_err(|e| match e {
            rustix::io::Errno::NOTDIR | rustix::io::Errno::EXIST => {
                SandboxError::wrong_kind(&parent.display(), "is not a directory, so it cannot hold a file")
            }
            other => SandboxError::from_errno(&parent.display(), other),
        })?;
    }
    // Never O_TRUNC at open: the file might be a hard link to something outside, which is only known
    // after fstat. O_NONBLOCK: a FIFO planted by a command must not block the call.
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK | OFlags::NOCTTY | if append { OFlags::APPEND } else { OFlags::empty() };
    let existed = resolve::open_beneath(&root, &rel, OFlags::PATH, Mode::empty()).is_ok();
    let fd = resolve::open_beneath(&root, &rel, flags, Mode::from_raw_mode(0o644)).map_err(errno)?;
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
