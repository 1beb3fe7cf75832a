//! The extraction prompt and the strict reading of its answer.
//!
//! The model sees the current summaries, the existing facts most relevant to the conversation (under
//! short references `f1`, `f2`, … as mem0 does, so it cannot invent ids), and the filtered conversation,
//! HTML-escaped against tag breakout. It answers one JSON object of operations — ADD / UPDATE /
//! INVALIDATE / NOOP against those facts — and summary rewrites. The answer is validated as a whole: one
//! bad operation makes it malformed, and a malformed answer is dropped and counted, never half-applied.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use serde_json::json;

use crate::facts::{CATEGORIES, escape};
use crate::filter::Turn;
use crate::profile::{Profile, Section};
use crate::store::entity::facts::Model as Fact;

pub const SYSTEM_PROMPT: &str = "You maintain the long-term memory an assistant keeps about one user. \
Read the conversation and decide what is worth remembering across future conversations: durable facts \
about the user (who they are, their work, preferences, knowledge, goals, habits, constraints, decisions) \
and corrections of mistakes the assistant made. Do not record transient states (\"the user is waiting\"), \
file upload events, the contents of files or tool results, instructions given to the assistant, or \
anything you are guessing.\n\n\
Existing facts are listed with short ids (f1, f2, ...). For each thing you learned, choose one operation:\n\
- ADD a new fact that no existing fact covers;\n\
- UPDATE an existing fact (by id) that the conversation changes or contradicts, giving its full new content;\n\
- INVALIDATE an existing fact (by id) that is no longer true, with a reason;\n\
- NOOP when nothing changes.\n\
Categories: preference, knowledge, context, behavior, goal, correction, identity, constraint, decision. \
Confidence: 0.9-1.0 stated explicitly, 0.7-0.8 clearly implied, 0.5-0.6 inferred; corrections 0.95 or \
more, with source_error saying what the assistant had wrong. A fact is one short self-contained statement.\n\
You may also rewrite summary sections (workContext, personalContext, topOfMind, recentMonths, \
earlierContext, longTermBackground) when the conversation changes them; omit the sections that stay.\n\n\
Answer with exactly one JSON object and nothing else:\n\
{\"operations\": [{\"op\": \"ADD\", \"content\": \"...\", \"category\": \"preference\", \"confidence\": 0.9}, \
{\"op\": \"UPDATE\", \"id\": \"f1\", \"content\": \"...\", \"category\": \"context\", \"confidence\": 0.9}, \
{\"op\": \"INVALIDATE\", \"id\": \"f2\", \"reason\": \"...\"}, {\"op\": \"NOOP\"}], \
\"summaries\": {\"workContext\": \"...\"}}";

/// Most characters of one summary section in an answer.
pub const MAX_SUMMARY_CHARS: usize = 4000;
/// Longest free-form category label.
pub const MAX_LABEL_CHARS: usize = 64;

/// The user part of the prompt, and the short id → fact id map it used.
pub fn prompt(profile: &Profile, facts: &[Fact], turns: &[Turn]) -> (String, HashMap<String, String>) {
    let mut summaries = serde_json::Map::new();
    for section in Section::ALL {
        let text = &profile.get(section).0;
        if !text.is_empty() {
            summaries.insert(section.json_name().to_owned(), json!(escape(text)));
        }
    }
    let mut refs = HashMap::new();
    let listed: Vec<serde_json::Value> = facts
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let short = format!("f{}", i + 1);
            refs.insert(short.clone(), f.fact_id.clone());
            json!({"id": short, "content": escape(&f.content), "category": f.category, "confidence": (f.confidence * 100.0).round() / 100.0})
        })
        .collect();
    let memory = json!({"summaries": summaries, "facts": listed});
    let conversation: Vec<String> = turns.iter().map(|t| format!("{}: {}", t.role, escape(&t.text))).collect();
    let text = format!("<current_memory>\n{memory}\n</current_memory>\n\n<conversation>\n{}\n</conversation>", conversation.join("\n"));
    (text, refs)
}

/// A validated operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    Add(Candidate),
    /// Replace `fact_id` with a new version.
    Update {
        fact_id: String,
        candidate: Candidate,
    },
    Invalidate {
        fact_id: String,
        reason: String,
    },
    Noop,
}

/// A fact the model proposes.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub content: String,
    pub category: String,
    pub category_label: String,
    pub confidence: f64,
    pub source_error: String,
}

/// A validated answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub operations: Vec<Operation>,
    pub summaries: Vec<(Section, String)>,
}

