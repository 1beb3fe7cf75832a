//! A chat request after validation: every rule `ChatRequest` documents is checked here, once, before any
//! model is resolved or any upstream is called. Checks that depend on the chosen model (vision, tools,
//! output limit) are in [`ChatCall::check_against`], because a fallback model may differ.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use antler_proto::common::{ContentPart, Message, ReasoningEffort, Role, content_part, image_part};
use antler_proto::models::{ChatRequest, ToolChoiceMode};
use prost::Message as _;

use crate::error::ModelError;
use crate::spec::ModelSpec;

/// True when an image URL names a file in a sandbox (`/mnt/…`), which the models service reads through the
/// sandbox service (`images`), rather than something a provider can fetch.
pub fn is_virtual(url: &str) -> bool {
    url.starts_with("/mnt/")
}

/// Largest encoded `metadata` accepted.
const MAX_METADATA_BYTES: usize = 16 * 1024;
/// Longest caller tag.
const MAX_CALLER_LEN: usize = 128;

/// Attribution bucket of a caller tag; a bounded metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerBucket {
    LeadAgent,
    Subagent,
    Middleware,
}

impl CallerBucket {
    /// `subagent:x` → Subagent, `middleware:x` → Middleware, anything else → LeadAgent.
    pub fn of(caller: &str) -> Self {
        match caller.split_once(':').map(|(prefix, _)| prefix).unwrap_or(caller) {
            "subagent" => Self::Subagent,
            "middleware" => Self::Middleware,
            _ => Self::LeadAgent,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::LeadAgent => "lead_agent",
            Self::Subagent => "subagent",
            Self::Middleware => "middleware",
        }
    }
}

/// How the model may use tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolUse {
    Auto,
    None,
    Required,
    Tool(String),
}

/// A validated chat request.
#[derive(Debug, Clone)]
pub struct ChatCall {
    /// Requested model; empty = the default model.
    pub model_name: String,
    pub messages: Vec<Message>,
    /// Shared with other calls that send the same definitions (see `tool_intern`).
    pub tools: Vec<Arc<CallTool>>,
    pub tool_use: ToolUse,
    pub thinking_enabled: bool,
    pub thinking_budget_tokens: u32,
    /// `minimal`, `low`, `medium` or `high`.
    pub reasoning_effort: Option<&'static str>,
    /// 0 = the model's configured limit.
    pub max_tokens: u32,
    pub temperature: Option<f64>,
    pub stop: Vec<String>,
    /// Caller tag as given, or `lead_agent`.
    pub caller: String,
    pub bucket: CallerBucket,
    pub run_id: String,
    pub thread_id: String,
    /// When the RPC arrived (latency and time to first token count from here).
    pub received: Instant,
}

fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

pub use crate::tool_intern::CallTool;

/// A tool schema's rule, whichever form it comes in (`parameters` or `parameters_json`).
const OBJECT_SCHEMA: &str = "must be a JSON Schema with \"type\": \"object\"";

/// The top of a tool schema given as JSON text: only `type` is built, every other member is skipped
/// (a full `serde_json::Value` would allocate the whole tree on every call).
#[derive(serde::Deserialize)]
struct SchemaTop {
    #[serde(rename = "type", default)]
    kind: Option<serde_json::Value>,
}

/// `ToolSpec.parameters_json` must be a JSON object whose `type`, when given, is "object" (the rule
/// `parameters` follows).
fn check_schema_text(text: &str) -> Result<(), String> {
    if !text.trim_start().starts_with('{') {
        return Err("must be a JSON object (a JSON Schema such as {\"type\": \"object\"})".to_owned());
    }
    match serde_json::from_str::<SchemaTop>(text) {
        Err(error) => Err(format!("is not valid JSON: {error}")),
        Ok(SchemaTop { kind: Some(kind) }) if kind != "object" => Err(OBJECT_SCHEMA.to_owned()),
        Ok(_) => Ok(()),
    }
}

