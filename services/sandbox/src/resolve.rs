//! The filesystem half of the path policy: every file the service touches is opened relative to its
//! root's directory descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`.
//!
//! Why not canonicalise and compare strings: between the check and the use, a command running in the
//! sandbox can swap a directory for a symbolic link. With `RESOLVE_BENEATH` the kernel itself refuses,
//! during the one lookup that also opens the file, any step that leaves the root — `..` past it, an
//! absolute symlink, a relative symlink climbing out — with EXDEV; a symlink loop gives ELOOP. Symlinks
//! that stay inside the root keep working. Creation goes through a parent opened the same way, then a
//! `*at` call on a single name, so no step ever follows a path string the sandbox could have changed.
//!
//! Kernels older than 5.6 (or seccomp policies that hide openat2) answer ENOSYS; then the lookup walks
//! the components one by one with `O_NOFOLLOW` and refuses every symbolic link, which is stricter but
//! just as safe.
//!
//! openat2 also answers EAGAIN when any rename or mount happens anywhere on the host while a walk
//! crosses `..` (the kernel cannot prove the walk stayed beneath the root, so it refuses to guess). A
//! busy host can make that persistent, so after a bounded backoff the lookup is redone by
//! [`open_resolving_in_userspace`]: the same rules (symlinks that stay inside work, escapes are EXDEV,
//! loops ELOOP), enforced on descriptors we hold, never on a path string.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{self, AtFlags, FileType, Gid, Mode, OFlags, ResolveFlags, Stat, Uid};
use rustix::io::Errno;

/// Who owns what the service creates inside a sandbox. When bwrap runs commands as an unprivileged host
/// user (because the service runs as root), files the service writes are handed to that user so the
/// sandboxed commands can modify them too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ownership {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

impl Ownership {
    pub fn is_set(&self) -> bool {
        self.uid.is_some() || self.gid.is_some()
    }

    fn ids(&self) -> (Option<Uid>, Option<Gid>) {
        (self.uid.map(Uid::from_raw), self.gid.map(Gid::from_raw))
    }

    /// Gives an open file to the sandbox user (no-op when unset).
    pub fn apply_fd(&self, fd: impl AsFd) -> Result<(), Errno> {
        if !self.is_set() {
            return Ok(());
        }
        let (uid, gid) = self.ids();
        fs::fchown(fd, uid, gid)
    }

    /// Gives `name` in `dir` to the sandbox user without following a symlink (no-op when unset).
    pub fn apply_at(&self, dir: impl AsFd, name: &str) -> Result<(), Errno> {
        if !self.is_set() {
            return Ok(());
        }
        let (uid, gid) = self.ids();
        fs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
    }

