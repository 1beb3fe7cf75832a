//! Checks a crate's source and README against its catalogue, for each crate's own unit test: every
//! `counter!` / `gauge!` / `histogram!` outside `#[cfg(test)]` modules must name a catalogued family (its
//! own or a shared one, e.g. [`super::KIT`]) with the catalogued label keys and, where a label value is
//! a literal, one of the catalogued values; every family of its own catalogue must be recorded somewhere;
//! and its README must have a table row for each.
//!
//! The source is read with a small Rust tokenizer (comments, strings, raw strings and char literals are
//! told apart), not a regex over lines, so a macro split over lines or a `"{"` in a string does not
//! confuse it. A metric name is a string literal, a `const NAME: &str = "…"` of the crate, or — when the
//! name is computed (`event.metric()`) — every `"antler_…"` literal of that file.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::{Catalogue, Family, Values};

/// One metric macro call found in the source.
#[derive(Debug, Clone)]
pub struct Use {
    pub name: String,
    /// Label keys with the value when it is a string literal.
    pub labels: Vec<(String, Option<String>)>,
    pub file: PathBuf,
    pub line: usize,
}

/// Everything wrong with `src` (a crate's `src/` directory) against `own` (its catalogue) and `shared`
/// (catalogues of other crates it records into); empty when all is well.
pub fn audit(src: &Path, own: Catalogue, shared: &[Catalogue]) -> Vec<String> {
    let uses = match scan(src) {
        Ok(uses) => uses,
        Err(problem) => return vec![problem],
    };
    let mut problems = Vec::new();
    let mut by_name: HashMap<&str, &Family> = HashMap::new();
    for family in shared.iter().flat_map(|c| c.iter()).chain(own.iter()) {
        by_name.insert(family.name, family);
    }
    for u in &uses {
        let at = format!("{}:{}", u.file.display(), u.line);
        let Some(family) = by_name.get(u.name.as_str()) else {
            problems.push(format!("{at}: {} is recorded but not in the crate's catalogue (src/metrics_catalog.rs)", u.name));
            continue;
        };
        let used: HashSet<&str> = u.labels.iter().map(|(k, _)| k.as_str()).collect();
        let catalogued: HashSet<&str> = family.labels.iter().map(|l| l.key).collect();
        if used != catalogued {
            problems.push(format!("{at}: {} is recorded with labels {used:?}; the catalogue says {catalogued:?}", u.name));
        }
        for (key, value) in &u.labels {
            let Some(value) = value else { continue };
            let known = family.labels.iter().find(|l| l.key == key).and_then(|l| match l.values {
                Values::Known(values) => Some(values),
                Values::Runtime(_) => None,
            });
            if let Some(known) = known
                && !known.contains(&value.as_str())
            {
                problems.push(format!("{at}: {}{{{key}=\"{value}\"}}: \"{value}\" is not among the catalogued values {known:?}", u.name));
            }
        }
    }
    let recorded: HashSet<&str> = uses.iter().map(|u| u.name.as_str()).collect();
    for family in own.iter().filter(|f| !recorded.contains(f.name)) {
        problems.push(format!("{} is catalogued but nothing under {} records it", family.name, src.display()));
    }
    let mut names = HashSet::new();
    for family in own {
        if !names.insert(family.name) {
            problems.push(format!("{} is catalogued twice", family.name));
        }
    }
    problems
}

/// Families of `families` without a row `` | `name` | <kind>… | … `` in a Markdown table of `readme`
/// whose labels cell names each label key in backticks.
pub fn undocumented_in_table(readme: &str, families: Catalogue) -> Vec<String> {
    let rows: Vec<Vec<&str>> = readme
        .lines()
        .filter_map(|l| l.trim().strip_prefix('|'))
        .map(|l| l.trim_end().trim_end_matches('|').split('|').map(str::trim).collect())
        .collect();
    families
        .iter()
        .filter_map(|family| {
            let cell = format!("`{}`", family.name);
            let Some(row) = rows.iter().find(|r| r.first() == Some(&cell.as_str())) else {
                return Some(format!("{}: no table row", family.name));
            };
            if !row.get(1).is_some_and(|kind| kind.starts_with(family.kind.as_str())) {
                return Some(format!("{}: the type cell is not `{}`", family.name, family.kind.as_str()));
            }
            let labels = row.get(2).copied().unwrap_or_default();
            let missing: Vec<&str> = family.labels.iter().map(|l| l.key).filter(|k| !labels.contains(&format!("`{k}`"))).collect();
            (!missing.is_empty()).then(|| format!("{}: the labels cell does not name {missing:?}", family.name))
        })
        .collect()
}

