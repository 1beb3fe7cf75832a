//! SnapshotOutputs: every regular file under /mnt/user-data/outputs with its size and SHA-256, in one
//! pass, for the runs service's delivery receipts. Links are not followed; staging files are skipped.

use std::io::Read;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::error::{Result, SandboxError};
use crate::files::{self, ignore_list, mime, walk};
use crate::paths::{Root, VirtualPath};
use crate::resolve;
use crate::workspace::Workspace;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFile {
    pub path: String,
    pub size_bytes: u64,
    pub sha256: String,
    pub modified_at: SystemTime,
    pub mime_type: Option<&'static str>,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub files: Vec<OutputFile>,
    pub total_bytes: u64,
    pub taken_at: SystemTime,
}

pub fn snapshot(workspace: &Workspace, max_files: usize) -> Result<Snapshot> {
    let taken_at = SystemTime::now();
    let outputs = VirtualPath::root(Root::Outputs);
    let mut files_found = Vec::new();
    for base in walk::bases(workspace, &outputs)? {
        for entry in walk::builder(&base, true).build() {
            let Ok(entry) = entry else { continue };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy();
            if ignore_list::is_staging(&name) {
                continue;
            }
            let Some(rel) = walk::relative(&base, entry.path()) else { continue };
            if files_found.len() >= max_files {
                return Err(SandboxError::ResourceExhausted(format!(
                    "/mnt/user-data/outputs holds more than {max_files} files (sandbox.files.snapshot_max_files)\nhint: archive or remove intermediate files"
                )));
            }
            let display = base.virtual_path(&rel);
            // Opened beneath the root: a file swapped for a link since the walk saw it is not read.
            let Ok((fd, stat)) = resolve::open_regular_read(&*base.root_fd, &base.rel_in_root(&rel)) else { continue };
            // A file with several hard links may be shared with one outside the sandbox: not read.
            if stat.st_nlink > 1 {
                continue;
            }
            let mut hasher = Sha256::new();
            let mut file = std::fs::File::from(fd);
            let mut buffer = vec![0u8; 64 * 1024];
            let mut size = 0u64;
            loop {
                let n = file.read(&mut buffer).map_err(|e| SandboxError::from_io(&display, &e))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buffer[..n]);
                size += n as u64;
            }
            files_found.push(OutputFile {
                mime_type: mime::guess(&name),
                path: display,
                size_bytes: size,
                sha256: hex::encode(hasher.finalize()),
                modified_at: files::modified(&stat),
            });
        }
    }
    files_found.sort_by(|a, b| a.path.cmp(&b.path));
    let total_bytes = files_found.iter().map(|f| f.size_bytes).sum();
    Ok(Snapshot { files: files_found, total_bytes, taken_at })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolve::Ownership;
    use crate::workspace::Layout;

    #[test]
    fn hashes_regular_files_only() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let ws = Layout::new(dir.path(), &Default::default(), Ownership::default())?.workspace("u", "t");
        ws.ensure()?;
        let out = ws.host_root(Root::Outputs);
        std::fs::create_dir_all(out.join("sub"))?;
        std::fs::write(out.join("report.md"), "hello")?;
        std::fs::write(out.join("sub/data.csv"), "")?;
        std::fs::write(out.join(".upload-x.part"), "staging")?;
        std::fs::write(dir.path().join("secret"), "s")?;
        std::os::unix::fs::symlink(dir.path().join("secret"), out.join("link"))?;
        let snap = snapshot(&ws, 100)?;
        let paths: Vec<&str> = snap.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["/mnt/user-data/outputs/report.md", "/mnt/user-data/outputs/sub/data.csv"]);
        assert_eq!(snap.files[0].sha256, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
        assert_eq!(snap.files[0].mime_type, Some("text/markdown"));
        assert_eq!(snap.total_bytes, 5);
        assert!(matches!(snapshot(&ws, 1), Err(SandboxError::ResourceExhausted(_))));
        Ok(())
    }
}
