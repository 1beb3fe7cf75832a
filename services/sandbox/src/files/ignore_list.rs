//! DeerFlow's search ignore list (`sandbox/search.py::IGNORE_PATTERNS`), applied to entry names by
//! ListDir, Glob and Grep: VCS directories, dependency and build trees, caches, editor droppings, logs and
//! upload staging files.

use std::sync::OnceLock;

use globset::{Glob, GlobSet, GlobSetBuilder};

const PATTERNS: &[&str] = &[
    ".git",
    ".svn",
    ".hg",
    ".bzr",
    "node_modules",
    "__pycache__",
    ".venv",
    "venv",
    ".env",
    "env",
    ".tox",
    ".nox",
    ".eggs",
    "*.egg-info",
    "site-packages",
    "dist",
    "build",
    ".next",
    ".nuxt",
    ".output",
    ".turbo",
    "target",
    "out",
    ".idea",
    ".vscode",
    "*.swp",
    "*.swo",
    "*~",
    ".project",
    ".classpath",
    ".settings",
    ".DS_Store",
    "Thumbs.db",
    "desktop.ini",
    "*.lnk",
    "*.log",
    "*.tmp",
    "*.temp",
    ".upload-*.part",
    "*.bak",
    "*.cache",
    ".cache",
    "logs",
    ".coverage",
    "coverage",
    ".nyc_output",
    "htmlcov",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
];

fn set() -> &'static GlobSet {
    static SET: OnceLock<GlobSet> = OnceLock::new();
    SET.get_or_init(|| {
        let mut builder = GlobSetBuilder::new();
        for pattern in PATTERNS {
            // The patterns are constants that compile; a failure would be a typo caught by the tests.
            if let Ok(glob) = Glob::new(pattern) {
                builder.add(glob);
            }
        }
        builder.build().unwrap_or_else(|_| GlobSet::empty())
    })
}

/// Whether an entry named `name` is on the ignore list.
pub fn is_ignored(name: &str) -> bool {
    set().is_match(name)
}

/// Whether `name` is an upload staging file (never shown, never snapshotted).
pub fn is_staging(name: &str) -> bool {
    name.starts_with(".upload-") && name.ends_with(".part")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_compiles() {
        for pattern in PATTERNS {
            assert!(Glob::new(pattern).is_ok(), "{pattern}");
        }
        assert_eq!(set().len(), PATTERNS.len());
    }

    #[test]
    fn names_are_matched_whole() {
        for name in [".git", "node_modules", "x.log", "pkg.egg-info", "file~", ".upload-abc.part", "target"] {
            assert!(is_ignored(name), "{name}");
        }
        for name in ["src", "main.rs", "gitignore", "targets", "log.txt", "my_env"] {
            assert!(!is_ignored(name), "{name}");
        }
    }
}
