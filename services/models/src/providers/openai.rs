//! OpenAI Chat Completions, streamed — and everything that speaks it (DeepSeek, Doubao, Kimi, vLLM, Ollama,
//! OpenRouter, Gemini's compatible endpoint, …).
//!
//! Wire facts handled here:
//! * `stream_options.include_usage` asks for a last chunk with `usage` and empty `choices`; other chunks carry
//!   `usage: null` (vLLM with cumulative usage repeats it on every chunk: later counts win).
//! * Tool calls arrive as `delta.tool_calls[]` pieces keyed by `index`: the first piece has `id` and
//!   `function.name`, later ones only `function.arguments` fragments; parallel calls interleave.
//! * DeepSeek/vLLM put thinking in `delta.reasoning_content`, Ollama in `delta.reasoning`.
//! * `data: [DONE]` ends the stream; an error may arrive as `data: {"error": {...}}` with status 200.

use std::collections::HashMap;
use std::sync::Arc;

use antler_proto::common::{ContentPart, ImagePart, Message, Role, content_part, image_part};
use base64::Engine as _;
use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::header::{AUTHORIZATION, HeaderMap};
use serde_json::{Map, Value, json};

use super::http::{Http, SseEvent, SseParser};
use super::{Attempt, Provider, apply_settings};
use crate::convert::arguments_text;
use crate::error::{ModelError, UpstreamError, UpstreamKind};
use crate::events::{Event, Stop, UsageReport};
use crate::request::{ChatCall, ToolUse};
use crate::spec::ModelSpec;

/// Body fields the provider owns; model parameters cannot replace them.
const RESERVED: &[&str] = &["model", "messages", "stream", "stream_options", "tools", "tool_choice"];

/// An OpenAI-compatible model.
#[derive(Debug)]
pub struct OpenAi {
    http: Arc<Http>,
    model: String,
    send_reasoning_content: bool,
    /// OpenAI itself: its reasoning models refuse `max_tokens` and every model takes
    /// `max_completion_tokens`, while many compatible servers know only `max_tokens`.
    official: bool,
}

impl OpenAi {
    pub fn new(spec: &ModelSpec) -> Result<Self, String> {
        let mut headers = HeaderMap::new();
        if let Some(key) = spec.api_key.value() {
            headers.insert(AUTHORIZATION, Http::secret(&format!("Bearer {key}"))?);
        }
        let url = format!("{}/chat/completions", spec.base_url);
        Ok(Self {
            http: Arc::new(Http::new(spec, url, headers)?),
            model: spec.upstream_model.clone(),
            send_reasoning_content: spec.send_reasoning_content,
            official: reqwest::Url::parse(&spec.base_url).ok().and_then(|u| u.host_str().map(|h| h == "api.openai.com")).unwrap_or(false),
        })
    }
}

