//! DeerFlow's `memory.json`, read and written.
//!
//! Version "1.0" keeps the facts inside the document: `{"version", "lastUpdated", "user": {workContext,
//! personalContext, topOfMind}, "history": {recentMonths, earlierContext, longTermBackground}, "facts":
//! [{id, content, category, confidence, createdAt, source}]}`, each section `{summary, updatedAt}` and a
//! fact's `source` the thread id. Version "2.0" (DeerMem) keeps only the summaries in `memory.json`
//! (plus `revision`) and each fact in its own Markdown file with YAML front matter; Antler reads and
//! writes the v2 form as one document, the manifest with a `facts` array of front-matter objects that
//! also carry the Markdown body as `content` (`id`, `schemaVersion: 2`, `category`,
//! `categoryExtension`, `confidence`, `status`, `source {type, threadId}`, `createdAt`, `updatedAt`,
//! `revision`, `confirmationCount`, `lastConfirmedAt`, `sourceError`).

use std::str::FromStr;

use serde_json::{Map, Value, json};

use crate::error::MemoryError;
use crate::facts::{self, CATEGORIES, NewFact};
use crate::profile::{Profile, Section};
use crate::store::entity::facts::Model as Fact;

/// What a document holds, ready to write.
#[derive(Debug, Default)]
pub struct Parsed {
    pub version: String,
    pub sections: Vec<(Section, String, Option<i64>)>,
    pub facts: Vec<NewFact>,
    /// Facts not imported because their v2 status is not `active`.
    pub inactive: u32,
}

fn parse_time(value: Option<&Value>) -> Option<i64> {
    let text = value?.as_str()?;
    let ts = prost_types::Timestamp::from_str(text).ok()?;
    Some(ts.seconds * 1000 + i64::from(ts.nanos) / 1_000_000)
}

/// RFC 3339 UTC with milliseconds, as DeerFlow writes (`2026-01-02T03:04:05.678Z`).
pub fn format_time(ms: i64) -> String {
    let ts = prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 };
    ts.to_string()
}

fn invalid(path: &str, message: impl std::fmt::Display) -> MemoryError {
    MemoryError::invalid(format!("document{path}"), message)
}

/// Reads a memory.json document (`max_fact_chars` bounds each fact's content).
pub fn parse(document: &str, max_fact_chars: usize) -> Result<Parsed, MemoryError> {
    let root: Value = serde_json::from_str(document).map_err(|e| invalid("", format!("is not JSON: {e}")))?;
    let Some(root) = root.as_object() else { return Err(invalid("", "must be a JSON object")) };
    let version = match root.get("version") {
        None => "1.0".to_owned(),
        Some(Value::String(v)) if v == "1.0" || v == "1" => "1.0".to_owned(),
        Some(Value::String(v)) if v == "2.0" || v == "2" => "2.0".to_owned(),
        Some(other) => return Err(invalid(".version", format!("{other} is not a memory.json version; \"1.0\" and \"2.0\" are"))),
    };
    let mut parsed = Parsed { version: version.clone(), ..Parsed::default() };
    for section in Section::ALL {
        let Some(group) = root.get(section.group()) else { continue };
        let Some(value) = group.get(section.json_name()) else { continue };
        let path = format!(".{}.{}", section.group(), section.json_name());
        let (summary, at) = match value {
            Value::String(s) => (s.clone(), None),
            Value::Object(o) => match o.get("summary") {
                Some(Value::String(s)) => (s.clone(), parse_time(o.get("updatedAt"))),
                None | Some(Value::Null) => continue,
                Some(_) => return Err(invalid(&format!("{path}.summary"), "must be a string")),
            },
            Value::Null => continue,
            _ => return Err(invalid(&path, "must be an object {summary, updatedAt}")),
        };
        if !summary.trim().is_empty() {
            parsed.sections.push((section, summary.trim().to_owned(), at));
        }
    }
    let list = match root.get("facts") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(invalid(".facts", "must be an array")),
    };
    for (i, fact) in list.iter().enumerate() {
        let path = format!(".facts[{i}]");
        let Some(fact) = fact.as_object() else { return Err(invalid(&path, "must be an object")) };
        if let Some(status) = fact.get("status").and_then(Value::as_str)
            && status != "active"
        {
            parsed.inactive += 1;
            continue;
        }
        let content = fact.get("content").and_then(Value::as_str).map(str::trim).unwrap_or_default();
        if content.is_empty() {
            return Err(invalid(&format!("{path}.content"), "is required"));
        }
        if content.chars().count() > max_fact_chars {
            return Err(invalid(
                &format!("{path}.content"),
                format!("is longer than the limit of {max_fact_chars} characters (memory.max_fact_chars)"),
            ));
        }
        let confidence = match fact.get("confidence") {
            None | Some(Value::Null) => 0.7,
            Some(v) => v
                .as_f64()
                .filter(|c| (0.0..=1.0).contains(c))
                .ok_or_else(|| invalid(&format!("{path}.confidence"), "must be a number from 0 to 1"))?,
        };
        let raw_category = fact.get("category").and_then(Value::as_str).unwrap_or("context").trim().to_lowercase();
        let (category, label) = if CATEGORIES.contains(&raw_category.as_str()) {
            let label = if raw_category == "other" {
                fact.get("categoryExtension").and_then(Value::as_str).unwrap_or_default().to_owned()
            } else {
                String::new()
            };
            (raw_category, label)
        } else {
            ("other".to_owned(), raw_category.chars().take(64).collect())
        };
        let (kind, thread) = match fact.get("source") {
            Some(Value::String(thread)) => (facts::source::IMPORT, thread.clone()),
            Some(Value::Object(o)) => (facts::source::IMPORT, o.get("threadId").and_then(Value::as_str).unwrap_or_default().to_owned()),
            _ => (facts::source::IMPORT, String::new()),
        };
        let created = parse_time(fact.get("createdAt"));
        parsed.facts.push(NewFact {
            content: content.to_owned(),
            category,
            category_label: label,
            confidence,
            source_kind: kind.to_owned(),
            thread_id: thread.chars().take(256).collect(),
            run_id: String::new(),
            message_id: fact.get("id").and_then(Value::as_str).unwrap_or_default().chars().take(256).collect(),
            source_error: fact.get("sourceError").and_then(Value::as_str).unwrap_or_default().chars().take(1000).collect(),
            valid_from: created,
            created_at: created,
            supersedes: String::new(),
            confirmation_count: fact.get("confirmationCount").and_then(Value::as_i64).unwrap_or(0).clamp(0, i64::from(i32::MAX)) as i32,
            last_confirmed_at: parse_time(fact.get("lastConfirmedAt")),
        });
    }
    Ok(parsed)
}

