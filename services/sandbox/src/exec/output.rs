//! Shaping a command's output on its way to the client, in order:
//!
//! 1. per-stream byte cap: the first `max_output_bytes` of stdout (and of stderr) are kept, the rest is
//!    counted and discarded, and a marker says so at the end;
//! 2. masking ([`StreamMasker`]): host paths → virtual paths, injected secrets → `[redacted]`, also when a
//!    needle is split across two reads;
//! 3. UTF-8 decoding that never splits a character across chunks (invalid bytes become U+FFFD);
//! 4. middle truncation of the whole output (both streams together): the first half of the character
//!    budget streams live, the last half is held in a window that slides to the end, and when the
//!    command ends the marker `... [middle truncated: N chars skipped] ...` and the held tail follow.

use std::collections::VecDeque;

use crate::mask::{Masker, StreamMasker};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

/// The middle-truncation marker (DeerFlow's wording).
pub fn middle_marker(skipped: u64) -> String {
    format!("\n... [middle truncated: {skipped} chars skipped] ...\n")
}

/// The marker after a stream hit its byte cap (DeerFlow's wording).
pub fn capped_marker(kept: u64, total: u64) -> String {
    format!("\n... [output truncated after {kept} of {total} bytes; remaining output discarded] ...\n")
}

#[derive(Debug)]
struct StreamState {
    total: u64,
    kept: u64,
    masker: StreamMasker,
    carry: Vec<u8>,
}

/// Totals reported in the exit message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// A stream went over its byte cap.
    pub truncated: bool,
    /// Characters cut out of the middle.
    pub middle_skipped: u64,
}

#[derive(Debug)]
pub struct OutputShaper {
    streams: [StreamState; 2],
    cap_bytes: u64,
    head_budget: u64,
    tail_budget: u64,
    middle_enabled: bool,
    head_used: u64,
    tail: VecDeque<(Stream, String)>,
    tail_chars: u64,
    skipped: u64,
}

impl OutputShaper {
    /// `max_chars` 0 disables middle truncation.
    pub fn new(masker: Masker, cap_bytes: u64, max_chars: u64) -> Self {
        let state = || StreamState { total: 0, kept: 0, masker: StreamMasker::new(masker.clone()), carry: Vec::new() };
        Self {
            streams: [state(), state()],
            cap_bytes,
            head_budget: max_chars / 2,
            tail_budget: max_chars - max_chars / 2,
            middle_enabled: max_chars > 0,
            head_used: 0,
            tail: VecDeque::new(),
            tail_chars: 0,
            skipped: 0,
        }
    }

    /// Feeds raw bytes read from `stream`; returns what may be sent now.
    pub fn push(&mut self, stream: Stream, bytes: &[u8]) -> Vec<(Stream, String)> {
        let state = &mut self.streams[stream.index()];
        state.total += bytes.len() as u64;
        let room = self.cap_bytes.saturating_sub(state.kept);
        let take = usize::try_from(room).unwrap_or(usize::MAX).min(bytes.len());
        if take == 0 {
            return Vec::new();
        }
        state.kept += take as u64;
        let masked = state.masker.push(&bytes[..take]);
        let text = decode(&mut state.carry, masked, false);
        self.route(stream, text)
    }

    /// Ends both streams: flushes held bytes, then the middle marker and the tail, then cap markers.
    pub fn finish(&mut self) -> Vec<(Stream, String)> {
        let mut out = Vec::new();
        for stream in [Stream::Stdout, Stream::Stderr] {
            let state = &mut self.streams[stream.index()];
            let rest = state.masker.finish();
            let text = decode(&mut state.carry, rest, true);
            out.extend(self.route(stream, text));
        }
        if self.skipped > 0 {
            let first = self.tail.front().map_or(Stream::Stdout, |(s, _)| *s);
            out.push((first, middle_marker(self.skipped)));
        }
        out.extend(self.tail.drain(..));
        for stream in [Stream::Stdout, Stream::Stderr] {
            let state = &self.streams[stream.index()];
            if state.total > state.kept {
                out.push((stream, capped_marker(state.kept, state.total)));
            }
        }
        out.retain(|(_, text)| !text.is_empty());
        out
    }

    pub fn totals(&self) -> Totals {
        let [out, err] = &self.streams;
        Totals {
            stdout_bytes: out.total,
            stderr_bytes: err.total,
            truncated: out.total > out.kept || err.total > err.kept,
            middle_skipped: self.skipped,
        }
    }

