//! The tool catalog: tools discovered on servers, under their exposed names, with the hash that tells a
//! stale promotion from a current one.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// Behaviour hints a server declared.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Annotations {
    pub title: String,
    pub read_only: Option<bool>,
    pub destructive: Option<bool>,
    pub idempotent: Option<bool>,
    pub open_world: Option<bool>,
}

/// One tool.
#[derive(Debug)]
pub struct ToolEntry {
    /// Exposed name, `^[A-Za-z0-9_-]+$`.
    pub name: String,
    pub original: String,
    pub description: String,
    pub input_schema: Map<String, Value>,
    pub output_schema: Option<Map<String, Value>>,
    pub annotations: Option<Annotations>,
    pub server: String,
    validator: OnceLock<Option<Arc<jsonschema::Validator>>>,
}

/// Replaces every character outside `[A-Za-z0-9_-]` with `_`.
pub fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}

/// The exposed name of `tool` on `server`.
pub fn exposed_name(server: &str, tool: &str, prefix: bool) -> String {
    if prefix { sanitize(&format!("{server}_{tool}")) } else { sanitize(tool) }
}

impl ToolEntry {
    /// Builds an entry from an rmcp tool (read through its JSON form, which is stable across rmcp versions).
    pub fn from_mcp(server: &str, prefix: bool, tool: &rmcp::model::Tool) -> Option<Self> {
        let original = tool.name.to_string();
        let name = exposed_name(server, &original, prefix);
        if original.is_empty() || name.is_empty() {
            return None;
        }
        let annotations = tool.annotations.as_ref().and_then(|a| serde_json::to_value(a).ok()).map(|v| Annotations {
            title: v.get("title").and_then(Value::as_str).unwrap_or_default().to_owned(),
            read_only: v.get("readOnlyHint").and_then(Value::as_bool),
            destructive: v.get("destructiveHint").and_then(Value::as_bool),
            idempotent: v.get("idempotentHint").and_then(Value::as_bool),
            open_world: v.get("openWorldHint").and_then(Value::as_bool),
        });
        Some(Self {
            name,
            original,
            description: tool.description.as_deref().unwrap_or_default().to_owned(),
            input_schema: (*tool.input_schema).clone(),
            output_schema: tool.output_schema.as_ref().map(|s| (**s).clone()),
            annotations,
            server: server.to_owned(),
            validator: OnceLock::new(),
        })
    }

    /// The compiled input schema; None when the server's schema does not compile (then nothing is checked
    /// here and the server judges the arguments).
    pub fn validator(&self) -> Option<Arc<jsonschema::Validator>> {
        self.validator
            .get_or_init(|| match jsonschema::validator_for(&Value::Object(self.input_schema.clone())) {
                Ok(v) => Some(Arc::new(v)),
                Err(error) => {
                    tracing::warn!(server = %self.server, tool = %self.original, %error, "tool input schema does not compile; arguments are not checked");
                    None
                }
            })
            .clone()
    }
}

/// Drops later tools whose exposed name is already taken (the catalog is in server-name order).
pub fn dedup(tools: Vec<Arc<ToolEntry>>) -> Vec<Arc<ToolEntry>> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(tools.len());
    for tool in tools {
        if seen.insert(tool.name.clone()) {
            out.push(tool);
        } else {
            tracing::warn!(server = %tool.server, tool = %tool.original, name = %tool.name, "tool dropped: its exposed name is taken by another server's tool");
        }
    }
    out
}

/// First 16 hex characters of the SHA-256 of the sorted `[{name, description, parameters}]` list.
pub fn catalog_hash(tools: &[Arc<ToolEntry>]) -> String {
    let sorted: BTreeMap<&str, Value> = tools
        .iter()
        .map(|t| (t.name.as_str(), json!({"name": t.name, "description": t.description, "parameters": t.input_schema})))
        .collect();
    let list: Vec<&Value> = sorted.values().collect();
    let text = serde_json::to_string(&list).unwrap_or_default();
    hex::encode(Sha256::digest(text.as_bytes()))[..16].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_and_sanitised() {
        assert_eq!(exposed_name("git hub", "create.issue", true), "git_hub_create_issue");
        assert_eq!(exposed_name("fs", "read-file", false), "read-file");
    }
}
