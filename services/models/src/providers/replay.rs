//! The replay provider: deterministic scripted answers, streamed in chunks like a real provider, with
//! optional delays, injected failures and cut streams. For demos and tests; it never touches the network.
//!
//! A script is a list of turns. The turn answered is the number of assistant messages in the request (the
//! first call of a conversation gets turn 0, the call after one assistant reply and its tool results gets
//! turn 1, …), so a script plays an agent loop through without any state kept between calls — except the
//! count of injected failures, which is per process (`fail.times` failures, then the turn succeeds).
//! Turns and calls marked `if_offered` apply only when the request offers the tools they name, so one
//! script plays with and without a tool (the demo's plan step needs plan mode's `write_todos`); a script
//! with `memory:` answers the memory layer too (`memory.rs`).

use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use super::{Attempt, Provider};
use crate::error::{ModelError, UpstreamError, UpstreamKind};
use crate::events::{Event, Stop, UsageReport};
use crate::request::ChatCall;
use crate::spec::ModelSpec;

pub mod memory;
pub mod script;

use script::{AfterLast, ReplayFailure, ReplayScript, ReplayTurn};

/// A replay model.
#[derive(Debug)]
pub struct Replay {
    name: String,
    upstream_model: String,
    script: Arc<ReplayScript>,
    /// Failures injected so far, per turn.
    failures: Arc<Vec<AtomicU32>>,
}

impl Replay {
    pub fn new(spec: &ModelSpec) -> Result<Self, String> {
        let script = spec.replay.clone().ok_or_else(|| "a replay model needs a script".to_owned())?;
        let failures = Arc::new(script.turns.iter().map(|_| AtomicU32::new(0)).collect());
        Ok(Self { name: spec.name.clone(), upstream_model: spec.upstream_model.clone(), script, failures })
    }
}

impl Provider for Replay {
    /// The "body" of a replay call says what is played: a turn (by its index in the script, with the
    /// calls left out that name a tool the request does not offer, and the text to start with), or a
    /// derived answer for the memory layer; and whether thinking is shown.
    fn prepare(&self, call: &ChatCall, _settings: Map<String, Value>) -> Result<Value, ModelError> {
        if self.script.memory.extract && memory::is_extraction(call) {
            return Ok(json!({ "answer": memory::extraction_answer(call), "thinking": false }));
        }
        let offered = |name: &str| call.tools.iter().any(|t| t.name == name);
        // The turns that apply to this request; the conversation walks through them in order.
        let applicable: Vec<usize> =
            (0..self.script.turns.len()).filter(|&i| self.script.turns[i].if_offered.iter().all(|name| offered(name))).collect();
        if applicable.is_empty() {
            return Err(ModelError::Replay {
                model: self.name.clone(),
                message: "no turn of the script applies: each needs a tool (if_offered) that the request does not offer\nhint: add a turn without if_offered".to_owned(),
            });
        }
        let turns = applicable.len();
        let asked = call.assistant_turns();
        let position = match self.script.after_last {
            _ if asked < turns => asked,
            AfterLast::RepeatLast => turns - 1,
            AfterLast::Cycle => asked % turns,
            AfterLast::Error => {
                return Err(ModelError::Replay {
                    model: self.name.clone(),
                    message: format!(
                        "the script has {turns} turn(s) and the conversation already has {asked} assistant message(s)\nhint: add turns, or set after_last: repeat_last | cycle"
                    ),
                });
            }
        };
        let turn = applicable[position];
        let omit: Vec<usize> = self.script.turns[turn]
            .tool_calls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.if_offered && !offered(&c.name))
            .map(|(k, _)| k)
            .collect();
        let prefix = if self.script.memory.recall && asked == 0 { memory::recalled(call) } else { None };
        Ok(json!({ "turn": turn, "omit_calls": omit, "prefix": prefix, "thinking": call.thinking_enabled }))
    }

    fn send(&self, body: &Bytes) -> BoxFuture<'static, Result<Attempt, UpstreamError>> {
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let turn_index = body.get("turn").and_then(Value::as_u64).and_then(|t| usize::try_from(t).ok()).unwrap_or(0);
        let thinking = body.get("thinking").and_then(Value::as_bool).unwrap_or(false);
        let script = self.script.clone();
        let failures = self.failures.clone();
        let upstream_model = self.upstream_model.clone();
        Box::pin(async move {
            if let Some(answer) = body.get("answer").and_then(Value::as_str) {
                let turn = ReplayTurn { text: Some(answer.to_owned()), ..ReplayTurn::default() };
                let events = script_events(&turn, 0, false, &upstream_model, script.chunk_chars);
                return Ok(Attempt { events: futures::stream::iter(events).boxed(), request_id: "replay-memory".to_owned() });
            }
            let Some(scripted) = script.turns.get(turn_index) else {
                return Err(UpstreamError::new(UpstreamKind::Malformed, format!("turn {turn_index} is not in the script")));
            };
            let turn = played(scripted, &body);
            let first_byte = Duration::from_millis(turn.first_byte_delay_ms.unwrap_or(script.first_byte_delay_ms));
            if !first_byte.is_zero() {
                tokio::time::sleep(first_byte).await;
            }
            if let Some(fail) = &turn.fail {
                let so_far = failures.get(turn_index).map(|c| c.fetch_add(1, Ordering::Relaxed)).unwrap_or(0);
                if fail.times == 0 || so_far < fail.times {
                    return Err(injected(fail));
                }
            }
            let events = script_events(&turn, turn_index, thinking, &upstream_model, script.chunk_chars);
            let delay = Duration::from_millis(turn.chunk_delay_ms.unwrap_or(script.chunk_delay_ms));
            let stream = futures::stream::iter(events).then(move |item| async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                item
            });
            Ok(Attempt { events: stream.boxed(), request_id: format!("replay-{turn_index}") })
        })
    }
}

