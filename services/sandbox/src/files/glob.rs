//! Glob: paths under a directory matching a pattern (`**` recurses; `**/x` also matches a top-level `x`),
//! via `globset`, sorted, with truncation flagged.

use globset::GlobBuilder;

use crate::error::{Result, SandboxError};
use crate::files::walk;
use crate::paths::VirtualPath;
use crate::workspace::Workspace;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GlobOutcome {
    pub paths: Vec<String>,
    pub truncated: bool,
}

/// Matches are collected up to this multiple of the requested count before the walk stops; sorting then
/// keeps the first `max_results` in path order among them.
const COLLECT_FACTOR: usize = 8;

pub fn glob(workspace: &Workspace, path: &VirtualPath, pattern: &str, include_dirs: bool, max_results: usize) -> Result<GlobOutcome> {
    if pattern.is_empty() {
        return Err(SandboxError::invalid("pattern", "is required (e.g. \"**/*.py\")"));
    }
    if pattern.contains('\0') {
        return Err(SandboxError::invalid("pattern", "contains a NUL byte"));
    }
    let matcher = GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| SandboxError::invalid("pattern", format!("invalid glob: {}", e.kind())))?
        .compile_matcher();
    let limit = max_results.saturating_mul(COLLECT_FACTOR).max(max_results + 1);
    let mut found: Vec<String> = Vec::new();
    'bases: for base in walk::bases(workspace, path)? {
        for entry in walk::builder(&base, false).build() {
            let Ok(entry) = entry else { continue };
            let Some(rel) = walk::relative(&base, entry.path()) else { continue };
            let Some(kind) = entry.file_type() else { continue };
            let wanted = kind.is_file() || (include_dirs && kind.is_dir());
            let candidate = format!("{}{rel}", base.prefix);
            if !wanted || !matcher.is_match(&candidate) || !walk::verify(&base, &rel) {
                continue;
            }
            let mut virtual_path = base.virtual_path(&rel);
            if kind.is_dir() {
                virtual_path.push('/');
            }
            found.push(virtual_path);
            if found.len() >= limit {
                break 'bases;
            }
        }
    }
    found.sort();
    let truncated = found.len() > max_results;
    found.truncate(max_results);
    Ok(GlobOutcome { paths: found, truncated })
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
        let root = ws.host_root(Root::Workspace);
        for f in ["a.py", "src/b.py", "src/deep/c.py", "node_modules/x.py", "readme.md"] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap_or(&root))?;
            std::fs::write(p, "x")?;
        }
        std::os::unix::fs::symlink(dir.path(), root.join("escape"))?;
        Ok((dir, ws))
    }

    #[test]
    fn recursive_patterns_skip_the_ignore_list_and_links() -> anyhow::Result<()> {
        let (_d, ws) = setup()?;
        let ws_path = parse("", "path", Some(VirtualPath::root(Root::Workspace)))?;
        let out = glob(&ws, &ws_path, "**/*.py", false, 100)?;
        assert_eq!(
            out.paths,
            ["/mnt/user-data/workspace/a.py", "/mnt/user-data/workspace/src/b.py", "/mnt/user-data/workspace/src/deep/c.py"]
        );
        assert!(!out.truncated);
        let top = glob(&ws, &ws_path, "*.py", false, 100)?;
        assert_eq!(top.paths, ["/mnt/user-data/workspace/a.py"], "`*` does not cross `/`");
        let dirs = glob(&ws, &ws_path, "**/src", true, 100)?;
        assert_eq!(dirs.paths, ["/mnt/user-data/workspace/src/"]);
        Ok(())
    }

    #[test]
    fn truncation_is_flagged_and_bad_patterns_refused() -> anyhow::Result<()> {
        let (_d, ws) = setup()?;
        let ws_path = VirtualPath::root(Root::Workspace);
        let out = glob(&ws, &ws_path, "**/*", false, 2)?;
        assert_eq!(out.paths.len(), 2);
        assert!(out.truncated);
        assert!(matches!(glob(&ws, &ws_path, "a[", false, 2), Err(SandboxError::InvalidArgument { .. })));
        let all = glob(&ws, &VirtualPath::UserData, "workspace/*.md", false, 10)?;
        assert_eq!(all.paths, ["/mnt/user-data/workspace/readme.md"]);
        Ok(())
    }
}