impl Provider for OpenAi {
    fn prepare(&self, call: &ChatCall, settings: Map<String, Value>) -> Result<Value, ModelError> {
        let messages = call
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| message(m, self.send_reasoning_content, &format!("messages[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let mut body = Map::new();
        body.insert("model".into(), Value::from(self.model.clone()));
        body.insert("messages".into(), Value::Array(messages));
        body.insert("stream".into(), Value::Bool(true));
        body.insert("stream_options".into(), json!({ "include_usage": true }));
        if !call.tools.is_empty() {
            let tools = call
                .tools
                .iter()
                .map(|t| {
                    let parameters = t.schema().unwrap_or_else(empty_schema);
                    json!({ "type": "function", "function": { "name": t.name, "description": t.description, "parameters": parameters } })
                })
                .collect();
            body.insert("tools".into(), Value::Array(tools));
            let choice = match &call.tool_use {
                ToolUse::Auto => json!("auto"),
                ToolUse::None => json!("none"),
                ToolUse::Required => json!("required"),
                ToolUse::Tool(name) => json!({ "type": "function", "function": { "name": name } }),
            };
            body.insert("tool_choice".into(), choice);
        }
        if !call.stop.is_empty() {
            body.insert("stop".into(), json!(call.stop));
        }
        apply_settings(&mut body, settings, RESERVED);
        if self.official
            && let Some(max) = body.remove("max_tokens")
        {
            body.entry("max_completion_tokens").or_insert(max);
        }
        Ok(Value::Object(body))
    }

    fn send(&self, body: &Bytes) -> BoxFuture<'static, Result<Attempt, UpstreamError>> {
        let http = self.http.clone();
        let bytes = body.clone();
        Box::pin(async move {
            let (request_id, sse) = http.open(bytes).await?;
            Ok(Attempt { events: super::http::parse(sse, Parser::default()), request_id })
        })
    }
}

fn empty_schema() -> Value {
    json!({ "type": "object", "properties": {} })
}

/// How a file part is shown to a model: a reference, not the contents.
pub(crate) fn file_reference(file: &antler_proto::common::FilePart) -> String {
    let name = if file.name.is_empty() { file.path.rsplit('/').next().unwrap_or(&file.path) } else { &file.name };
    let mime = if file.mime_type.is_empty() { "unknown type" } else { &file.mime_type };
    format!("[file: {name} at {} ({mime})]", file.path)
}

fn image_url(image: &ImagePart, path: &str) -> Result<String, ModelError> {
    match &image.source {
        Some(image_part::Source::Data(data)) => {
            Ok(format!("data:{};base64,{}", image.mime_type, base64::engine::general_purpose::STANDARD.encode(data)))
        }
        Some(image_part::Source::Url(url)) if url.starts_with("https://") || url.starts_with("data:") => Ok(url.clone()),
        _ => Err(ModelError::invalid(format!("{path}.image"), "a sandbox path must be resolved to image data first (thread_id missing?)")),
    }
}

fn text_of(parts: &[ContentPart]) -> String {
    let mut out = String::new();
    for part in parts {
        // Borrowed: every call resends the whole conversation, and a clone here would copy each text twice.
        let reference;
        let piece = match &part.part {
            Some(content_part::Part::Text(t)) => t.text.as_str(),
            Some(content_part::Part::File(f)) => {
                reference = file_reference(f);
                reference.as_str()
            }
            Some(content_part::Part::Image(_)) => "[image]",
            _ => continue,
        };
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(piece);
    }
    out
}

fn message(m: &Message, send_reasoning: bool, path: &str) -> Result<Value, ModelError> {
    let role = Role::try_from(m.role).unwrap_or(Role::User);
    Ok(match role {
        Role::System => json!({ "role": "system", "content": text_of(&m.content) }),
        Role::Tool => json!({ "role": "tool", "tool_call_id": m.tool_call_id, "content": text_of(&m.content) }),
        Role::Assistant => {
            let text = text_of(&m.content);
            let mut out = Map::new();
            out.insert("role".into(), json!("assistant"));
            out.insert("content".into(), if text.is_empty() && !m.tool_calls.is_empty() { Value::Null } else { Value::from(text) });
            if !m.tool_calls.is_empty() {
                let calls = m
                    .tool_calls
                    .iter()
                    .map(|c| json!({ "id": c.id, "type": "function", "function": { "name": c.name, "arguments": arguments_text(c) } }))
                    .collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            if send_reasoning {
                let reasoning: String = m
                    .content
                    .iter()
                    .filter_map(|p| match &p.part {
                        Some(content_part::Part::Thinking(t)) => Some(t.text.as_str()),
                        _ => None,
                    })
                    .collect();
                if !reasoning.is_empty() {
                    out.insert("reasoning_content".into(), Value::from(reasoning));
                }
            }
            Value::Object(out)
        }
        Role::User | Role::Unspecified => {
            let has_image = m.content.iter().any(|p| matches!(p.part, Some(content_part::Part::Image(_))));
            if !has_image {
                json!({ "role": "user", "content": text_of(&m.content) })
            } else {
                let mut parts = Vec::new();
                for (j, part) in m.content.iter().enumerate() {
                    match &part.part {
                        Some(content_part::Part::Text(t)) => parts.push(json!({ "type": "text", "text": t.text })),
                        Some(content_part::Part::File(f)) => parts.push(json!({ "type": "text", "text": file_reference(f) })),
                        Some(content_part::Part::Image(image)) => {
                            let mut url = Map::new();
                            url.insert("url".into(), Value::from(image_url(image, &format!("{path}.content[{j}]"))?));
                            if !image.detail.is_empty() {
                                url.insert("detail".into(), Value::from(image.detail.clone()));
                            }
                            parts.push(json!({ "type": "image_url", "image_url": url }));
                        }
                        _ => {}
                    }
                }
                json!({ "role": "user", "content": parts })
            }
        }
    })
}

/// A tool call whose first piece had no name yet (some servers send the id first).
#[derive(Debug, Default)]
struct PendingTool {
    id: String,
    arguments: String,
}

/// Reads a Chat Completions event stream.
#[derive(Debug, Default)]
pub struct Parser {
    model_seen: bool,
    finished: bool,
    done: bool,
    started: HashMap<u32, bool>,
    pending: HashMap<u32, PendingTool>,
}

fn count(value: &Value, pointer: &str) -> Option<u64> {
    value.pointer(pointer).and_then(Value::as_u64)
}

/// Normalised usage from an OpenAI `usage` object.
pub fn usage(value: &Value) -> UsageReport {
    UsageReport {
        input: count(value, "/prompt_tokens"),
        output: count(value, "/completion_tokens"),
        total: count(value, "/total_tokens"),
        cache_read: count(value, "/prompt_tokens_details/cached_tokens").or_else(|| count(value, "/prompt_cache_hit_tokens")),
        cache_creation: None,
        reasoning: count(value, "/completion_tokens_details/reasoning_tokens"),
    }
}

fn stop_of(reason: &str) -> Stop {
    match reason {
        "tool_calls" | "function_call" => Stop::ToolCalls,
        "length" => Stop::Length,
        "content_filter" => Stop::ContentFilter,
        _ => Stop::Stop,
    }
}

/// An error object sent inside the stream.
fn stream_error(error: &Value) -> UpstreamError {
    let message = error.get("message").and_then(Value::as_str).unwrap_or("error event without a message").to_owned();
    let status = error.get("code").and_then(Value::as_u64).and_then(|c| u16::try_from(c).ok()).filter(|c| (400..600).contains(c));
    let kind = error.get("type").and_then(Value::as_str).unwrap_or_default();
    let status = status.unwrap_or(match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "rate_limit_error" | "rate_limit_exceeded" => 429,
        _ => 500,
    });
    UpstreamError::from_status(status, message, None)
}

impl SseParser for Parser {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<Event>, UpstreamError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(vec![Event::Done]);
        }
        let chunk: Value = serde_json::from_str(data).map_err(|_| UpstreamError::malformed("a chunk that is not JSON", data))?;
        if let Some(error) = chunk.get("error").filter(|e| e.is_object()) {
            return Err(stream_error(error));
        }
        if !chunk.is_object() {
            return Err(UpstreamError::malformed("a chunk that is not a JSON object", data));
        }
        let mut events = Vec::new();
        if !self.model_seen
            && let Some(model) = chunk.get("model").and_then(Value::as_str)
        {
            self.model_seen = true;
            events.push(Event::Model(model.to_owned()));
        }
        let choices = match chunk.get("choices") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(list)) => list.as_slice(),
            Some(_) => return Err(UpstreamError::malformed("`choices` is not a list", data)),
        };
        // Only the first choice: Antler never asks for n > 1.
        if let Some(choice) = choices.iter().find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0) {
            if let Some(delta) = choice.get("delta") {
                for key in ["reasoning_content", "reasoning"] {
                    if let Some(text) = delta.get(key).and_then(Value::as_str) {
                        events.push(Event::Thinking(text.to_owned()));
                    }
                }
                if let Some(text) = delta.get("content").and_then(Value::as_str) {
                    events.push(Event::Text(text.to_owned()));
                }
                if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                    for (position, call) in calls.iter().enumerate() {
                        self.tool_piece(call, position, data, &mut events)?;
                    }
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finished = true;
                events.push(Event::Finish { stop: stop_of(reason), raw: reason.to_owned(), stop_sequence: String::new() });
            }
        }
        if let Some(usage_value) = chunk.get("usage").filter(|u| u.is_object()) {
            events.push(Event::Usage(usage(usage_value)));
        }
        Ok(events)
    }

    fn on_eof(&mut self) -> Result<Vec<Event>, UpstreamError> {
        if self.done {
            Ok(Vec::new())
        } else if self.finished {
            // A finish_reason but no [DONE]: some servers skip the marker. The answer itself is complete.
            Ok(vec![Event::Done])
        } else {
            Err(UpstreamError::new(UpstreamKind::Broken, "the stream ended before a finish_reason or [DONE]"))
        }
    }
}

impl Parser {
    fn tool_piece(&mut self, call: &Value, position: usize, data: &str, events: &mut Vec<Event>) -> Result<(), UpstreamError> {
        let key = match call.get("index") {
            Some(index) => index
                .as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| UpstreamError::malformed("tool call index is not a number", data))?,
            None => u32::try_from(position).unwrap_or(u32::MAX),
        };
        let function = call.get("function");
        let name = function.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or_default();
        let arguments = function.and_then(|f| f.get("arguments")).and_then(Value::as_str).unwrap_or_default();
        let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
        if self.started.get(&key).copied().unwrap_or(false) {
            if !arguments.is_empty() {
                events.push(Event::ToolArgs { key, delta: arguments.to_owned() });
            }
            return Ok(());
        }
        let pending = self.pending.entry(key).or_default();
        if pending.id.is_empty() {
            pending.id = id.to_owned();
        }
        pending.arguments.push_str(arguments);
        if !name.is_empty() {
            let pending = self.pending.remove(&key).unwrap_or_default();
            self.started.insert(key, true);
            events.push(Event::ToolStart { key, id: pending.id, name: name.to_owned() });
            if !pending.arguments.is_empty() {
                events.push(Event::ToolArgs { key, delta: pending.arguments });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