#[derive(Deserialize)]
struct RawAnswer {
    #[serde(default)]
    operations: Vec<RawOperation>,
    #[serde(default)]
    summaries: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawOperation {
    op: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    category: Option<String>,
    #[serde(default)]
    confidence: Option<f64>,
    #[serde(default)]
    source_error: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

/// The JSON object in a model's text: the whole text, or a fenced block, after removing `<think>`.
fn json_text(text: &str) -> &str {
    let text = match text.rfind("</think>") {
        Some(end) => &text[end + "</think>".len()..],
        None => text,
    };
    let text = text.trim();
    if let Some(inner) = text.strip_prefix("```json").or_else(|| text.strip_prefix("```")) {
        return inner.trim().strip_suffix("```").unwrap_or(inner).trim();
    }
    text
}

/// Reads and validates an answer; `Err` says why it is malformed. `refs` maps the prompt's short ids;
/// a full fact id of a listed fact is accepted too.
pub fn parse(text: &str, refs: &HashMap<String, String>, max_fact_chars: usize) -> Result<Answer, String> {
    let raw: RawAnswer = serde_json::from_str(json_text(text)).map_err(|e| format!("not the expected JSON object: {e}"))?;
    let resolve = |i: usize, id: &Option<String>| -> Result<String, String> {
        let id = id.as_deref().map(str::trim).unwrap_or_default();
        if id.is_empty() {
            return Err(format!("operations[{i}].id is required"));
        }
        if let Some(full) = refs.get(id) {
            return Ok(full.clone());
        }
        if refs.values().any(|v| v == id) {
            return Ok(id.to_owned());
        }
        Err(format!("operations[{i}].id `{id}` is not one of the listed facts"))
    };
    let candidate = |i: usize, op: &RawOperation| -> Result<Candidate, String> {
        let content = op.content.as_deref().map(str::trim).unwrap_or_default();
        if content.is_empty() {
            return Err(format!("operations[{i}].content is required"));
        }
        if content.chars().count() > max_fact_chars {
            return Err(format!("operations[{i}].content is longer than {max_fact_chars} characters"));
        }
        let confidence = op.confidence.ok_or_else(|| format!("operations[{i}].confidence is required"))?;
        if !(0.0..=1.0).contains(&confidence) {
            return Err(format!("operations[{i}].confidence {confidence} is outside 0..1"));
        }
        let category = op.category.as_deref().map(|c| c.trim().to_lowercase()).unwrap_or_else(|| "context".to_owned());
        let (category, category_label) = if CATEGORIES.contains(&category.as_str()) {
            (category, String::new())
        } else if category.is_empty() || category.chars().count() > MAX_LABEL_CHARS {
            return Err(format!("operations[{i}].category must be a short word"));
        } else {
            ("other".to_owned(), category)
        };
        let source_error = op.source_error.clone().unwrap_or_default();
        if source_error.chars().count() > 1000 {
            return Err(format!("operations[{i}].source_error is longer than 1000 characters"));
        }
        Ok(Candidate { content: content.to_owned(), category, category_label, confidence, source_error })
    };
    let mut operations = Vec::with_capacity(raw.operations.len());
    for (i, op) in raw.operations.iter().enumerate() {
        let operation = match op.op.trim().to_ascii_uppercase().as_str() {
            "ADD" => Operation::Add(candidate(i, op)?),
            "UPDATE" => Operation::Update { fact_id: resolve(i, &op.id)?, candidate: candidate(i, op)? },
            "INVALIDATE" | "DELETE" => Operation::Invalidate {
                fact_id: resolve(i, &op.id)?,
                reason: op.reason.clone().unwrap_or_default().chars().take(500).collect(),
            },
            "NOOP" | "NONE" => Operation::Noop,
            other => return Err(format!("operations[{i}].op `{other}` is not ADD, UPDATE, INVALIDATE or NOOP")),
        };
        operations.push(operation);
    }
    let mut summaries = Vec::new();
    for (name, text) in raw.summaries {
        let section = Section::from_json_name(&name).ok_or_else(|| format!("summaries.{name} is not a summary section"))?;
        if text.chars().count() > MAX_SUMMARY_CHARS {
            return Err(format!("summaries.{name} is longer than {MAX_SUMMARY_CHARS} characters"));
        }
        summaries.push((section, text.trim().to_owned()));
    }
    Ok(Answer { operations, summaries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs() -> HashMap<String, String> {
        HashMap::from([("f1".to_owned(), "fact_aaa".to_owned())])
    }

    #[test]
    fn reads_every_operation_and_maps_short_ids() {
        let text = r#"```json
{"operations": [{"op": "ADD", "content": "Prefers Rust", "category": "preference", "confidence": 0.9},
 {"op": "UPDATE", "id": "f1", "content": "Lives in Lisbon", "category": "context", "confidence": 0.95},
 {"op": "INVALIDATE", "id": "fact_aaa", "reason": "moved"}, {"op": "NOOP"}],
 "summaries": {"workContext": "Engineer at Acme"}}
```"#;
        let answer = parse(text, &refs(), 4000).map_err(|e| e.to_string());
        let answer = answer.unwrap_or_default();
        assert_eq!(answer.operations.len(), 4);
        assert!(matches!(&answer.operations[1], Operation::Update { fact_id, .. } if fact_id == "fact_aaa"));
        assert_eq!(answer.summaries, vec![(Section::WorkContext, "Engineer at Acme".to_owned())]);
    }

    #[test]
    fn one_bad_operation_makes_the_answer_malformed() {
        for bad in [
            "not json",
            r#"{"operations": [{"op": "ADD", "content": "x", "confidence": 1.5}]}"#,
            r#"{"operations": [{"op": "UPDATE", "id": "f9", "content": "x", "confidence": 0.9}]}"#,
            r#"{"operations": [{"op": "MERGE"}]}"#,
            r#"{"operations": [{"op": "ADD", "content": "", "confidence": 0.9}]}"#,
            r#"{"operations": [], "summaries": {"mood": "happy"}}"#,
        ] {
            assert!(parse(bad, &refs(), 4000).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_categories_become_other_with_a_label() {
        let answer =
            parse(r#"{"operations": [{"op": "ADD", "content": "Plays chess", "category": "Hobby", "confidence": 0.8}]}"#, &refs(), 4000);
        assert!(
            matches!(answer, Ok(Answer { ref operations, .. }) if matches!(&operations[0], Operation::Add(c) if c.category == "other" && c.category_label == "hobby"))
        );
    }
}
