//! Keeping host paths and injected secrets out of what clients see.
//!
//! One [`Masker`] holds (needle → replacement) pairs: each host directory of the sandbox → its virtual
//! path, and, for a command, each injected variable value of 8 characters or more → `[redacted]`. Matching
//! is leftmost-longest, so the longest host prefix wins and a secret containing another is masked whole.
//! [`StreamMasker`] applies it to output that arrives in chunks without missing a needle split across two.

use std::borrow::Cow;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// What replaces a secret value.
pub const REDACTED: &str = "[redacted]";
/// Shorter values are not masked (they would mangle ordinary output; DeerFlow uses the same bound).
pub const MIN_SECRET_CHARS: usize = 8;

/// A set of needles and their replacements.
#[derive(Debug, Clone)]
pub struct Masker {
    matcher: Option<AhoCorasick>,
    replacements: Vec<String>,
    longest: usize,
}

impl Masker {
    /// Builds a masker; empty needles are ignored.
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        let (needles, replacements): (Vec<String>, Vec<String>) = pairs.into_iter().filter(|(needle, _)| !needle.is_empty()).unzip();
        let longest = needles.iter().map(String::len).max().unwrap_or(0);
        let matcher = if needles.is_empty() {
            None
        } else {
            // Building can only fail for pathological sizes; then nothing matches, which is reported.
            AhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&needles)
                .map_err(|e| tracing::error!(error = %e, "masker build failed"))
                .ok()
        };
        Self { matcher, replacements, longest }
    }

    /// Host paths of a workspace plus the secret values of a command.
    pub fn for_output(host_paths: &[(String, String)], secrets: impl IntoIterator<Item = String>) -> Self {
        let secrets = secrets.into_iter().filter(|s| s.chars().count() >= MIN_SECRET_CHARS).map(|s| (s, REDACTED.to_owned()));
        Self::new(host_paths.iter().cloned().chain(secrets))
    }

    /// Masks a whole text.
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match &self.matcher {
            Some(ac) if ac.is_match(text) => {
                let mut out = String::with_capacity(text.len());
                let mut last = 0;
                for m in ac.find_iter(text) {
                    out.push_str(&text[last..m.start()]);
                    out.push_str(&self.replacements[m.pattern().as_usize()]);
                    last = m.end();
                }
                out.push_str(&text[last..]);
                Cow::Owned(out)
            }
            _ => Cow::Borrowed(text),
        }
    }

    /// Masks whole bytes (command output before UTF-8 decoding).
    fn mask_bytes(&self, bytes: &[u8], out: &mut Vec<u8>) {
        match &self.matcher {
            Some(ac) => {
                let mut last = 0;
                for m in ac.find_iter(bytes) {
                    out.extend_from_slice(&bytes[last..m.start()]);
                    out.extend_from_slice(self.replacements[m.pattern().as_usize()].as_bytes());
                    last = m.end();
                }
                out.extend_from_slice(&bytes[last..]);
            }
            None => out.extend_from_slice(bytes),
        }
    }
}

/// Applies a [`Masker`] to a byte stream. Bytes that could still be the start of a needle are held back
/// until the next chunk (or the end) decides; everything else is released at once.
#[derive(Debug)]
pub struct StreamMasker {
    masker: Masker,
    pending: Vec<u8>,
}

impl StreamMasker {
    pub fn new(masker: Masker) -> Self {
        Self { masker, pending: Vec::new() }
    }

    /// Feeds a chunk; returns the masked bytes that are final.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        let Some(ac) = &self.masker.matcher else {
            return std::mem::take(&mut self.pending);
        };
        // A match starting before `safe` is complete in the buffer (no needle is longer than `longest`),
        // so leftmost-longest decides it exactly as it would on the whole stream.
        let safe = self.pending.len().saturating_sub(self.masker.longest.saturating_sub(1));
        let mut out = Vec::with_capacity(self.pending.len());
        let mut last = 0;
        for m in ac.find_iter(&self.pending) {
            if m.start() >= safe {
                break;
            }
            out.extend_from_slice(&self.pending[last..m.start()]);
            out.extend_from_slice(self.masker.replacements[m.pattern().as_usize()].as_bytes());
            last = m.end();
        }
        let cut = safe.max(last);
        out.extend_from_slice(&self.pending[last..cut]);
        self.pending.drain(..cut);
        out
    }

    /// Ends the stream; returns what was held back, masked.
    pub fn finish(&mut self) -> Vec<u8> {
        let pending = std::mem::take(&mut self.pending);
        let mut out = Vec::with_capacity(pending.len());
        self.masker.mask_bytes(&pending, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masker() -> Masker {
        Masker::for_output(
            &[
                ("/data/u/t/user-data/workspace".into(), "/mnt/user-data/workspace".into()),
                ("/data/u/t/user-data".into(), "/mnt/user-data".into()),
            ],
            ["s3cr3t-value".to_owned(), "short".to_owned()],
        )
    }

    #[test]
    fn host_paths_and_secrets_are_replaced() {
        let m = masker();
        let out = m.mask("cd /data/u/t/user-data/workspace/x && echo s3cr3t-value short /data/u/t/user-data/outputs");
        assert_eq!(out, "cd /mnt/user-data/workspace/x && echo [redacted] short /mnt/user-data/outputs");
    }

    #[test]
    fn needles_split_across_chunks_are_still_masked() {
        let m = masker();
        let text = "a s3cr3t-value b /data/u/t/user-data/workspace/f c s3cr3t-value";
        for split in 0..text.len() {
            for step in [1usize, 3, 7] {
                let mut stream = StreamMasker::new(m.clone());
                let mut out = Vec::new();
                let (a, b) = text.as_bytes().split_at(split);
                for piece in a.chunks(step).chain(b.chunks(step)) {
                    out.extend(stream.push(piece));
                }
                out.extend(stream.finish());
                assert_eq!(
                    String::from_utf8_lossy(&out),
                    "a [redacted] b /mnt/user-data/workspace/f c [redacted]",
                    "split {split} step {step}"
                );
            }
        }
    }

    #[test]
    fn without_needles_everything_passes_at_once() {
        let mut stream = StreamMasker::new(Masker::new(Vec::new()));
        assert_eq!(stream.push(b"abc"), b"abc");
        assert!(stream.finish().is_empty());
    }
}