impl ChatCall {
    /// Validates a wire request. Field names in errors are the request's own (`messages[2].role`).
    pub fn from_proto(request: ChatRequest, received: Instant) -> Result<Self, ModelError> {
        if request.messages.is_empty() {
            return Err(ModelError::invalid("messages", "at least one message is required"));
        }
        for (i, message) in request.messages.iter().enumerate() {
            check_message(message, &format!("messages[{i}]"))?;
        }

        let mut names = HashSet::new();
        for (i, tool) in request.tools.iter().enumerate() {
            if !valid_tool_name(&tool.name) {
                return Err(ModelError::invalid(format!("tools[{i}].name"), format!("`{}` must match ^[A-Za-z0-9_-]{{1,64}}$", tool.name)));
            }
            if !names.insert(tool.name.as_str()) {
                return Err(ModelError::invalid(format!("tools[{i}].name"), format!("`{}` is given twice", tool.name)));
            }
            if let Some(params) = &tool.parameters
                && let Some(kind) = params.fields.get("type")
                && !matches!(&kind.kind, Some(prost_types::value::Kind::StringValue(s)) if s == "object")
            {
                return Err(ModelError::invalid(format!("tools[{i}].parameters"), OBJECT_SCHEMA));
            }
            if !tool.parameters_json.is_empty() {
                if tool.parameters.is_some() {
                    return Err(ModelError::invalid(
                        format!("tools[{i}].parameters_json"),
                        "is set together with parameters; set one of the two",
                    ));
                }
                check_schema_text(&tool.parameters_json).map_err(|why| ModelError::invalid(format!("tools[{i}].parameters_json"), why))?;
            }
        }

        let tool_use = match &request.tool_choice {
            None => ToolUse::Auto,
            Some(choice) => {
                let mode = ToolChoiceMode::try_from(choice.mode)
                    .map_err(|_| ModelError::invalid("tool_choice.mode", format!("{} is not a ToolChoiceMode", choice.mode)))?;
                if mode != ToolChoiceMode::Tool && !choice.tool_name.is_empty() {
                    return Err(ModelError::invalid("tool_choice.tool_name", "must be empty unless mode is TOOL_CHOICE_MODE_TOOL"));
                }
                match mode {
                    ToolChoiceMode::Unspecified | ToolChoiceMode::Auto => ToolUse::Auto,
                    ToolChoiceMode::None => ToolUse::None,
                    ToolChoiceMode::Required if request.tools.is_empty() => {
                        return Err(ModelError::invalid("tool_choice.mode", "REQUIRED needs at least one tool in `tools`"));
                    }
                    ToolChoiceMode::Required => ToolUse::Required,
                    ToolChoiceMode::Tool => {
                        if !names.contains(choice.tool_name.as_str()) {
                            return Err(ModelError::invalid(
                                "tool_choice.tool_name",
                                format!("`{}` is not one of the request's tools", choice.tool_name),
                            ));
                        }
                        ToolUse::Tool(choice.tool_name.clone())
                    }
                }
            }
        };

        let reasoning_effort = match ReasoningEffort::try_from(request.reasoning_effort) {
            Ok(ReasoningEffort::Unspecified) => None,
            Ok(ReasoningEffort::Minimal) => Some("minimal"),
            Ok(ReasoningEffort::Low) => Some("low"),
            Ok(ReasoningEffort::Medium) => Some("medium"),
            Ok(ReasoningEffort::High) => Some("high"),
            Err(_) => {
                return Err(ModelError::invalid("reasoning_effort", format!("{} is not a ReasoningEffort", request.reasoning_effort)));
            }
        };

        if let Some(t) = request.temperature
            && !(t.is_finite() && (0.0..=2.0).contains(&t))
        {
            return Err(ModelError::invalid("temperature", format!("{t} is out of range: must be between 0.0 and 2.0")));
        }
        if request.stop_sequences.len() > 4 {
            return Err(ModelError::invalid("stop_sequences", format!("{} given; at most 4 are allowed", request.stop_sequences.len())));
        }
        if let Some(i) = request.stop_sequences.iter().position(String::is_empty) {
            return Err(ModelError::invalid(format!("stop_sequences[{i}]"), "must not be empty"));
        }
        if let Some(metadata) = &request.metadata
            && metadata.encoded_len() > MAX_METADATA_BYTES
        {
            return Err(ModelError::invalid("metadata", format!("{} bytes encoded; at most {MAX_METADATA_BYTES}", metadata.encoded_len())));
        }
        if request.thread_id.is_empty() {
            for (i, message) in request.messages.iter().enumerate() {
                for (j, part) in message.content.iter().enumerate() {
                    if let Some(content_part::Part::Image(image)) = &part.part
                        && let Some(image_part::Source::Url(url)) = &image.source
                        && is_virtual(url)
                    {
                        return Err(ModelError::invalid(
                            format!("messages[{i}].content[{j}].image.url"),
                            format!("`{url}` is a sandbox path; set thread_id to say whose sandbox holds it"),
                        ));
                    }
                }
            }
        }
        if request.caller.len() > MAX_CALLER_LEN {
            return Err(ModelError::invalid("caller", format!("{} characters; at most {MAX_CALLER_LEN}", request.caller.len())));
        }
        let caller = if request.caller.is_empty() { "lead_agent".to_owned() } else { request.caller };
        let bucket = CallerBucket::of(&caller);

        Ok(Self {
            model_name: request.model_name,
            messages: request.messages,
            tools: crate::tool_intern::intern(request.tools.into_iter().map(CallTool::from).collect()),
            tool_use,
            thinking_enabled: request.thinking_enabled,
            thinking_budget_tokens: request.thinking_budget_tokens,
            reasoning_effort,
            max_tokens: request.max_tokens,
            temperature: request.temperature,
            stop: request.stop_sequences,
            caller,
            bucket,
            run_id: request.run_id,
            thread_id: request.thread_id,
            received,
        })
    }

