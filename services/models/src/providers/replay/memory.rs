//! What a replay model answers the memory layer with, when its script asks for it (`memory:`), so the
//! built-in `demo` model can play the README's memory walkthrough offline:
//!
//! * **extract**: a call from the memory service's extraction worker (caller `middleware:memory`) is not
//!   played from the turns — it has no assistant message, so it would get turn 0, a tool call, and the
//!   memory service would drop that as a malformed answer. It gets instead an answer in the memory
//!   service's strict JSON format, derived from the `<conversation>` of the prompt by one fixed rule:
//!   every sentence of a user message that speaks about the user in the first person ("I …", "I'm …",
//!   "My …"; not a question) becomes one ADD of "The user said: <sentence>", category `preference` when
//!   the sentence says always / never / prefer / like / love / hate / usually / favourite, else
//!   `context`, confidence 0.9 (stated explicitly); no such sentence → one NOOP. A real model phrases
//!   facts better; this one only ever repeats what the user said.
//! * **recall**: when the system prompt holds a `<memory>` block (what the lead agent's Memory layer
//!   injects), the first answer of the conversation starts with "From memory: " and the facts it lists,
//!   so what was injected shows in the run's output.
//!
//! The prompt format read here is the memory service's (`services/memory/src/extract.rs`: the
//! conversation as `role: text` lines inside `<conversation>`, HTML-escaped; `render.rs`: fact lines
//! `- [category | 0.95] content`); `integration-tests/python/test_readme_examples.py` runs both sides.

use antler_proto::common::{Message, Role, content_part};
use serde_json::{Value, json};

use crate::request::ChatCall;

/// The caller tag of the memory service's extraction calls (`antler_memory::worker::CALLER`).
pub const EXTRACTION_CALLER: &str = "middleware:memory";

/// Most facts one derived answer adds.
const MAX_FACTS: usize = 10;

/// Words that make a first-person sentence a preference.
const PREFERENCE_WORDS: &[&str] =
    &["always", "never", "prefer", "prefers", "like", "love", "hate", "usually", "favourite", "favorite", "rather"];

/// Whether `call` is a memory extraction call.
pub fn is_extraction(call: &ChatCall) -> bool {
    call.caller == EXTRACTION_CALLER
}

/// The extraction answer (one JSON object, as text) for `call`'s conversation.
pub fn extraction_answer(call: &ChatCall) -> String {
    let prompt = call.messages.iter().rev().find(|m| m.role == Role::User as i32).map(text_of).unwrap_or_default();
    let conversation = between(&prompt, "<conversation>", "</conversation>").unwrap_or_default();
    let mut said: Vec<String> = Vec::new();
    for line in conversation.lines() {
        let Some(text) = line.strip_prefix("user: ") else { continue };
        for sentence in sentences(&unescape(text)) {
            if said.len() < MAX_FACTS && first_person(&sentence) && !said.contains(&sentence) {
                said.push(sentence);
            }
        }
    }
    let mut operations: Vec<Value> = said
        .iter()
        .map(|sentence| {
            let category = if preference(sentence) { "preference" } else { "context" };
            json!({"op": "ADD", "content": format!("The user said: {sentence}"), "category": category, "confidence": 0.9})
        })
        .collect();
    if operations.is_empty() {
        operations.push(json!({"op": "NOOP"}));
    }
    json!({ "operations": operations }).to_string()
}