fn sections_json(profile: &Profile, group: &str) -> Value {
    let mut out = Map::new();
    for section in Section::ALL.into_iter().filter(|s| s.group() == group) {
        let (summary, at) = profile.get(section);
        out.insert(section.json_name().to_owned(), json!({"summary": summary, "updatedAt": at.map(format_time).unwrap_or_default()}));
    }
    Value::Object(out)
}

fn source_type(kind: &str) -> &str {
    match kind {
        facts::source::CONVERSATION | facts::source::MANUAL | facts::source::CONSOLIDATION | facts::source::IMPORT => kind,
        _ => "unknown",
    }
}

/// Writes a memory.json document of `version` ("1.0" or "2.0").
pub fn export(version: &str, profile: &Profile, live: &[Fact], revision: i64) -> String {
    let last = live.iter().map(|f| f.created_at).chain(profile.updated_at).max().map(format_time).unwrap_or_default();
    let category = |f: &Fact| f.category.clone();
    let facts: Vec<Value> = live
        .iter()
        .map(|f| {
            if version == "1.0" {
                json!({"id": f.fact_id, "content": f.content, "category": category(f), "confidence": f.confidence,
                       "createdAt": format_time(f.created_at), "source": f.source_thread_id})
            } else {
                let mut v = json!({"id": f.fact_id, "schemaVersion": 2, "category": category(f), "confidence": f.confidence,
                    "status": "active", "content": f.content,
                    "source": {"type": source_type(&f.source_kind), "threadId": f.source_thread_id},
                    "createdAt": format_time(f.created_at), "updatedAt": format_time(f.created_at), "revision": 1,
                    "confirmationCount": f.confirmation_count, "agent_name": f.agent_name});
                if let Some(map) = v.as_object_mut() {
                    if f.category == "other" && !f.category_label.is_empty() {
                        map.insert("categoryExtension".to_owned(), json!(f.category_label));
                    }
                    if let Some(at) = f.last_confirmed_at {
                        map.insert("lastConfirmedAt".to_owned(), json!(format_time(at)));
                    }
                    if !f.source_error.is_empty() {
                        map.insert("sourceError".to_owned(), json!(f.source_error));
                    }
                }
                v
            }
        })
        .collect();
    let document = json!({
        "version": version,
        "revision": revision,
        "lastUpdated": last,
        "user": sections_json(profile, "user"),
        "history": sections_json(profile, "history"),
        "facts": facts,
    });
    serde_json::to_string_pretty(&document).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_v1_document() {
        let doc = r#"{"version": "1.0", "lastUpdated": "2025-06-01T10:00:00Z",
          "user": {"workContext": {"summary": "Data engineer at Acme", "updatedAt": "2025-06-01T10:00:00Z"},
                   "personalContext": {"summary": "", "updatedAt": ""}, "topOfMind": {"summary": "Migrating to Iceberg", "updatedAt": ""}},
          "history": {"recentMonths": {"summary": "Built the lakehouse", "updatedAt": ""}},
          "facts": [{"id": "fact_1", "content": "Prefers Python", "category": "preference", "confidence": 0.9,
                     "createdAt": "2025-05-01T00:00:00Z", "source": "thread-1"},
                    {"id": "fact_2", "content": "Has a cat", "category": "hobby", "confidence": 0.8, "createdAt": "2025-05-02T00:00:00Z", "source": "thread-2"}]}"#;
        let parsed = parse(doc, 4000).map_err(|e| e.to_string());
        let parsed = parsed.unwrap_or_default();
        assert_eq!(parsed.version, "1.0");
        assert_eq!(parsed.sections.len(), 3);
        assert_eq!(parsed.facts.len(), 2);
        assert_eq!(parsed.facts[0].thread_id, "thread-1");
        assert_eq!(parsed.facts[0].created_at, Some(1_746_057_600_000));
        assert_eq!((parsed.facts[1].category.as_str(), parsed.facts[1].category_label.as_str()), ("other", "hobby"));
    }

    #[test]
    fn bad_documents_name_the_json_path() {
        for (doc, field) in [
            ("[]", "document"),
            (r#"{"version": "3.0"}"#, "document.version"),
            (r#"{"facts": [{"content": ""}]}"#, "document.facts[0].content"),
            (r#"{"facts": [{"content": "x", "confidence": 2.0}]}"#, "document.facts[0].confidence"),
        ] {
            let error = parse(doc, 4000).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.starts_with(field), "{doc}: {error}");
        }
    }

    #[test]
    fn time_round_trips() {
        assert_eq!(parse_time(Some(&json!(format_time(1_746_057_600_123)))), Some(1_746_057_600_123));
    }
}
