//! Turns provider events into the caller's stream deltas and the final assistant message.
//!
//! Content parts keep the order the model produced them in; a part stays open while deltas of its kind keep
//! coming and closes when another kind starts (a thinking part closing emits `thinking_end` with its
//! signature). Tool calls are numbered 0, 1, … in the order they start, whatever handle the provider uses,
//! and several may be open at once (OpenAI interleaves parallel calls by index).

use std::collections::HashMap;

use antler_proto::common::{ContentPart, Message, RedactedThinkingPart, Role, TextPart, ThinkingPart, ToolCall, content_part};
use antler_proto::models::{
    ChatStreamResponse, RedactedThinking, TextDelta, ThinkingDelta, ThinkingEnd, ToolCallArgumentsDelta, ToolCallEnd, ToolCallStart,
    chat_stream_response::Delta,
};

use crate::convert::parse_arguments;
use crate::error::{UpstreamError, UpstreamKind};
use crate::events::{Event, Stop, UsageReport};

#[derive(Debug)]
enum Part {
    Text(String),
    Thinking { text: String, signature: String },
    Redacted(String),
}

#[derive(Debug)]
struct Tool {
    id: String,
    name: String,
    arguments: String,
    ended: bool,
}

/// What one attempt produced.
#[derive(Debug, Clone)]
pub struct Assembled {
    /// ROLE_ASSISTANT, content and tool calls; usage is filled in by the gateway.
    pub message: Message,
    pub stop: Option<(Stop, String, String)>,
    pub usage: UsageReport,
    pub upstream_model: String,
    /// The provider said the response was complete.
    pub done: bool,
}

/// Builds one attempt's output.
#[derive(Debug, Default)]
pub struct Assembler {
    parts: Vec<Part>,
    /// The part that still takes deltas.
    open: Option<usize>,
    tools: Vec<Tool>,
    /// Provider handle → tool index.
    keys: HashMap<u32, usize>,
    usage: UsageReport,
    stop: Option<(Stop, String, String)>,
    upstream_model: String,
    done: bool,
}

fn delta(d: Delta) -> ChatStreamResponse {
    ChatStreamResponse { delta: Some(d) }
}

fn index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