/// The facts of the `<memory>` block in `call`'s system prompt, as "From memory: …" text to start an
/// answer with; None without such a block or with no facts in it.
pub fn recalled(call: &ChatCall) -> Option<String> {
    let system = call.messages.iter().find(|m| m.role == Role::System as i32).map(text_of)?;
    let block = between(&system, "<memory>", "</memory>")?;
    let facts: Vec<String> = block
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- ["))
        .filter_map(|rest| rest.split_once("] ").map(|(_, content)| unescape(content.trim())))
        .filter(|content| !content.is_empty())
        .collect();
    (!facts.is_empty()).then(|| format!("From memory: {} ", facts.join(" / ")))
}

fn text_of(message: &Message) -> String {
    message
        .content
        .iter()
        .filter_map(|part| match &part.part {
            Some(content_part::Part::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("")
}

/// The text between the last `open` and the `close` after it.
fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.rfind(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(text[start..end].trim())
}

/// The memory service escapes `& < > " '` in everything it shows a model.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'").replace("&amp;", "&")
}

/// `text` cut after each `.`, `!` or `?` that ends a word, trimmed, empty pieces left out.
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        current.push(ch);
        if matches!(ch, '.' | '!' | '?') && chars.peek().is_none_or(|next| next.is_whitespace()) {
            let sentence = current.trim();
            if !sentence.is_empty() {
                out.push(sentence.to_owned());
            }
            current.clear();
        }
    }
    let rest = current.trim();
    if !rest.is_empty() {
        out.push(format!("{rest}."));
    }
    out
}

/// A statement about the speaker: starts with I / I'm / I've / I'd / I'll / I am / My, and is not a question.
fn first_person(sentence: &str) -> bool {
    if sentence.ends_with('?') {
        return false;
    }
    let first = sentence.split_whitespace().next().unwrap_or_default().replace('’', "'");
    matches!(first.as_str(), "I" | "I'm" | "I've" | "I'd" | "I'll" | "My" | "my")
}

fn preference(sentence: &str) -> bool {
    sentence.split(|c: char| !c.is_alphanumeric()).any(|word| PREFERENCE_WORDS.iter().any(|p| word.eq_ignore_ascii_case(p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ChatCall;
    use antler_proto::common::{ContentPart, TextPart};
    use antler_proto::models::ChatRequest;

    fn message(role: Role, text: &str) -> Message {
        Message {
            role: role as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
            ..Message::default()
        }
    }

    fn call(caller: &str, messages: Vec<Message>) -> ChatCall {
        let request = ChatRequest { messages, caller: caller.to_owned(), ..ChatRequest::default() };
        let call = ChatCall::from_proto(request, std::time::Instant::now());
        call.unwrap_or_else(|e| panic!("a valid request: {e}"))
    }

    /// The memory service's prompt, as `extract::prompt` builds it.
    fn extraction_prompt(conversation: &str) -> String {
        format!(
            "<current_memory>\n{{\"facts\":[],\"summaries\":{{}}}}\n</current_memory>\n\n<conversation>\n{conversation}\n</conversation>"
        )
    }

    fn operations(answer: &str) -> Vec<Value> {
        let parsed: Value = serde_json::from_str(answer).unwrap_or_default();
        parsed["operations"].as_array().cloned().unwrap_or_default()
    }

    #[test]
    fn first_person_statements_of_the_user_become_facts() {
        let prompt = extraction_prompt(
            "user: I always write my services in Rust. Can you help me? Start a new service.\n\
             assistant: I will write it in Rust.\n\
             user: I&#39;m a data engineer at Acme &amp; co",
        );
        let call = call(EXTRACTION_CALLER, vec![message(Role::System, "You maintain the long-term memory"), message(Role::User, &prompt)]);
        assert!(is_extraction(&call));
        let ops = operations(&extraction_answer(&call));
        assert_eq!(
            ops,
            vec![
                json!({"op": "ADD", "content": "The user said: I always write my services in Rust.", "category": "preference", "confidence": 0.9}),
                json!({"op": "ADD", "content": "The user said: I'm a data engineer at Acme & co.", "category": "context", "confidence": 0.9}),
            ],
            "questions, requests and the assistant's words are not facts"
        );
    }

    #[test]
    fn nothing_said_about_the_user_is_a_noop() {
        let call = call(EXTRACTION_CALLER, vec![message(Role::User, &extraction_prompt("user: Start a new service for me."))]);
        assert_eq!(operations(&extraction_answer(&call)), vec![json!({"op": "NOOP"})]);
        let without = call_without_conversation();
        assert_eq!(operations(&extraction_answer(&without)), vec![json!({"op": "NOOP"})]);
    }

    fn call_without_conversation() -> ChatCall {
        call(EXTRACTION_CALLER, vec![message(Role::User, "hello")])
    }

    #[test]
    fn a_repeated_sentence_is_added_once() {
        let call = call(EXTRACTION_CALLER, vec![message(Role::User, &extraction_prompt("user: I like tea.\nuser: I like tea."))]);
        assert_eq!(operations(&extraction_answer(&call)).len(), 1);
    }

    #[test]
    fn only_the_memory_services_caller_is_an_extraction() {
        assert!(!is_extraction(&call("lead_agent", vec![message(Role::User, "hi")])));
        assert!(!is_extraction(&call("middleware:title", vec![message(Role::User, "hi")])));
    }

    #[test]
    fn recall_lists_the_facts_of_the_injected_block() {
        let system = "You are a lead agent.\n\n<memory>\nUser Context:\n- Work: Engineer\nFacts:\n\
                      - [preference | 0.90] The user said: I always write my services in Rust.\n\
                      - [correction | 0.98] Uses &lt;b&gt;PG&lt;/b&gt; (avoid: said MySQL)\n</memory>";
        let call = call("lead_agent", vec![message(Role::System, system), message(Role::User, "Start a new service for me.")]);
        assert_eq!(
            recalled(&call).as_deref(),
            Some("From memory: The user said: I always write my services in Rust. / Uses <b>PG</b> (avoid: said MySQL) ")
        );
        let plain = self::call("lead_agent", vec![message(Role::System, "You are a lead agent."), message(Role::User, "hi")]);
        assert_eq!(recalled(&plain), None);
    }
}
