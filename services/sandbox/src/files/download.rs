//! DownloadFile: opens a file under /mnt/user-data for streaming. The size cap is checked against the
//! open file before a byte is sent; the API layer streams the chunks and the trailer's SHA-256.

use std::time::SystemTime;

use crate::error::{Result, SandboxError};
use crate::files::{self, mime};
use crate::paths::{Root, VirtualPath};
use crate::resolve;
use crate::workspace::Workspace;

#[derive(Debug)]
pub struct Download {
    pub path: String,
    pub size_bytes: u64,
    pub mime_type: &'static str,
    pub modified_at: SystemTime,
    pub file: std::fs::File,
}

pub fn open(workspace: &Workspace, path: &VirtualPath, max_bytes: u64) -> Result<Download> {
    let display = path.display();
    if path == &VirtualPath::UserData {
        return Err(SandboxError::wrong_kind(&display, "is a directory"));
    }
    let (root, root_fd, rel) = files::open(workspace, path)?;
    if root == Root::Skills {
        return Err(SandboxError::denied(&display, "only files under /mnt/user-data can be downloaded"));
    }
    let (fd, stat) = resolve::open_regular_read(&root_fd, &rel).map_err(|e| SandboxError::from_errno(&display, e))?;
    files::refuse_hard_links(path, &stat)?;
    let size = u64::try_from(stat.st_size).unwrap_or(u64::MAX);
    if size > max_bytes {
        return Err(SandboxError::ResourceExhausted(format!(
            "{display} is {size} bytes, above the download cap of {max_bytes} bytes (sandbox.files.download_max_bytes)"
        )));
    }
    let name = rel.rsplit('/').next().unwrap_or_default();
    Ok(Download {
        path: display,
        size_bytes: size,
        mime_type: mime::guess(name).unwrap_or("application/octet-stream"),
        modified_at: files::modified(&stat),
        file: std::fs::File::from(fd),
    })
}
