//! The Markdown companion of a converted document: `{stem}.md` in the document's directory
//! (`report.pdf` → `report.md`), or `{stem}_{n}.md` when that name is taken — nothing is ever
//! overwritten (the same rule as uploads: names compared after NFC and lower-casing, written to a
//! staging file and renamed into place with `RENAME_NOREPLACE`). The document itself is opened
//! beneath its root like any file tool's, and must be a single-link regular file.

use std::io::Write;

use rustix::fs::AtFlags;

use crate::error::{Result, SandboxError};
use crate::files;
use crate::files::upload::{create_staging, existing_names, rename_unique};
use crate::paths::VirtualPath;
use crate::resolve;
use crate::workspace::Workspace;

/// A companion written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Companion {
    pub filename: String,
    pub virtual_path: String,
    pub size_bytes: u64,
}

/// Opens the document at `path` for reading: (file, size).
pub fn open_source(workspace: &Workspace, path: &VirtualPath) -> Result<(std::fs::File, u64)> {
    let display = path.display();
    let (_, root, rel) = files::open(workspace, path)?;
    if rel.is_empty() {
        return Err(SandboxError::wrong_kind(&display, "is a directory"));
    }
    let (fd, stat) = resolve::open_regular_read(&root, &rel).map_err(|e| match e {
        rustix::io::Errno::ISDIR => SandboxError::wrong_kind(&display, "is a directory"),
        other => SandboxError::from_errno(&display, other),
    })?;
    files::refuse_hard_links(path, &stat)?;
    Ok((std::fs::File::from(fd), stat.st_size as u64))
}

/// Writes `markdown` as the companion of the document at `source` (in a writable root).
pub fn write(workspace: &Workspace, source: &VirtualPath, markdown: &str) -> Result<Companion> {
    let display = source.display();
    let (_, root, rel) = files::open_writable(workspace, source)?;
    let (dir_rel, name) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
    let errno = |e| SandboxError::from_errno(&display, e);
    let dir = if dir_rel.is_empty() { root } else { resolve::open_dir(&root, dir_rel).map_err(errno)? };
    let stem = match name.rsplit_once('.') {
        Some((stem, _)) if !stem.is_empty() => stem,
        _ => name,
    };
    let wanted = format!("{stem}.md");
    let (temp, mut file) = create_staging(&dir, workspace.ownership())?;
    let cleanup = |dir: &std::os::fd::OwnedFd| {
        let _ = rustix::fs::unlinkat(dir, temp.as_str(), AtFlags::empty());
    };
    if let Err(e) = file.write_all(markdown.as_bytes()).and_then(|()| file.flush()) {
        cleanup(&dir);
        return Err(SandboxError::from_io(&display, &e));
    }
    drop(file);
    let mut taken = match existing_names(&dir) {
        Ok(taken) => taken,
        Err(e) => {
            cleanup(&dir);
            return Err(errno(e));
        }
    };
    let filename = match rename_unique(&dir, &temp, &wanted, &mut taken) {
        Ok(filename) => filename,
        Err(e) => {
            cleanup(&dir);
            return Err(errno(e));
        }
    };
    let parent = display.rsplit_once('/').map_or("", |(parent, _)| parent);
    Ok(Companion { virtual_path: format!("{parent}/{filename}"), filename, size_bytes: markdown.len() as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::{Root, parse};
    use crate::resolve::Ownership;
    use crate::workspace::Layout;

    #[test]
    fn the_companion_lands_beside_the_document_under_a_free_name() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let ws = Layout::new(dir.path(), &Default::default(), Ownership::default())?.workspace("u", "t");
        ws.ensure()?;
        let uploads = ws.host_root(Root::Uploads);
        std::fs::write(uploads.join("report.pdf"), "%PDF")?;
        std::fs::write(uploads.join("Report.MD"), "the user's own notes")?;
        let source = parse("/mnt/user-data/uploads/report.pdf", "path", None)?;
        let (_, size) = open_source(&ws, &source)?;
        assert_eq!(size, 4);
        let companion = write(&ws, &source, "# Report\n")?;
        assert_eq!(companion.filename, "report_1.md");
        assert_eq!(companion.virtual_path, "/mnt/user-data/uploads/report_1.md");
        assert_eq!(std::fs::read_to_string(uploads.join("Report.MD"))?, "the user's own notes", "nothing is overwritten");
        assert_eq!(std::fs::read_to_string(uploads.join("report_1.md"))?, "# Report\n");

        std::fs::create_dir_all(ws.host_root(Root::Workspace).join("web"))?;
        std::fs::write(ws.host_root(Root::Workspace).join("web/page.html"), "<p>x</p>")?;
        let nested = write(&ws, &parse("web/page.html", "path", None)?, "x\n")?;
        assert_eq!(nested.virtual_path, "/mnt/user-data/workspace/web/page.md");
        let leftovers: Vec<_> =
            std::fs::read_dir(&uploads)?.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".part")).collect();
        assert!(leftovers.is_empty(), "no staging file is left behind");
        Ok(())
    }
}
