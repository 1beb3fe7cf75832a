//! Antler messages ⇄ LangChain message dicts (what LangGraph clients send in `input.messages` and
//! read in `values`, `updates` and `messages-tuple` frames).

use antler_kit::json::{json_to_value, struct_to_json};
use antler_proto::common::{ContentPart, FilePart, ImagePart, Message, Role, TextPart, ToolCall, Usage, content_part, image_part};
use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The LangChain `type` of a role.
pub fn type_of(role: i32) -> &'static str {
    match Role::try_from(role) {
        Ok(Role::Assistant) => "ai",
        Ok(Role::Tool) => "tool",
        Ok(Role::System) => "system",
        _ => "human",
    }
}

/// A message as LangChain serialises it (`message.model_dump()`), which LangGraph's SDKs and UIs read.
/// Visible text becomes `content` (a string when the message is text only, else a list of blocks);
/// thinking goes to `additional_kwargs.reasoning_content`, where DeerFlow's UI looks for it.
pub fn to_langchain(message: &Message) -> Value {
    let mut text = String::new();
    let mut thinking = String::new();
    let mut blocks = Vec::new();
    let mut only_text = true;
    for part in &message.content {
        match &part.part {
            Some(content_part::Part::Text(t)) => {
                text.push_str(&t.text);
                blocks.push(json!({ "type": "text", "text": t.text }));
            }
            Some(content_part::Part::Thinking(t)) => thinking.push_str(&t.text),
            Some(content_part::Part::Image(image)) => {
                only_text = false;
                let url = match &image.source {
                    Some(image_part::Source::Url(url)) => url.clone(),
                    Some(image_part::Source::Data(data)) => {
                        format!("data:{};base64,{}", image.mime_type, base64::engine::general_purpose::STANDARD.encode(data))
                    }
                    None => String::new(),
                };
                blocks.push(json!({ "type": "image_url", "image_url": { "url": url } }));
            }
            Some(content_part::Part::File(file)) => {
                only_text = false;
                blocks.push(json!({ "type": "file", "path": file.path, "mime_type": file.mime_type, "name": file.name, "size_bytes": file.size_bytes }));
            }
            Some(content_part::Part::RedactedThinking(_)) | None => {}
        }
    }
    let content = if only_text { Value::String(text) } else { Value::Array(blocks) };
    let mut additional = match message.metadata.as_ref().map(struct_to_json) {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    if !thinking.is_empty() {
        additional.insert("reasoning_content".to_owned(), Value::String(thinking));
    }
    let mut out = json!({
        "type": type_of(message.role),
        "id": message.id,
        "name": if message.name.is_empty() { Value::Null } else { Value::String(message.name.clone()) },
        "content": content,
        "additional_kwargs": additional,
        "response_metadata": {},
    });
    match Role::try_from(message.role) {
        Ok(Role::Assistant) => {
            let (valid, invalid): (Vec<&ToolCall>, Vec<&ToolCall>) = message.tool_calls.iter().partition(|c| c.arguments.is_some());
            out["tool_calls"] = valid.iter().map(|c| tool_call(c)).collect();
            out["invalid_tool_calls"] = invalid
                .iter()
                .map(|c| {
                    json!({ "type": "invalid_tool_call", "id": c.id, "name": c.name, "args": c.raw_arguments,
                            "error": "the arguments are not a JSON object" })
                })
                .collect();
            out["usage_metadata"] = message.usage.as_ref().map(usage_metadata).unwrap_or(Value::Null);
        }
        Ok(Role::Tool) => {
            out["tool_call_id"] = Value::String(message.tool_call_id.clone());
            out["status"] = Value::String(if message.is_error { "error" } else { "success" }.to_owned());
            out["artifact"] = Value::Null;
        }
        _ => {}
    }
    out
}

fn tool_call(call: &ToolCall) -> Value {
    json!({ "type": "tool_call", "id": call.id, "name": call.name,
            "args": call.arguments.as_ref().map(struct_to_json).unwrap_or_else(|| json!({})) })
}

/// LangChain's `usage_metadata`.
pub fn usage_metadata(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "input_token_details": { "cache_read": usage.cache_read_tokens, "cache_creation": usage.cache_creation_tokens },
        "output_token_details": { "reasoning": usage.reasoning_tokens },
    })
}

