//! EditFile: exact string replacement in a UTF-8 text file. The caller holds the path's lock across the
//! whole read-modify-write, so concurrent edits are applied one after the other.
//!
//! The new content is written to a temporary file beside the original and renamed over it, so a reader
//! (or a crash) never sees half an edit. When the name is a symbolic link (inside the root) the edit is
//! written through the link instead, so the link stays a link.

use std::io::{Read, Seek, Write};

use rustix::fs::{FileType, Mode, OFlags};

use crate::error::{Result, SandboxError};
use crate::files::{self, looks_binary};
use crate::paths::VirtualPath;
use crate::resolve;
use crate::workspace::Workspace;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditOutcome {
    pub path: String,
    pub replacements: u32,
    pub size_bytes: u64,
}

pub fn edit(workspace: &Workspace, path: &VirtualPath, old: &str, new: &str, replace_all: bool, max_bytes: u64) -> Result<EditOutcome> {
    if old.is_empty() {
        return Err(SandboxError::invalid("old_str", "must not be empty"));
    }
    let display = path.display();
    let errno = |e| SandboxError::from_errno(&display, e);
    let (_, root, rel) = files::open_writable(workspace, path)?;
    let fd = resolve::open_beneath(&root, &rel, OFlags::RDWR | OFlags::NONBLOCK | OFlags::NOCTTY, Mode::empty()).map_err(errno)?;
    let stat = rustix::fs::fstat(&fd).map_err(errno)?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => return Err(SandboxError::wrong_kind(&display, "is a directory")),
        _ => return Err(SandboxError::wrong_kind(&display, "is not a regular file")),
    }
    files::refuse_hard_links(path, &stat)?;
    resolve::clear_nonblock(&fd).map_err(errno)?;
    let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if size > max_bytes {
        return Err(SandboxError::ResourceExhausted(format!(
            "{display} is {size} bytes, above the edit cap of {max_bytes} bytes (sandbox.files.edit_max_bytes)\nhint: use a command (sed, a script) for files this large"
        )));
    }
    let mut file = std::fs::File::from(fd);
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    (&mut file).take(max_bytes + 1).read_to_end(&mut bytes).map_err(|e| SandboxError::from_io(&display, &e))?;
    if looks_binary(&bytes) {
        return Err(SandboxError::FailedPrecondition(format!("{display} is a binary file; EditFile only edits UTF-8 text")));
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| SandboxError::FailedPrecondition(format!("{display} is not valid UTF-8; EditFile only edits UTF-8 text")))?;
    let count = text.matches(old).count();
    if count == 0 {
        return Err(SandboxError::FailedPrecondition(format!(
            "old_str was not found in {display}\nhint: old_str must match the file exactly, including whitespace and line breaks; read the file first"
        )));
    }
    if count > 1 && !replace_all {
        return Err(SandboxError::FailedPrecondition(format!(
            "old_str occurs {count} times in {display}\nhint: include more surrounding text to make it unique, or set replace_all to replace all {count}"
        )));
    }
    let updated = if replace_all { text.replace(old, new) } else { text.replacen(old, new, 1) };
    let replacements = if replace_all { count } else { 1 };

    let renamed = match path.split_last() {
        Some((parent, name)) => replace_by_rename(&root, parent.within_root()?.1, name, &stat, updated.as_bytes()).map_err(errno)?,
        None => false,
    };
    if !renamed {
        file.rewind().map_err(|e| SandboxError::from_io(&display, &e))?;
        file.write_all(updated.as_bytes()).map_err(|e| SandboxError::from_io(&display, &e))?;
        file.set_len(updated.len() as u64).map_err(|e| SandboxError::from_io(&display, &e))?;
    }
    Ok(EditOutcome { path: display, replacements: u32::try_from(replacements).unwrap_or(u32::MAX), size_bytes: updated.len() as u64 })
}

