//! Anthropic Messages, streamed.
//!
//! Wire facts handled here:
//! * System messages are not turns: they are joined into the top-level `system` prompt.
//! * Tool results are `tool_result` blocks in a user turn; consecutive turns of one role are merged.
//! * Earlier thinking (`thinking` with its `signature`, `redacted_thinking`) is sent back unchanged, in
//!   order, before the `tool_use` blocks it led to — the API refuses a tool-use continuation otherwise.
//!   Thinking without a signature (from another provider) cannot be verified and is left out.
//! * Thinking: `thinking: {type: enabled, budget_tokens: N}` needs 1024 <= N < max_tokens; checked here
//!   so a bad budget is INVALID_ARGUMENT before any call. Sampling parameters are dropped while thinking,
//!   which the API would refuse.
//! * The stream: `message_start` (model, input usage), `content_block_start/delta/stop` per block (`text`,
//!   `thinking` + `signature_delta`, `redacted_thinking`, `tool_use` + `input_json_delta`), `message_delta`
//!   (stop reason, output usage), `message_stop`; `ping` keeps the connection alive; `error` may arrive at
//!   any point.

use std::collections::HashMap;
use std::sync::Arc;

use antler_proto::common::{ContentPart, ImagePart, Message, Role, content_part, image_part};
use base64::Engine as _;
use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use super::http::{Http, SseEvent, SseParser};
use super::openai::file_reference;
use super::{Attempt, Provider, apply_settings};
use crate::error::{ModelError, UpstreamError, UpstreamKind};
use crate::events::{Event, Stop, UsageReport};
use crate::request::{ChatCall, ToolUse};
use crate::spec::ModelSpec;
use antler_kit::json::{Numbers, struct_to_map};

/// Body fields the provider owns.
const RESERVED: &[&str] = &["model", "messages", "system", "stream", "tools", "tool_choice"];
/// Parameters the Messages API does not take (they may come from OpenAI-minded configuration).
const NOT_ANTHROPIC: &[&str] = &["reasoning_effort", "frequency_penalty", "presence_penalty", "seed", "stream_options"];
/// Output limit when neither the model nor the request sets one (the API requires a value).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;
/// Smallest thinking budget the API accepts.
pub const MIN_THINKING_BUDGET: u64 = 1024;

/// An Anthropic model.
#[derive(Debug)]
pub struct Anthropic {
    http: Arc<Http>,
    model: String,
    name: String,
}

impl Anthropic {
    pub fn new(spec: &ModelSpec) -> Result<Self, String> {
        let mut headers = HeaderMap::new();
        if let Some(key) = spec.api_key.value() {
            headers.insert(HeaderName::from_static("x-api-key"), Http::secret(key)?);
        }
        let version =
            HeaderValue::from_str(&spec.anthropic_version).map_err(|_| "anthropic_version is not a valid header value".to_owned())?;
        headers.insert(HeaderName::from_static("anthropic-version"), version);
        let url =
            if spec.base_url.ends_with("/v1") { format!("{}/messages", spec.base_url) } else { format!("{}/v1/messages", spec.base_url) };
        Ok(Self { http: Arc::new(Http::new(spec, url, headers)?), model: spec.upstream_model.clone(), name: spec.name.clone() })
    }
}

