//! Token counting for injection budgets: cl100k_base from `tiktoken-rs`, the tokenizer the models
//! service estimates usage with, or DeerMem's character estimate.
//!
//! Counts are exact for text made of whole lines: cl100k's pre-tokenizer never joins the first
//! character of a line starting with a non-space with the line before it (a newline either closes the
//! preceding punctuation or stands alone), so the tokens of `"a\nb\n"` are those of `"a\n"` plus those of
//! `"b\n"`. The injection block is built that way, so it is budgeted by adding per-line counts, which
//! are computed once when a fact is written.

use crate::config::TokenCounting;

/// Tokens of `text` counted by `mode`.
pub fn count(text: &str, mode: TokenCounting) -> usize {
    if text.is_empty() {
        return 0;
    }
    match mode {
        TokenCounting::Tiktoken => tiktoken_rs::cl100k_base_singleton().encode_ordinary(text).len(),
        TokenCounting::Chars => {
            let (cjk, other) = text.chars().fold((0usize, 0usize), |(c, o), ch| if is_cjk(ch) { (c + 1, o) } else { (c, o + 1) });
            other / 4 + cjk / 2 + usize::from(other % 4 != 0 || cjk % 2 != 0)
        }
    }
}

fn is_cjk(ch: char) -> bool {
    matches!(ch as u32, 0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xAC00..=0xD7AF | 0xF900..=0xFAFF | 0xFF00..=0xFFEF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_counts_add_up_to_the_count_of_the_block() {
        let lines = [
            "User Context:\n",
            "- Work: Staff engineer at Acme; works on &lt;billing&gt; in Rust.\n",
            "Facts:\n",
            "- [preference | 0.95] Prefers concise answers, with code first.\n",
            "- [correction | 0.98] Uses PostgreSQL 16, not MySQL (avoid: assumed MySQL)\n",
            "- [context | 0.70] 住在东京\n",
            "- [goal | 0.80] ship v2 by March!!!\n",
        ];
        let sum: usize = lines.iter().map(|l| count(l, TokenCounting::Tiktoken)).sum();
        assert_eq!(sum, count(&lines.concat(), TokenCounting::Tiktoken));
    }

    #[test]
    fn chars_estimate_counts_cjk_double() {
        assert_eq!(count("abcdefgh", TokenCounting::Chars), 2);
        assert_eq!(count("东京", TokenCounting::Chars), 1);
    }
}
