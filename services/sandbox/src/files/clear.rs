//! Emptying a root for ResetSandbox, descriptor-relative: each directory is opened with O_NOFOLLOW from
//! its parent's descriptor, so a symbolic link planted by a command is removed as a link and whatever it
//! points to is never touched.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Deletes everything inside `dir` (not `dir` itself); returns how many entries were removed.
pub fn clear_dir(dir: &OwnedFd) -> Result<u64, Errno> {
    let mut removed = 0;
    let mut names = Vec::new();
    let mut reader = Dir::read_from(dir)?;
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name().to_owned();
        if name.as_bytes() == b"." || name.as_bytes() == b".." {
            continue;
        }
        names.push(name);
    }
    for name in names {
        let stat = match rustix::fs::statat(dir.as_fd(), name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(e),
        };
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            let child = rustix::fs::openat(
                dir.as_fd(),
                name.as_c_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            removed += clear_dir(&child)?;
            rustix::fs::unlinkat(dir.as_fd(), name.as_c_str(), AtFlags::REMOVEDIR)?;
        } else {
            rustix::fs::unlinkat(dir.as_fd(), name.as_c_str(), AtFlags::empty())?;
        }
        removed += 1;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_contents_and_links_but_not_their_targets() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("a/b"))?;
        std::fs::write(root.join("a/b/f"), "x")?;
        std::fs::write(root.join("g"), "x")?;
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside)?;
        std::fs::write(outside.join("keep"), "x")?;
        std::os::unix::fs::symlink(&outside, root.join("link"))?;
        let fd = rustix::fs::open(&root, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        assert_eq!(clear_dir(&fd)?, 5);
        assert_eq!(std::fs::read_dir(&root)?.count(), 0);
        assert!(outside.join("keep").exists());
        Ok(())
    }
}
