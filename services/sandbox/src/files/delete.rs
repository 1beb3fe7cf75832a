//! DeleteFile: removes one file by name from its parent directory's descriptor, opened beneath the
//! root, so the name cannot lead outside the sandbox and a symbolic link is removed as a link (its
//! target is never touched). Directories are refused. The caller holds the path's lock.

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::error::{Result, SandboxError};
use crate::files;
use crate::paths::VirtualPath;
use crate::resolve;
use crate::workspace::Workspace;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deleted {
    pub path: String,
    /// Bytes of the regular file removed (0 for a link).
    pub size_bytes: u64,
}

pub fn delete(workspace: &Workspace, path: &VirtualPath) -> Result<Deleted> {
    let display = path.display();
    let (_, root, _) = files::open_writable(workspace, path)?;
    let Some((parent, name)) = path.split_last() else {
        return Err(SandboxError::denied(&display, "is a root directory; only files are deleted"));
    };
    let (_, parent_rel) = parent.within_root()?;
    let dir = resolve::open_beneath(&root, parent_rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| SandboxError::from_errno(&display, e))?;
    let stat = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| SandboxError::from_errno(&display, e))?;
    let size_bytes = match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => u64::try_from(stat.st_size).unwrap_or(0),
        FileType::Symlink => 0,
        FileType::Directory => return Err(SandboxError::wrong_kind(&display, "is a directory; only files are deleted")),
        _ => return Err(SandboxError::wrong_kind(&display, "is not a regular file")),
    };
    rustix::fs::unlinkat(&dir, name, AtFlags::empty()).map_err(|e| SandboxError::from_errno(&display, e))?;
    Ok(Deleted { path: display, size_bytes })
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
    fn deletes_a_file_and_refuses_directories_and_missing_names() -> anyhow::Result<()> {
        let (_dir, ws) = setup()?;
        let uploads = ws.host_root(Root::Uploads);
        std::fs::write(uploads.join("a.txt"), b"hello")?;
        std::fs::create_dir(uploads.join("sub"))?;
        let deleted = delete(&ws, &parse("/mnt/user-data/uploads/a.txt", "path", None)?)?;
        assert_eq!(deleted, Deleted { path: "/mnt/user-data/uploads/a.txt".to_owned(), size_bytes: 5 });
        assert!(!uploads.join("a.txt").exists());
        let again = delete(&ws, &parse("/mnt/user-data/uploads/a.txt", "path", None)?);
        assert!(matches!(again, Err(SandboxError::PathNotFound { .. })), "{again:?}");
        let dir = delete(&ws, &parse("/mnt/user-data/uploads/sub", "path", None)?);
        assert!(matches!(dir, Err(SandboxError::WrongKind { .. })), "{dir:?}");
        assert!(uploads.join("sub").is_dir());
        let root = delete(&ws, &parse("/mnt/user-data/uploads", "path", None)?);
        assert!(root.is_err());
        Ok(())
    }

    #[test]
    fn a_link_is_removed_as_a_link() -> anyhow::Result<()> {
        let (dir, ws) = setup()?;
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, b"keep me")?;
        let outputs = ws.host_root(Root::Outputs);
        std::os::unix::fs::symlink(&outside, outputs.join("link.txt"))?;
        let deleted = delete(&ws, &parse("/mnt/user-data/outputs/link.txt", "path", None)?)?;
        assert_eq!(deleted.size_bytes, 0);
        assert!(std::fs::symlink_metadata(outputs.join("link.txt")).is_err());
        assert_eq!(std::fs::read(&outside)?, b"keep me");
        Ok(())
    }
}
