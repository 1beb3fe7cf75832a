//! Grep: line-oriented search with ripgrep's crates (`grep-regex`, `grep-searcher`) over a parallel
//! `ignore` walk. Binary files (a NUL in the first 8192 bytes) and files above the size cap are skipped
//! and counted; lines longer than the line cap are skipped; shown lines are cut with "...".

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use globset::{GlobBuilder, GlobMatcher};
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use ignore::WalkState;
use rustix::io::Errno;

use crate::error::{Result, SandboxError};
use crate::files::{looks_binary, walk};
use crate::mask::Masker;
use crate::paths::VirtualPath;
use crate::resolve;
use crate::workspace::Workspace;

/// What to search for.
#[derive(Debug, Clone)]
pub struct GrepRequest {
    pub path: VirtualPath,
    pub pattern: String,
    pub literal: bool,
    pub case_insensitive: bool,
    pub glob: String,
    pub max_results: usize,
    pub max_file_bytes: u64,
    pub max_line_chars: usize,
    pub display_chars: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepMatch {
    pub path: String,
    pub line_number: u32,
    pub line: String,
    pub line_truncated: bool,
}

#[derive(Debug, Clone, Default)]
pub struct GrepOutcome {
    pub matches: Vec<GrepMatch>,
    pub truncated: bool,
    pub files_searched: u32,
    pub files_skipped: u32,
}

/// Matches are collected up to this multiple of the requested count (at least `COLLECT_MIN` more) before
/// the walk stops; sorting then keeps the first `max_results` in path and line order among them.
const COLLECT_FACTOR: usize = 4;
const COLLECT_MIN: usize = 1000;

struct Shared {
    matches: Mutex<Vec<GrepMatch>>,
    count: AtomicUsize,
    limit: usize,
    searched: AtomicU32,
    skipped: AtomicU32,
    stop: AtomicBool,
}

pub fn grep(workspace: &Workspace, request: &GrepRequest, masker: &Masker) -> Result<GrepOutcome> {
    if request.pattern.is_empty() {
        return Err(SandboxError::invalid("pattern", "is required"));
    }
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(request.case_insensitive)
        .fixed_strings(request.literal)
        .line_terminator(Some(b'\n'))
        .build(&request.pattern)
        .map_err(|e| SandboxError::invalid("pattern", format!("invalid regex: {e}")))?;
    let filter = if request.glob.is_empty() {
        None
    } else {
        let glob = GlobBuilder::new(&request.glob)
            .literal_separator(true)
            .build()
            .map_err(|e| SandboxError::invalid("glob", format!("invalid glob: {}", e.kind())))?;
        Some(glob.compile_matcher())
    };
    let shared = Arc::new(Shared {
        matches: Mutex::new(Vec::new()),
        count: AtomicUsize::new(0),
        limit: request.max_results.saturating_mul(COLLECT_FACTOR).max(request.max_results + COLLECT_MIN),
        searched: AtomicU32::new(0),
        skipped: AtomicU32::new(0),
        stop: AtomicBool::new(false),
    });

    // A single file is searched as it is (glob filter and ignore list do not apply to an explicit name).
    let single = match &request.path {
        VirtualPath::In { root, rel } if !rel.is_empty() => {
            let root_fd = workspace.open_root(*root)?;
            match resolve::open_regular_read(&root_fd, rel) {
                Ok(_) => Some((root_fd, rel.clone())),
                Err(Errno::ISDIR) => None,
                Err(e) => return Err(SandboxError::from_errno(&request.path.display(), e)),
            }
        }
        _ => None,
    };
    if let Some((root_fd, rel)) = single {
        search_file(&root_fd, &rel, &request.path.display(), &matcher, request, &shared, masker);
    } else {
        for base in walk::bases(workspace, &request.path)? {
            search_tree(&base, &matcher, filter.as_ref(), request, &shared, masker);
        }
    }

    let mut matches = std::mem::take(&mut *shared.matches.lock().unwrap_or_else(|p| p.into_inner()));
    matches.sort_by(|a, b| a.path.cmp(&b.path).then(a.line_number.cmp(&b.line_number)));
    let truncated = matches.len() > request.max_results;
    matches.truncate(request.max_results);
    Ok(GrepOutcome {
        matches,
        truncated,
        files_searched: shared.searched.load(Ordering::Relaxed),
        files_skipped: shared.skipped.load(Ordering::Relaxed),
    })
}

fn search_tree(
    base: &walk::Base,
    matcher: &RegexMatcher,
    filter: Option<&GlobMatcher>,
    request: &GrepRequest,
    shared: &Arc<Shared>,
    masker: &Masker,
) {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).min(8);
    walk::builder(base, false).threads(threads).build_parallel().run(|| {
        let matcher = matcher.clone();
        let shared = shared.clone();
        Box::new(move |entry| {
            if shared.stop.load(Ordering::Relaxed) {
                return WalkState::Quit;
            }
            let Ok(entry) = entry else { return WalkState::Continue };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                return WalkState::Continue;
            }
            let Some(rel) = walk::relative(base, entry.path()) else { return WalkState::Continue };
            if let Some(filter) = filter {
                let candidate = if request.glob.contains('/') {
                    format!("{}{rel}", base.prefix)
                } else {
                    entry.file_name().to_string_lossy().into_owned()
                };
                if !filter.is_match(&candidate) {
                    return WalkState::Continue;
                }
            }
            search_file(&base.root_fd, &base.rel_in_root(&rel), &base.virtual_path(&rel), &matcher, request, &shared, masker);
            if shared.stop.load(Ordering::Relaxed) { WalkState::Quit } else { WalkState::Continue }
        })
    });
}

