//! The client half of ACP's `fs/read_text_file` and `fs/write_text_file`, confined to the call's ACP
//! workspace: the one place an ACP agent may change through us. A path may be absolute under the
//! workspace's host directory, absolute under `/mnt/acp-workspace` (the name the lead agent knows it
//! by), or relative to the workspace. Refused: any `..`, anything else absolute, and symbolic links
//! that lead out (each existing component is resolved and checked; a write never follows a link in
//! its final component).

use std::path::{Component, Path, PathBuf};

/// The workspace's path inside the lead agent's sandbox (read-only there).
pub const VIRTUAL: &str = "/mnt/acp-workspace";

/// Why a path was refused or a file could not be read or written (the text goes back to the agent).
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{0} is outside the ACP workspace ({VIRTUAL}); only files inside it can be read or written")]
    Outside(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// The ACP workspace of one call: its canonical host directory.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// `dir` must exist; it is canonicalised so that later prefix checks compare like with like.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        Ok(Self { root: std::fs::canonicalize(dir)? })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path relative to the workspace, lexically: refuses `..` and absolute paths elsewhere.
    fn relative(&self, requested: &Path) -> Result<PathBuf, FsError> {
        let outside = || FsError::Outside(requested.display().to_string());
        let rest = if requested.is_absolute() {
            requested.strip_prefix(&self.root).or_else(|_| requested.strip_prefix(VIRTUAL)).map_err(|_| outside())?
        } else {
            requested
        };
        let mut relative = PathBuf::new();
        for component in rest.components() {
            match component {
                Component::Normal(name) => relative.push(name),
                Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => return Err(outside()),
            }
        }
        Ok(relative)
    }

    /// Whether `resolved` (canonical) is the workspace or inside it.
    fn inside(&self, resolved: &Path) -> bool {
        resolved.starts_with(&self.root)
    }

    /// The host path to read: resolved through every link, and inside.
    pub fn read_path(&self, requested: &Path) -> Result<PathBuf, FsError> {
        let path = self.root.join(self.relative(requested)?);
        let resolved = std::fs::canonicalize(&path).map_err(|source| FsError::Io { path: requested.display().to_string(), source })?;
        if !self.inside(&resolved) {
            return Err(FsError::Outside(requested.display().to_string()));
        }
        Ok(resolved)
    }

    /// Reads a text file, from 1-based `line`, at most `limit` lines (ACP's optional window).
    pub fn read(&self, requested: &Path, line: Option<u32>, limit: Option<u32>) -> Result<String, FsError> {
        let path = self.read_path(requested)?;
        let text = std::fs::read_to_string(&path).map_err(|source| FsError::Io { path: requested.display().to_string(), source })?;
        if line.is_none() && limit.is_none() {
            return Ok(text);
        }
        let skip = line.map_or(0, |l| l.saturating_sub(1) as usize);
        let take = limit.map_or(usize::MAX, |l| l as usize);
        Ok(text.split_inclusive('\n').skip(skip).take(take).collect())
    }

    /// The host path to write: its directories created inside the workspace (each existing one
    /// resolved and checked), its final component not a link.
    pub fn write_path(&self, requested: &Path) -> Result<PathBuf, FsError> {
        let relative = self.relative(requested)?;
        let io = |source| FsError::Io { path: requested.display().to_string(), source };
        let Some(name) = relative.file_name().map(ToOwned::to_owned) else {
            return Err(io(std::io::Error::new(std::io::ErrorKind::InvalidInput, "names the workspace itself, not a file")));
        };
        let mut dir = self.root.clone();
        if let Some(parent) = relative.parent() {
            for component in parent.components() {
                dir.push(component);
                match std::fs::symlink_metadata(&dir) {
                    Ok(meta) if meta.file_type().is_symlink() || meta.is_dir() => {
                        dir = std::fs::canonicalize(&dir).map_err(io)?;
                        if !self.inside(&dir) {
                            return Err(FsError::Outside(requested.display().to_string()));
                        }
                    }
                    Ok(_) => return Err(io(std::io::Error::new(std::io::ErrorKind::NotADirectory, "a parent is a file"))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(&dir).map_err(io)?,
                    Err(e) => return Err(io(e)),
                }
            }
        }
        let path = dir.join(name);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(FsError::Outside(format!("{} (a symbolic link)", requested.display())));
        }
        Ok(path)
    }

    /// Writes a text file (replacing it); answers the path as the lead agent sees it.
    pub fn write(&self, requested: &Path, content: &str) -> Result<String, FsError> {
        let path = self.write_path(requested)?;
        std::fs::write(&path, content).map_err(|source| FsError::Io { path: requested.display().to_string(), source })?;
        Ok(self.virtual_path(&path))
    }

    /// `/mnt/acp-workspace/…` of a host path inside the workspace.
    pub fn virtual_path(&self, host: &Path) -> String {
        match host.strip_prefix(&self.root) {
            Ok(rest) if rest.as_os_str().is_empty() => VIRTUAL.to_owned(),
            Ok(rest) => format!("{VIRTUAL}/{}", rest.display()),
            Err(_) => host.display().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> std::io::Result<(tempfile::TempDir, Workspace, PathBuf)> {
        let dir = tempfile::tempdir()?;
        let ws_dir = dir.path().join("acp-workspace");
        let outside = dir.path().join("secret");
        std::fs::create_dir_all(&ws_dir)?;
        std::fs::create_dir_all(&outside)?;
        std::fs::write(outside.join("key.txt"), "SECRET")?;
        let ws = Workspace::open(&ws_dir)?;
        Ok((dir, ws, outside))
    }

    #[test]
    fn writes_inside_land_and_read_back_under_every_spelling() -> std::io::Result<()> {
        let (_dir, ws, _) = setup()?;
        let shown = ws.write(Path::new("src/main.py"), "print(1)\n").map_err(std::io::Error::other)?;
        assert_eq!(shown, "/mnt/acp-workspace/src/main.py");
        assert!(ws.root().join("src/main.py").is_file());
        let absolute = ws.root().join("src/main.py");
        assert_eq!(ws.read(&absolute, None, None).map_err(std::io::Error::other)?, "print(1)\n");
        assert_eq!(ws.read(Path::new("/mnt/acp-workspace/src/main.py"), None, None).map_err(std::io::Error::other)?, "print(1)\n");
        ws.write(Path::new("./lines.txt"), "a\nb\nc\n").map_err(std::io::Error::other)?;
        assert_eq!(ws.read(Path::new("lines.txt"), Some(2), Some(1)).map_err(std::io::Error::other)?, "b\n");
        Ok(())
    }

    #[test]
    fn escapes_are_refused() -> std::io::Result<()> {
        let (_dir, ws, outside) = setup()?;
        for bad in ["../secret/key.txt", "a/../../secret/x", "/etc/passwd", "/mnt/acp-workspace/../x"] {
            assert!(matches!(ws.write(Path::new(bad), "x"), Err(FsError::Outside(_))), "{bad}");
        }
        assert!(matches!(ws.write(&outside.join("new.txt"), "x"), Err(FsError::Outside(_))));
        assert!(!outside.join("new.txt").exists());
        // A link inside that points out: neither a directory on the way nor the final name is followed.
        std::os::unix::fs::symlink(&outside, ws.root().join("door"))?;
        std::os::unix::fs::symlink(outside.join("key.txt"), ws.root().join("key"))?;
        assert!(matches!(ws.write(Path::new("door/new.txt"), "x"), Err(FsError::Outside(_))));
        assert!(matches!(ws.write(Path::new("key"), "x"), Err(FsError::Outside(_))));
        assert!(matches!(ws.read(Path::new("door/key.txt"), None, None), Err(FsError::Outside(_))));
        assert!(matches!(ws.read(Path::new("key"), None, None), Err(FsError::Outside(_))));
        assert_eq!(std::fs::read_to_string(outside.join("key.txt"))?, "SECRET");
        assert!(!outside.join("new.txt").exists());
        Ok(())
    }
}
