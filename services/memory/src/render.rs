//! The injection block: summary sections first, then corrections from their own budget, then the
//! other facts ranked by full-text relevance to the current user message, confidence, recency and id
//! — each fact once, the same text for the same inputs (so a provider's prompt cache keeps hitting).
//!
//! Budgeting is exact to the token: the block is whole lines, each with its newline, and cl100k counts
//! of such lines add up (see [`crate::tokens`]); a fact's line count is stored when it is written.
//! Facts are taken in rank order until the next one does not fit.

use std::collections::HashMap;

use crate::config::TokenCounting;
use crate::facts::{self, CORRECTION, escape};
use crate::profile::{Profile, Section};
use crate::store::entity::facts::Model as Fact;
use crate::tokens;

/// What a render reads of a live fact: 9 of its 24 columns. A cold render reads a scope's facts as
/// one JSON array (see [`crate::render_cache::Snapshot::load_if_changed`]), so each column left out is
/// text SQLite does not print and the server does not parse or keep (the normalised duplicate key
/// alone is as long as the content). `Deserialize` reads it from the JSON array of
/// [`RenderFact::COLUMNS`], in that order.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct RenderFact {
    pub doc: i64,
    pub fact_id: String,
    pub category: String,
    pub category_label: String,
    #[serde(deserialize_with = "crate::store::json_f64")]
    pub confidence: f64,
    pub content: String,
    pub source_error: String,
    /// cl100k tokens of the fact's line, stored when it was written.
    pub line_tokens: i32,
    pub created_at: i64,
}

impl RenderFact {
    /// The columns of `memory_facts` in field order; `{confidence}` is the REAL column's form.
    pub const COLUMNS: &str = "doc, fact_id, category, category_label, {confidence}, content, source_error, line_tokens, created_at";

    fn line(&self) -> String {
        facts::line(&self.category, &self.category_label, self.confidence, &self.content, &self.source_error)
    }
}

impl From<&Fact> for RenderFact {
    fn from(f: &Fact) -> Self {
        Self {
            doc: f.doc,
            fact_id: f.fact_id.clone(),
            category: f.category.clone(),
            category_label: f.category_label.clone(),
            confidence: f.confidence,
            content: f.content.clone(),
            source_error: f.source_error.clone(),
            line_tokens: f.line_tokens,
            created_at: f.created_at,
        }
    }
}

/// What to render.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Summaries and regular facts.
    pub tokens: usize,
    /// Corrections, on top of `tokens`.
    pub corrections: usize,
    pub counting: TokenCounting,
    pub summaries_only: bool,
}

/// A rendered block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rendered {
    pub text: String,
    pub tokens: usize,
    pub included: Vec<String>,
    pub omitted: usize,
}

fn header_and_lines(profile: &Profile, sections: &[Section], header: &str) -> Vec<String> {
    let lines: Vec<String> = sections
        .iter()
        .filter_map(|s| {
            let text = profile.get(*s).0.trim();
            (!text.is_empty()).then(|| format!("- {}: {}\n", s.label(), escape(text)))
        })
        .collect();
    if lines.is_empty() {
        return lines;
    }
    std::iter::once(format!("{header}\n")).chain(lines).collect()
}

/// Renders `profile` and `live` facts; `scores` holds the full-text score of facts relevant to the
/// query (absent = 0).
pub fn render(profile: &Profile, live: &[RenderFact], scores: &HashMap<i64, f64>, budget: &Budget) -> Rendered {
    let count = |text: &str| tokens::count(text, budget.counting);
    let fact_tokens = |fact: &RenderFact| match budget.counting {
        TokenCounting::Tiktoken => fact.line_tokens.max(0) as usize,
        TokenCounting::Chars => count(&fact.line()),
    };
    let mut text = String::new();
    let mut used = 0usize;
    // Summary lines, within the main budget (a section that does not fit is left out whole).
    let summary_lines = [
        header_and_lines(profile, &[Section::WorkContext, Section::PersonalContext, Section::TopOfMind], "User Context:"),
        header_and_lines(profile, &[Section::RecentMonths, Section::EarlierContext, Section::LongTermBackground], "History:"),
    ];
    for group in summary_lines {
        let mut lines = group.into_iter();
        let Some(header) = lines.next() else { continue };
        let header_tokens = count(&header);
        let mut wrote_header = false;
        for line in lines {
            let cost = count(&line) + if wrote_header { 0 } else { header_tokens };
            if used + cost > budget.tokens {
                continue;
            }
            if !wrote_header {
                text.push_str(&header);
                wrote_header = true;
            }
            text.push_str(&line);
            used += cost;
        }
    }
    let mut rendered = Rendered { included: Vec::new(), omitted: 0, ..Rendered::default() };
    if budget.summaries_only {
        rendered.omitted = live.len();
        rendered.tokens = if budget.counting == TokenCounting::Chars { count(&text) } else { used };
        rendered.text = text;
        return rendered;
    }
    let score = |f: &RenderFact| scores.get(&f.doc).copied().unwrap_or(0.0);
    let (mut corrections, mut regular): (Vec<&RenderFact>, Vec<&RenderFact>) = live.iter().partition(|f| f.category == CORRECTION);
    let rank = |a: &&RenderFact, b: &&RenderFact| {
        score(b)
            .total_cmp(&score(a))
            .then(b.confidence.total_cmp(&a.confidence))
            .then(b.created_at.cmp(&a.created_at))
            .then(a.fact_id.cmp(&b.fact_id))
    };
    corrections.sort_by(rank);
    regular.sort_by(rank);
    let header = "Facts:\n";
    let header_tokens = count(header);
    let mut wrote_header = false;
    let mut take = |facts: Vec<&RenderFact>, limit: usize, used: &mut usize, text: &mut String, rendered: &mut Rendered| {
        let mut full = false;
        for fact in facts {
            if full {
                rendered.omitted += 1;
                continue;
            }
            let cost = fact_tokens(fact) + if wrote_header { 0 } else { header_tokens };
            if *used + cost > limit {
                full = true;
                rendered.omitted += 1;
                continue;
            }
            if !wrote_header {
                text.push_str(header);
                wrote_header = true;
            }
            text.push_str(&fact.line());
            *used += cost;
            rendered.included.push(fact.fact_id.clone());
        }
    };
    let mut correction_used = 0usize;
    take(corrections, budget.corrections, &mut correction_used, &mut text, &mut rendered);
    take(regular, budget.tokens, &mut used, &mut text, &mut rendered);
    rendered.tokens = if budget.counting == TokenCounting::Chars { count(&text) } else { used + correction_used };
    rendered.text = text;
    rendered
}
