//! DeerFlow's `tool_search` over the catalog: `select:a,b` (exact names, in order, no cap), `+required
//! rest` (names containing `required`, ranked by matches of `rest`), or a case-insensitive regex over
//! "name description" where a name hit scores 2 and a description hit 1 (an invalid regex is matched as
//! literal text).

use std::sync::Arc;

use regex::{Regex, RegexBuilder};

use crate::catalog::ToolEntry;
use crate::error::McpError;

/// Longest query accepted.
pub const MAX_QUERY_CHARS: usize = 1000;
/// Results when the request asks for none (DeerFlow's MAX_RESULTS).
pub const DEFAULT_RESULTS: usize = 5;
/// Most results a request may ask for.
pub const MAX_RESULTS: usize = 50;
/// Compiled size bound for query regexes, so a hostile pattern cannot take the service's memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// How the query was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryKind {
    Select,
    RequiredKeyword,
    Regex,
    Literal,
}

#[derive(Debug)]
pub struct Found {
    pub tools: Vec<Arc<ToolEntry>>,
    pub kind: QueryKind,
    pub missing: Vec<String>,
}

fn pattern(text: &str) -> (Regex, bool) {
    let build = |p: &str| RegexBuilder::new(p).case_insensitive(true).size_limit(REGEX_SIZE_LIMIT).build();
    match build(text) {
        Ok(re) => (re, true),
        // The escaped literal always compiles (it is a plain string).
        Err(_) => match build(&regex::escape(text)) {
            Ok(re) => (re, false),
            Err(_) => (Regex::new("$^").unwrap_or_else(|_| unreachable_regex()), false),
        },
    }
}

fn unreachable_regex() -> Regex {
    // Invariant: "$^" is a valid regex.
    panic!("the empty-match regex failed to compile")
}

/// Runs `query` over `tools`.
pub fn search(tools: &[Arc<ToolEntry>], query: &str, max_results: u32) -> Result<Found, McpError> {
    let query = query.trim();
    if query.is_empty() {
        return Err(McpError::invalid("query", "is required"));
    }
    let chars = query.chars().count();
    if chars > MAX_QUERY_CHARS {
        return Err(McpError::invalid("query", format!("{chars} characters exceeds the limit of {MAX_QUERY_CHARS}")));
    }
    let limit = match max_results {
        0 => DEFAULT_RESULTS,
        n => (n as usize).min(MAX_RESULTS),
    };
    if let Some(names) = query.strip_prefix("select:") {
        let mut found = Vec::new();
        let mut missing = Vec::new();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match tools.iter().find(|t| t.name == name) {
                Some(tool) if !found.iter().any(|f: &Arc<ToolEntry>| Arc::ptr_eq(f, tool)) => found.push(tool.clone()),
                Some(_) => {}
                None => missing.push(name.to_owned()),
            }
        }
        return Ok(Found { tools: found, kind: QueryKind::Select, missing });
    }
    if let Some(rest) = query.strip_prefix('+') {
        let (required, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let required = required.to_lowercase();
        let rest = rest.trim();
        let ranker = (!rest.is_empty()).then(|| pattern(rest).0);
        let mut scored: Vec<(usize, &Arc<ToolEntry>)> = tools
            .iter()
            .filter(|t| t.name.to_lowercase().contains(&required))
            .map(|t| {
                let score = ranker.as_ref().map_or(0, |re| re.find_iter(&format!("{} {}", t.name, t.description)).count());
                (score, t)
            })
            .collect();
        scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
        let tools = scored.into_iter().take(limit).map(|(_, t)| t.clone()).collect();
        return Ok(Found { tools, kind: QueryKind::RequiredKeyword, missing: Vec::new() });
    }
    let (re, valid) = pattern(query);
    let mut scored: Vec<(u32, &Arc<ToolEntry>)> = tools
        .iter()
        .filter_map(|t| {
            let score = if re.is_match(&t.name) { 2 } else { 0 } + u32::from(re.is_match(&t.description));
            (score > 0).then_some((score, t))
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
    let tools = scored.into_iter().take(limit).map(|(_, t)| t.clone()).collect();
    Ok(Found { tools, kind: if valid { QueryKind::Regex } else { QueryKind::Literal }, missing: Vec::new() })
}
