//! The two gateway calls DeerFlow's web UI makes beside the LangGraph API when the edge stands where
//! DeerFlow's gateway would (its same-origin deployment, everything under `/api/`): the thread
//! history its chat view pages through, and the channel providers its sidebar lists. Both are read
//! from what the LangGraph routes already serve, so they are mounted with them (under `/api/` only,
//! where the UI calls them).

use std::sync::Arc;

use antler_proto::common::{Message, Role};
use antler_proto::runs::{GetThreadStateRequest, ThreadState};
use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use serde_json::{Value, json};

use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::langgraph::convert;
use crate::langgraph::messages::to_langchain;
use crate::request::Query;

/// Largest page of `/messages/page` (DeerFlow's own bound).
const MAX_PAGE: u64 = 200;
/// How many messages are read per step, at most, when walking back to the user message that names
/// the run of a page's first rows.
const RUN_LOOKBACK_PAGE: u32 = 200;
/// Steps of that walk; past them a row's run id is left empty (a run with more than 1,000 messages
/// since its user message).
const RUN_LOOKBACK_STEPS: usize = 5;

async fn read_state(edge: &Edge, caller: &Caller, request: GetThreadStateRequest) -> Result<ThreadState, ApiError> {
    let reply = edge.threads().get_thread_state(edge.grpc(caller, request)).await?.into_inner();
    reply.state.ok_or_else(|| ApiError::internal("GetThreadState answered without a state"))
}

/// The run a user message was sent with (the ThreadData layer stamps `metadata.run_id`).
fn run_of(message: &Message) -> Option<String> {
    if message.role != Role::User as i32 {
        return None;
    }
    match message.metadata.as_ref()?.fields.get("run_id")?.kind.as_ref()? {
        prost_types::value::Kind::StringValue(id) if !id.is_empty() => Some(id.clone()),
        _ => None,
    }
}

/// `GET /api/threads/{thread_id}/messages/page?limit=&before_seq=`: the thread's messages, newest
/// page first, as DeerFlow's gateway pages its message feed — `{data: [{run_id, seq, content,
/// metadata, created_at, feedback}], has_more, next_before_seq}`, rows oldest first. A row's `seq`
/// is its position in the thread's message list (1 for the first message): it orders the rows and
/// `before_seq` pages back from it. The messages are the thread's state at its head (a summarized
/// conversation keeps the summary in its state, not the dropped turns). A row's `run_id` is the run
/// its user message was sent with, carried to the replies that follow it.
pub async fn messages_page(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let limit = query.integer("limit", 1, MAX_PAGE)?.unwrap_or(50) as u32;
    let before = query.integer("before_seq", 1, u64::MAX)?;
    if query.last("after_seq").is_some() {
        return Err(ApiError::invalid("after_seq", "this page goes backwards only: page with before_seq"));
    }
    // With before_seq, only the head's id and size are needed from this first read.
    let first = if before.is_some() { 1 } else { limit };
    let head = GetThreadStateRequest { thread_id: thread_id.clone(), messages_limit: first, ..Default::default() };
    let mut state = read_state(&edge, &caller, head).await?;
    if let (Some(before), Some(checkpoint)) = (before, state.checkpoint.as_ref()) {
        // The page that ends before `before_seq`, of the same head.
        let end = (before - 1).min(state.messages_total);
        let token = antler_runs::paging::encode(end as i64, &checkpoint.checkpoint_id);
        let request =
            GetThreadStateRequest { thread_id: thread_id.clone(), messages_limit: limit, messages_page_token: token, ..Default::default() };
        state = read_state(&edge, &caller, request).await?;
    }
    let Some(checkpoint) = state.checkpoint.as_ref() else {
        return Ok(json_response(&json!({ "data": [], "has_more": false, "next_before_seq": null })));
    };
    // The run of the rows before the page's first user message: walk back to the user message.
    let mut run = String::new();
    if state.messages_offset > 0 && checkpoint.messages.first().and_then(run_of).is_none() {
        let mut end = state.messages_offset;
        for _ in 0..RUN_LOOKBACK_STEPS {
            let token = antler_runs::paging::encode(end as i64, &checkpoint.checkpoint_id);
            let request = GetThreadStateRequest {
                thread_id: thread_id.clone(),
                messages_limit: RUN_LOOKBACK_PAGE,
                messages_page_token: token,
                ..Default::default()
            };
            let earlier = read_state(&edge, &caller, request).await?;
            let messages = earlier.checkpoint.map(|c| c.messages).unwrap_or_default();
            if let Some(found) = messages.iter().rev().find_map(run_of) {
                run = found;
                break;
            }
            if earlier.messages_offset == 0 || messages.is_empty() {
                break;
            }
            end = earlier.messages_offset;
        }
    }
    let fallback_time = convert::time(checkpoint.created_at.as_ref());
    let mut data = Vec::with_capacity(checkpoint.messages.len());
    for (index, message) in checkpoint.messages.iter().enumerate() {
        if let Some(id) = run_of(message) {
            run = id;
        }
        let created_at = match message.created_at.as_ref() {
            Some(at) => convert::time(Some(at)),
            None => fallback_time.clone(),
        };
        data.push(json!({
            "run_id": run,
            "seq": state.messages_offset + index as u64 + 1,
            "content": to_langchain(message),
            "metadata": { "caller": "lead_agent" },
            "created_at": created_at,
            "feedback": null,
        }));
    }
    let has_more = state.messages_offset > 0;
    let next = if has_more { json!(state.messages_offset + 1) } else { Value::Null };
    Ok(json_response(&json!({ "data": data, "has_more": has_more, "next_before_seq": next })))
}

/// `GET /api/channels/providers`: Antler connects no IM channels (Slack, Feishu, …), so the list is
/// empty and the feature reads as off — the UI hides its channel settings instead of an error.
pub async fn channel_providers() -> Response {
    json_response(&json!({ "enabled": false, "providers": [] }))
}

/// `GET /api/channels/connections`: none, for the same reason.
pub async fn channel_connections() -> Response {
    json_response(&json!({ "connections": [] }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_message_names_its_run_and_other_messages_do_not() {
        let mut user = Message { role: Role::User as i32, ..Message::default() };
        assert_eq!(run_of(&user), None);
        let mut metadata = prost_types::Struct::default();
        metadata
            .fields
            .insert("run_id".to_owned(), prost_types::Value { kind: Some(prost_types::value::Kind::StringValue("r-1".to_owned())) });
        user.metadata = Some(metadata.clone());
        assert_eq!(run_of(&user), Some("r-1".to_owned()));
        let reply = Message { role: Role::Assistant as i32, metadata: Some(metadata), ..Message::default() };
        assert_eq!(run_of(&reply), None);
    }
}
