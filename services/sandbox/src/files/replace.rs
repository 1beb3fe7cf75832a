//! Replacing a file whole, atomically: the new content goes to a temporary file in the same directory,
//! which is then renamed over the name. A reader (DownloadFile, ReadFile, a command) opens either the old
//! file or the new one, never a truncated or half-written one, and a crash leaves the old file (plus at
//! worst a stray `.antler-*.tmp`). WriteFile and EditFile both replace files this way.

use std::io::Write;
use std::os::fd::AsFd;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::resolve::Ownership;

/// Who the replacement belongs to and its permission bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attributes {
    /// Permission bits (`st_mode & 0o7777` of the file it replaces, 0o644 for a new one).
    pub mode: u32,
    /// Owner to give the new file: the replaced file's (so a file a sandboxed command made stays
    /// writable by it), or the sandbox user's for a new one. Unset: the service's own.
    pub owner: Ownership,
    /// Whether a failed change of owner is an error (a new file for the sandbox user must be theirs)
    /// or not (only root can give a file away; without root the replaced file already was ours).
    pub owner_required: bool,
}

/// Writes `content` to a temporary file in `dir` and renames it over `name`. The temporary file is
/// created exclusively (never following a link) and removed again if anything fails.
pub fn replace(dir: impl AsFd, name: &str, content: &[u8], attributes: Attributes, prefix: &str) -> Result<(), Errno> {
    let dir = dir.as_fd();
    let temp = format!(".antler-{prefix}-{:016x}.tmp", fastrand::u64(..));
    let mode = Mode::from_raw_mode(attributes.mode & 0o7777);
    let fd =
        rustix::fs::openat(dir, temp.as_str(), OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC, mode)?;
    let result = (|| {
        match attributes.owner.apply_fd(&fd) {
            Err(error) if attributes.owner_required => return Err(error),
            _ => {}
        }
        // openat's mode is filtered by the umask; the replaced file's bits are kept exactly.
        rustix::fs::fchmod(&fd, mode)?;
        let mut file = std::fs::File::from(fd);
        file.write_all(content).map_err(|e| e.raw_os_error().map_or(Errno::IO, Errno::from_raw_os_error))?;
        rustix::fs::renameat(dir, temp.as_str(), dir, name)
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, temp.as_str(), AtFlags::empty());
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_keeps_the_mode_and_leaves_no_temporary_file() -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("f"), "old")?;
        let fd = rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        replace(&fd, "f", b"new content", Attributes { mode: 0o600, owner: Ownership::default(), owner_required: false }, "test")?;
        assert_eq!(std::fs::read_to_string(dir.path().join("f"))?, "new content");
        assert_eq!(std::fs::metadata(dir.path().join("f"))?.permissions().mode() & 0o7777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())?.flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, ["f"]);
        // Renaming onto a directory fails, and the temporary file is gone again.
        std::fs::create_dir(dir.path().join("d"))?;
        assert!(replace(&fd, "d", b"x", Attributes { mode: 0o644, owner: Ownership::default(), owner_required: false }, "test").is_err());
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 2);
        Ok(())
    }
}
