//! Google's Gemini API, native: `POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse` with
//! the key in `x-goog-api-key`.
//!
//! Wire facts handled here:
//! * A request is `contents` (turns of role `user` / `model`, each a list of `parts`), a separate
//!   `systemInstruction`, `tools: [{functionDeclarations}]`, `toolConfig` and `generationConfig`
//!   (sampling, `maxOutputTokens`, `stopSequences`, `thinkingConfig`).
//! * Tool calls are `functionCall {name, args}` parts of a `model` turn; their results are
//!   `functionResponse {name, response}` parts of a `user` turn, matched by name and order (so the
//!   name of the call a result answers is looked up from the conversation). Calls arrive whole, never
//!   split across events, and carry no id unless the model gives one.
//! * Thinking: with `thinkingConfig.includeThoughts`, thought summaries stream as parts with
//!   `thought: true`. A part may carry a `thoughtSignature`; the one on the first `functionCall` of a
//!   turn must be sent back on that part, or a thinking model refuses the continuation. Antler keeps it
//!   as a thinking block's signature and returns it there (or on the last text part of a turn without
//!   calls).
//! * The stream is SSE `data:` events, each a whole `GenerateContentResponse`; there is no end marker:
//!   the event with a `finishReason` (and the final `usageMetadata`) is the last. `finishReason` is
//!   `STOP` also when the turn made calls. `promptFeedback.blockReason` means the prompt was refused.
//! * Usage: `promptTokenCount` (cached tokens included, `cachedContentTokenCount` of them),
//!   `candidatesTokenCount` and, apart from it, `thoughtsTokenCount`.
//! * Errors are `{"error": {"code", "message", "status", "details"}}`, as the HTTP answer or as an event.
//!   A wrong key is HTTP 400 with reason `API_KEY_INVALID`, which is a credential failure here; a 429
//!   says when to retry in a `RetryInfo` detail, not in a header.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use antler_proto::common::{ContentPart, ImagePart, Message, Role, content_part, image_part};
use base64::Engine as _;
use bytes::Bytes;
use futures::future::BoxFuture;
use reqwest::header::{HeaderMap, HeaderName};
use serde_json::{Map, Value, json};

use super::http::{Http, SseEvent, SseParser};
use super::openai::file_reference;
use super::{Attempt, Provider};
use crate::error::{ModelError, UpstreamError, UpstreamKind};
use crate::events::{Event, Stop, UsageReport};
use crate::request::{ChatCall, ToolUse};
use crate::spec::ModelSpec;
use antler_kit::json::{Numbers, struct_to_map};

/// Model settings that become `generationConfig` fields.
const GENERATION: &[(&str, &str)] = &[
    ("temperature", "temperature"),
    ("top_p", "topP"),
    ("top_k", "topK"),
    ("max_tokens", "maxOutputTokens"),
    ("seed", "seed"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
    ("response_mime_type", "responseMimeType"),
];
/// Model settings that become `generationConfig.thinkingConfig` fields.
const THINKING: &[(&str, &str)] =
    &[("thinking_budget", "thinkingBudget"), ("include_thoughts", "includeThoughts"), ("thinking_level", "thinkingLevel")];
/// Settings this provider reads; anything else is refused by name rather than sent as a field the
/// API does not have (it answers 400 "Unknown name").
pub const SETTINGS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "response_mime_type",
    "thinking_budget",
    "include_thoughts",
    "thinking_level",
    "reasoning_effort",
    "safety_settings",
    "extra_body",
    "model_kwargs",
];
/// JSON Schema keywords the API's `Schema` takes; others (`additionalProperties`, `$schema`, …) are
/// dropped from tool parameters, which the API would refuse.
const SCHEMA_KEYS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "items",
    "properties",
    "required",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "anyOf",
    "propertyOrdering",
    "minProperties",
    "maxProperties",
    "default",
    "example",
];

/// A Gemini model.
#[derive(Debug)]
pub struct Gemini {
    http: Arc<Http>,
    name: String,
}

/// `{base}/v1beta/models/{model}:streamGenerateContent?alt=sse`; a base that already names the API
/// version (`…/v1beta`, `…/v1`) is used as it is.
pub fn stream_url(base_url: &str, model: &str) -> String {
    let model = model.strip_prefix("models/").unwrap_or(model);
    let versioned = ["/v1beta", "/v1", "/v1alpha"].iter().any(|v| base_url.ends_with(v));
    let root = if versioned { base_url.to_owned() } else { format!("{base_url}/v1beta") };
    format!("{root}/models/{model}:streamGenerateContent?alt=sse")
}