impl Assembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// True once the provider has said the response is complete.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Applies one event, appending the deltas it produces to `out`.
    pub fn push(&mut self, event: Event, out: &mut Vec<ChatStreamResponse>) -> Result<(), UpstreamError> {
        if self.done {
            // Bytes after the end marker are not part of the answer.
            return Ok(());
        }
        match event {
            Event::Text(text) => {
                if text.is_empty() {
                    return Ok(());
                }
                let i = match self.open {
                    Some(i) if matches!(self.parts[i], Part::Text(_)) => i,
                    _ => self.start(Part::Text(String::new()), out),
                };
                if let Part::Text(existing) = &mut self.parts[i] {
                    existing.push_str(&text);
                }
                out.push(delta(Delta::Text(TextDelta { part_index: index(i), text })));
            }
            Event::Thinking(text) => {
                if text.is_empty() {
                    return Ok(());
                }
                let i = self.open_thinking(out);
                if let Part::Thinking { text: existing, .. } = &mut self.parts[i] {
                    existing.push_str(&text);
                }
                out.push(delta(Delta::Thinking(ThinkingDelta { part_index: index(i), text, signature_delta: String::new() })));
            }
            Event::Signature(signature) => {
                if signature.is_empty() {
                    return Ok(());
                }
                let i = self.open_thinking(out);
                if let Part::Thinking { signature: existing, .. } = &mut self.parts[i] {
                    existing.push_str(&signature);
                }
                out.push(delta(Delta::Thinking(ThinkingDelta { part_index: index(i), text: String::new(), signature_delta: signature })));
            }
            Event::ThinkingStop => {
                if self.open.is_some_and(|i| matches!(self.parts[i], Part::Thinking { .. })) {
                    self.close_open(out);
                }
            }
            Event::Redacted(data) => {
                self.close_open(out);
                self.parts.push(Part::Redacted(data.clone()));
                let part_index = index(self.parts.len() - 1);
                out.push(delta(Delta::RedactedThinking(RedactedThinking { part_index, data })));
            }
            Event::ToolStart { key, id, name } => {
                if self.keys.contains_key(&key) {
                    return Ok(());
                }
                if name.is_empty() {
                    return Err(UpstreamError::new(UpstreamKind::Malformed, format!("tool call {key} started without a name")));
                }
                // Reasoning precedes the calls it led to; text may go on after them, in a new part.
                self.close_open(out);
                let id = if id.is_empty() { generated_call_id() } else { id };
                let i = self.tools.len();
                self.tools.push(Tool { id: id.clone(), name: name.clone(), arguments: String::new(), ended: false });
                self.keys.insert(key, i);
                out.push(delta(Delta::ToolCallStart(ToolCallStart { index: index(i), id, name })));
            }
            Event::ToolArgs { key, delta: text } => {
                let Some(&i) = self.keys.get(&key) else {
                    return Err(UpstreamError::new(UpstreamKind::Malformed, format!("arguments for tool call {key}, which never started")));
                };
                if text.is_empty() || self.tools[i].ended {
                    return Ok(());
                }
                self.tools[i].arguments.push_str(&text);
                out.push(delta(Delta::ToolCallDelta(ToolCallArgumentsDelta { index: index(i), arguments_delta: text })));
            }
            Event::ToolStop { key } => {
                if let Some(&i) = self.keys.get(&key) {
                    self.end_tool(i, out);
                }
            }
            Event::Usage(report) => self.usage.merge(report),
            Event::Finish { stop, raw, stop_sequence } => self.stop = Some((stop, raw, stop_sequence)),
            Event::Model(model) => {
                if self.upstream_model.is_empty() {
                    self.upstream_model = model;
                }
            }
            Event::Done => self.done = true,
        }
        Ok(())
    }

    /// Closes what is still open (emitting `thinking_end` / `tool_call_end`) and returns the result.
    pub fn finish(mut self, out: &mut Vec<ChatStreamResponse>) -> Assembled {
        self.close_open(out);
        for i in 0..self.tools.len() {
            self.end_tool(i, out);
        }
        let content = self
            .parts
            .into_iter()
            .map(|part| {
                let part = match part {
                    Part::Text(text) => content_part::Part::Text(TextPart { text }),
                    Part::Thinking { text, signature } => content_part::Part::Thinking(ThinkingPart { text, signature }),
                    Part::Redacted(data) => content_part::Part::RedactedThinking(RedactedThinkingPart { data }),
                };
                ContentPart { part: Some(part) }
            })
            .collect();
        let tool_calls = self.tools.iter().map(tool_call).collect();
        let message = Message { role: Role::Assistant as i32, content, tool_calls, ..Message::default() };
        Assembled { message, stop: self.stop, usage: self.usage, upstream_model: self.upstream_model, done: self.done }
    }

    fn start(&mut self, part: Part, out: &mut Vec<ChatStreamResponse>) -> usize {
        self.close_open(out);
        self.parts.push(part);
        let i = self.parts.len() - 1;
        self.open = Some(i);
        i
    }

    fn open_thinking(&mut self, out: &mut Vec<ChatStreamResponse>) -> usize {
        match self.open {
            Some(i) if matches!(self.parts[i], Part::Thinking { .. }) => i,
            _ => self.start(Part::Thinking { text: String::new(), signature: String::new() }, out),
        }
    }

    fn close_open(&mut self, out: &mut Vec<ChatStreamResponse>) {
        if let Some(i) = self.open.take()
            && let Part::Thinking { signature, .. } = &self.parts[i]
        {
            out.push(delta(Delta::ThinkingEnd(ThinkingEnd { part_index: index(i), signature: signature.clone() })));
        }
    }

    fn end_tool(&mut self, i: usize, out: &mut Vec<ChatStreamResponse>) {
        let tool = &mut self.tools[i];
        if tool.ended {
            return;
        }
        tool.ended = true;
        let call = tool_call(tool);
        let arguments_invalid = call.arguments.is_none();
        out.push(delta(Delta::ToolCallEnd(ToolCallEnd { index: index(i), tool_call: Some(call), arguments_invalid })));
    }
}

