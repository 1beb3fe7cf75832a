//! The tools of a call, and one shared copy of each tool definition across calls.
//!
//! A call keeps its tools for as long as its stream is open (fallbacks build their own body from
//! them, and usage may be estimated at the end). Nearly every call of a deployment sends the same
//! definitions — the lead agent's built-in tools, an MCP server's catalogue — so a thousand runs
//! waiting on their models held a thousand copies of the same dozen schemas, ≈10 KiB per open stream
//! (issue #11). Calls share one `Arc` per distinct definition instead. Entries are weak, so a
//! definition no call uses any more is freed; dead entries are swept when the table doubles.
//!
//! Hand-written because the interning crates intern strings, not a struct of three, and hold their
//! entries for ever.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

use antler_proto::common::ToolSpec;

/// A tool the model may call. The schema is kept as JSON text, not as the decoded `Struct`: a call
/// keeps its tools for as long as its stream lasts (fallbacks prepare their own body, and usage may be
/// estimated at the end), and a dozen schemas as `Struct` trees took ~40 KiB per open stream, as text
/// a fifth of that.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallTool {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments, as JSON text; None when the request gave none.
    pub parameters: Option<String>,
}

impl CallTool {
    /// The schema as a JSON value (None when none was given).
    pub fn schema(&self) -> Option<serde_json::Value> {
        self.parameters.as_deref().and_then(|text| serde_json::from_str(text).ok())
    }
}

impl From<ToolSpec> for CallTool {
    /// A validated tool (`ChatCall::from_proto`): `parameters_json` is taken as it is (no copy),
    /// `parameters` is turned into the same text.
    fn from(tool: ToolSpec) -> Self {
        let parameters = if tool.parameters_json.is_empty() {
            tool.parameters.as_ref().map(|p| antler_kit::json::struct_to_json_text_as(p, antler_kit::json::Numbers::WholeAsInteger))
        } else {
            Some(tool.parameters_json)
        };
        Self { name: tool.name, description: tool.description, parameters }
    }
}

/// Distinct definitions kept before dead entries are swept; the table never holds more than twice
/// the live ones plus this.
const SWEEP_AT: usize = 1024;

#[derive(Default)]
struct Table {
    entries: HashMap<u64, Weak<CallTool>>,
    sweep_at: usize,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn key(tool: &CallTool) -> u64 {
    let mut hasher = DefaultHasher::new();
    tool.hash(&mut hasher);
    hasher.finish()
}

/// The shared copies of `tools`, in order.
pub fn intern(tools: Vec<CallTool>) -> Vec<Arc<CallTool>> {
    if tools.is_empty() {
        return Vec::new();
    }
    let mut guard = TABLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let table = guard.get_or_insert_with(|| Table { entries: HashMap::new(), sweep_at: SWEEP_AT });
    let shared = tools
        .into_iter()
        .map(|tool| {
            let key = key(&tool);
            if let Some(existing) = table.entries.get(&key).and_then(Weak::upgrade)
                && *existing == tool
            {
                return existing;
            }
            // New, freed, or a hash collision (then the newer one takes the slot).
            let tool = Arc::new(tool);
            table.entries.insert(key, Arc::downgrade(&tool));
            tool
        })
        .collect();
    if table.entries.len() >= table.sweep_at {
        table.entries.retain(|_, weak| weak.strong_count() > 0);
        table.sweep_at = (table.entries.len() * 2).max(SWEEP_AT);
    }
    shared
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, schema: &str) -> CallTool {
        CallTool { name: name.to_owned(), description: format!("{name} things"), parameters: Some(schema.to_owned()) }
    }

    #[test]
    fn equal_definitions_share_one_copy_and_different_ones_do_not() {
        let first = intern(vec![tool("intern_a", "{}"), tool("intern_b", "{}")]);
        let second = intern(vec![tool("intern_a", "{}"), tool("intern_b", r#"{"type":"object"}"#)]);
        assert!(Arc::ptr_eq(&first[0], &second[0]));
        assert!(!Arc::ptr_eq(&first[1], &second[1]));
        assert_eq!(second[1].parameters.as_deref(), Some(r#"{"type":"object"}"#));
    }

    #[test]
    fn a_definition_no_call_holds_is_freed() {
        let weak = Arc::downgrade(&intern(vec![tool("intern_gone", "{}")])[0]);
        assert_eq!(weak.strong_count(), 0);
        let again = intern(vec![tool("intern_gone", "{}")]);
        assert_eq!(again[0].name, "intern_gone");
    }

    #[test]
    fn dead_entries_are_swept() {
        for i in 0..(SWEEP_AT * 3) {
            drop(intern(vec![tool(&format!("intern_sweep_{i}"), "{}")]));
        }
        let guard = TABLE.lock().unwrap_or_else(|p| p.into_inner());
        let live = guard.as_ref().map(|t| t.entries.len()).unwrap_or_default();
        assert!(live <= SWEEP_AT * 2, "{live} entries kept");
    }
}