impl Gemini {
    pub fn new(spec: &ModelSpec) -> Result<Self, String> {
        let mut headers = HeaderMap::new();
        if let Some(key) = spec.api_key.value() {
            headers.insert(HeaderName::from_static("x-goog-api-key"), Http::secret(key)?);
        }
        let http = Http::new(spec, stream_url(&spec.base_url, &spec.upstream_model), headers)?.with_error_reader(read_error);
        Ok(Self { http: Arc::new(http), name: spec.name.clone() })
    }
}

/// The status and retry delay an error answer stands for: `API_KEY_INVALID` (sent as 400) is a
/// credential failure, and a `RetryInfo` detail gives the delay the headers do not.
fn read_error(status: u16, body: &str) -> (u16, Option<Duration>) {
    let Ok(value) = serde_json::from_str::<Value>(body) else { return (status, None) };
    let details = value.pointer("/error/details").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let invalid_key = details.iter().any(|d| d.get("reason").and_then(Value::as_str) == Some("API_KEY_INVALID"));
    let delay = details.iter().find_map(|d| d.get("retryDelay").and_then(Value::as_str)).and_then(|text| {
        let seconds: f64 = text.trim().strip_suffix('s')?.parse().ok()?;
        (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(86_400.0)))
    });
    (if invalid_key && status == 400 { 401 } else { status }, delay)
}