/// Names of `families` that `text` never mentions as `` `name` `` or `` `name{…}` ``.
pub fn undocumented_in_text(text: &str, families: Catalogue) -> Vec<&'static str> {
    families.iter().map(|f| f.name).filter(|name| !text.contains(&format!("`{name}`")) && !text.contains(&format!("`{name}{{"))).collect()
}

/// Every metric macro call in the `.rs` files under `dir`, test modules left out.
pub fn scan(dir: &Path) -> Result<Vec<Use>, String> {
    let mut files = Vec::new();
    collect_rs(dir, &mut files).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    files.sort();
    let mut parsed = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let tokens = without_test_modules(tokenize(&text));
        parsed.push((file, tokens));
    }
    let mut crate_consts: HashMap<String, Vec<String>> = HashMap::new();
    for (_, tokens) in &parsed {
        for (name, value) in consts(tokens) {
            crate_consts.entry(name).or_default().push(value);
        }
    }
    let mut uses = Vec::new();
    for (file, tokens) in &parsed {
        let file_consts: HashMap<String, String> = consts(tokens).into_iter().collect();
        let literals: Vec<String> = tokens
            .iter()
            .filter_map(|t| match &t.kind {
                Tok::Str(s) if is_metric_like(s) => Some(s.clone()),
                _ => None,
            })
            .collect();
        for call in macro_calls(tokens) {
            let at = format!("{}:{}", file.display(), call.line);
            let labels = call.args[1..]
                .iter()
                .map(|arg| match arg.as_slice() {
                    [
                        Token { kind: Tok::Str(key), .. },
                        Token { kind: Tok::Punct('='), .. },
                        Token { kind: Tok::Punct('>'), .. },
                        value @ ..,
                    ] => {
                        let literal = match value {
                            [Token { kind: Tok::Str(v), .. }] => Some(v.clone()),
                            _ => None,
                        };
                        Ok((key.clone(), literal))
                    }
                    _ => Err(format!("{at}: cannot read the labels of this metric call; write them as \"key\" => value")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let names: Vec<String> = match call.args[0].as_slice() {
                [Token { kind: Tok::Str(name), .. }] => vec![name.clone()],
                path if !path.is_empty() && path.iter().all(|t| matches!(t.kind, Tok::Ident(_) | Tok::Punct(':'))) => {
                    let ident = path.iter().rev().find_map(|t| match &t.kind {
                        Tok::Ident(s) => Some(s.as_str()),
                        _ => None,
                    });
                    let ident = ident.unwrap_or_default();
                    match (file_consts.get(ident), crate_consts.get(ident).map(Vec::as_slice)) {
                        (Some(value), _) => vec![value.clone()],
                        (None, Some([value])) => vec![value.clone()],
                        _ => return Err(format!("{at}: the metric name {ident} is not a `const {ident}: &str` of this crate")),
                    }
                }
                _ if !literals.is_empty() => literals.clone(),
                _ => return Err(format!("{at}: the metric name is computed and the file has no \"antler_…\" literal to check")),
            };
            uses.extend(names.into_iter().map(|name| Use { name, labels: labels.clone(), file: file.clone(), line: call.line }));
        }
    }
    Ok(uses)
}

fn is_metric_like(s: &str) -> bool {
    s.starts_with("antler_") && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_rs(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Punct(char),
    /// Numbers, char literals, lifetimes.
    Other,
}

#[derive(Debug, Clone)]
struct Token {
    kind: Tok,
    line: usize,
}

/// Rust source to tokens, comments dropped. String contents are kept raw (escapes are not decoded:
/// metric names and label words have none).
fn tokenize(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0, 1);
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        let start_line = line;
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&chars, i) {
            // r"…", r#"…"#, br"…": ends at a quote followed by as many #.
            let mut j = i + 1 + usize::from(c == 'b') + hashes + 1;
            let content_start = j;
            let end = loop {
                if j >= chars.len() {
                    break j;
                }
                if chars[j] == '"' && (1..=hashes).all(|k| at(j + k) == '#') {
                    break j;
                }
                line += usize::from(chars[j] == '\n');
                j += 1;
            };
            tokens.push(Token { kind: Tok::Str(chars[content_start..end.min(chars.len())].iter().collect()), line: start_line });
            i = end + 1 + hashes;
        } else if c == '"' || (c == 'b' && at(i + 1) == '"') {
            let mut j = i + if c == 'b' { 2 } else { 1 };
            let content_start = j;
            while j < chars.len() && chars[j] != '"' {
                if chars[j] == '\\' {
                    j += 1;
                }
                line += usize::from(at(j) == '\n');
                j += 1;
            }
            tokens.push(Token { kind: Tok::Str(chars[content_start..j.min(chars.len())].iter().collect()), line: start_line });
            i = j + 1;
        } else if c == '\'' {
            // A char literal ('a', '{', '\n', '\u{1F600}') or a lifetime ('a, 'static).
            if at(i + 1) == '\\' {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
            }
            tokens.push(Token { kind: Tok::Other, line: start_line });
        } else if c.is_alphabetic() || c == '_' {
            let mut j = i;
            while at(j).is_alphanumeric() || at(j) == '_' {
                j += 1;
            }
            tokens.push(Token { kind: Tok::Ident(chars[i..j].iter().collect()), line: start_line });
            i = j;
        } else if c.is_ascii_digit() {
            while at(i).is_alphanumeric() || at(i) == '_' || (at(i) == '.' && at(i + 1).is_ascii_digit()) {
                i += 1;
            }
            tokens.push(Token { kind: Tok::Other, line: start_line });
        } else {
            tokens.push(Token { kind: Tok::Punct(c), line: start_line });
            i += 1;
        }
    }
    tokens
}

