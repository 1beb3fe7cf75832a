//! UploadFiles: files streamed by the client land in /mnt/user-data/uploads, all or nothing.
//!
//! Every file is first written to a staging file `.upload-<random>.part` created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` in the uploads directory (so a link planted under that name makes the
//! create fail instead of writing through it) and checked to be a regular file with a single link. Only
//! when every byte has arrived and matched its declared size (and SHA-256, when given) are the staging
//! files renamed to their final names with `RENAME_NOREPLACE`: an existing entry of that name — file,
//! symlink or hard link — is never replaced; the upload takes the next free `{stem}_{n}{suffix}` instead.
//! Any failure, including the client going away mid-stream, removes every file this call created
//! ([`Upload`]'s `Drop`).

use std::collections::HashSet;
use std::io::Write;
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

use crate::error::{Result, SandboxError};
use crate::files::ignore_list;
use crate::paths::{MAX_NAME_BYTES, Root};
use crate::resolve::Ownership;
use crate::workspace::Workspace;

/// One file announced in the header.
#[derive(Debug, Clone, Default)]
pub struct FileSpec {
    pub filename: String,
    pub size_bytes: u64,
    /// Lower-case hex SHA-256, or empty.
    pub sha256: String,
}

#[derive(Debug, Clone, Copy)]
pub struct UploadLimits {
    pub max_files: u64,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub index: u32,
    pub original_filename: String,
    pub filename: String,
    pub virtual_path: String,
    pub size_bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub index: u32,
    pub original_filename: String,
    pub reason: String,
}

#[derive(Debug, Clone, Default)]
pub struct UploadOutcome {
    pub files: Vec<Stored>,
    pub skipped: Vec<Skipped>,
}

/// The file name reduced to its last component, or why it is unsafe (DeerFlow's `normalize_filename`).
pub fn safe_name(name: &str) -> std::result::Result<String, &'static str> {
    let base = name.rsplit('/').next().unwrap_or_default();
    if base.is_empty() || base == "." || base == ".." {
        return Err("filename is unsafe: empty, \".\" or \"..\" after removing directories");
    }
    if base.contains('\\') {
        return Err("filename is unsafe: contains a backslash");
    }
    if base.contains('\0') {
        return Err("filename is unsafe: contains a NUL byte");
    }
    if base.len() > MAX_NAME_BYTES {
        return Err("filename is unsafe: longer than 255 UTF-8 bytes");
    }
    if ignore_list::is_staging(base) {
        return Err("filename is unsafe: the .upload-*.part pattern is reserved for staging files");
    }
    Ok(base.to_owned())
}

/// How names are compared for collisions: NFC, then lower case (so `Report.PDF` and `report.pdf`, or
/// two encodings of `é`, count as the same name on case-insensitive clients).
fn collision_key(name: &str) -> String {
    name.nfc().collect::<String>().to_lowercase()
}

/// `name` or `{stem}_{n}{suffix}` with the smallest n >= 1 whose key is not in `taken`; the chosen key is
/// added to `taken`.
pub fn claim_unique(name: &str, taken: &mut HashSet<String>) -> String {
    if taken.insert(collision_key(name)) {
        return name.to_owned();
    }
    let (stem, suffix) = match name.rfind('.') {
        Some(dot) if dot > 0 => name.split_at(dot),
        _ => (name, ""),
    };
    (1u64..)
        .map(|n| format!("{stem}_{n}{suffix}"))
        .find(|candidate| candidate.len() <= MAX_NAME_BYTES && taken.insert(collision_key(candidate)))
        .unwrap_or_else(|| name.to_owned())
}

enum Slot {
    Skipped { reason: &'static str, received: u64 },
    Staged { name: String, temp: String, file: std::fs::File, hasher: Sha256, received: u64 },
}

/// An upload in progress. Dropping it before [`Upload::finish`] succeeds removes everything it wrote.
pub struct Upload {
    dir: OwnedFd,
    specs: Vec<FileSpec>,
    slots: Vec<Slot>,
    current: usize,
    /// Staging files not yet renamed into place (removed on drop).
    temps: Vec<String>,
    /// Final names already renamed into place by `finish` (removed again if a later one fails).
    committed: Vec<String>,
    done: bool,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload").field("files", &self.specs.len()).field("current", &self.current).finish_non_exhaustive()
    }
}

