//! `GET /api/threads/{thread_id}/runs/{run_id}/workspace-changes`: the files a run created, changed or
//! deleted, which DeerFlow records per run when its workspace-change tracking is on and its UI shows
//! under each answer. Antler records no such diff, so the answer is DeerFlow's own for a run without a
//! record (`available: false`, empty summary): the UI then shows nothing, as it does for DeerFlow with
//! tracking off. The run must still be the caller's (RunService.GetRun: another user's run, or one of
//! another thread, is 404 like a missing one). `/api/features` reports `workspace_changes` disabled.

use std::sync::Arc;

use antler_proto::runs::GetRunRequest;
use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use serde_json::json;

use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::request::Query;

/// `?include_files=&include_diff=` are checked (422 naming one that is not a boolean) though an answer
/// without a record has neither.
pub async fn workspace_changes(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, run_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    query.bool("include_files")?;
    query.bool("include_diff")?;
    edge.runs().get_run(edge.grpc(&caller, GetRunRequest { thread_id, run_id })).await?;
    Ok(json_response(&json!({
        "available": false,
        "version": 1,
        "summary": {
            "created": 0,
            "modified": 0,
            "deleted": 0,
            "symlink_created": 0,
            "additions": 0,
            "deletions": 0,
            "truncated": false,
        },
        "files": [],
        "limits": {},
    })))
}