/// One input message (`input.messages[i]`, named `field`) as an Antler message. Accepts LangChain's
/// shapes: `role` (user, human, assistant, ai, tool) or `type`; `content` as a string or a list of
/// blocks (`text`, `image_url`, `image`, `file`); `id`, `name`, `tool_call_id`, `tool_calls`;
/// `additional_kwargs` becomes the message's metadata. Other keys of a serialised message
/// (`response_metadata`, `example`, …) are what clients echo back and are ignored.
pub fn from_langchain(field: &str, value: &Value) -> Result<Message, ApiError> {
    let Value::Object(map) = value else { return Err(ApiError::invalid(field, "must be a message object")) };
    let role_name = match (map.get("role"), map.get("type")) {
        (Some(Value::String(role)), _) => (role.as_str(), "role"),
        (_, Some(Value::String(kind))) => (kind.as_str(), "type"),
        _ => return Err(ApiError::invalid(&format!("{field}.role"), "is required (user, assistant or tool)")),
    };
    let role = match role_name.0 {
        "user" | "human" | "HumanMessage" => Role::User,
        "assistant" | "ai" | "AIMessage" => Role::Assistant,
        "tool" | "ToolMessage" => Role::Tool,
        "system" | "developer" => {
            return Err(ApiError::invalid(
                &format!("{field}.{}", role_name.1),
                "system messages are not accepted: the system prompt comes from the agent",
            ));
        }
        other => {
            return Err(ApiError::invalid(&format!("{field}.{}", role_name.1), format!("`{other}` is not one of user, assistant, tool")));
        }
    };
    let string = |key: &str| -> Result<String, ApiError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(ApiError::invalid(&format!("{field}.{key}"), "must be a string")),
        }
    };
    let mut message = Message {
        id: string("id")?,
        role: role as i32,
        name: string("name")?,
        tool_call_id: if role == Role::Tool { string("tool_call_id")? } else { String::new() },
        ..Message::default()
    };
    if role == Role::Tool && message.tool_call_id.is_empty() {
        return Err(ApiError::invalid(&format!("{field}.tool_call_id"), "is required for a tool message"));
    }
    if role == Role::Tool {
        message.is_error = matches!(map.get("status"), Some(Value::String(s)) if s == "error");
    }
    message.content = match map.get("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(text)) => vec![text_part(text)],
        Some(Value::Array(blocks)) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.iter().enumerate() {
                parts.push(content_block(&format!("{field}.content[{j}]"), block)?);
            }
            parts
        }
        Some(_) => return Err(ApiError::invalid(&format!("{field}.content"), "must be a string or a list of content blocks")),
    };
    if role == Role::Assistant
        && let Some(calls) = map.get("tool_calls").filter(|v| !v.is_null())
    {
        let Value::Array(calls) = calls else { return Err(ApiError::invalid(&format!("{field}.tool_calls"), "must be a list")) };
        for (j, call) in calls.iter().enumerate() {
            let at = format!("{field}.tool_calls[{j}]");
            let Value::Object(call) = call else { return Err(ApiError::invalid(&at, "must be an object")) };
            let text = |key: &str| match call.get(key) {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(ApiError::invalid(&format!("{at}.{key}"), "must be a string")),
            };
            let arguments = match call.get("args") {
                None | Some(Value::Null) => prost_types::Struct::default(),
                Some(args @ Value::Object(_)) => match json_to_value(args).kind {
                    Some(prost_types::value::Kind::StructValue(s)) => s,
                    _ => prost_types::Struct::default(),
                },
                Some(_) => return Err(ApiError::invalid(&format!("{at}.args"), "must be an object")),
            };
            message.tool_calls.push(ToolCall {
                id: text("id")?,
                name: text("name")?,
                arguments: Some(arguments),
                raw_arguments: String::new(),
            });
        }
    }
    match map.get("additional_kwargs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(extra)) if extra.is_empty() => {}
        Some(extra @ Value::Object(_)) => {
            if let Some(prost_types::value::Kind::StructValue(s)) = json_to_value(extra).kind {
                message.metadata = Some(s);
            }
        }
        Some(_) => return Err(ApiError::invalid(&format!("{field}.additional_kwargs"), "must be an object")),
    }
    Ok(message)
}

fn text_part(text: &str) -> ContentPart {
    ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }
}