impl Upload {
    /// Checks the header against the caps (before any byte is written) and creates the staging files.
    pub fn begin(workspace: &Workspace, specs: Vec<FileSpec>, limits: UploadLimits) -> Result<Self> {
        if specs.is_empty() {
            return Err(SandboxError::invalid("header.files", "must list at least one file"));
        }
        if specs.len() as u64 > limits.max_files {
            return Err(SandboxError::ResourceExhausted(format!(
                "{} files in one upload, above the cap of {} (sandbox.uploads.max_files)",
                specs.len(),
                limits.max_files
            )));
        }
        let mut total: u64 = 0;
        for (i, spec) in specs.iter().enumerate() {
            if spec.size_bytes > limits.max_file_bytes {
                return Err(SandboxError::ResourceExhausted(format!(
                    "file {i} ({}) is {} bytes, above the per-file cap of {} bytes (sandbox.uploads.max_file_bytes)",
                    crate::error::echo(&spec.filename),
                    spec.size_bytes,
                    limits.max_file_bytes
                )));
            }
            total = total.saturating_add(spec.size_bytes);
            let hex_ok = spec.sha256.len() == 64 && spec.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !spec.sha256.is_empty() && !hex_ok {
                return Err(SandboxError::invalid(format!("header.files[{i}].sha256"), "must be 64 lower-case hex digits (or empty)"));
            }
        }
        if total > limits.max_total_bytes {
            return Err(SandboxError::ResourceExhausted(format!(
                "the upload totals {total} bytes, above the cap of {} bytes (sandbox.uploads.max_total_bytes)",
                limits.max_total_bytes
            )));
        }
        let dir = workspace.open_root(Root::Uploads)?;
        let mut upload = Self { dir, specs, slots: Vec::new(), current: 0, temps: Vec::new(), committed: Vec::new(), done: false };
        for i in 0..upload.specs.len() {
            let slot = match safe_name(&upload.specs[i].filename) {
                Err(reason) => Slot::Skipped { reason, received: 0 },
                Ok(name) => {
                    let (temp, file) = create_staging(&upload.dir, workspace.ownership())?;
                    upload.temps.push(temp.clone());
                    Slot::Staged { name, temp, file, hasher: Sha256::new(), received: 0 }
                }
            };
            upload.slots.push(slot);
        }
        Ok(upload)
    }

    /// Appends bytes to file `index`. Indexes never go back; moving on requires the previous file complete.
    pub fn write(&mut self, index: u32, data: &[u8]) -> Result<()> {
        let index = usize::try_from(index).unwrap_or(usize::MAX);
        if index >= self.slots.len() {
            return Err(SandboxError::invalid(
                "chunk.file_index",
                format!("{index} is not a file of the header (it lists {})", self.slots.len()),
            ));
        }
        if index < self.current {
            return Err(SandboxError::invalid(
                "chunk.file_index",
                format!("went back from {} to {index}; send each file's bytes in header order", self.current),
            ));
        }
        while self.current < index {
            self.check_complete(self.current)?;
            self.current += 1;
        }
        let declared = self.specs[index].size_bytes;
        let name = self.specs[index].filename.clone();
        let received = match &mut self.slots[index] {
            Slot::Skipped { received, .. } => received,
            Slot::Staged { file, hasher, received, .. } => {
                if *received + data.len() as u64 <= declared {
                    // Small synchronous writes to the page cache; chunks are bounded by the message size.
                    file.write_all(data).map_err(|e| SandboxError::from_io("/mnt/user-data/uploads", &e))?;
                    hasher.update(data);
                }
                received
            }
        };
        *received += data.len() as u64;
        if *received > declared {
            return Err(SandboxError::invalid(
                format!("file {index} ({})", crate::error::echo(&name)),
                format!("received more than the declared {declared} bytes"),
            ));
        }
        Ok(())
    }

    fn check_complete(&self, index: usize) -> Result<()> {
        let received = match &self.slots[index] {
            Slot::Skipped { received, .. } | Slot::Staged { received, .. } => *received,
        };
        let declared = self.specs[index].size_bytes;
        if received != declared {
            return Err(SandboxError::invalid(
                format!("file {index} ({})", crate::error::echo(&self.specs[index].filename)),
                format!("received {received} bytes, but the header declared {declared}"),
            ));
        }
        Ok(())
    }