    /// Checks what depends on the model: tools, images, output limit. Thinking is checked with the model's
    /// parameters ([`crate::thinking::settings`]).
    pub fn check_against(&self, model: &ModelSpec) -> Result<(), ModelError> {
        if !self.tools.is_empty() && !model.capabilities.tools {
            return Err(ModelError::invalid("tools", format!("model `{}` does not support tools (supports_tools: false)", model.name)));
        }
        if !model.capabilities.vision {
            for (i, message) in self.messages.iter().enumerate() {
                if let Some(j) = message.content.iter().position(|p| matches!(p.part, Some(content_part::Part::Image(_)))) {
                    return Err(ModelError::invalid(
                        format!("messages[{i}].content[{j}]"),
                        format!("model `{}` does not accept images (supports_vision: false)", model.name),
                    ));
                }
            }
        }
        if let Some(limit) = model.max_tokens
            && self.max_tokens > limit
        {
            return Err(ModelError::invalid(
                "max_tokens",
                format!("{} is above model `{}`'s max_output_tokens {limit}", self.max_tokens, model.name),
            ));
        }
        Ok(())
    }

    /// True when an image is given as a sandbox path and must be read before a provider can see it.
    pub fn has_sandbox_images(&self) -> bool {
        self.messages.iter().flat_map(|m| &m.content).any(|p| {
            matches!(&p.part, Some(content_part::Part::Image(image)) if matches!(&image.source, Some(image_part::Source::Url(url)) if is_virtual(url)))
        })
    }

    /// The number of assistant turns so far (the replay provider's turn index).
    pub fn assistant_turns(&self) -> usize {
        self.messages.iter().filter(|m| m.role == Role::Assistant as i32).count()
    }
}

