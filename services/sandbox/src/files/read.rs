//! ReadFile: a UTF-8 text file, or a 1-based inclusive line range of it, head-truncated at a character
//! cap with a marker that tells the agent how to read the rest. One streaming pass: memory stays bounded
//! by the cap whatever the file's size.

use std::io::{BufRead, BufReader, Read};
use std::time::SystemTime;

use crate::error::{Result, SandboxError};
use crate::files::{self, looks_binary};
use crate::mask::Masker;
use crate::paths::VirtualPath;
use crate::resolve;
use crate::workspace::Workspace;

/// Largest piece of a line held in memory at once.
const SEGMENT: u64 = 1 << 20;

/// What to read.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    pub path: VirtualPath,
    /// 0 = from line 1.
    pub start_line: u32,
    /// 0 = to the end.
    pub end_line: u32,
    /// Effective cap (already clamped by the caller).
    pub max_chars: u64,
}

/// What was read.
#[derive(Debug, Clone, Default)]
pub struct ReadOutcome {
    pub path: String,
    pub content: String,
    pub start_line: u32,
    pub end_line: u32,
    pub total_lines: u32,
    pub size_bytes: u64,
    pub truncated: bool,
    pub total_chars: u64,
    pub shown_chars: u64,
    pub truncation_marker: String,
    pub binary: bool,
    pub modified_at: Option<SystemTime>,
}

/// The marker appended to head-truncated content (DeerFlow's wording).
pub fn truncation_marker(kept: u64, total: u64) -> String {
    format!("\n... [truncated: showing first {kept} of {total} chars. Use start_line/end_line to read a specific range] ...")
}