    /// Verifies every file and moves them into place under unique names.
    pub fn finish(mut self) -> Result<UploadOutcome> {
        for i in 0..self.slots.len() {
            self.check_complete(i)?;
        }
        let mut taken = existing_names(&self.dir).map_err(|e| SandboxError::from_errno("/mnt/user-data/uploads", e))?;
        let mut outcome = UploadOutcome::default();
        let slots = std::mem::take(&mut self.slots);
        for (i, slot) in slots.into_iter().enumerate() {
            let spec = self.specs[i].clone();
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            match slot {
                Slot::Skipped { reason, .. } => {
                    outcome.skipped.push(Skipped { index, original_filename: spec.filename, reason: reason.to_owned() })
                }
                Slot::Staged { name, temp, file, hasher, received } => {
                    drop(file);
                    let digest = hex::encode(hasher.finalize());
                    // Returning an error drops `self`, which removes the staging files and what was
                    // already renamed into place.
                    if !spec.sha256.is_empty() && spec.sha256 != digest {
                        return Err(SandboxError::invalid(
                            format!("header.files[{i}].sha256"),
                            format!("{} does not match the received content (sha256 {digest})", crate::error::echo(&spec.filename)),
                        ));
                    }
                    let stored =
                        self.commit(&temp, &name, &mut taken).map_err(|e| SandboxError::from_errno("/mnt/user-data/uploads", e))?;
                    self.temps.retain(|t| t != &temp);
                    outcome.files.push(Stored {
                        index,
                        original_filename: spec.filename,
                        virtual_path: format!("{}/{stored}", Root::Uploads.virtual_path()),
                        filename: stored,
                        size_bytes: received,
                        sha256: digest,
                    });
                }
            }
        }
        self.done = true;
        Ok(outcome)
    }

    /// Renames a staging file to the first free variant of `name`, never replacing anything.
    fn commit(&mut self, temp: &str, name: &str, taken: &mut HashSet<String>) -> std::result::Result<String, Errno> {
        let stored = rename_unique(&self.dir, temp, name, taken)?;
        self.committed.push(stored.clone());
        Ok(stored)
    }
}

/// Renames `temp` in `dir` to the first free variant of `name` (see [`claim_unique`]), never
/// replacing an existing entry, and returns the name it got.
pub(crate) fn rename_unique(dir: &OwnedFd, temp: &str, name: &str, taken: &mut HashSet<String>) -> std::result::Result<String, Errno> {
    for _ in 0..1000 {
        let candidate = claim_unique(name, taken);
        let renamed = match rustix::fs::renameat_with(dir, temp, dir, candidate.as_str(), RenameFlags::NOREPLACE) {
            // Filesystems without RENAME_NOREPLACE: link(2) also refuses an existing name.
            Err(Errno::INVAL) | Err(Errno::NOSYS) => rustix::fs::linkat(dir, temp, dir, candidate.as_str(), AtFlags::empty())
                .and_then(|()| rustix::fs::unlinkat(dir, temp, AtFlags::empty())),
            other => other,
        };
        match renamed {
            Ok(()) => return Ok(candidate),
            // Created by someone else since the directory was listed: try the next name.
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::EXIST)
}

impl Drop for Upload {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.slots.clear();
        for name in self.temps.iter().chain(&self.committed) {
            let _ = rustix::fs::unlinkat(&self.dir, name.as_str(), AtFlags::empty());
        }
        if !self.temps.is_empty() || !self.committed.is_empty() {
            tracing::debug!(committed = self.committed.len(), "upload rolled back");
        }
    }
}

pub(crate) fn create_staging(dir: &OwnedFd, owner: Ownership) -> Result<(String, std::fs::File)> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for _ in 0..16 {
        let temp = format!(".upload-{:016x}.part", fastrand::u64(..));
        match rustix::fs::openat(dir, temp.as_str(), flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => {
                let cleanup = |e| {
                    let _ = rustix::fs::unlinkat(dir, temp.as_str(), AtFlags::empty());
                    SandboxError::from_errno("/mnt/user-data/uploads", e)
                };
                let stat = rustix::fs::fstat(&fd).map_err(cleanup)?;
                if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile || stat.st_nlink != 1 {
                    let _ = rustix::fs::unlinkat(dir, temp.as_str(), AtFlags::empty());
                    return Err(SandboxError::Internal("a fresh staging file is not a single-link regular file".to_owned()));
                }
                owner.apply_fd(&fd).map_err(cleanup)?;
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o644)).map_err(cleanup)?;
                return Ok((temp, std::fs::File::from(fd)));
            }
            // A name taken (or a link planted on it): draw another.
            Err(Errno::EXIST) | Err(Errno::LOOP) => continue,
            Err(e) => return Err(SandboxError::from_errno("/mnt/user-data/uploads", e)),
        }
    }
    Err(SandboxError::Unavailable("could not create a staging file in /mnt/user-data/uploads".to_owned()))
}