    /// Gives a host path we created ourselves to the sandbox user (no-op when unset).
    pub fn apply_path(&self, path: &Path) -> Result<(), Errno> {
        if !self.is_set() {
            return Ok(());
        }
        let (uid, gid) = self.ids();
        fs::chownat(fs::CWD, path, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
    }
}

/// Opens the directory of a root (a host path the service created) without following a final symlink.
pub fn open_root(host: &Path) -> Result<OwnedFd, Errno> {
    fs::open(host, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
}

/// Opens `rel` (normalised, no `..`) beneath `root`. `""` opens the root itself.
pub fn open_beneath(root: impl AsFd, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let rel = if rel.is_empty() { "." } else { rel };
    let flags = flags | OFlags::CLOEXEC;
    // EAGAIN: the kernel saw a concurrent rename or mount during a RESOLVE_BENEATH walk that crossed
    // `..` and refuses to guess. (With O_NONBLOCK, EAGAIN can also mean a file lease; retrying that is
    // just as right.) A retry usually sees a settled tree; a host renaming without pause may never
    // settle, so after the backoff the walk is done by hand.
    for attempt in 0..EAGAIN_ATTEMPTS {
        match fs::openat2(root.as_fd(), rel, flags, mode, ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS) {
            Err(Errno::AGAIN) => {
                RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                backoff(attempt)
            }
            Err(Errno::NOSYS) => return open_without_symlinks(root, rel, flags, mode),
            other => return other,
        }
    }
    metrics::counter!("antler_sandbox_resolve_fallbacks_total").increment(1);
    FALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    open_resolving_in_userspace(root, rel, flags, mode)
}

static FALLBACKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static RETRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// openat2 answers of EAGAIN this process retried.
pub fn eagain_retries() -> u64 {
    RETRIES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Lookups this process finished in user space because openat2 kept answering EAGAIN.
pub fn userspace_fallbacks() -> u64 {
    FALLBACKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// openat2 attempts before the lookup is done in user space.
const EAGAIN_ATTEMPTS: u32 = 24;

/// The first 8 retries are immediate; then 50 µs doubling to at most 1 ms (about 7 ms in all). The
/// callers run on blocking threads, so sleeping here blocks no async task.
fn backoff(attempt: u32) {
    if attempt >= 8 {
        let micros = (50u64 << (attempt - 8).min(5)).min(1000);
        std::thread::sleep(std::time::Duration::from_micros(micros));
    }
}

/// Most symbolic links followed in one lookup (the kernel's own limit).
const MAX_LINKS: u32 = 40;
/// Most components one user-space lookup handles (paths are at most 4096 bytes; links add at most
/// MAX_LINKS targets of as much again).
const MAX_STEPS: u32 = 4096 * (MAX_LINKS + 1);

/// RESOLVE_BENEATH done by hand, for when the kernel keeps answering EAGAIN. Written by hand because
/// no crate resolves beneath a descriptor without openat2.
///
/// Every directory on the way is opened with `O_NOFOLLOW` relative to the one before and kept open; a
/// symbolic link is read (`readlinkat`) and its target's components are walked in its place; `..`
/// pops a directory we hold (never `openat("..")`), and popping past the root is EXDEV, as is an
/// absolute target. A name that turns into a symlink between our look and our open is looked at
/// again. Magic links cannot appear: their targets are absolute or name no entry.
pub fn open_resolving_in_userspace(root: impl AsFd, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut stack: Vec<OwnedFd> = vec![fs::openat(root.as_fd(), ".", dir_flags, Mode::empty())?];
    let mut pending: std::collections::VecDeque<String> = components(rel).collect();
    let (mut links, mut steps) = (0u32, 0u32);
    while let Some(part) = pending.pop_front() {
        // Bounds a walk whose entries keep changing under it, as well as one through many links.
        steps += 1;
        if steps > MAX_STEPS {
            return Err(Errno::LOOP);
        }
        if part == ".." {
            if stack.len() == 1 {
                return Err(Errno::XDEV);
            }
            stack.pop();
            continue;
        }
        let last = pending.is_empty();
        let dir = stack.last().ok_or(Errno::XDEV)?;
        let stat = match fs::statat(dir, part.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Some(stat),
            // A final name that does not exist yet may be created by the open below.
            Err(Errno::NOENT) if last => None,
            Err(e) => return Err(e),
        };
        if stat.is_some_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink) {
            links += 1;
            if links > MAX_LINKS {
                return Err(Errno::LOOP);
            }
            let target = fs::readlinkat(dir, part.as_str(), Vec::new())?;
            let target = target.to_string_lossy().into_owned();
            if target.starts_with('/') {
                return Err(Errno::XDEV);
            }
            for (i, component) in components(&target).enumerate() {
                pending.insert(i, component);
            }
            continue;
        }
        let opened = if last {
            fs::openat(dir, part.as_str(), flags | OFlags::NOFOLLOW, mode)
        } else {
            fs::openat(dir, part.as_str(), dir_flags, Mode::empty())
        };
        match opened {
            // It became a symlink after we looked (or O_PATH opened the link itself): look again.
            Err(Errno::LOOP) | Err(Errno::NOTDIR) if became_symlink(dir, &part) => pending.push_front(part),
            Ok(fd) if last && flags.contains(OFlags::PATH) && is_symlink_fd(&fd) => pending.push_front(part),
            Ok(fd) if last => return Ok(fd),
            Ok(fd) => stack.push(fd),
            Err(e) => return Err(e),
        }
    }
    // The path named the root itself (or walked back to a directory we hold).
    let dir = stack.last().ok_or(Errno::XDEV)?;
    fs::openat(dir, ".", flags, mode)
}

/// The non-empty, non-`.` components of a relative path.
fn components(path: &str) -> impl Iterator<Item = String> + '_ {
    path.split('/').filter(|p| !p.is_empty() && *p != ".").map(str::to_owned)
}

fn became_symlink(dir: impl AsFd, name: &str) -> bool {
    fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink)
}

fn is_symlink_fd(fd: impl AsFd) -> bool {
    fs::fstat(fd).is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink)
}

