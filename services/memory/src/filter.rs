//! Which parts of a conversation reach extraction, as DeerFlow's `filter_messages_for_memory` decides:
//! user messages (except hidden ones) and assistant messages without tool calls; tool traffic, system
//! prompts, upload notices and injected memory removed; a user message that was only an upload notice is
//! dropped together with the assistant reply that follows it; trivial turns ("ok", "thanks") dropped.
//!
//! What is removed is not forgotten entirely: system prompts, tool results and uploaded file listings
//! are kept as *refusals*, text an extracted fact must not repeat (a fact quoting them is a template
//! leak or a file's contents, not something the user said). Every kept text passes through the secret
//! redactor, so a run's secrets registered in this process never reach the memory database.

use antler_proto::common::{Message, Role, content_part};
use serde::{Deserialize, Serialize};

/// One kept turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub role: String,
    pub text: String,
}

/// The filtered conversation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filtered {
    pub turns: Vec<Turn>,
    pub refusals: Vec<String>,
    /// Id of the last kept user message.
    pub message_id: String,
}

const BLOCKS: [(&str, &str); 4] = [
    ("<uploaded_files>", "</uploaded_files>"),
    ("<current_uploads>", "</current_uploads>"),
    ("<memory>", "</memory>"),
    ("<system-reminder>", "</system-reminder>"),
];

/// Removes the tagged blocks; returns the rest and the removed blocks' text.
fn strip_blocks(text: &str) -> (String, Vec<String>) {
    let mut rest = text.to_owned();
    let mut removed = Vec::new();
    for (open, close) in BLOCKS {
        while let Some(start) = rest.find(open) {
            let end = rest[start..].find(close).map_or(rest.len(), |e| start + e + close.len());
            removed.push(rest[start..end].to_owned());
            rest.replace_range(start..end, "");
        }
    }
    (rest.trim().to_owned(), removed)
}

/// Turns with nothing to remember.
fn trivial(text: &str) -> bool {
    const TRIVIAL: [&str; 16] =
        ["ok", "okay", "k", "thanks", "thank you", "thx", "ty", "yes", "no", "sure", "great", "cool", "nice", "got it", "hi", "hello"];
    let t = text.trim().trim_end_matches(['!', '.', '?']).to_lowercase();
    t.is_empty() || TRIVIAL.contains(&t.as_str())
}

fn text_of(message: &Message) -> String {
    let mut out = String::new();
    for part in &message.content {
        if let Some(content_part::Part::Text(t)) = &part.part {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&t.text);
        }
    }
    out
}

fn hidden(message: &Message) -> bool {
    let Some(metadata) = &message.metadata else { return false };
    let flag =
        |key: &str| matches!(metadata.fields.get(key).and_then(|v| v.kind.as_ref()), Some(prost_types::value::Kind::BoolValue(true)));
    flag("hide_from_ui") && !flag("human_input_response")
}

/// Filters `messages` (oldest first).
pub fn filter(messages: &[Message]) -> Filtered {
    let mut out = Filtered::default();
    let mut skip_next_reply = false;
    for message in messages {
        let text = antler_kit::redact::redact(&text_of(message)).into_owned();
        let role = Role::try_from(message.role).unwrap_or(Role::Unspecified);
        match role {
            Role::User => {
                skip_next_reply = false;
                if hidden(message) {
                    continue;
                }
                let (rest, removed) = strip_blocks(&text);
                let had_blocks = !removed.is_empty();
                out.refusals.extend(removed);
                if rest.is_empty() && had_blocks {
                    skip_next_reply = true;
                    continue;
                }
                if trivial(&rest) {
                    continue;
                }
                if !message.id.is_empty() {
                    out.message_id = message.id.clone();
                }
                out.turns.push(Turn { role: "user".to_owned(), text: rest });
            }
            Role::Assistant => {
                if !message.tool_calls.is_empty() {
                    for call in &message.tool_calls {
                        out.refusals.push(call.name.clone());
                    }
                    continue;
                }
                if std::mem::take(&mut skip_next_reply) {
                    continue;
                }
                let (rest, removed) = strip_blocks(&text);
                out.refusals.extend(removed);
                if !trivial(&rest) {
                    out.turns.push(Turn { role: "assistant".to_owned(), text: rest });
                }
            }
            Role::System | Role::Tool | Role::Unspecified => {
                if !text.trim().is_empty() {
                    out.refusals.push(text);
                }
            }
        }
    }
    out
}

/// Keeps the newest turns that fit in `max_chars` (the oldest are cut first).
pub fn bound(turns: &mut Vec<Turn>, max_chars: usize) {
    let mut total = 0usize;
    let mut keep_from = turns.len();
    for (i, turn) in turns.iter().enumerate().rev() {
        total += turn.text.chars().count();
        if total > max_chars && keep_from < turns.len() {
            break;
        }
        keep_from = i;
    }
    turns.drain(..keep_from);
    if let Some(first) = turns.first_mut() {
        let count = first.text.chars().count();
        if count > max_chars {
            first.text = first.text.chars().skip(count - max_chars).collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use antler_proto::common::{ContentPart, TextPart, ToolCall};

    use super::*;

    fn message(role: Role, text: &str) -> Message {
        Message {
            role: role as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
            ..Message::default()
        }
    }

    #[test]
    fn keeps_user_and_final_assistant_turns_only() {
        let mut call = message(Role::Assistant, "let me look");
        call.tool_calls.push(ToolCall { id: "c1".into(), name: "read_file".into(), ..ToolCall::default() });
        let filtered = filter(&[
            message(Role::System, "You are DeerFlow, a helpful agent."),
            message(Role::User, "I work at Acme on billing, in Rust"),
            call,
            message(Role::Tool, "fn main() { secret_sauce() }"),
            message(Role::Assistant, "Noted: Rust at Acme."),
            message(Role::User, "thanks!"),
        ]);
        let roles: Vec<&str> = filtered.turns.iter().map(|t| t.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant"]);
        assert!(filtered.refusals.iter().any(|r| r.contains("You are DeerFlow")));
        assert!(filtered.refusals.iter().any(|r| r.contains("secret_sauce")));
    }

    #[test]
    fn upload_only_messages_drop_the_next_reply_and_memory_blocks_go() {
        let filtered = filter(&[
            message(Role::User, "<uploaded_files>\n- report.pdf\n</uploaded_files>"),
            message(Role::Assistant, "I see you uploaded report.pdf"),
            message(Role::User, "<memory>User Context: old</memory>\nI moved to Lisbon"),
        ]);
        assert_eq!(filtered.turns, vec![Turn { role: "user".into(), text: "I moved to Lisbon".into() }]);
    }

    #[test]
    fn bound_keeps_the_newest_text() {
        let mut turns = vec![
            Turn { role: "user".into(), text: "a".repeat(50) },
            Turn { role: "assistant".into(), text: "b".repeat(50) },
            Turn { role: "user".into(), text: "c".repeat(10) },
        ];
        bound(&mut turns, 70);
        assert_eq!(turns.len(), 2);
        assert!(turns[0].text.starts_with('b'));
    }
}