/// Replaces `name` by rename ([`files::replace`]), keeping the original's mode and owner. Returns
/// false (nothing done) when `name` is not the very file we read — a symlink, or swapped since — so
/// the caller writes in place instead.
fn replace_by_rename(
    root: &std::os::fd::OwnedFd,
    parent_rel: &str,
    name: &str,
    original: &rustix::fs::Stat,
    content: &[u8],
) -> std::result::Result<bool, rustix::io::Errno> {
    let dir = resolve::open_dir(root, parent_rel)?;
    let current = resolve::lstat_at(&dir, name)?;
    if FileType::from_raw_mode(current.st_mode) != FileType::RegularFile
        || current.st_ino != original.st_ino
        || current.st_dev != original.st_dev
    {
        return Ok(false);
    }
    let attributes = files::replace::Attributes {
        mode: original.st_mode & 0o7777,
        owner: resolve::Ownership { uid: Some(original.st_uid), gid: Some(original.st_gid) },
        owner_required: false,
    };
    files::replace::replace(&dir, name, content, attributes, "edit").map(|()| true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::{Root, parse};
    use crate::resolve::Ownership;
    use crate::workspace::Layout;

    fn setup(content: &str) -> anyhow::Result<(tempfile::TempDir, Workspace, VirtualPath)> {
        let dir = tempfile::tempdir()?;
        let ws = Layout::new(dir.path(), &Default::default(), Ownership::default())?.workspace("u", "t");
        ws.ensure()?;
        std::fs::write(ws.host_root(Root::Workspace).join("f.txt"), content)?;
        Ok((dir, ws, parse("f.txt", "path", None)?))
    }

    fn contents(ws: &Workspace) -> String {
        std::fs::read_to_string(ws.host_root(Root::Workspace).join("f.txt")).unwrap_or_default()
    }

    #[test]
    fn replaces_one_or_all_and_reports_counts() -> anyhow::Result<()> {
        let (_d, ws, p) = setup("a b a")?;
        match edit(&ws, &p, "a", "x", false, 1 << 20) {
            Err(SandboxError::FailedPrecondition(m)) => assert!(m.contains("occurs 2 times"), "{m}"),
            other => panic!("expected a count error, got {other:?}"),
        }
        assert!(matches!(edit(&ws, &p, "zzz", "x", false, 1 << 20), Err(SandboxError::FailedPrecondition(_))));
        assert!(matches!(edit(&ws, &p, "", "x", false, 1 << 20), Err(SandboxError::InvalidArgument { .. })));
        let out = edit(&ws, &p, "a", "x", true, 1 << 20)?;
        assert_eq!(out.replacements, 2);
        assert_eq!(contents(&ws), "x b x");
        let out = edit(&ws, &p, "b", "yy", false, 1 << 20)?;
        assert_eq!((out.replacements, out.size_bytes), (1, 6));
        assert_eq!(contents(&ws), "x yy x");
        Ok(())
    }

    #[test]
    fn edits_through_a_symlink_keep_the_link() -> anyhow::Result<()> {
        let (_d, ws, _) = setup("hello")?;
        let root = ws.host_root(Root::Workspace);
        std::os::unix::fs::symlink("f.txt", root.join("link"))?;
        edit(&ws, &parse("link", "path", None)?, "hello", "bye", false, 1 << 20)?;
        assert!(std::fs::symlink_metadata(root.join("link"))?.file_type().is_symlink());
        assert_eq!(contents(&ws), "bye");
        Ok(())
    }

    #[test]
    fn binary_and_oversized_files_are_refused() -> anyhow::Result<()> {
        let (_d, ws, p) = setup("a\0b")?;
        assert!(matches!(edit(&ws, &p, "a", "b", false, 1 << 20), Err(SandboxError::FailedPrecondition(_))));
        let (_d, ws, p) = setup(&"x".repeat(2000))?;
        assert!(matches!(edit(&ws, &p, "x", "y", true, 1024), Err(SandboxError::ResourceExhausted(_))));
        Ok(())
    }
}
