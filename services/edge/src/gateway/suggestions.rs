//! Follow-up suggestions: `GET /api/suggestions/config` (`edge.gateway.suggestions`) and
//! `POST /api/threads/{thread_id}/suggestions`, a one-shot ModelService.Chat with DeerFlow's prompt
//! (as `middleware:suggestions`, so its tokens count in the middleware bucket of the models metrics).
//! Like DeerFlow, a model that fails or answers something that is not a JSON list of strings yields an
//! empty list, not an error: suggestions are optional decoration.

use std::sync::Arc;

use antler_proto::common::content_part::Part;
use antler_proto::common::{ContentPart, Message, Role, TextPart};
use antler_proto::models::ChatRequest;
use antler_proto::models::model_service_client::ModelServiceClient;
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};

use super::{Call, thread_exists};
use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::request::{Fields, read_body};

/// Most messages of context sent to the model, and characters per message (the UI sends the last few).
const MAX_MESSAGES: usize = 50;
const MAX_MESSAGE_CHARS: usize = 8000;

pub async fn config(State(edge): State<Arc<Edge>>) -> Response {
    let suggestions = &edge.config.gateway.suggestions;
    json_response(&json!({ "enabled": suggestions.enabled, "max_suggestions": suggestions.max_suggestions }))
}

fn text(role: Role, text: String) -> Message {
    Message { role: role as i32, content: vec![ContentPart { part: Some(Part::Text(TextPart { text })) }], ..Default::default() }
}

/// The JSON list of strings in a model's answer (after any `<think>` block and code fence).
pub fn parse_list(answer: &str) -> Vec<String> {
    let answer = match answer.rfind("</think>") {
        Some(at) => &answer[at + "</think>".len()..],
        None => answer,
    };
    let (Some(start), Some(end)) = (answer.find('['), answer.rfind(']')) else { return Vec::new() };
    if end <= start {
        return Vec::new();
    }
    match serde_json::from_str::<Value>(&answer[start..=end]) {
        Ok(Value::Array(items)) => {
            items.iter().filter_map(Value::as_str).map(|s| s.replace('\n', " ").trim().to_owned()).filter(|s| !s.is_empty()).collect()
        }
        _ => Vec::new(),
    }
}

/// `POST /api/threads/{thread_id}/suggestions` with `{messages: [{role, content}], n, model_name}`:
/// `{suggestions: [..]}`, at most `n` (clamped to `max_suggestions`). The thread must be the caller's.
pub async fn generate(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let settings = &edge.config.gateway.suggestions;
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let messages = match fields.take("messages") {
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid("messages", "must be a list of {role, content}")),
        None => return Err(ApiError::invalid("messages", "is required: the recent conversation as [{role, content}]")),
    };
    let n = fields.integer("n", 1, 5)?.unwrap_or(u64::from(settings.max_suggestions)).min(u64::from(settings.max_suggestions));
    let model_name = fields.string("model_name")?.unwrap_or_default();
    fields.finish("a suggestions request")?;
    if messages.len() > MAX_MESSAGES {
        return Err(ApiError::invalid("messages", format!("holds {} messages; at most {MAX_MESSAGES}", messages.len())));
    }
    let mut lines = Vec::new();
    for (i, message) in messages.into_iter().enumerate() {
        let Value::Object(mut message) = message else {
            return Err(ApiError::invalid(&format!("messages[{i}]"), "must be {role, content}"));
        };
        let role = match message.remove("role") {
            Some(Value::String(r)) => r,
            _ => return Err(ApiError::invalid(&format!("messages[{i}].role"), "is required: user or assistant")),
        };
        let content = match message.remove("content") {
            Some(Value::String(c)) => c,
            _ => return Err(ApiError::invalid(&format!("messages[{i}].content"), "is required: the message as plain text")),
        };
        if let Some(key) = message.keys().next() {
            return Err(ApiError::invalid(&format!("messages[{i}].{key}"), "is not a field of a suggestions message"));
        }
        let content: String = content.trim().chars().take(MAX_MESSAGE_CHARS).collect();
        let who = match role.trim().to_lowercase().as_str() {
            "user" | "human" => "User".to_owned(),
            "assistant" | "ai" => "Assistant".to_owned(),
            other => other.to_owned(),
        };
        lines.push(format!("{who}: {content}"));
    }
    if !thread_exists(&edge, &caller, &thread_id).await? {
        return Err(ApiError::not_found(format!("thread {thread_id}")));
    }
    let conversation = lines.join("\n");
    if !settings.enabled || conversation.trim().is_empty() {
        return Ok(json_response(&json!({ "suggestions": [] })));
    }
    let system = format!(
        "You are generating follow-up questions to help the user continue the conversation.\n\
         Based on the conversation below, produce EXACTLY {n} short questions the user might ask next.\n\
         Requirements:\n\
         - Questions must be relevant to the preceding conversation.\n\
         - Questions must be written in the same language as the user.\n\
         - Keep each question concise (ideally <= 20 words / <= 40 Chinese characters).\n\
         - Do NOT include numbering, markdown, or any extra text.\n\
         - Output MUST be a JSON array of strings only.\n"
    );
    let user = format!("Conversation Context:\n{conversation}\n\nGenerate {n} follow-up questions");
    let model = if settings.model.is_empty() { model_name } else { settings.model.clone() };
    let request = ChatRequest {
        model_name: model,
        messages: vec![text(Role::System, system), text(Role::User, user)],
        caller: "middleware:suggestions".to_owned(),
        thread_id: thread_id.clone(),
        ..Default::default()
    };
    let call = Call::new(&edge, "models", &caller)?;
    let answer = match ModelServiceClient::new(call.channel()).chat(call.unary(request)).await {
        Ok(reply) => reply
            .into_inner()
            .message
            .map(|m| {
                m.content
                    .into_iter()
                    .filter_map(|p| match p.part {
                        Some(Part::Text(t)) => Some(t.text),
                        _ => None,
                    })
                    .collect::<String>()
            })
            .unwrap_or_default(),
        Err(status) => {
            tracing::warn!(thread_id = %thread_id, code = ?status.code(), error = %status.message(), "follow-up suggestions failed");
            String::new()
        }
    };
    let mut suggestions = parse_list(&answer);
    suggestions.truncate(n as usize);
    Ok(json_response(&json!({ "suggestions": suggestions })))
}

#[cfg(test)]
mod tests {
    use super::parse_list;

    #[test]
    fn the_list_is_found_in_fences_and_after_thinking() {
        assert_eq!(parse_list("```json\n[\"a?\", \" b? \", 3, \"\"]\n```"), vec!["a?", "b?"]);
        assert_eq!(parse_list("<think>[no]</think>[\"x\"]"), vec!["x"]);
        assert!(parse_list("no list here").is_empty());
        assert!(parse_list("[not json").is_empty());
    }
}