/// The fallback when openat2 is unavailable: walk one component at a time with O_NOFOLLOW, so no
/// symbolic link is ever followed (ELOOP for any link on the way).
fn open_without_symlinks(root: impl AsFd, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    let Some((last, dirs)) = parts.split_last() else {
        return fs::openat(root, ".", flags, mode);
    };
    let mut current = fs::openat(root, ".", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    for dir in dirs {
        if *dir == ".." {
            return Err(Errno::XDEV);
        }
        current = fs::openat(&current, *dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    }
    fs::openat(&current, *last, flags | OFlags::NOFOLLOW, mode)
}

/// Opens a directory beneath `root` for use as the `dirfd` of `*at` calls.
pub fn open_dir(root: impl AsFd, rel: &str) -> Result<OwnedFd, Errno> {
    open_beneath(root, rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
}

/// Opens a directory beneath `root` for reading its entries.
pub fn open_dir_for_listing(root: impl AsFd, rel: &str) -> Result<OwnedFd, Errno> {
    open_beneath(root, rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
}

/// Opens an existing regular file for reading. O_NONBLOCK keeps a FIFO planted by a command from
/// blocking the call; anything but a regular file is refused with ENXIO after the open.
pub fn open_regular_read(root: impl AsFd, rel: &str) -> Result<(OwnedFd, Stat), Errno> {
    let fd = open_beneath(root, rel, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY, Mode::empty())?;
    let stat = fs::fstat(&fd)?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {
            clear_nonblock(&fd)?;
            Ok((fd, stat))
        }
        FileType::Directory => Err(Errno::ISDIR),
        _ => Err(Errno::NXIO),
    }
}

/// Clears O_NONBLOCK once we know the file is regular (it has no effect there, but a later reader of the
/// descriptor should not have to care).
pub fn clear_nonblock(fd: impl AsFd) -> Result<(), Errno> {
    let flags = fs::fcntl_getfl(&fd)?;
    fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)
}

/// Creates every missing directory of `rel` beneath `root` (like `mkdir -p`) and returns the last one.
/// Each new directory is made with `mkdirat` on one name inside a parent opened beneath the root, then
/// handed to `owner`.
pub fn create_dirs(root: impl AsFd, rel: &str, owner: Ownership) -> Result<OwnedFd, Errno> {
    let root = root.as_fd();
    let mut current = open_dir(root, "")?;
    let mut prefix = String::new();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        let parent_prefix = prefix.clone();
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(part);
        match open_dir(root, &prefix) {
            Ok(fd) => current = fd,
            Err(Errno::NOENT) => {
                let parent = open_dir(root, &parent_prefix)?;
                match fs::mkdirat(&parent, part, Mode::from_raw_mode(0o755)) {
                    Ok(()) => owner.apply_at(&parent, part)?,
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(e),
                }
                current = open_dir(root, &prefix)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(current)
}

/// The host path the kernel gives for an open descriptor (after every symlink it went through).
pub fn host_path_of(fd: impl AsFd) -> Result<PathBuf, Errno> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
        .map_err(|e| e.raw_os_error().map_or(Errno::IO, Errno::from_raw_os_error))
}

/// The type of `name` in `dir`, without following a symlink.
pub fn lstat_at(dir: impl AsFd, name: &str) -> Result<Stat, Errno> {
    fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn fixture() -> std::io::Result<(tempfile::TempDir, PathBuf)> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub"))?;
        std::fs::write(root.join("sub/file.txt"), "inside")?;
        std::fs::write(dir.path().join("secret.txt"), "outside")?;
        symlink("sub/file.txt", root.join("ok-link"))?;
        symlink("../secret.txt", root.join("escape-rel"))?;
        symlink(dir.path().join("secret.txt"), root.join("escape-abs"))?;
        symlink("loop-b", root.join("loop-a"))?;
        symlink("loop-a", root.join("loop-b"))?;
        symlink("..", root.join("sub/up"))?;
        Ok((dir, root))
    }

    #[test]
    fn symlinks_inside_work_and_escapes_are_refused_by_the_kernel() -> std::io::Result<()> {
        let (_dir, root) = fixture()?;
        let fd = open_root(&root)?;
        assert!(open_regular_read(&fd, "ok-link").is_ok());
        assert!(open_regular_read(&fd, "sub/up/sub/file.txt").is_ok(), "a link to .. that stays inside the root works");
        assert_eq!(open_regular_read(&fd, "escape-rel").err(), Some(Errno::XDEV));
        assert_eq!(open_regular_read(&fd, "escape-abs").err(), Some(Errno::XDEV));
        assert_eq!(open_regular_read(&fd, "sub/up/../secret.txt").err(), Some(Errno::XDEV));
        assert_eq!(open_regular_read(&fd, "loop-a").err(), Some(Errno::LOOP));
        assert_eq!(open_regular_read(&fd, "sub").err(), Some(Errno::ISDIR));
        Ok(())
    }

    #[test]
    fn the_fallback_walk_refuses_every_symlink() -> std::io::Result<()> {
        let (_dir, root) = fixture()?;
        let fd = open_root(&root)?;
        assert!(open_without_symlinks(&fd, "sub/file.txt", OFlags::RDONLY, Mode::empty()).is_ok());
        assert_eq!(open_without_symlinks(&fd, "ok-link", OFlags::RDONLY, Mode::empty()).err(), Some(Errno::LOOP));
        assert_eq!(open_without_symlinks(&fd, "sub/up/secret.txt", OFlags::RDONLY, Mode::empty()).err(), Some(Errno::NOTDIR));
        Ok(())
    }

    #[test]
    fn the_userspace_walk_follows_the_same_rules_as_the_kernel() -> std::io::Result<()> {
        let (_dir, root) = fixture()?;
        let fd = open_root(&root)?;
        let read = |rel: &str| open_resolving_in_userspace(&fd, rel, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty());
        assert!(read("ok-link").is_ok());
        assert!(read("sub/up/sub/file.txt").is_ok(), "a link to .. that stays inside the root works");
        assert!(read("sub/../sub/file.txt").is_ok());
        assert_eq!(read("escape-rel").err(), Some(Errno::XDEV));
        assert_eq!(read("escape-abs").err(), Some(Errno::XDEV));
        assert_eq!(read("sub/up/../secret.txt").err(), Some(Errno::XDEV));
        assert_eq!(read("loop-a").err(), Some(Errno::LOOP));
        assert_eq!(read("missing/x").err(), Some(Errno::NOENT));
        let file = read("sub/up/ok-link")?;
        assert_eq!(std::fs::read_to_string(format!("/proc/self/fd/{}", file.as_raw_fd()))?, "inside");
        let dir = open_resolving_in_userspace(&fd, "sub/up", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        assert_eq!(host_path_of(&dir).ok(), std::fs::canonicalize(&root).ok());
        let created =
            open_resolving_in_userspace(&fd, "sub/new.txt", OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC, Mode::from_raw_mode(0o644));
        assert!(created.is_ok() && root.join("sub/new.txt").is_file());
        Ok(())
    }

    #[test]
    fn create_dirs_never_follows_a_link_out() -> std::io::Result<()> {
        let (dir, root) = fixture()?;
        let fd = open_root(&root)?;
        assert!(create_dirs(&fd, "a/b/c", Ownership::default()).is_ok());
        assert!(root.join("a/b/c").is_dir());
        symlink(dir.path(), root.join("out"))?;
        assert_eq!(create_dirs(&fd, "out/evil", Ownership::default()).err(), Some(Errno::XDEV));
        assert!(!dir.path().join("evil").exists());
        Ok(())
    }

    #[test]
    fn fifos_are_not_opened_as_files() -> std::io::Result<()> {
        let (_dir, root) = fixture()?;
        let fd = open_root(&root)?;
        fs::mknodat(&fd, "fifo", FileType::Fifo, Mode::from_raw_mode(0o644), 0)?;
        assert_eq!(open_regular_read(&fd, "fifo").err(), Some(Errno::NXIO));
        Ok(())
    }
}