impl Provider for Gemini {
    fn prepare(&self, call: &ChatCall, settings: Map<String, Value>) -> Result<Value, ModelError> {
        let mut body = Map::new();
        let (system, contents) = conversation(&call.messages)?;
        body.insert("contents".into(), Value::Array(contents));
        if !system.is_empty() {
            body.insert("systemInstruction".into(), json!({ "parts": [{ "text": system.join("\n\n") }] }));
        }
        if !call.tools.is_empty() && call.tool_use != ToolUse::None {
            let declarations: Vec<Value> = call
                .tools
                .iter()
                .map(|t| {
                    let mut declaration = json!({ "name": t.name, "description": t.description });
                    // A tool without parameters has no `parameters` at all (an empty object schema is refused).
                    if let Some(schema) = t.schema().map(|s| sanitize_schema(&s)).filter(has_properties)
                        && let Some(obj) = declaration.as_object_mut()
                    {
                        obj.insert("parameters".into(), schema);
                    }
                    declaration
                })
                .collect();
            body.insert("tools".into(), json!([{ "functionDeclarations": declarations }]));
            let config = match &call.tool_use {
                ToolUse::Auto | ToolUse::None => None,
                ToolUse::Required => Some(json!({ "mode": "ANY" })),
                ToolUse::Tool(name) => Some(json!({ "mode": "ANY", "allowedFunctionNames": [name] })),
            };
            if let Some(config) = config {
                body.insert("toolConfig".into(), json!({ "functionCallingConfig": config }));
            }
        }
        let mut generation = Map::new();
        let mut thinking = Map::new();
        if !call.stop.is_empty() {
            generation.insert("stopSequences".into(), json!(call.stop));
        }
        let mut raw = Map::new();
        for (key, value) in settings {
            if let Some((_, field)) = GENERATION.iter().find(|(k, _)| *k == key) {
                generation.insert((*field).into(), value);
            } else if let Some((_, field)) = THINKING.iter().find(|(k, _)| *k == key) {
                thinking.insert((*field).into(), value);
            } else if key == "reasoning_effort" {
                thinking.entry("thinkingLevel").or_insert(value);
            } else if key == "safety_settings" {
                body.insert("safetySettings".into(), safety_settings(value, &self.name)?);
            } else if let ("extra_body" | "model_kwargs", Value::Object(inner)) = (key.as_str(), &value) {
                crate::thinking::deep_merge(&mut raw, inner);
            } else {
                return Err(ModelError::invalid(
                    "model_name",
                    format!(
                        "model `{}` (gemini) has the setting `{key}`, which the Gemini API does not take\nhint: the Gemini keys are {}; \
                         raw request fields go under extra_body",
                        self.name,
                        SETTINGS.join(", ")
                    ),
                ));
            }
        }
        if call.thinking_enabled {
            // Thought summaries are what Antler streams as thinking; the model thinks either way.
            thinking.entry("includeThoughts").or_insert(Value::Bool(true));
        }
        if !thinking.is_empty() {
            generation.insert("thinkingConfig".into(), Value::Object(thinking));
        }
        if !generation.is_empty() {
            body.insert("generationConfig".into(), Value::Object(generation));
        }
        crate::thinking::deep_merge(&mut body, &raw);
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

/// `safety_settings` as LangChain writes it (`{category: threshold}`) or as the API does
/// (`[{category, threshold}]`).
fn safety_settings(value: Value, model: &str) -> Result<Value, ModelError> {
    match value {
        Value::Array(list) => Ok(Value::Array(list)),
        Value::Object(map) => {
            Ok(Value::Array(map.into_iter().map(|(category, threshold)| json!({ "category": category, "threshold": threshold })).collect()))
        }
        _ => Err(ModelError::invalid(
            "model_name",
            format!("model `{model}`: safety_settings must be a mapping of category to threshold, or a list"),
        )),
    }
}

fn has_properties(schema: &Value) -> bool {
    schema.get("properties").and_then(Value::as_object).is_some_and(|p| !p.is_empty())
}

/// A JSON Schema reduced to what the API's `Schema` takes: unknown keywords dropped, `["string",
/// "null"]` types turned into `nullable`, `const` into a one-value `enum`.
pub fn sanitize_schema(schema: &Value) -> Value {
    let Value::Object(map) = schema else { return schema.clone() };
    let mut out = Map::new();
    for (key, value) in map {
        match key.as_str() {
            "type" => match value {
                Value::Array(types) => {
                    let concrete: Vec<&Value> = types.iter().filter(|t| t.as_str() != Some("null")).collect();
                    if let Some(first) = concrete.first() {
                        out.insert("type".into(), (*first).clone());
                    }
                    if concrete.len() < types.len() {
                        out.insert("nullable".into(), Value::Bool(true));
                    }
                }
                other => {
                    out.insert("type".into(), other.clone());
                }
            },
            "const" => {
                out.insert("enum".into(), json!([value]));
            }
            "properties" => {
                let props = value.as_object().map(|p| p.iter().map(|(k, v)| (k.clone(), sanitize_schema(v))).collect()).unwrap_or_default();
                out.insert("properties".into(), Value::Object(props));
            }
            "items" => {
                out.insert("items".into(), sanitize_schema(value));
            }
            "anyOf" | "oneOf" => {
                let options = value.as_array().map(|o| o.iter().map(sanitize_schema).collect()).unwrap_or_default();
                out.insert("anyOf".into(), Value::Array(options));
            }
            _ if SCHEMA_KEYS.contains(&key.as_str()) => {
                out.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    Value::Object(out)
}

/// The system text and the `contents` of a conversation.
fn conversation(messages: &[Message]) -> Result<(Vec<String>, Vec<Value>), ModelError> {
    let mut system = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    // A result names the function it answers; the call's id is how Antler's messages link them.
    let mut names: HashMap<&str, &str> = HashMap::new();
    for (i, m) in messages.iter().enumerate() {
        let path = format!("messages[{i}]");
        let (role, parts) = match Role::try_from(m.role).unwrap_or(Role::User) {
            Role::System => {
                let text = plain_text(&m.content);
                if !text.is_empty() {
                    system.push(text);
                }
                continue;
            }
            Role::Assistant => {
                for call in &m.tool_calls {
                    names.insert(call.id.as_str(), call.name.as_str());
                }
                ("model", model_parts(m))
            }
            Role::Tool => {
                let name = names.get(m.tool_call_id.as_str()).copied().unwrap_or(m.name.as_str());
                if name.is_empty() {
                    return Err(ModelError::invalid(
                        format!("{path}.tool_call_id"),
                        format!(
                            "`{}` answers no tool call of an earlier assistant message, and Gemini matches results by the function's name",
                            m.tool_call_id
                        ),
                    ));
                }
                let text = plain_text(&m.content);
                let key = if m.is_error { "error" } else { "output" };
                ("user", vec![json!({ "functionResponse": { "name": name, "response": { key: text } } })])
            }
            Role::User | Role::Unspecified => ("user", user_parts(&m.content, &path)?),
        };
        if parts.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(parts),
            _ => turns.push((role, parts)),
        }
    }
    Ok((system, turns.into_iter().map(|(role, parts)| json!({ "role": role, "parts": parts })).collect()))
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

fn image_part(image: &ImagePart, path: &str) -> Result<Value, ModelError> {
    match &image.source {
        Some(image_part::Source::Data(data)) => {
            Ok(json!({ "inlineData": { "mimeType": image.mime_type, "data": base64::engine::general_purpose::STANDARD.encode(data) } }))
        }
        Some(image_part::Source::Url(url)) if url.starts_with("data:") => {
            let parsed = url
                .strip_prefix("data:")
                .and_then(|rest| rest.split_once(','))
                .and_then(|(meta, payload)| meta.strip_suffix(";base64").map(|media| (media, payload)));
            let Some((media, payload)) = parsed else {
                return Err(ModelError::invalid(format!("{path}.image.url"), "a data: URL must be base64 (data:image/png;base64,...)"));
            };
            Ok(json!({ "inlineData": { "mimeType": media, "data": payload } }))
        }
        Some(image_part::Source::Url(url)) if url.starts_with("https://") => {
            let mime = if image.mime_type.is_empty() { "image/jpeg" } else { image.mime_type.as_str() };
            Ok(json!({ "fileData": { "mimeType": mime, "fileUri": url } }))
        }
        _ => Err(ModelError::invalid(format!("{path}.image"), "a sandbox path must be resolved to image data first (thread_id missing?)")),
    }
}

fn user_parts(parts: &[ContentPart], path: &str) -> Result<Vec<Value>, ModelError> {
    let mut out = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        match &part.part {
            Some(content_part::Part::Text(t)) if !t.text.is_empty() => out.push(json!({ "text": t.text })),
            Some(content_part::Part::File(f)) => out.push(json!({ "text": file_reference(f) })),
            Some(content_part::Part::Image(image)) => out.push(image_part(image, &format!("{path}.content[{j}]"))?),
            _ => {}
        }
    }
    Ok(out)
}

/// A `model` turn: its text, its calls, and the thought signature it was given, back on the part
/// that carried it (the first call, else the last text part). Thought summaries are not sent back.
fn model_parts(m: &Message) -> Vec<Value> {
    // The last one: a call's signature follows any thought summary's.
    let signature = m
        .content
        .iter()
        .filter_map(|p| match &p.part {
            Some(content_part::Part::Thinking(t)) if !t.signature.is_empty() => Some(t.signature.clone()),
            _ => None,
        })
        .next_back();
    let mut parts: Vec<Value> = m
        .content
        .iter()
        .filter_map(|p| match &p.part {
            Some(content_part::Part::Text(t)) if !t.text.is_empty() => Some(json!({ "text": t.text })),
            Some(content_part::Part::File(f)) => Some(json!({ "text": file_reference(f) })),
            _ => None,
        })
        .collect();
    let text_parts = parts.len();
    for call in &m.tool_calls {
        let args = call.arguments.as_ref().map(|a| Value::Object(struct_to_map(a, Numbers::WholeAsInteger))).unwrap_or_else(|| json!({}));
        parts.push(json!({ "functionCall": { "name": call.name, "args": args } }));
    }
    let carrier = if parts.len() > text_parts { Some(text_parts) } else { text_parts.checked_sub(1) };
    if let (Some(signature), Some(index)) = (signature, carrier)
        && let Some(part) = parts.get_mut(index).and_then(Value::as_object_mut)
    {
        part.insert("thoughtSignature".into(), Value::from(signature));
    }
    parts
}

/// Reads a `streamGenerateContent?alt=sse` stream.
#[derive(Debug, Default)]
pub struct Parser {
    model_seen: bool,
    /// Function calls so far; each one's key.
    calls: u32,
    finished: bool,
}

fn count(value: &Value, key: &str) -> Option<u64> {
    value.get(key).and_then(Value::as_u64)
}

/// Normalised usage from `usageMetadata`: output counts thoughts too (they are billed as output).
pub fn usage(meta: &Value) -> UsageReport {
    let candidates = count(meta, "candidatesTokenCount");
    let thoughts = count(meta, "thoughtsTokenCount");
    let prompt = count(meta, "promptTokenCount");
    let tool_prompt = count(meta, "toolUsePromptTokenCount");
    UsageReport {
        input: prompt.map(|p| p + tool_prompt.unwrap_or(0)),
        output: match (candidates, thoughts) {
            (None, None) => None,
            (c, t) => Some(c.unwrap_or(0) + t.unwrap_or(0)),
        },
        total: count(meta, "totalTokenCount"),
        cache_read: count(meta, "cachedContentTokenCount"),
        cache_creation: None,
        reasoning: thoughts,
    }
}

fn stop_of(reason: &str, made_calls: bool) -> Result<Stop, UpstreamError> {
    Ok(match reason {
        "STOP" if made_calls => Stop::ToolCalls,
        "MAX_TOKENS" => Stop::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" | "LANGUAGE" => Stop::ContentFilter,
        "MALFORMED_FUNCTION_CALL" | "UNEXPECTED_TOOL_CALL" => {
            // The model wrote a call that does not parse; another attempt usually writes it right.
            return Err(UpstreamError::new(
                UpstreamKind::Broken,
                format!("Gemini ended the answer with {reason} (a function call it could not form)"),
            ));
        }
        _ => Stop::Stop,
    })
}

/// An `error` object (in an event or an error body) as an upstream error.
fn stream_error(error: &Value) -> UpstreamError {
    let message = error.get("message").and_then(Value::as_str).unwrap_or("error event without a message");
    let code = error.get("code").and_then(Value::as_u64).and_then(|c| u16::try_from(c).ok()).filter(|c| (400..600).contains(c));
    let status = code.unwrap_or(match error.get("status").and_then(Value::as_str).unwrap_or_default() {
        "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => 400,
        "UNAUTHENTICATED" => 401,
        "PERMISSION_DENIED" => 403,
        "NOT_FOUND" => 404,
        "RESOURCE_EXHAUSTED" => 429,
        "UNAVAILABLE" => 503,
        "DEADLINE_EXCEEDED" => 504,
        _ => 500,
    });
    let (status, retry_after) = read_error(status, &json!({ "error": error }).to_string());
    UpstreamError::from_status(status, message, retry_after)
}

impl SseParser for Parser {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<Event>, UpstreamError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|_| UpstreamError::malformed("an event that is not JSON", data))?;
        if let Some(error) = chunk.get("error").filter(|e| e.is_object()) {
            return Err(stream_error(error));
        }
        if !chunk.is_object() {
            return Err(UpstreamError::malformed("an event that is not a JSON object", data));
        }
        let mut events = Vec::new();
        if !self.model_seen
            && let Some(model) = chunk.get("modelVersion").and_then(Value::as_str).filter(|m| !m.is_empty())
        {
            self.model_seen = true;
            events.push(Event::Model(model.to_owned()));
        }
        if let Some(reason) = chunk.pointer("/promptFeedback/blockReason").and_then(Value::as_str) {
            self.finished = true;
            events.push(Event::Finish { stop: Stop::ContentFilter, raw: reason.to_owned(), stop_sequence: String::new() });
        }
        let candidates = match chunk.get("candidates") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(list)) => list.as_slice(),
            Some(_) => return Err(UpstreamError::malformed("`candidates` is not a list", data)),
        };
        // Only the first candidate: Antler never asks for more.
        if let Some(candidate) = candidates.iter().find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0) {
            let parts = candidate.pointer("/content/parts").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
            for part in parts {
                self.part(part, data, &mut events)?;
            }
            if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
                self.finished = true;
                events.push(Event::Finish { stop: stop_of(reason, self.calls > 0)?, raw: reason.to_owned(), stop_sequence: String::new() });
            }
        }
        if let Some(meta) = chunk.get("usageMetadata").filter(|u| u.is_object()) {
            events.push(Event::Usage(usage(meta)));
        }
        Ok(events)
    }

    fn on_eof(&mut self) -> Result<Vec<Event>, UpstreamError> {
        if self.finished {
            Ok(vec![Event::Done])
        } else {
            Err(UpstreamError::new(UpstreamKind::Broken, "the stream ended before a finishReason"))
        }
    }
}

