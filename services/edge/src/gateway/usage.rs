//! `GET /api/threads/{thread_id}/token-usage` (RunService.GetTokenUsage) in DeerFlow's
//! `ThreadTokenUsageResponse` shape: totals over the thread's runs, per model, per caller bucket, and
//! how full the context window is at the thread's head.

use std::sync::Arc;

use antler_proto::runs::GetTokenUsageRequest;
use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use serde_json::{Map, Value, json};

use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::request::Query;

/// `?include_active=true` also counts the usage of a run still going.
pub async fn thread(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let include_active = Query::parse(raw.as_deref()).bool("include_active")?.unwrap_or(false);
    let request = GetTokenUsageRequest { thread_id, include_active };
    let reply = edge.runs().get_token_usage(edge.grpc(&caller, request)).await?.into_inner();
    let total = reply.total.unwrap_or_default();
    let mut by_model = Map::new();
    for (model, usage) in &reply.by_model {
        let tokens = usage.usage.as_ref().map_or(0, |u| u.total_tokens);
        by_model.insert(model.clone(), json!({ "tokens": tokens, "runs": usage.runs, "llm_calls": usage.llm_calls }));
    }
    let by_caller = reply.by_caller.unwrap_or_default();
    let context_usage = reply.context_usage.map_or(Value::Null, |c| {
        let known = c.max_context_tokens > 0;
        json!({
            "token_count": c.token_count,
            "max_context_tokens": if known { json!(c.max_context_tokens) } else { Value::Null },
            "percentage": if known { json!((c.fraction * 1000.0).round() / 10.0) } else { Value::Null },
        })
    });
    Ok(json_response(&json!({
        "thread_id": reply.thread_id,
        "total_tokens": total.total_tokens,
        "total_input_tokens": total.input_tokens,
        "total_output_tokens": total.output_tokens,
        "total_runs": reply.runs,
        "llm_calls": reply.llm_calls,
        "by_model": by_model,
        "by_caller": {
            "lead_agent": by_caller.lead_agent_tokens,
            "subagent": by_caller.subagent_tokens,
            "middleware": by_caller.middleware_tokens,
        },
        "context_usage": context_usage,
    })))
}