impl Provider for Anthropic {
    fn prepare(&self, call: &ChatCall, settings: Map<String, Value>) -> Result<Value, ModelError> {
        let mut system = Vec::new();
        let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
        for (i, m) in call.messages.iter().enumerate() {
            let path = format!("messages[{i}]");
            let (role, blocks) = match Role::try_from(m.role).unwrap_or(Role::User) {
                Role::System => {
                    let text = plain_text(&m.content);
                    if !text.is_empty() {
                        system.push(text);
                    }
                    continue;
                }
                Role::Assistant => ("assistant", assistant_blocks(m)),
                Role::Tool => ("user", vec![tool_result(m, &path)?]),
                Role::User | Role::Unspecified => ("user", user_blocks(&m.content, &path)?),
            };
            if blocks.is_empty() {
                continue;
            }
            match turns.last_mut() {
                Some((last, existing)) if *last == role => existing.extend(blocks),
                _ => turns.push((role, blocks)),
            }
        }

        let mut body = Map::new();
        body.insert("model".into(), Value::from(self.model.clone()));
        body.insert(
            "messages".into(),
            Value::Array(turns.into_iter().map(|(role, content)| json!({ "role": role, "content": content })).collect()),
        );
        if !system.is_empty() {
            body.insert("system".into(), Value::from(system.join("\n\n")));
        }
        body.insert("stream".into(), Value::Bool(true));
        if !call.tools.is_empty() {
            let tools = call
                .tools
                .iter()
                .map(|t| {
                    let schema = t.schema().unwrap_or_else(|| json!({ "type": "object", "properties": {} }));
                    json!({ "name": t.name, "description": t.description, "input_schema": schema })
                })
                .collect();
            body.insert("tools".into(), Value::Array(tools));
            let choice = match &call.tool_use {
                ToolUse::Auto => json!({ "type": "auto" }),
                ToolUse::None => json!({ "type": "none" }),
                ToolUse::Required => json!({ "type": "any" }),
                ToolUse::Tool(name) => json!({ "type": "tool", "name": name }),
            };
            body.insert("tool_choice".into(), choice);
        }
        if !call.stop.is_empty() {
            body.insert("stop_sequences".into(), json!(call.stop));
        }
        apply_settings(&mut body, settings, RESERVED);
        for key in NOT_ANTHROPIC {
            body.remove(*key);
        }
        if !body.get("max_tokens").is_some_and(Value::is_u64) {
            body.insert("max_tokens".into(), Value::from(DEFAULT_MAX_TOKENS));
        }
        self.check_thinking(&mut body, call)?;
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

impl Anthropic {
    /// The budget rules, before anything is sent.
    fn check_thinking(&self, body: &mut Map<String, Value>, call: &ChatCall) -> Result<(), ModelError> {
        let enabled = body.get("thinking").and_then(|t| t.get("type")).and_then(Value::as_str) == Some("enabled");
        if !enabled {
            return Ok(());
        }
        let max_tokens = body.get("max_tokens").and_then(Value::as_u64).unwrap_or(DEFAULT_MAX_TOKENS);
        let field = if call.thinking_budget_tokens > 0 { "thinking_budget_tokens" } else { "when_thinking_enabled.thinking.budget_tokens" };
        let budget = body.get("thinking").and_then(|t| t.get("budget_tokens")).and_then(Value::as_u64);
        let Some(budget) = budget else {
            return Err(ModelError::invalid(
                "thinking_budget_tokens",
                format!(
                    "model `{}` has no thinking budget configured\nhint: pass thinking_budget_tokens (>= {MIN_THINKING_BUDGET} and < max_tokens {max_tokens}), or set when_thinking_enabled.thinking.budget_tokens",
                    self.name
                ),
            ));
        };
        if budget < MIN_THINKING_BUDGET {
            return Err(ModelError::invalid(
                field,
                format!("{budget} is below Anthropic's minimum thinking budget of {MIN_THINKING_BUDGET}"),
            ));
        }
        if budget >= max_tokens {
            return Err(ModelError::invalid(
                field,
                format!("{budget} must be less than max_tokens {max_tokens}\nhint: lower the budget or raise max_tokens"),
            ));
        }
        // The API refuses temperature/top_k with thinking and limits top_p; the proto documents that the
        // temperature may be ignored while thinking.
        for key in ["temperature", "top_k", "top_p"] {
            body.remove(key);
        }
        Ok(())
    }
}

fn plain_text(parts: &[ContentPart]) -> String {
    parts
        .iter()
        .filter_map(|p| match &p.part {
            Some(content_part::Part::Text(t)) => Some(t.text.clone()),
            Some(content_part::Part::File(f)) => Some(file_reference(f)),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn image_block(image: &ImagePart, path: &str) -> Result<Value, ModelError> {
    let source = match &image.source {
        Some(image_part::Source::Data(data)) => {
            json!({ "type": "base64", "media_type": image.mime_type, "data": base64::engine::general_purpose::STANDARD.encode(data) })
        }
        Some(image_part::Source::Url(url)) if url.starts_with("data:") => {
            // data:<media type>;base64,<payload>
            let parsed = url
                .strip_prefix("data:")
                .and_then(|rest| rest.split_once(','))
                .and_then(|(meta, payload)| meta.strip_suffix(";base64").map(|media| (media, payload)));
            let Some((media, payload)) = parsed else {
                return Err(ModelError::invalid(format!("{path}.image.url"), "a data: URL must be base64 (data:image/png;base64,...)"));
            };
            json!({ "type": "base64", "media_type": media, "data": payload })
        }
        Some(image_part::Source::Url(url)) if url.starts_with("https://") => json!({ "type": "url", "url": url }),
        _ => {
            return Err(ModelError::invalid(
                format!("{path}.image"),
                "a sandbox path must be resolved to image data first (thread_id missing?)",
            ));
        }
    };
    Ok(json!({ "type": "image", "source": source }))
}

fn user_blocks(parts: &[ContentPart], path: &str) -> Result<Vec<Value>, ModelError> {
    let mut blocks = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        match &part.part {
            Some(content_part::Part::Text(t)) if !t.text.is_empty() => blocks.push(json!({ "type": "text", "text": t.text })),
            Some(content_part::Part::File(f)) => blocks.push(json!({ "type": "text", "text": file_reference(f) })),
            Some(content_part::Part::Image(image)) => blocks.push(image_block(image, &format!("{path}.content[{j}]"))?),
            _ => {}
        }
    }
    Ok(blocks)
}

fn assistant_blocks(m: &Message) -> Vec<Value> {
    let mut blocks = Vec::new();
    for part in &m.content {
        match &part.part {
            Some(content_part::Part::Thinking(t)) if !t.signature.is_empty() => {
                blocks.push(json!({ "type": "thinking", "thinking": t.text, "signature": t.signature }));
            }
            Some(content_part::Part::RedactedThinking(r)) => blocks.push(json!({ "type": "redacted_thinking", "data": r.data })),
            Some(content_part::Part::Text(t)) if !t.text.is_empty() => blocks.push(json!({ "type": "text", "text": t.text })),
            Some(content_part::Part::File(f)) => blocks.push(json!({ "type": "text", "text": file_reference(f) })),
            _ => {}
        }
    }
    for call in &m.tool_calls {
        // Arguments that were never a JSON object cannot be sent as `input`; the tool result says what failed.
        let input = call.arguments.as_ref().map(|a| Value::Object(struct_to_map(a, Numbers::WholeAsInteger))).unwrap_or_else(|| json!({}));
        blocks.push(json!({ "type": "tool_use", "id": call.id, "name": call.name, "input": input }));
    }
    blocks
}

fn tool_result(m: &Message, path: &str) -> Result<Value, ModelError> {
    let content = user_blocks(&m.content, path)?;
    let mut block = json!({ "type": "tool_result", "tool_use_id": m.tool_call_id, "content": content });
    if m.is_error
        && let Some(obj) = block.as_object_mut()
    {
        obj.insert("is_error".into(), Value::Bool(true));
    }
    Ok(block)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
    Tool,
    Other,
}

/// Reads a Messages event stream.
#[derive(Debug, Default)]
pub struct Parser {
    blocks: HashMap<u64, Block>,
    done: bool,
    input: Option<u64>,
    output: Option<u64>,
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
}

fn string_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

fn stop_of(reason: &str) -> Stop {
    match reason {
        "tool_use" => Stop::ToolCalls,
        "max_tokens" | "model_context_window_exceeded" => Stop::Length,
        "refusal" => Stop::ContentFilter,
        "pause_turn" => Stop::Paused,
        _ => Stop::Stop,
    }
}

impl Parser {
    /// Anthropic counts cached prompt tokens apart from `input_tokens`; Antler's input includes them.
    fn usage(&mut self, usage: &Value) -> Event {
        let get = |key: &str| usage.get(key).and_then(Value::as_u64);
        for (slot, key) in [
            (&mut self.input, "input_tokens"),
            (&mut self.output, "output_tokens"),
            (&mut self.cache_read, "cache_read_input_tokens"),
            (&mut self.cache_creation, "cache_creation_input_tokens"),
        ] {
            if let Some(v) = get(key) {
                *slot = Some(v);
            }
        }
        let input = self.input.map(|i| i + self.cache_read.unwrap_or(0) + self.cache_creation.unwrap_or(0));
        Event::Usage(UsageReport {
            input,
            output: self.output,
            total: None,
            cache_read: self.cache_read,
            cache_creation: self.cache_creation,
            reasoning: None,
        })
    }
}

/// An `error` event (or error body) as an upstream error.
fn stream_error(data: &Value) -> UpstreamError {
    let kind = string_at(data, "/error/type");
    let message = string_at(data, "/error/message");
    let status = match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "overloaded_error" => 529,
        _ => 500,
    };
    UpstreamError::from_status(status, if message.is_empty() { kind } else { message }, None)
}

impl SseParser for Parser {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<Event>, UpstreamError> {
        let data = event.data.trim();
        if event.event == "ping" || data.is_empty() {
            return Ok(Vec::new());
        }
        let value: Value = serde_json::from_str(data).map_err(|_| UpstreamError::malformed("an event that is not JSON", data))?;
        // The type is in the data as well as the event line; the data is what the SDKs trust.
        let kind = value.get("type").and_then(Value::as_str).unwrap_or(event.event.as_str());
        let index = value.get("index").and_then(Value::as_u64);
        let key = |index: Option<u64>| -> Result<u32, UpstreamError> {
            index.and_then(|i| u32::try_from(i).ok()).ok_or_else(|| UpstreamError::malformed("a block event without an index", data))
        };
        let mut events = Vec::new();
        match kind {
            "message_start" => {
                let model = string_at(&value, "/message/model");
                if !model.is_empty() {
                    events.push(Event::Model(model.to_owned()));
                }
                if let Some(usage) = value.pointer("/message/usage") {
                    events.push(self.usage(usage));
                }
            }
            "content_block_start" => {
                let block =
                    value.get("content_block").ok_or_else(|| UpstreamError::malformed("content_block_start without a block", data))?;
                let i = key(index)?;
                match string_at(block, "/type") {
                    "text" => {
                        self.blocks.insert(u64::from(i), Block::Text);
                        events.push(Event::Text(string_at(block, "/text").to_owned()));
                    }
                    "thinking" => {
                        self.blocks.insert(u64::from(i), Block::Thinking);
                        events.push(Event::Thinking(string_at(block, "/thinking").to_owned()));
                        events.push(Event::Signature(string_at(block, "/signature").to_owned()));
                    }
                    "redacted_thinking" => {
                        self.blocks.insert(u64::from(i), Block::Other);
                        events.push(Event::Redacted(string_at(block, "/data").to_owned()));
                    }
                    "tool_use" | "server_tool_use" => {
                        self.blocks.insert(u64::from(i), Block::Tool);
                        events.push(Event::ToolStart {
                            key: i,
                            id: string_at(block, "/id").to_owned(),
                            name: string_at(block, "/name").to_owned(),
                        });
                        if let Some(input) = block.get("input").and_then(Value::as_object).filter(|o| !o.is_empty()) {
                            events.push(Event::ToolArgs { key: i, delta: Value::Object(input.clone()).to_string() });
                        }
                    }
                    _ => {
                        self.blocks.insert(u64::from(i), Block::Other);
                    }
                }
            }
            "content_block_delta" => {
                let i = key(index)?;
                let delta = value.get("delta").ok_or_else(|| UpstreamError::malformed("content_block_delta without a delta", data))?;
                match string_at(delta, "/type") {
                    "text_delta" => events.push(Event::Text(string_at(delta, "/text").to_owned())),
                    "thinking_delta" => events.push(Event::Thinking(string_at(delta, "/thinking").to_owned())),
                    "signature_delta" => events.push(Event::Signature(string_at(delta, "/signature").to_owned())),
                    "input_json_delta" => events.push(Event::ToolArgs { key: i, delta: string_at(delta, "/partial_json").to_owned() }),
                    // citations and future delta kinds carry nothing Antler shows.
                    _ => {}
                }
            }
            "content_block_stop" => {
                let i = key(index)?;
                match self.blocks.get(&u64::from(i)) {
                    Some(Block::Thinking) => events.push(Event::ThinkingStop),
                    Some(Block::Tool) => events.push(Event::ToolStop { key: i }),
                    _ => {}
                }
            }
            "message_delta" => {
                let reason = string_at(&value, "/delta/stop_reason");
                if !reason.is_empty() {
                    events.push(Event::Finish {
                        stop: stop_of(reason),
                        raw: reason.to_owned(),
                        stop_sequence: string_at(&value, "/delta/stop_sequence").to_owned(),
                    });
                }
                if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
                    events.push(self.usage(usage));
                }
            }
            "message_stop" => {
                self.done = true;
                events.push(Event::Done);
            }
            "error" => return Err(stream_error(&value)),
            // New event kinds are ignored, as the API asks clients to do.
            _ => {}
        }
        Ok(events)
    }

    fn on_eof(&mut self) -> Result<Vec<Event>, UpstreamError> {
        if self.done { Ok(Vec::new()) } else { Err(UpstreamError::new(UpstreamKind::Broken, "the stream ended before message_stop")) }
    }
}

#[cfg(test)]
mod tests;