impl Parser {
    fn part(&mut self, part: &Value, data: &str, events: &mut Vec<Event>) -> Result<(), UpstreamError> {
        let signature = part.get("thoughtSignature").and_then(Value::as_str).filter(|s| !s.is_empty());
        let thought = part.get("thought").and_then(Value::as_bool).unwrap_or(false);
        if let Some(call) = part.get("functionCall") {
            if let Some(signature) = signature {
                events.push(Event::Signature(signature.to_owned()));
                events.push(Event::ThinkingStop);
            }
            let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
            if name.is_empty() {
                return Err(UpstreamError::malformed("a functionCall without a name", data));
            }
            let args = match call.get("args") {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(args @ Value::Object(_)) => args.to_string(),
                Some(_) => return Err(UpstreamError::malformed("functionCall args that are not an object", data)),
            };
            let key = self.calls;
            self.calls += 1;
            let id = call.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
            events.push(Event::ToolStart { key, id, name: name.to_owned() });
            events.push(Event::ToolArgs { key, delta: args });
            events.push(Event::ToolStop { key });
            return Ok(());
        }
        let text = part.get("text").and_then(Value::as_str).unwrap_or_default();
        if thought {
            events.push(Event::Thinking(text.to_owned()));
            if let Some(signature) = signature {
                events.push(Event::Signature(signature.to_owned()));
                events.push(Event::ThinkingStop);
            }
            return Ok(());
        }
        if let Some(signature) = signature {
            // The signature of a turn without calls rides on its text; kept as its own thinking block.
            events.push(Event::Signature(signature.to_owned()));
            events.push(Event::ThinkingStop);
        }
        if !text.is_empty() {
            events.push(Event::Text(text.to_owned()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