fn tool_call(tool: &Tool) -> ToolCall {
    match parse_arguments(&tool.arguments) {
        Ok(arguments) => {
            ToolCall { id: tool.id.clone(), name: tool.name.clone(), arguments: Some(arguments), raw_arguments: String::new() }
        }
        Err(raw) => ToolCall { id: tool.id.clone(), name: tool.name.clone(), arguments: None, raw_arguments: raw },
    }
}

/// An id for a tool call the provider left unnamed (some OpenAI-compatible servers do).
fn generated_call_id() -> String {
    format!("call_{:016x}", fastrand::u64(..))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: Vec<Event>) -> (Vec<ChatStreamResponse>, Assembled) {
        let mut a = Assembler::new();
        let mut out = Vec::new();
        for e in events {
            a.push(e, &mut out).unwrap_or_else(|e| panic!("{e}"));
        }
        let done = a.finish(&mut out);
        (out, done)
    }

    #[test]
    fn interleaved_tool_calls_are_reassembled_per_index() {
        let (out, done) = run(vec![
            Event::ToolStart { key: 0, id: "a".into(), name: "ls".into() },
            Event::ToolStart { key: 1, id: "b".into(), name: "cat".into() },
            Event::ToolArgs { key: 0, delta: "{\"pa".into() },
            Event::ToolArgs { key: 1, delta: "{\"f\":".into() },
            Event::ToolArgs { key: 0, delta: "th\":\"/\"}".into() },
            Event::ToolArgs { key: 1, delta: "1}".into() },
        ]);
        assert_eq!(done.message.tool_calls.len(), 2);
        assert_eq!(done.message.tool_calls[0].arguments.as_ref().map(|s| s.fields.len()), Some(1));
        assert!(done.message.tool_calls[1].raw_arguments.is_empty());
        let ends = out.iter().filter(|d| matches!(d.delta, Some(Delta::ToolCallEnd(_)))).count();
        assert_eq!(ends, 2);
    }

    #[test]
    fn thinking_then_text_gives_two_parts_and_one_thinking_end() {
        let (out, done) = run(vec![
            Event::Thinking("hmm".into()),
            Event::Signature("sig".into()),
            Event::ThinkingStop,
            Event::Text("Hel".into()),
            Event::Text("lo".into()),
        ]);
        assert_eq!(done.message.content.len(), 2);
        let end = out.iter().find_map(|d| match &d.delta {
            Some(Delta::ThinkingEnd(e)) => Some(e.signature.clone()),
            _ => None,
        });
        assert_eq!(end.as_deref(), Some("sig"));
        assert!(matches!(&done.message.content[1].part, Some(content_part::Part::Text(t)) if t.text == "Hello"));
    }

    #[test]
    fn invalid_arguments_are_kept_raw_and_flagged() {
        let (out, done) =
            run(vec![Event::ToolStart { key: 3, id: String::new(), name: "x".into() }, Event::ToolArgs { key: 3, delta: "{oops".into() }]);
        assert_eq!(done.message.tool_calls[0].raw_arguments, "{oops");
        assert!(done.message.tool_calls[0].id.starts_with("call_"));
        assert!(out.iter().any(|d| matches!(&d.delta, Some(Delta::ToolCallEnd(e)) if e.arguments_invalid)));
    }

    #[test]
    fn arguments_for_an_unknown_call_are_malformed() {
        let mut a = Assembler::new();
        let err = a.push(Event::ToolArgs { key: 9, delta: "{}".into() }, &mut Vec::new()).err();
        assert!(matches!(err, Some(UpstreamError { kind: UpstreamKind::Malformed, .. })), "{err:?}");
    }
}