fn content_block(field: &str, block: &Value) -> Result<ContentPart, ApiError> {
    let map = match block {
        Value::String(text) => return Ok(text_part(text)),
        Value::Object(map) => map,
        _ => return Err(ApiError::invalid(field, "must be a string or a content block object")),
    };
    let get = |key: &str| map.get(key).and_then(Value::as_str).map(str::to_owned);
    let image = |url: String| ContentPart {
        part: Some(content_part::Part::Image(ImagePart {
            source: Some(image_part::Source::Url(url)),
            mime_type: get("mime_type").unwrap_or_default(),
            detail: String::new(),
        })),
    };
    match map.get("type").and_then(Value::as_str) {
        Some("text") => match map.get("text") {
            Some(Value::String(text)) => Ok(text_part(text)),
            _ => Err(ApiError::invalid(&format!("{field}.text"), "must be a string")),
        },
        Some("image_url") => match map.get("image_url") {
            Some(Value::String(url)) => Ok(image(url.clone())),
            Some(Value::Object(inner)) => match inner.get("url") {
                Some(Value::String(url)) => Ok(image(url.clone())),
                _ => Err(ApiError::invalid(&format!("{field}.image_url.url"), "must be a string")),
            },
            _ => Err(ApiError::invalid(&format!("{field}.image_url"), "must be a URL or {\"url\": …}")),
        },
        Some("image") => match get("url") {
            Some(url) => Ok(image(url)),
            None => Err(ApiError::invalid(
                &format!("{field}.url"),
                "an image block needs a url (inline base64 images: use an image_url data: URL)",
            )),
        },
        Some("file") => match get("path").or_else(|| get("file_path")) {
            Some(path) => Ok(ContentPart {
                part: Some(content_part::Part::File(FilePart {
                    path,
                    mime_type: get("mime_type").unwrap_or_default(),
                    size_bytes: map.get("size_bytes").and_then(Value::as_u64).unwrap_or(0),
                    name: get("name").unwrap_or_default(),
                })),
            }),
            None => Err(ApiError::invalid(&format!("{field}.path"), "a file block needs the file's sandbox path (/mnt/user-data/…)")),
        },
        Some(other) => Err(ApiError::invalid(
            &format!("{field}.type"),
            format!("`{other}` is not a content block Antler accepts (text, image_url, image, file)"),
        )),
        None => Err(ApiError::invalid(&format!("{field}.type"), "is required")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assistant_turn_reads_as_a_langchain_ai_message() {
        let message = Message {
            id: "m1".to_owned(),
            role: Role::Assistant as i32,
            content: vec![
                ContentPart {
                    part: Some(content_part::Part::Thinking(antler_proto::common::ThinkingPart {
                        text: "plan".to_owned(),
                        signature: String::new(),
                    })),
                },
                text_part("Hello"),
            ],
            tool_calls: vec![ToolCall {
                id: "c1".to_owned(),
                name: "bash".to_owned(),
                arguments: json_text("{\"command\": \"ls\"}"),
                raw_arguments: String::new(),
            }],
            usage: Some(Usage { input_tokens: 3, output_tokens: 2, total_tokens: 5, ..Usage::default() }),
            ..Message::default()
        };
        let out = to_langchain(&message);
        assert_eq!(out["type"], "ai");
        assert_eq!(out["content"], "Hello");
        assert_eq!(out["additional_kwargs"]["reasoning_content"], "plan");
        assert_eq!(out["tool_calls"][0], json!({"type": "tool_call", "id": "c1", "name": "bash", "args": {"command": "ls"}}));
        assert_eq!(out["usage_metadata"]["total_tokens"], 5);
    }

    #[test]
    fn input_messages_accept_langchain_shapes_and_name_the_bad_field() -> Result<(), ApiError> {
        let user = from_langchain("input.messages[0]", &json!({"role": "user", "content": "hi"}))?;
        assert_eq!(user.role, Role::User as i32);
        assert_eq!(user.content, vec![text_part("hi")]);
        let human = from_langchain(
            "input.messages[1]",
            &json!({"type": "human", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}),
        )?;
        assert_eq!(human.content.len(), 2);
        let system = from_langchain("input.messages[2]", &json!({"role": "system", "content": "obey"}));
        assert!(matches!(system, Err(ref e) if e.param.as_deref() == Some("input.messages[2].role")), "{system:?}");
        let block = from_langchain("input.messages[3]", &json!({"role": "user", "content": [{"type": "audio"}]}));
        assert!(matches!(block, Err(ref e) if e.param.as_deref() == Some("input.messages[3].content[0].type")), "{block:?}");
        let tool = from_langchain("input.messages[4]", &json!({"role": "tool", "content": "ok"}));
        assert!(matches!(tool, Err(ref e) if e.param.as_deref() == Some("input.messages[4].tool_call_id")), "{tool:?}");
        Ok(())
    }

    fn json_text(text: &str) -> Option<prost_types::Struct> {
        Some(antler_kit::json::json_text_to_struct(text))
    }
}