/// The number of `#` of a raw string starting at `i`, or None when none starts there.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    // Not the tail of an identifier such as `bar"`: the caller only tries this at a token start.
    j += 1;
    let hashes = chars[j.min(chars.len())..].iter().take_while(|c| **c == '#').count();
    (chars.get(j + hashes) == Some(&'"')).then_some(hashes)
}

/// Drops `#[cfg(test)] mod name { … }` blocks.
fn without_test_modules(tokens: Vec<Token>) -> Vec<Token> {
    let is = |t: Option<&Token>, k: &Tok| t.is_some_and(|t| &t.kind == k);
    let ident = |s: &str| Tok::Ident(s.to_owned());
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let cfg_test = [Tok::Punct('#'), Tok::Punct('['), ident("cfg"), Tok::Punct('('), ident("test"), Tok::Punct(')'), Tok::Punct(']')];
        if cfg_test.iter().enumerate().all(|(k, t)| is(tokens.get(i + k), t))
            && is(tokens.get(i + 7), &ident("mod"))
            && is(tokens.get(i + 9), &Tok::Punct('{'))
        {
            let mut depth = 0;
            let mut j = i + 9;
            while j < tokens.len() {
                match tokens[j].kind {
                    Tok::Punct('{') => depth += 1,
                    Tok::Punct('}') => depth -= 1,
                    _ => {}
                }
                j += 1;
                if depth == 0 {
                    break;
                }
            }
            i = j;
            continue;
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    out
}

/// `const NAME: &str = "value";` and `const NAME: &'static str = "value";`
fn consts(tokens: &[Token]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        if token.kind != Tok::Ident("const".to_owned()) {
            continue;
        }
        let rest: Vec<&Tok> = tokens[i + 1..].iter().take(8).map(|t| &t.kind).collect();
        let tail = match rest.as_slice() {
            [Tok::Ident(name), Tok::Punct(':'), Tok::Punct('&'), Tok::Ident(s), Tok::Punct('='), Tok::Str(value), ..] if s == "str" => {
                Some((name, value))
            }
            [Tok::Ident(name), Tok::Punct(':'), Tok::Punct('&'), Tok::Other, Tok::Ident(s), Tok::Punct('='), Tok::Str(value), ..]
                if s == "str" =>
            {
                Some((name, value))
            }
            _ => None,
        };
        if let Some((name, value)) = tail {
            out.push((name.clone(), value.clone()));
        }
    }
    out
}

struct Call {
    line: usize,
    /// The arguments, split at top-level commas.
    args: Vec<Vec<Token>>,
}

