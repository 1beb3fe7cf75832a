//! `/api/threads/{thread_id}/runs/{run_id}/feedback`: the caller's thumbs up / down on a run
//! (RunService.SubmitFeedback: one rating per user and run, a new one replaces it; DeleteFeedback).
//! Another user's run is 404, like a missing one.

use std::sync::Arc;

use antler_proto::runs::{DeleteFeedbackRequest, Feedback, SubmitFeedbackRequest};
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};

use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::langgraph::convert;
use crate::request::{Fields, read_body};

/// DeerFlow's `FeedbackResponse`.
fn feedback_json(feedback: &Feedback, user_id: &str) -> Value {
    let text = |s: &str| if s.is_empty() { Value::Null } else { json!(s) };
    json!({
        "feedback_id": feedback.feedback_id,
        "run_id": feedback.run_id,
        "thread_id": feedback.thread_id,
        "user_id": user_id,
        "message_id": text(&feedback.message_id),
        "rating": feedback.rating,
        "comment": text(&feedback.comment),
        "created_at": convert::time(feedback.created_at.as_ref()),
        "updated_at": convert::time(feedback.updated_at.as_ref()),
    })
}

async fn submit(
    edge: &Edge,
    caller: &Caller,
    thread_id: String,
    run_id: String,
    headers: &HeaderMap,
    body: Body,
    allow_message: bool,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(headers, body, edge.config.max_body_bytes).await?)?;
    let rating = match fields.take("rating") {
        Some(Value::Number(n)) if n.as_i64() == Some(1) || n.as_i64() == Some(-1) => n.as_i64().unwrap_or_default() as i32,
        Some(other) => return Err(ApiError::invalid("rating", format!("{other} is not a rating: +1 (good) or -1 (bad)"))),
        None => return Err(ApiError::invalid("rating", "is required: +1 (good) or -1 (bad)")),
    };
    let comment = fields.string("comment")?.unwrap_or_default();
    let message_id = if allow_message { fields.string("message_id")?.unwrap_or_default() } else { String::new() };
    fields.finish("a run feedback")?;
    let request = SubmitFeedbackRequest { thread_id, run_id, rating, comment, message_id };
    let reply = edge.runs().submit_feedback(edge.grpc(caller, request)).await?.into_inner();
    let feedback = reply.feedback.ok_or_else(|| ApiError::internal("SubmitFeedback answered without the feedback"))?;
    Ok(json_response(&feedback_json(&feedback, &caller.identity.user_id)))
}

/// `PUT …/feedback` with `{rating, comment}`: create or replace the caller's rating.
pub async fn upsert(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    submit(&edge, &caller, thread_id, run_id, &headers, body, false).await
}

/// `POST …/feedback` with `{rating, comment, message_id}`: the same, optionally about one message.
pub async fn create(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    submit(&edge, &caller, thread_id, run_id, &headers, body, true).await
}

/// `DELETE …/feedback`: removes the caller's rating of the run; 404 when there is none.
pub async fn delete(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let request = DeleteFeedbackRequest { thread_id, run_id };
    let reply = edge.runs().delete_feedback(edge.grpc(&caller, request)).await?.into_inner();
    if !reply.deleted {
        return Err(ApiError::not_found("feedback for this run (none was submitted)"));
    }
    Ok(json_response(&json!({ "success": true })))
}