/// The turn as this request gets it: without the calls `prepare` left out, after the text it starts with.
fn played(scripted: &ReplayTurn, body: &Value) -> ReplayTurn {
    let omit: Vec<u64> =
        body.get("omit_calls").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
    let prefix = body.get("prefix").and_then(Value::as_str).unwrap_or_default();
    let mut turn = scripted.clone();
    if !omit.is_empty() {
        turn.tool_calls =
            scripted.tool_calls.iter().enumerate().filter(|(k, _)| !omit.contains(&(*k as u64))).map(|(_, c)| c.clone()).collect();
    }
    if !prefix.is_empty() {
        turn.text = Some(format!("{prefix}{}", scripted.text.as_deref().unwrap_or_default()));
    }
    turn
}

fn injected(fail: &ReplayFailure) -> UpstreamError {
    let message = if fail.message.is_empty() { format!("injected failure (HTTP {})", fail.status) } else { fail.message.clone() };
    if fail.status == 0 {
        return UpstreamError::new(UpstreamKind::Connect, message);
    }
    UpstreamError::from_status(fail.status, message, fail.retry_after_secs.map(Duration::from_secs))
}

fn chunks(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(size.max(1)).map(|c| c.iter().collect()).collect()
}

/// The whole answer as stream items, chunked; a `break_after_chunks` cut ends it with a broken-stream error.
fn script_events(
    turn: &ReplayTurn,
    turn_index: usize,
    thinking: bool,
    default_model: &str,
    default_chunk: usize,
) -> Vec<Result<Event, UpstreamError>> {
    let size = turn.chunk_chars.unwrap_or(default_chunk);
    let mut content: Vec<Event> = Vec::new();
    if thinking {
        if let Some(text) = &turn.thinking {
            content.extend(chunks(text, size).into_iter().map(Event::Thinking));
            if let Some(signature) = &turn.signature {
                content.push(Event::Signature(signature.clone()));
            }
            content.push(Event::ThinkingStop);
        }
        if let Some(data) = &turn.redacted_thinking {
            content.push(Event::Redacted(data.clone()));
        }
    }
    if let Some(text) = &turn.text {
        content.extend(chunks(text, size).into_iter().map(Event::Text));
    }
    for (k, call) in turn.tool_calls.iter().enumerate() {
        let key = u32::try_from(k).unwrap_or(u32::MAX);
        let id = call.id.clone().unwrap_or_else(|| format!("call_{turn_index}_{k}"));
        content.push(Event::ToolStart { key, id, name: call.name.clone() });
        let arguments = match &call.arguments {
            Value::String(raw) => raw.clone(),
            Value::Null => "{}".to_owned(),
            other => other.to_string(),
        };
        content.extend(chunks(&arguments, size).into_iter().map(|delta| Event::ToolArgs { key, delta }));
        content.push(Event::ToolStop { key });
    }

    let mut items: Vec<Result<Event, UpstreamError>> =
        vec![Ok(Event::Model(turn.model.clone().unwrap_or_else(|| default_model.to_owned())))];
    if let Some(cut) = turn.break_after_chunks {
        items.extend(content.into_iter().take(cut).map(Ok));
        items.push(Err(UpstreamError::new(UpstreamKind::Broken, format!("scripted cut after {cut} chunk(s)"))));
        return items;
    }
    items.extend(content.into_iter().map(Ok));
    let stop = match turn.finish_reason.as_deref() {
        Some("tool_calls") => Stop::ToolCalls,
        Some("length") => Stop::Length,
        Some("content_filter") => Stop::ContentFilter,
        Some("paused") => Stop::Paused,
        Some(_) => Stop::Stop,
        None if turn.tool_calls.is_empty() => Stop::Stop,
        None => Stop::ToolCalls,
    };
    let raw = turn.finish_reason.clone().unwrap_or_else(|| if stop == Stop::ToolCalls { "tool_calls".into() } else { "stop".into() });
    items.push(Ok(Event::Finish { stop, raw, stop_sequence: String::new() }));
    if let Some(u) = turn.usage {
        items.push(Ok(Event::Usage(UsageReport {
            input: Some(u.input_tokens),
            output: Some(u.output_tokens),
            total: Some(u.input_tokens + u.output_tokens),
            cache_read: Some(u.cache_read_tokens),
            cache_creation: Some(u.cache_creation_tokens),
            reasoning: Some(u.reasoning_tokens),
        })));
    }
    items.push(Ok(Event::Done));
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_streamed_in_chunks_of_the_configured_size() {
        let turn = ReplayTurn { text: Some("abcdefgh".into()), ..ReplayTurn::default() };
        let items = script_events(&turn, 0, false, "m", 3);
        let texts: Vec<String> = items
            .iter()
            .filter_map(|i| match i {
                Ok(Event::Text(t)) => Some(t.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(texts, ["abc", "def", "gh"]);
        assert!(matches!(items.last(), Some(Ok(Event::Done))));
    }

    #[test]
    fn thinking_is_only_played_when_asked_for() {
        let turn = ReplayTurn { thinking: Some("hmm".into()), text: Some("ok".into()), ..ReplayTurn::default() };
        let has_thinking = |items: &[Result<Event, UpstreamError>]| items.iter().any(|i| matches!(i, Ok(Event::Thinking(_))));
        assert!(has_thinking(&script_events(&turn, 0, true, "m", 16)));
        assert!(!has_thinking(&script_events(&turn, 0, false, "m", 16)));
    }

    fn replay(yaml: &str) -> Replay {
        let script: ReplayScript = serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("a valid script: {e}"));
        let mut spec = crate::spec::tests::spec("r", crate::spec::ProviderKind::Replay);
        spec.replay = Some(Arc::new(script));
        Replay::new(&spec).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A call with `assistant` assistant messages so far, offering `tools`.
    fn call(caller: &str, system: &str, assistant: usize, tools: &[&str]) -> ChatCall {
        use antler_proto::common::{ContentPart, Message, Role, TextPart, ToolSpec, content_part};
        let text = |role: Role, text: &str| Message {
            role: role as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
            ..Message::default()
        };
        let mut messages = vec![text(Role::System, system), text(Role::User, "Write a note")];
        for _ in 0..assistant {
            messages.push(text(Role::Assistant, "ok"));
            messages.push(text(Role::User, "go on"));
        }
        let tools = tools.iter().map(|name| ToolSpec { name: (*name).to_owned(), ..ToolSpec::default() }).collect();
        let request = antler_proto::models::ChatRequest { messages, tools, caller: caller.to_owned(), ..Default::default() };
        ChatCall::from_proto(request, std::time::Instant::now()).unwrap_or_else(|e| panic!("a valid request: {e}"))
    }

    /// What `replay` answers `call` with: (text, tool call names).
    fn answer(replay: &Replay, call: &ChatCall) -> (String, Vec<String>) {
        let body = replay.prepare(call, Map::new()).unwrap_or_else(|e| panic!("{e}"));
        let (turn, thinking) = match body.get("answer").and_then(Value::as_str) {
            Some(text) => (ReplayTurn { text: Some(text.to_owned()), ..ReplayTurn::default() }, false),
            None => {
                let index = body["turn"].as_u64().unwrap_or(u64::MAX) as usize;
                (played(&replay.script.turns[index], &body), false)
            }
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        for item in script_events(&turn, 0, thinking, "m", 1000) {
            match item {
                Ok(Event::Text(t)) => text.push_str(&t),
                Ok(Event::ToolStart { name, .. }) => calls.push(name),
                _ => {}
            }
        }
        (text, calls)
    }

    const PLAN_SCRIPT: &str = "
turns:
  - {if_offered: [write_todos], text: plan, tool_calls: [{name: write_todos, arguments: {todos: []}}]}
  - {text: write, tool_calls: [{name: write_file, arguments: {path: /a}}]}
  - {text: present, tool_calls: [{name: write_todos, if_offered: true, arguments: {todos: []}}, {name: present_files, arguments: {}}]}
  - {text: done}
";

    #[test]
    fn turns_and_calls_naming_a_tool_not_offered_are_left_out() {
        let replay = replay(PLAN_SCRIPT);
        let plan = ["write_todos", "write_file", "present_files"];
        let plain = ["write_file", "present_files"];
        // Plan mode: all four turns, each call.
        let played: Vec<_> = (0..4).map(|n| answer(&replay, &call("lead_agent", "sys", n, &plan))).collect();
        assert_eq!(played[0], ("plan".to_owned(), vec!["write_todos".to_owned()]));
        assert_eq!(played[2].1, ["write_todos", "present_files"]);
        assert_eq!(played[3].0, "done");
        // Without write_todos: the plan turn is skipped (the count starts at the next) and its call is dropped.
        let played: Vec<_> = (0..3).map(|n| answer(&replay, &call("lead_agent", "sys", n, &plain))).collect();
        assert_eq!(played[0], ("write".to_owned(), vec!["write_file".to_owned()]));
        assert_eq!(played[1], ("present".to_owned(), vec!["present_files".to_owned()]));
        assert_eq!(played[2].0, "done");
        let past = replay.prepare(&call("lead_agent", "sys", 3, &plain), Map::new());
        assert!(past.is_err_and(|e| e.to_string().contains("3 turn(s)")), "counted among the turns that apply");
    }

    #[test]
    fn a_script_where_no_turn_applies_says_so() {
        let replay = replay("turns: [{if_offered: [write_todos], text: plan}]");
        let err = replay.prepare(&call("lead_agent", "sys", 0, &[]), Map::new()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("no turn of the script applies"), "{err}");
    }

    #[test]
    fn memory_extraction_and_recall_only_when_the_script_asks() {
        let extraction = call(memory::EXTRACTION_CALLER, "You maintain the long-term memory", 0, &[]);
        let mut extraction = extraction;
        if let Some(antler_proto::common::content_part::Part::Text(t)) =
            extraction.messages[1].content.first_mut().and_then(|p| p.part.as_mut())
        {
            t.text = "<conversation>\nuser: I prefer tabs.\n</conversation>".to_owned();
        }
        let with = replay("memory: {extract: true, recall: true}\nafter_last: repeat_last\nturns: [{text: hello}]");
        let (text, calls) = answer(&with, &extraction);
        assert!(calls.is_empty() && text.contains(r#""content":"The user said: I prefer tabs.""#), "{text}");
        let without = replay("after_last: repeat_last\nturns: [{text: hello}]");
        assert_eq!(answer(&without, &extraction).0, "hello", "a plain script plays its turn");

        let system = "sys\n<memory>\nFacts:\n- [preference | 0.90] The user said: I prefer tabs.\n</memory>";
        assert_eq!(answer(&with, &call("lead_agent", system, 0, &[])).0, "From memory: The user said: I prefer tabs. hello");
        assert_eq!(answer(&with, &call("lead_agent", system, 1, &[])).0, "hello", "only the first answer recalls");
        assert_eq!(answer(&without, &call("lead_agent", system, 0, &[])).0, "hello");
    }

    #[test]
    fn a_cut_ends_with_a_broken_stream() {
        let turn = ReplayTurn { text: Some("abcdefgh".into()), break_after_chunks: Some(2), ..ReplayTurn::default() };
        let items = script_events(&turn, 0, false, "m", 2);
        assert!(matches!(items.last(), Some(Err(UpstreamError { kind: UpstreamKind::Broken, .. }))));
        assert!(!items.iter().any(|i| matches!(i, Ok(Event::Finish { .. }))));
    }
}