pub fn read(workspace: &Workspace, request: &ReadRequest, masker: &Masker) -> Result<ReadOutcome> {
    if request.start_line > 0 && request.end_line > 0 && request.start_line > request.end_line {
        return Err(SandboxError::invalid(
            "end_line",
            format!(
                "{} is before start_line {}; give end_line >= start_line (or 0 for the end of the file)",
                request.end_line, request.start_line
            ),
        ));
    }
    let display = request.path.display();
    if request.path == VirtualPath::UserData {
        return Err(SandboxError::wrong_kind(&display, "is a directory"));
    }
    let (_, root, rel) = files::open(workspace, &request.path)?;
    let (fd, stat) = resolve::open_regular_read(&root, &rel).map_err(|e| SandboxError::from_errno(&display, e))?;
    files::refuse_hard_links(&request.path, &stat)?;
    let mut outcome = ReadOutcome {
        path: display.clone(),
        size_bytes: u64::try_from(stat.st_size).unwrap_or(0),
        modified_at: Some(files::modified(&stat)),
        ..ReadOutcome::default()
    };

    let mut file = std::fs::File::from(fd);
    let mut head = Vec::with_capacity(8192);
    (&mut file).take(8192).read_to_end(&mut head).map_err(|e| SandboxError::from_io(&display, &e))?;
    if looks_binary(&head) {
        outcome.binary = true;
        return Ok(outcome);
    }
    // The first block was read for the binary check; read it again from memory, then the rest.
    let mut reader = BufReader::with_capacity(64 * 1024, std::io::Cursor::new(head).chain(file));

    let first = request.start_line.max(1);
    let last = if request.end_line == 0 { u32::MAX } else { request.end_line };
    let max_chars = request.max_chars;
    let mut content = String::new();
    // A line is read in segments of at most SEGMENT bytes, so one enormous line cannot make the service
    // hold the whole file in memory; `pending` keeps a UTF-8 sequence cut by a segment boundary.
    let mut segment = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut number: u32 = 0;
    let mut at_line_start = true;
    loop {
        segment.clear();
        segment.append(&mut pending);
        let read = (&mut reader).take(SEGMENT).read_until(b'\n', &mut segment).map_err(|e| SandboxError::from_io(&display, &e))?;
        if segment.is_empty() {
            break;
        }
        let ends_line = segment.last() == Some(&b'\n');
        let text = match std::str::from_utf8(&segment) {
            Ok(text) => text,
            // Cut inside a character at the segment's end: keep the tail for the next segment.
            Err(e) if e.error_len().is_none() && read > 0 && !ends_line => {
                pending = segment.split_off(e.valid_up_to());
                std::str::from_utf8(&segment).unwrap_or_default()
            }
            Err(_) => return Ok(ReadOutcome { binary: true, ..outcome }),
        };
        if at_line_start {
            number = number.saturating_add(1);
        }
        at_line_start = ends_line;
        if !(first..=last).contains(&number) {
            continue;
        }
        let chars = text.chars().count() as u64;
        if outcome.start_line == 0 {
            outcome.start_line = number;
        }
        let room = max_chars.saturating_sub(outcome.shown_chars);
        if room > 0 {
            outcome.end_line = number;
            if chars <= room {
                content.push_str(text);
                outcome.shown_chars += chars;
            } else {
                content.extend(text.chars().take(usize::try_from(room).unwrap_or(usize::MAX)));
                outcome.shown_chars += room;
            }
        }
        outcome.total_chars += chars;
    }
    outcome.total_lines = number;
    if outcome.total_chars > outcome.shown_chars {
        outcome.truncated = true;
        outcome.truncation_marker = truncation_marker(outcome.shown_chars, outcome.total_chars);
        content.push_str(&outcome.truncation_marker);
    }
    outcome.content = masker.mask(&content).into_owned();
    if outcome.content.is_empty() {
        outcome.start_line = 0;
        outcome.end_line = 0;
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::{Root, parse};
    use crate::resolve::Ownership;
    use crate::workspace::Layout;

    fn setup(content: &[u8]) -> anyhow::Result<(tempfile::TempDir, Workspace)> {
        let dir = tempfile::tempdir()?;
        let ws = Layout::new(dir.path(), &Default::default(), Ownership::default())?.workspace("u", "t");
        ws.ensure()?;
        std::fs::write(ws.host_root(Root::Workspace).join("f.txt"), content)?;
        Ok((dir, ws))
    }

    fn req(start: u32, end: u32, max: u64) -> anyhow::Result<ReadRequest> {
        Ok(ReadRequest { path: parse("f.txt", "path", None)?, start_line: start, end_line: end, max_chars: max })
    }

    #[test]
    fn whole_file_and_line_ranges() -> anyhow::Result<()> {
        let (_d, ws) = setup(b"one\ntwo\nthree\n")?;
        let m = Masker::new(Vec::new());
        let all = read(&ws, &req(0, 0, 1000)?, &m)?;
        assert_eq!((all.content.as_str(), all.total_lines, all.start_line, all.end_line), ("one\ntwo\nthree\n", 3, 1, 3));
        let mid = read(&ws, &req(2, 2, 1000)?, &m)?;
        assert_eq!((mid.content.as_str(), mid.start_line, mid.end_line), ("two\n", 2, 2));
        let past = read(&ws, &req(9, 0, 1000)?, &m)?;
        assert_eq!((past.content.as_str(), past.start_line, past.total_lines), ("", 0, 3));
        assert!(matches!(read(&ws, &req(3, 2, 1000)?, &m), Err(SandboxError::InvalidArgument { .. })));
        Ok(())
    }

    #[test]
    fn long_content_is_head_truncated_with_the_marker() -> anyhow::Result<()> {
        let body: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        let (_d, ws) = setup(body.as_bytes())?;
        let out = read(&ws, &req(0, 0, 100)?, &Masker::new(Vec::new()))?;
        assert!(out.truncated);
        assert_eq!(out.shown_chars, 100);
        assert_eq!(out.total_chars, body.chars().count() as u64);
        assert!(out.content.ends_with("Use start_line/end_line to read a specific range] ..."));
        assert_eq!(out.content.len(), 100 + out.truncation_marker.len());
        Ok(())
    }

    #[test]
    fn lines_longer_than_the_first_block_are_counted_once() -> anyhow::Result<()> {
        let long = "x".repeat(20_000);
        let (_d, ws) = setup(format!("{long}\nshort\n").as_bytes())?;
        let out = read(&ws, &req(2, 2, 1000)?, &Masker::new(Vec::new()))?;
        assert_eq!((out.content.as_str(), out.total_lines), ("short\n", 2));
        Ok(())
    }

    #[test]
    fn binary_files_are_detected() -> anyhow::Result<()> {
        let (_d, ws) = setup(b"abc\0def")?;
        let out = read(&ws, &req(0, 0, 1000)?, &Masker::new(Vec::new()))?;
        assert!(out.binary && out.content.is_empty());
        let (_d, ws) = setup(&[b'a', 0xff, 0xfe, b'\n'])?;
        assert!(read(&ws, &req(0, 0, 1000)?, &Masker::new(Vec::new()))?.binary, "invalid UTF-8 is binary too");
        Ok(())
    }
}