    fn route(&mut self, stream: Stream, text: String) -> Vec<(Stream, String)> {
        if text.is_empty() {
            return Vec::new();
        }
        if !self.middle_enabled {
            return vec![(stream, text)];
        }
        let mut now = Vec::new();
        let room = self.head_budget - self.head_used;
        let chars = text.chars().count() as u64;
        let rest = if room == 0 {
            text
        } else if chars <= room {
            self.head_used += chars;
            now.push((stream, text));
            String::new()
        } else {
            let split = byte_offset(&text, room);
            self.head_used = self.head_budget;
            now.push((stream, text[..split].to_owned()));
            text[split..].to_owned()
        };
        if !rest.is_empty() {
            self.tail_chars += rest.chars().count() as u64;
            self.tail.push_back((stream, rest));
            self.trim_tail();
        }
        now
    }

    /// Drops characters from the front of the held tail until it fits its budget.
    fn trim_tail(&mut self) {
        while self.tail_chars > self.tail_budget {
            let excess = self.tail_chars - self.tail_budget;
            let Some((stream, front)) = self.tail.pop_front() else { break };
            let front_chars = front.chars().count() as u64;
            if front_chars <= excess {
                self.tail_chars -= front_chars;
                self.skipped += front_chars;
            } else {
                let split = byte_offset(&front, excess);
                self.tail_chars -= excess;
                self.skipped += excess;
                self.tail.push_front((stream, front[split..].to_owned()));
            }
        }
    }
}

/// Byte offset of the `chars`-th character of `text` (or its length).
fn byte_offset(text: &str, chars: u64) -> usize {
    text.char_indices().nth(usize::try_from(chars).unwrap_or(usize::MAX)).map_or(text.len(), |(i, _)| i)
}

/// Decodes `bytes` after the `carry` of the previous call. Unless `last`, an incomplete character at the
/// end is kept in `carry` for the next call.
fn decode(carry: &mut Vec<u8>, bytes: Vec<u8>, last: bool) -> String {
    let mut buffer = std::mem::take(carry);
    buffer.extend(bytes);
    if !last {
        let keep = incomplete_suffix(&buffer);
        *carry = buffer.split_off(buffer.len() - keep);
    }
    match String::from_utf8(buffer) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// Length of a UTF-8 sequence cut short at the end of `bytes` (0 when the end is complete).
fn incomplete_suffix(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: look further back for the lead byte
        }
        let width = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if width > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shaper(cap: u64, max_chars: u64) -> OutputShaper {
        OutputShaper::new(Masker::for_output(&[], ["topsecret-123".to_owned()]), cap, max_chars)
    }

    fn collect(events: Vec<(Stream, String)>) -> String {
        events.into_iter().map(|(_, t)| t).collect()
    }

    #[test]
    fn short_output_passes_through_masked() {
        let mut s = shaper(1 << 20, 20_000);
        let mut text = collect(s.push(Stream::Stdout, b"key=topsec"));
        text += &collect(s.push(Stream::Stdout, b"ret-123 done\n"));
        text += &collect(s.finish());
        assert_eq!(text, "key=[redacted] done\n");
        assert_eq!(s.totals().middle_skipped, 0);
    }

    #[test]
    fn long_output_is_cut_in_the_middle() {
        let mut s = shaper(1 << 20, 100);
        let body: String = (0..1000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let mut text = String::new();
        for chunk in body.as_bytes().chunks(37) {
            text += &collect(s.push(Stream::Stdout, chunk));
        }
        text += &collect(s.finish());
        let marker = middle_marker(900);
        assert!(text.contains(&marker), "{text}");
        assert_eq!(text.chars().count(), 100 + marker.chars().count());
        assert!(text.starts_with(&body[..50]) && text.ends_with(&body[950..]));
        assert_eq!(s.totals().middle_skipped, 900);
    }

    #[test]
    fn byte_caps_count_everything_and_say_so() {
        let mut s = shaper(10, 0);
        let text = collect(s.push(Stream::Stderr, &[b'x'; 25])) + &collect(s.finish());
        assert!(text.starts_with("xxxxxxxxxx\n... [output truncated after 10 of 25 bytes"), "{text}");
        let totals = s.totals();
        assert!(totals.truncated && totals.stderr_bytes == 25);
    }

    #[test]
    fn characters_split_across_reads_are_not_broken() {
        let mut s = shaper(1 << 20, 0);
        let bytes = "héllo wörld €".as_bytes();
        let mut text = String::new();
        for b in bytes {
            text += &collect(s.push(Stream::Stdout, std::slice::from_ref(b)));
        }
        text += &collect(s.finish());
        assert_eq!(text, "héllo wörld €");
        let mut s = shaper(1 << 20, 0);
        let text = collect(s.push(Stream::Stdout, b"a\xffb")) + &collect(s.finish());
        assert_eq!(text, "a\u{fffd}b");
    }
}
