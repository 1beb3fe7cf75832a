//! The thread state the lead agent works on, and how it travels in a checkpoint: messages in
//! `Checkpoint.messages`, every other channel in `Checkpoint.values`.

use antler_proto::common::{ContentPart, Message, Role, TextPart, ToolCall, content_part};
use std::collections::BTreeMap;

use antler_proto::runs::Checkpoint;
use prost_types::value::Kind;
use prost_types::{Struct, Value};

/// Messages plus the named channels of the thread.
#[derive(Debug, Clone, Default)]
pub struct ThreadState {
    pub messages: Vec<Message>,
    pub title: String,
    /// Paths passed to `present_files` (this thread's deliverables).
    pub artifacts: Vec<String>,
    pub sandbox_id: String,
    /// Loop step count of the current run (model calls plus tool rounds).
    pub step: i64,
    /// The run that wrote `step` (steps restart for each run).
    pub step_run_id: String,
    /// The plan (`write_todos`, plan mode).
    pub todos: Vec<Todo>,
    /// Why the run `step_run_id` stopped early (`loop_capped`, `clarification`, …); empty otherwise.
    /// Kept so that an attempt resuming after the stop finishes with the same reason.
    pub stop_reason: String,
    /// The outputs directory when the run `step_run_id` started (path → SHA-256), so the delivery
    /// receipt lists what this run produced; kept in checkpoints so a resumed attempt has it too.
    pub outputs_before: Option<BTreeMap<String, String>>,
    /// Deferred tools promoted by `tool_search` during this thread's runs.
    pub promoted: Promoted,
    /// What the Summarization layer condensed of the older messages (empty: nothing yet).
    pub summary_text: String,
    /// SKILL.md paths of the skills activated on this thread (read by the model), in order; their
    /// `allowed-tools` apply (the SkillToolPolicy layer).
    pub skill_context: Vec<String>,
}

/// Deferred tools promoted by `tool_search`, and the catalog they belong to. Kept in checkpoints, so a
/// resumed attempt still offers them, unless the catalog changed meanwhile (then they are stale).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Promoted {
    pub catalog_hash: String,
    pub names: Vec<String>,
}

impl Promoted {
    /// DeerFlow's `merge_promoted`: nothing new keeps what there is, another catalog replaces it,
    /// the same catalog adds the new names in order.
    pub fn merge(&mut self, catalog_hash: &str, names: &[String]) {
        if names.is_empty() {
            return;
        }
        if self.catalog_hash != catalog_hash {
            self.catalog_hash = catalog_hash.to_owned();
            self.names.clear();
        }
        for name in names {
            if !self.names.contains(name) {
                self.names.push(name.clone());
            }
        }
    }
}

/// One item of the plan.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Todo {
    pub content: String,
    /// `pending`, `in_progress` or `completed`.
    pub status: String,
}

impl Todo {
    pub fn done(&self) -> bool {
        self.status == "completed"
    }
}

