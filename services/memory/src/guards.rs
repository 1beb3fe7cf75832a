//! Junk guards for extracted facts (mem0 #4573 found 97.8 % of one store to be junk): text that repeats
//! the system prompt, a tool schema or result, or a file's contents; transient states and bookkeeping
//! matched by `memory.refuse_patterns`. Confidence and duplicates are checked where facts are applied.

use std::collections::HashSet;

use regex::RegexSet;

use crate::facts::{normalise, words};

/// Words per shingle when comparing a fact with refused text.
const SHINGLE: usize = 5;
/// Share of a fact's shingles found in refused text that makes it a copy.
const COPIED_SHARE: f64 = 0.5;

/// Why a candidate was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Repeats a system prompt, tool traffic or file contents of the conversation.
    Copied,
    /// Looks like a tool schema or other machine text.
    Schema,
    /// Matches a refuse pattern (transient state, upload notice, self-talk).
    Pattern,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Copied => "copied",
            Refusal::Schema => "schema",
            Refusal::Pattern => "pattern",
        }
    }
}

/// The guard of one update: its refused texts and the configured patterns.
#[derive(Debug)]
pub struct Guard<'a> {
    shingles: HashSet<Vec<String>>,
    refused_norm: Vec<String>,
    patterns: &'a RegexSet,
}

fn shingles(text: &str) -> Vec<Vec<String>> {
    let words = words(text);
    if words.len() < SHINGLE {
        return if words.is_empty() { Vec::new() } else { vec![words] };
    }
    words.windows(SHINGLE).map(<[String]>::to_vec).collect()
}

impl<'a> Guard<'a> {
    pub fn new(refusals: &[String], patterns: &'a RegexSet) -> Self {
        let mut shingle_set = HashSet::new();
        for text in refusals {
            shingle_set.extend(shingles(text));
        }
        Self { shingles: shingle_set, refused_norm: refusals.iter().map(|r| normalise(r)).collect(), patterns }
    }

    /// None when `content` may be stored.
    pub fn check(&self, content: &str) -> Option<Refusal> {
        if self.patterns.is_match(content) {
            return Some(Refusal::Pattern);
        }
        let trimmed = content.trim();
        let schema_markers = ["\"type\"", "\"properties\"", "\"parameters\"", "\"required\"", "\"$schema\""];
        if (trimmed.starts_with('{') || trimmed.starts_with('[')) || schema_markers.iter().filter(|m| content.contains(*m)).count() >= 2 {
            return Some(Refusal::Schema);
        }
        let norm = normalise(content);
        if norm.len() >= 24 && self.refused_norm.iter().any(|r| r.contains(&norm)) {
            return Some(Refusal::Copied);
        }
        let own = shingles(content);
        if own.len() >= 2 {
            let copied = own.iter().filter(|s| self.shingles.contains(*s)).count();
            if copied as f64 / own.len() as f64 >= COPIED_SHARE {
                return Some(Refusal::Copied);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_REFUSE_PATTERNS;

    fn patterns() -> RegexSet {
        RegexSet::new(DEFAULT_REFUSE_PATTERNS).unwrap_or_else(|_| RegexSet::empty())
    }

    #[test]
    fn refuses_prompt_leaks_schemas_and_transient_states() {
        let patterns = patterns();
        let system = "You are DeerFlow, an open-source super agent. Always answer in the language of the user and cite sources.".to_owned();
        let guard = Guard::new(&[system], &patterns);
        assert_eq!(guard.check("Always answer in the language of the user and cite sources"), Some(Refusal::Copied));
        assert_eq!(guard.check(r#"{"type": "object", "properties": {"path": {}}}"#), Some(Refusal::Schema));
        assert_eq!(guard.check("The user is waiting for the report"), Some(Refusal::Pattern));
        assert_eq!(guard.check("User uploaded a file named q3.xlsx"), Some(Refusal::Pattern));
        assert_eq!(guard.check("Prefers answers in German"), None);
    }
}