fn check_message(message: &Message, path: &str) -> Result<(), ModelError> {
    let role = Role::try_from(message.role).unwrap_or(Role::Unspecified);
    if role == Role::Unspecified {
        return Err(ModelError::invalid(format!("{path}.role"), "is required"));
    }
    if !message.id.is_empty() && !valid_tool_name(&message.id) {
        return Err(ModelError::invalid(format!("{path}.id"), format!("`{}` must match ^[A-Za-z0-9_-]{{1,64}}$", message.id)));
    }
    if !message.tool_calls.is_empty() && role != Role::Assistant {
        return Err(ModelError::invalid(format!("{path}.tool_calls"), "only assistant messages carry tool calls"));
    }
    for (k, call) in message.tool_calls.iter().enumerate() {
        if call.id.is_empty() || call.name.is_empty() {
            return Err(ModelError::invalid(format!("{path}.tool_calls[{k}]"), "id and name are required"));
        }
    }
    match (role, message.tool_call_id.is_empty()) {
        (Role::Tool, true) => return Err(ModelError::invalid(format!("{path}.tool_call_id"), "is required for ROLE_TOOL")),
        (Role::Tool, false) | (_, true) => {}
        (_, false) => return Err(ModelError::invalid(format!("{path}.tool_call_id"), "must be empty unless role is ROLE_TOOL")),
    }
    for (j, part) in message.content.iter().enumerate() {
        check_part(part, role, &format!("{path}.content[{j}]"))?;
    }
    Ok(())
}