impl ThreadState {
    /// The state a checkpoint holds.
    pub fn from_checkpoint(checkpoint: &Checkpoint) -> Self {
        let values = checkpoint.values.clone().unwrap_or_default();
        let text = |key: &str| match values.fields.get(key).and_then(|v| v.kind.as_ref()) {
            Some(Kind::StringValue(s)) => s.clone(),
            _ => String::new(),
        };
        let artifacts = match values.fields.get("artifacts").and_then(|v| v.kind.as_ref()) {
            Some(Kind::ListValue(list)) => list
                .values
                .iter()
                .filter_map(|v| match &v.kind {
                    Some(Kind::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let step = match values.fields.get("lead_step").and_then(|v| v.kind.as_ref()) {
            Some(Kind::NumberValue(n)) => *n as i64,
            _ => 0,
        };
        let todos = values
            .fields
            .get("todos")
            .map(antler_kit::json::value_to_json)
            .and_then(|v| serde_json::from_value::<Vec<Todo>>(v).ok())
            .unwrap_or_default();
        let outputs_before = match values.fields.get("outputs_before").and_then(|v| v.kind.as_ref()) {
            Some(Kind::StructValue(files)) => Some(
                files
                    .fields
                    .iter()
                    .filter_map(|(path, sha)| match &sha.kind {
                        Some(Kind::StringValue(sha)) => Some((path.clone(), sha.clone())),
                        _ => None,
                    })
                    .collect(),
            ),
            _ => None,
        };
        let promoted = values
            .fields
            .get("promoted")
            .map(antler_kit::json::value_to_json)
            .and_then(|v| serde_json::from_value::<Promoted>(v).ok())
            .unwrap_or_default();
        let skill_context = values
            .fields
            .get("skill_context")
            .map(antler_kit::json::value_to_json)
            .and_then(|v| serde_json::from_value::<Vec<String>>(v).ok())
            .unwrap_or_default();
        Self {
            skill_context,
            summary_text: text("summary_text"),
            promoted,
            outputs_before,
            todos,
            stop_reason: text("stop_reason"),
            messages: checkpoint.messages.clone(),
            title: text("title"),
            artifacts,
            sandbox_id: text("sandbox_id"),
            step,
            step_run_id: checkpoint.run_id.clone(),
        }
    }

    /// Every channel except the messages, for a checkpoint.
    pub fn values(&self) -> Struct {
        let string = |s: &str| Value { kind: Some(Kind::StringValue(s.to_owned())) };
        let mut values = Struct::default();
        values.fields.insert("title".to_owned(), string(&self.title));
        values.fields.insert("sandbox_id".to_owned(), string(&self.sandbox_id));
        values.fields.insert(
            "artifacts".to_owned(),
            Value { kind: Some(Kind::ListValue(prost_types::ListValue { values: self.artifacts.iter().map(|a| string(a)).collect() })) },
        );
        values.fields.insert("lead_step".to_owned(), Value { kind: Some(Kind::NumberValue(self.step as f64)) });
        values.fields.insert("stop_reason".to_owned(), string(&self.stop_reason));
        if !self.summary_text.is_empty() {
            values.fields.insert("summary_text".to_owned(), string(&self.summary_text));
        }
        if let Some(files) = &self.outputs_before {
            let fields = files.iter().map(|(path, sha)| (path.clone(), string(sha))).collect();
            values.fields.insert("outputs_before".to_owned(), Value { kind: Some(Kind::StructValue(Struct { fields })) });
        }
        if !self.promoted.names.is_empty()
            && let Ok(promoted) = serde_json::to_value(&self.promoted)
        {
            values.fields.insert("promoted".to_owned(), antler_kit::json::json_to_value(&promoted));
        }
        if !self.skill_context.is_empty() {
            let paths = self.skill_context.iter().map(|p| string(p)).collect();
            values
                .fields
                .insert("skill_context".to_owned(), Value { kind: Some(Kind::ListValue(prost_types::ListValue { values: paths })) });
        }
        if let Ok(todos) = serde_json::to_value(&self.todos) {
            values.fields.insert("todos".to_owned(), antler_kit::json::json_to_value(&todos));
        }
        values
    }

    /// The last assistant message's tool calls that have no result yet.
    pub fn pending_tool_calls(&self) -> Vec<ToolCall> {
        let Some(index) = self.messages.iter().rposition(|m| m.role == Role::Assistant as i32) else { return Vec::new() };
        let answered: Vec<&str> =
            self.messages[index + 1..].iter().filter(|m| m.role == Role::Tool as i32).map(|m| m.tool_call_id.as_str()).collect();
        self.messages[index].tool_calls.iter().filter(|c| !answered.contains(&c.id.as_str())).cloned().collect()
    }
}

/// The visible text of a message.
pub fn text_of(message: &Message) -> String {
    message
        .content
        .iter()
        .filter_map(|p| match &p.part {
            Some(content_part::Part::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("")
}

/// A message with one text part.
/// Makes an assistant turn final: its tool calls are dropped (they will not run) and `note` is
/// appended to its last text part (or becomes one). The layers that force a final answer use it.
pub fn finish_with_note(message: &mut Message, note: &str) {
    message.tool_calls.clear();
    let last_text = message.content.iter_mut().rev().find_map(|p| match &mut p.part {
        Some(content_part::Part::Text(t)) => Some(t),
        _ => None,
    });
    match last_text {
        Some(text) => text.text.push_str(note),
        None => message.content.push(ContentPart { part: Some(content_part::Part::Text(TextPart { text: note.trim_start().to_owned() })) }),
    }
}

pub fn text_message(role: Role, text: impl Into<String>) -> Message {
    Message {
        id: uuid::Uuid::now_v7().to_string(),
        role: role as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.into() })) }],
        ..Message::default()
    }
}

/// A tool result message answering `call`.
pub fn tool_message(call: &ToolCall, text: impl Into<String>, is_error: bool) -> Message {
    let mut message = text_message(Role::Tool, text);
    message.tool_call_id = call.id.clone();
    message.name = call.name.clone();
    message.is_error = is_error;
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_a_checkpoint() {
        let state = ThreadState {
            title: "T".to_owned(),
            artifacts: vec!["/mnt/user-data/outputs/a.md".to_owned()],
            step: 7,
            outputs_before: Some(BTreeMap::from([("/mnt/user-data/outputs/a.md".to_owned(), "ab12".to_owned())])),
            ..ThreadState::default()
        };
        let checkpoint = Checkpoint { values: Some(state.values()), run_id: "r".to_owned(), ..Checkpoint::default() };
        let back = ThreadState::from_checkpoint(&checkpoint);
        assert_eq!((back.title.as_str(), back.artifacts.clone(), back.step), ("T", state.artifacts.clone(), 7));
        assert_eq!(back.outputs_before, state.outputs_before);
    }

    #[test]
    fn pending_tool_calls_are_the_unanswered_ones_of_the_last_assistant_turn() {
        let call = |id: &str| ToolCall { id: id.to_owned(), name: "bash".to_owned(), ..ToolCall::default() };
        let mut assistant = text_message(Role::Assistant, "");
        assistant.tool_calls = vec![call("a"), call("b")];
        let state = ThreadState { messages: vec![assistant, tool_message(&call("a"), "ok", false)], ..ThreadState::default() };
        let pending: Vec<String> = state.pending_tool_calls().into_iter().map(|c| c.id).collect();
        assert_eq!(pending, vec!["b".to_owned()]);
    }
}