/// `counter!(…)`, `gauge!(…)`, `histogram!(…)` (with or without `metrics::`).
fn macro_calls(tokens: &[Token]) -> Vec<Call> {
    let mut calls = Vec::new();
    for i in 0..tokens.len() {
        let Tok::Ident(name) = &tokens[i].kind else { continue };
        if !matches!(name.as_str(), "counter" | "gauge" | "histogram")
            || tokens.get(i + 1).map(|t| &t.kind) != Some(&Tok::Punct('!'))
            || tokens.get(i + 2).map(|t| &t.kind) != Some(&Tok::Punct('('))
        {
            continue;
        }
        let mut args = vec![Vec::new()];
        let mut depth = 0usize;
        for token in &tokens[i + 3..] {
            match token.kind {
                Tok::Punct('(' | '[' | '{') => depth += 1,
                Tok::Punct(')' | ']' | '}') if depth == 0 => break,
                Tok::Punct(')' | ']' | '}') => depth -= 1,
                Tok::Punct(',') if depth == 0 => {
                    args.push(Vec::new());
                    continue;
                }
                _ => {}
            }
            if let Some(last) = args.last_mut() {
                last.push(token.clone());
            }
        }
        // A trailing comma leaves an empty last argument.
        if args.len() > 1 && args.last().is_some_and(Vec::is_empty) {
            args.pop();
        }
        calls.push(Call { line: tokens[i].line, args });
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::super::Label;
    use super::*;

    fn uses_in(source: &str) -> Vec<Use> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("lib.rs"), source).unwrap_or_else(|e| panic!("{e}"));
        scan(dir.path()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn names_come_from_literals_consts_and_computed_names_from_the_files_literals() {
        let uses = uses_in(
            r##"
            pub const HITS: &str = "antler_a_total";
            // metrics::counter!("antler_in_a_comment_total")
            fn f(ok: bool) {
                let s = "{ not a brace";
                let c = '{';
                metrics::counter!(
                    "antler_b_total",
                    "outcome" => if ok { "ok" } else { "failed" },
                    "kind" => "client",
                ).increment(1);
                metrics::histogram!(HITS).record(1.0);
                let r = r#"counter!("antler_raw_total")"#;
                gauge!(event.metric(), "server" => server.to_owned()).set(1.0);
            }
            fn metric() -> &'static str { "antler_c_total" }
            #[cfg(test)]
            mod tests {
                fn g() { metrics::counter!("antler_only_in_tests_total").increment(1); let c = '}'; }
            }
            "##,
        );
        let names: Vec<&str> = uses.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["antler_b_total", "antler_a_total", "antler_a_total", "antler_b_total", "antler_c_total"], "{uses:?}");
        assert_eq!(uses[0].labels, [("outcome".to_owned(), None), ("kind".to_owned(), Some("client".to_owned()))]);
        assert_eq!(uses[0].line, 7);
        assert_eq!(uses[4].labels, [("server".to_owned(), None)]);
    }

    #[test]
    fn an_uncatalogued_name_a_wrong_label_and_an_unknown_value_are_reported() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let source = r#"
            fn f() {
                metrics::counter!("antler_known_total", "outcome" => "applied").increment(1);
                metrics::counter!("antler_known_total", "outcome" => "exploded").increment(1);
                metrics::counter!("antler_known_total", "result" => "applied").increment(1);
                metrics::counter!("antler_new_total").increment(1);
            }
        "#;
        std::fs::write(dir.path().join("lib.rs"), source).unwrap_or_else(|e| panic!("{e}"));
        const CATALOGUE: Catalogue = &[
            Family::counter("antler_known_total", "k").labels(&[Label::known("outcome", &["applied", "rejected"])]),
            Family::gauge("antler_never_set", "n"),
        ];
        let problems = audit(dir.path(), CATALOGUE, &[]);
        let has = |needle: &str| problems.iter().any(|p| p.contains(needle));
        assert!(has("\"exploded\" is not among"), "{problems:?}");
        assert!(has("recorded with labels {\"result\"}"), "{problems:?}");
        assert!(has("antler_new_total is recorded but not in the crate's catalogue"), "{problems:?}");
        assert!(has("antler_never_set is catalogued but nothing"), "{problems:?}");
        assert_eq!(problems.len(), 4, "{problems:?}");
    }

    #[test]
    fn readme_rows_need_the_type_and_every_label_key() {
        const CATALOGUE: Catalogue = &[
            Family::counter("antler_a_total", "a").labels(&[Label::known("outcome", &["ok"])]),
            Family::gauge("antler_b", "b"),
            Family::counter("antler_c_total", "c"),
        ];
        let readme = "| name | type | labels | meaning |\n|---|---|---|---|\n| `antler_a_total` | counter | `kind` | x |\n| `antler_b` | gauge | – | y |\n";
        let problems = undocumented_in_table(readme, CATALOGUE);
        assert_eq!(problems, ["antler_a_total: the labels cell does not name [\"outcome\"]", "antler_c_total: no table row"]);
        assert_eq!(undocumented_in_text("`antler_a_total{outcome}` and `antler_b`", CATALOGUE), ["antler_c_total"]);
    }
}