fn check_part(part: &ContentPart, role: Role, path: &str) -> Result<(), ModelError> {
    match &part.part {
        None => Err(ModelError::invalid(format!("{path}.part"), "is required")),
        Some(content_part::Part::Text(_)) | Some(content_part::Part::File(_)) => Ok(()),
        Some(content_part::Part::Thinking(_)) | Some(content_part::Part::RedactedThinking(_)) if role != Role::Assistant => {
            Err(ModelError::invalid(path, "thinking parts belong to assistant messages only"))
        }
        Some(content_part::Part::Thinking(_)) | Some(content_part::Part::RedactedThinking(_)) => Ok(()),
        Some(content_part::Part::Image(image)) => {
            if !matches!(image.detail.as_str(), "" | "low" | "high" | "auto") {
                return Err(ModelError::invalid(format!("{path}.image.detail"), format!("`{}` must be low, high or auto", image.detail)));
            }
            match &image.source {
                None => Err(ModelError::invalid(format!("{path}.image.source"), "is required")),
                Some(image_part::Source::Data(data)) => {
                    if data.is_empty() {
                        Err(ModelError::invalid(format!("{path}.image.data"), "is empty"))
                    } else if !image.mime_type.starts_with("image/") {
                        Err(ModelError::invalid(format!("{path}.image.mime_type"), "an image/* media type is required with data"))
                    } else {
                        Ok(())
                    }
                }
                Some(image_part::Source::Url(url)) => {
                    if url.starts_with("https://") || url.starts_with("data:image/") || url.starts_with("/mnt/user-data/") {
                        Ok(())
                    } else {
                        Err(ModelError::invalid(
                            format!("{path}.image.url"),
                            "must be an https:// URL, a data:image/… URL or a /mnt/user-data/ virtual path",
                        ))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use antler_proto::common::{ImagePart, TextPart, ToolCall, ToolSpec};
    use antler_proto::models::ToolChoice;

    pub(crate) fn user(text: &str) -> Message {
        Message {
            role: Role::User as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
            ..Message::default()
        }
    }

    pub(crate) fn call() -> ChatCall {
        let request = ChatRequest { messages: vec![user("hi")], ..ChatRequest::default() };
        ChatCall::from_proto(request, Instant::now()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn field_of(request: ChatRequest) -> String {
        match ChatCall::from_proto(request, Instant::now()) {
            Err(ModelError::InvalidArgument { field, .. }) => field,
            other => format!("not invalid: {other:?}"),
        }
    }

    #[test]
    fn empty_conversations_and_missing_roles_are_named() {
        assert_eq!(field_of(ChatRequest::default()), "messages");
        let request = ChatRequest { messages: vec![user("a"), Message::default()], ..ChatRequest::default() };
        assert_eq!(field_of(request), "messages[1].role");
    }

    #[test]
    fn tool_rules_are_enforced() {
        let tool = |name: &str| ToolSpec { name: name.to_owned(), ..ToolSpec::default() };
        let base = || ChatRequest { messages: vec![user("a")], ..ChatRequest::default() };
        assert_eq!(field_of(ChatRequest { tools: vec![tool("bad name")], ..base() }), "tools[0].name");
        assert_eq!(field_of(ChatRequest { tools: vec![tool("a"), tool("a")], ..base() }), "tools[1].name");
        let choice = ToolChoice { mode: ToolChoiceMode::Tool as i32, tool_name: "missing".into() };
        assert_eq!(field_of(ChatRequest { tools: vec![tool("a")], tool_choice: Some(choice), ..base() }), "tool_choice.tool_name");
        let mut message = user("a");
        message.tool_calls.push(ToolCall { id: "c".into(), name: "a".into(), ..ToolCall::default() });
        assert_eq!(field_of(ChatRequest { messages: vec![message], ..ChatRequest::default() }), "messages[0].tool_calls");
    }

    #[test]
    fn a_schema_as_text_is_checked_and_kept_as_sent() {
        let base = || ChatRequest { messages: vec![user("a")], ..ChatRequest::default() };
        let tool = |json: &str| ToolSpec { name: "t".into(), parameters_json: json.into(), ..ToolSpec::default() };
        for bad in ["[1]", "not json", r#"{"type": "string"}"#, r#"{"type": ["object"]}"#, r#"{"type": "object""#] {
            assert_eq!(field_of(ChatRequest { tools: vec![tool(bad)], ..base() }), "tools[0].parameters_json", "{bad}");
        }
        let array_type = ChatCall::from_proto(ChatRequest { tools: vec![tool(r#"{"type": ["object"]}"#)], ..base() }, Instant::now());
        assert!(format!("{:?}", array_type.err()).contains("must be a JSON Schema"), "a wrong type is named as such, not as bad JSON");
        let both = ToolSpec { parameters: Some(prost_types::Struct::default()), ..tool("{}") };
        assert_eq!(field_of(ChatRequest { tools: vec![both], ..base() }), "tools[0].parameters_json");

        let text = r#"{"type":"object","properties":{"n":{"type":"integer","maximum":3}}}"#;
        let call =
            ChatCall::from_proto(ChatRequest { tools: vec![tool(text)], ..base() }, Instant::now()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(call.tools[0].parameters.as_deref(), Some(text), "the text is kept as sent (integers stay integers)");
        let untyped = ChatCall::from_proto(ChatRequest { tools: vec![tool(r#" {"properties": {}}"#)], ..base() }, Instant::now());
        assert!(untyped.is_ok(), "a schema without `type` is accepted, as with parameters");
    }

    #[test]
    fn sampling_limits_are_enforced() {
        let base = || ChatRequest { messages: vec![user("a")], ..ChatRequest::default() };
        assert_eq!(field_of(ChatRequest { temperature: Some(2.5), ..base() }), "temperature");
        let stops = vec!["a".to_owned(); 5];
        assert_eq!(field_of(ChatRequest { stop_sequences: stops, ..base() }), "stop_sequences");
        assert_eq!(field_of(ChatRequest { stop_sequences: vec![String::new()], ..base() }), "stop_sequences[0]");
    }

    #[test]
    fn plain_http_images_are_refused() {
        let mut message = user("look");
        message.content.push(ContentPart {
            part: Some(content_part::Part::Image(ImagePart {
                source: Some(image_part::Source::Url("http://x/y.png".into())),
                ..ImagePart::default()
            })),
        });
        assert_eq!(field_of(ChatRequest { messages: vec![message], ..ChatRequest::default() }), "messages[0].content[1].image.url");
    }

    #[test]
    fn caller_tags_pick_their_bucket() {
        assert_eq!(CallerBucket::of("subagent:research"), CallerBucket::Subagent);
        assert_eq!(CallerBucket::of("middleware:title"), CallerBucket::Middleware);
        assert_eq!(CallerBucket::of("lead_agent"), CallerBucket::LeadAgent);
        assert_eq!(CallerBucket::of("somebody"), CallerBucket::LeadAgent);
        assert_eq!(call().caller, "lead_agent");
    }
}