pub(crate) fn existing_names(dir: &OwnedFd) -> std::result::Result<HashSet<String>, Errno> {
    let listing = rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let mut reader = Dir::read_from(&listing)?;
    let mut names = HashSet::new();
    while let Some(entry) = reader.read() {
        let entry = entry?;
        names.insert(collision_key(&entry.file_name().to_string_lossy()));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Ownership;
    use crate::workspace::Layout;

    const LIMITS: UploadLimits = UploadLimits { max_files: 10, max_file_bytes: 1000, max_total_bytes: 1500 };

    fn setup() -> anyhow::Result<(tempfile::TempDir, Workspace)> {
        let dir = tempfile::tempdir()?;
        let ws = Layout::new(dir.path(), &Default::default(), Ownership::default())?.workspace("u", "t");
        ws.ensure()?;
        Ok((dir, ws))
    }

    fn spec(name: &str, size: u64) -> FileSpec {
        FileSpec { filename: name.to_owned(), size_bytes: size, sha256: String::new() }
    }

    fn names(ws: &Workspace) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(ws.host_root(Root::Uploads))
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn names_are_reduced_and_made_unique() {
        assert_eq!(safe_name("../../etc/passwd"), Ok("passwd".to_owned()));
        assert_eq!(safe_name("a/b/c.txt"), Ok("c.txt".to_owned()));
        for bad in ["", "dir/", "..", "a/..", "x\\y", &"n".repeat(256), ".upload-1.part"] {
            assert!(safe_name(bad).is_err(), "{bad:?}");
        }
        let mut taken = HashSet::from([collision_key("Report.pdf")]);
        assert_eq!(claim_unique("report.PDF", &mut taken), "report_1.PDF");
        assert_eq!(claim_unique("report.pdf", &mut taken), "report_2.pdf");
        assert_eq!(claim_unique(".bashrc", &mut taken), ".bashrc");
        assert_eq!(claim_unique(".bashrc", &mut taken), ".bashrc_1");
    }

    #[test]
    fn a_complete_upload_lands_under_unique_names() -> anyhow::Result<()> {
        let (_d, ws) = setup()?;
        std::fs::write(ws.host_root(Root::Uploads).join("a.txt"), "old")?;
        let mut up = Upload::begin(&ws, vec![spec("a.txt", 3), spec("../x/a.txt", 2), spec("..", 0)], LIMITS)?;
        up.write(0, b"new")?;
        up.write(1, b"hi")?;
        let out = up.finish()?;
        let stored: Vec<&str> = out.files.iter().map(|f| f.filename.as_str()).collect();
        assert_eq!(stored, ["a_1.txt", "a_2.txt"]);
        assert_eq!(out.skipped.len(), 1);
        assert_eq!(names(&ws), ["a.txt", "a_1.txt", "a_2.txt"]);
        assert_eq!(std::fs::read_to_string(ws.host_root(Root::Uploads).join("a.txt"))?, "old", "nothing is overwritten");
        Ok(())
    }

    #[test]
    fn caps_are_checked_before_any_byte_and_failures_leave_nothing() -> anyhow::Result<()> {
        let (_d, ws) = setup()?;
        assert!(matches!(Upload::begin(&ws, vec![spec("a", 1001)], LIMITS), Err(SandboxError::ResourceExhausted(_))));
        assert!(matches!(Upload::begin(&ws, vec![spec("a", 900), spec("b", 900)], LIMITS), Err(SandboxError::ResourceExhausted(_))));
        assert!(matches!(
            Upload::begin(&ws, (0..11).map(|i| spec(&format!("f{i}"), 1)).collect(), LIMITS),
            Err(SandboxError::ResourceExhausted(_))
        ));
        let mut up = Upload::begin(&ws, vec![spec("a", 2), spec("b", 2)], LIMITS)?;
        up.write(0, b"ab")?;
        assert!(up.write(1, b"abc").is_err(), "more than declared");
        drop(up);
        assert!(names(&ws).is_empty(), "{:?}", names(&ws));
        let mut up = Upload::begin(&ws, vec![FileSpec { sha256: "0".repeat(64), ..spec("a", 1) }], LIMITS)?;
        up.write(0, b"x")?;
        assert!(matches!(up.finish(), Err(SandboxError::InvalidArgument { .. })));
        assert!(names(&ws).is_empty(), "{:?}", names(&ws));
        let mut up = Upload::begin(&ws, vec![spec("a", 2), spec("b", 1)], LIMITS)?;
        up.write(0, b"a")?;
        assert!(up.write(1, b"b").is_err(), "file 0 is short");
        Ok(())
    }
}
