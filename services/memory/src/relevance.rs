//! Ranking facts by relevance to a text: BM25 over the words of one scope's live facts.
//!
//! The full-text indexes (SQLite FTS5, PostgreSQL `tsvector`) find the facts that contain a query
//! word; the ranking is computed here, with the scope's own statistics. FTS5's `bm25()` takes its
//! document frequencies from the whole index: for a word most facts contain, it read that word's
//! entries for every user on every query (28 ms over 1M facts, where matching alone took 0.2 ms), and
//! it let other users' facts weigh in one user's ranking. A scope holds at most `memory.max_facts`
//! live facts (≤ 500), so its exact statistics are cheap, and both backends rank alike.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

/// The words of a text for similarity and search: lower-cased runs of letters and digits.
pub fn words(text: &str) -> Vec<String> {
    word_iter(text).map(Cow::into_owned).collect()
}

/// BM25's usual constants: term-frequency saturation and length normalisation.
const K1: f64 = 1.2;
const B: f64 = 0.75;

/// The distinct words of a query, at most 32 (a long user message makes a long OR query; 32
/// distinct words rank as well as all of them).
pub fn query_words(text: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    words(text).into_iter().filter(|w| seen.insert(w.clone())).take(32).collect()
}

/// The words of `text` as [`words`] finds them, borrowed where they are lower case already.
fn word_iter(text: &str) -> impl Iterator<Item = Cow<'_, str>> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(|w| {
        if w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) { Cow::Borrowed(w) } else { Cow::Owned(w.to_lowercase()) }
    })
}

/// Scores of `texts` for the query `words` (same order; 0.0 = no query word in it). `scope_size` is
/// the number of live facts in the scope, at least `texts.len()`: every fact holding a query word is
/// among `texts`, so the document frequencies counted over them are the scope's.
///
/// RenderInjection ranks a whole scope (up to 500 facts) with this on every call, so a text is read
/// once and only its length and its query words' counts are kept (no list of its words).
pub fn scores<'a>(query: &[String], texts: impl IntoIterator<Item = &'a str>, scope_size: usize) -> Vec<f64> {
    let position: HashMap<&str, usize> = query.iter().enumerate().map(|(i, w)| (w.as_str(), i)).collect();
    // Per text: its length in words and (query word, count) for the query words in it.
    let docs: Vec<(usize, Vec<(usize, u32)>)> = texts
        .into_iter()
        .map(|text| {
            let (mut length, mut hits) = (0usize, Vec::<(usize, u32)>::new());
            for word in word_iter(text) {
                length += 1;
                if let Some(&i) = position.get(&*word) {
                    match hits.iter_mut().find(|(j, _)| *j == i) {
                        Some((_, count)) => *count += 1,
                        None => hits.push((i, 1)),
                    }
                }
            }
            (length, hits)
        })
        .collect();
    if query.is_empty() || docs.is_empty() {
        return vec![0.0; docs.len()];
    }
    let mut frequency = vec![0usize; query.len()];
    for (_, hits) in &docs {
        for (i, _) in hits {
            frequency[*i] += 1;
        }
    }
    let n = scope_size.max(docs.len()) as f64;
    let average = (docs.iter().map(|(length, _)| *length).sum::<usize>() as f64 / docs.len() as f64).max(1.0);
    docs.iter()
        .map(|(length, hits)| {
            let length = *length as f64;
            hits.iter()
                .map(|&(i, count)| {
                    let df = frequency[i] as f64;
                    let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                    let count = f64::from(count);
                    idf * count * (K1 + 1.0) / (count + K1 * (1.0 - B + B * length / average))
                })
                .sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Vec<String> {
        query_words(text)
    }

    #[test]
    fn a_fact_without_a_query_word_scores_zero_and_one_with_it_more() {
        let s = scores(&q("postgres"), ["Uses PostgreSQL 16", "Uses postgres daily", "Likes tea"], 3);
        assert_eq!(s[0], 0.0, "whole words only, as the index matches them");
        assert!(s[1] > 0.0);
        assert_eq!(s[2], 0.0);
    }

    #[test]
    fn a_rare_word_outweighs_a_common_one() {
        let texts = ["likes rust and coffee", "likes rust and tea", "likes rust and chess", "likes go"];
        let s = scores(&q("rust chess"), texts, 4);
        assert!(s[2] > s[0] && s[2] > s[1], "{s:?}");
        assert_eq!(s[0], s[1]);
    }

    #[test]
    fn the_scope_size_counts_facts_without_any_query_word() {
        // One matching fact among many is more telling than one among one.
        let alone = scores(&q("chess"), ["plays chess"], 1)[0];
        let among_many = scores(&q("chess"), ["plays chess"], 100)[0];
        assert!(among_many > alone, "{alone} {among_many}");
    }

    #[test]
    fn text_words_are_compared_lower_case_and_each_occurrence_counts() {
        let s = scores(&q("rust zürich"), ["RUST, Rust and rust", "rust", "Moved to Zürich", "nothing"], 4);
        assert!(s[0] > s[1] && s[1] > 0.0, "three occurrences outweigh one: {s:?}");
        assert!(s[2] > 0.0, "non-ASCII text is lower-cased too: {s:?}");
        assert_eq!(s[3], 0.0);
        // The same inputs give the same bits (the rendered order depends on exact ties).
        assert_eq!(s, scores(&q("rust zürich"), ["RUST, Rust and rust", "rust", "Moved to Zürich", "nothing"], 4));
    }

    #[test]
    fn query_words_are_distinct_lower_case_and_bounded() {
        assert_eq!(q("Rust, rust and RUST!"), vec!["rust".to_owned(), "and".to_owned()]);
        let long: String = (0..100).map(|i| format!("w{i} ")).collect();
        assert_eq!(q(&long).len(), 32);
    }
}