/// Searches one file, opened beneath its root (so a file swapped for an escaping link is not read).
fn search_file(
    root_fd: &std::os::fd::OwnedFd,
    rel: &str,
    display: &str,
    matcher: &RegexMatcher,
    request: &GrepRequest,
    shared: &Shared,
    masker: &Masker,
) {
    let Ok((fd, stat)) = resolve::open_regular_read(root_fd, rel) else { return };
    // A file with several hard links may be shared with one outside the sandbox: not read (see files::refuse_hard_links).
    if u64::try_from(stat.st_size).unwrap_or(u64::MAX) > request.max_file_bytes || stat.st_nlink > 1 {
        shared.skipped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut bytes = Vec::with_capacity(usize::try_from(stat.st_size).unwrap_or(0));
    if std::fs::File::from(fd).take(request.max_file_bytes + 1).read_to_end(&mut bytes).is_err() {
        return;
    }
    if looks_binary(&bytes) || bytes.len() as u64 > request.max_file_bytes {
        shared.skipped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    shared.searched.fetch_add(1, Ordering::Relaxed);
    let mut found = Vec::new();
    let mut searcher = SearcherBuilder::new().line_number(true).binary_detection(BinaryDetection::none()).build();
    let per_file_cap = request.max_results + 1;
    let _ = searcher.search_slice(
        matcher,
        &bytes,
        Lossy(|number, line| {
            let line = line.trim_end_matches(['\n', '\r']);
            let chars = line.chars().count();
            if chars > request.max_line_chars {
                return Ok(true);
            }
            let masked = masker.mask(line);
            let (text, cut) = if masked.chars().count() > request.display_chars {
                (format!("{}...", masked.chars().take(request.display_chars).collect::<String>()), true)
            } else {
                (masked.into_owned(), false)
            };
            found.push(GrepMatch {
                path: display.to_owned(),
                line_number: u32::try_from(number).unwrap_or(u32::MAX),
                line: text,
                line_truncated: cut,
            });
            Ok(found.len() < per_file_cap)
        }),
    );
    if found.is_empty() {
        return;
    }
    let total = shared.count.fetch_add(found.len(), Ordering::Relaxed) + found.len();
    shared.matches.lock().unwrap_or_else(|p| p.into_inner()).extend(found);
    if total >= shared.limit {
        shared.stop.store(true, Ordering::Relaxed);
    }
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
        std::fs::create_dir_all(root.join("src"))?;
        std::fs::create_dir_all(root.join("node_modules"))?;
        std::fs::write(root.join("src/a.rs"), "fn main() {}\nlet Needle = 1;\n")?;
        std::fs::write(root.join("b.txt"), format!("needle here\n{}needle\n", "x".repeat(3000)))?;
        std::fs::write(root.join("node_modules/c.txt"), "needle\n")?;
        std::fs::write(root.join("bin.dat"), b"needle\0")?;
        std::fs::write(root.join("long.txt"), format!("needle {}\n", "y".repeat(500)))?;
        Ok((dir, ws))
    }

    fn request(pattern: &str) -> GrepRequest {
        GrepRequest {
            path: VirtualPath::root(Root::Workspace),
            pattern: pattern.to_owned(),
            literal: false,
            case_insensitive: false,
            glob: String::new(),
            max_results: 100,
            max_file_bytes: 1_000_000,
            max_line_chars: 2000,
            display_chars: 200,
        }
    }

    #[test]
    fn finds_lines_skipping_binary_ignored_and_overlong() -> anyhow::Result<()> {
        let (_d, ws) = setup()?;
        let out = grep(&ws, &request("needle"), &Masker::new(Vec::new()))?;
        let found: Vec<(String, u32)> = out.matches.iter().map(|m| (m.path.clone(), m.line_number)).collect();
        assert_eq!(found, [("/mnt/user-data/workspace/b.txt".to_owned(), 1), ("/mnt/user-data/workspace/long.txt".to_owned(), 1)]);
        assert_eq!(out.files_skipped, 1, "the binary file");
        let long = &out.matches[1];
        assert!(long.line_truncated && long.line.ends_with("...") && long.line.chars().count() == 203);
        Ok(())
    }

    #[test]
    fn case_literal_glob_and_single_file() -> anyhow::Result<()> {
        let (_d, ws) = setup()?;
        let masker = Masker::new(Vec::new());
        let ci = GrepRequest { case_insensitive: true, glob: "*.rs".into(), ..request("needle") };
        assert_eq!(grep(&ws, &ci, &masker)?.matches.len(), 1);
        let lit = GrepRequest { literal: true, ..request("main()") };
        assert_eq!(grep(&ws, &lit, &masker)?.matches.len(), 1);
        assert!(matches!(grep(&ws, &request("a("), &masker), Err(SandboxError::InvalidArgument { .. })));
        let one = GrepRequest { path: parse("src/a.rs", "path", None)?, ..request("Needle") };
        assert_eq!(grep(&ws, &one, &masker)?.matches[0].line_number, 2);
        let capped = GrepRequest { max_results: 1, ..request("needle") };
        let out = grep(&ws, &capped, &masker)?;
        assert!(out.truncated && out.matches.len() == 1);
        Ok(())
    }
}
