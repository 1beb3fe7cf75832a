//! Threads: create, get, patch, delete, search, state and history — each one or a few
//! `ThreadService` calls.

use std::sync::Arc;

use antler_proto::runs::{
    CreateThreadRequest, DeleteThreadRequest, GetThreadRequest, GetThreadStateRequest, ListThreadHistoryRequest, ListThreadsRequest,
    SortOrder, Thread, ThreadSort, ThreadState, ThreadStatus, UpdateThreadRequest, UpdateThreadStateRequest,
};
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::langgraph::convert;
use crate::request::{Fields, Query, read_body};

fn struct_of(map: Map<String, Value>) -> prost_types::Struct {
    match antler_kit::json::json_to_value(&Value::Object(map)).kind {
        Some(prost_types::value::Kind::StructValue(s)) => s,
        _ => prost_types::Struct::default(),
    }
}

/// The thread's state at its head (or at `checkpoint_id`).
pub async fn thread_state(edge: &Edge, caller: &Caller, thread_id: &str, checkpoint_id: &str) -> Result<ThreadState, ApiError> {
    let request = GetThreadStateRequest { thread_id: thread_id.to_owned(), checkpoint_id: checkpoint_id.to_owned(), ..Default::default() };
    let reply = edge.threads().get_thread_state(edge.grpc(caller, request)).await?.into_inner();
    reply.state.ok_or_else(|| ApiError::internal("GetThreadState answered without a state"))
}

/// A thread with its whole state as `values` and its pending clarification as `interrupts`.
async fn full_thread(edge: &Edge, caller: &Caller, thread_id: &str) -> Result<Value, ApiError> {
    let reply = edge.threads().get_thread(edge.grpc(caller, GetThreadRequest { thread_id: thread_id.to_owned() })).await?.into_inner();
    let thread = reply.thread.ok_or_else(|| ApiError::internal("GetThread answered without a thread"))?;
    let state = thread_state(edge, caller, thread_id, "").await?;
    let (interrupts, _) = convert::interrupts(&state);
    Ok(convert::thread(&thread, crate::langgraph::stream::state_values(state.checkpoint.as_ref()), interrupts))
}

/// Keeps the fields `select` names (top-level keys, or `values.<channel>`).
fn select(value: Value, select: &[String]) -> Value {
    if select.is_empty() {
        return value;
    }
    let Value::Object(map) = value else { return value };
    let mut out = Map::new();
    for field in select {
        match field.split_once('.') {
            Some((outer, inner)) => {
                if let Some(Value::Object(nested)) = map.get(outer) {
                    let entry = out.entry(outer.to_owned()).or_insert_with(|| Value::Object(Map::new()));
                    if let (Value::Object(target), Some(v)) = (entry, nested.get(inner)) {
                        target.insert(inner.to_owned(), v.clone());
                    }
                }
            }
            None => {
                if let Some(v) = map.get(field) {
                    out.insert(field.clone(), v.clone());
                }
            }
        }
    }
    Value::Object(out)
}

fn string_list(field: &str, value: Option<Value>) -> Result<Vec<String>, ApiError> {
    match value {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::invalid(&format!("{field}[{i}]"), "must be a string")),
            })
            .collect(),
        Some(_) => Err(ApiError::invalid(field, "must be a list of strings")),
    }
}

/// `POST /threads`.
pub async fn create(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let thread_id = fields.string("thread_id")?.unwrap_or_default();
    let metadata = fields.object("metadata")?.map(struct_of);
    let if_exists = fields.choice("if_exists", &["raise", "do_nothing"])?;
    if fields.take("supersteps").is_some() {
        return Err(ApiError::unsupported_option("supersteps", "a thread starts empty; its state changes only through runs"));
    }
    if fields.take("ttl").is_some() {
        return Err(ApiError::unsupported_option("ttl", "threads are kept until DELETE /threads/{id}"));
    }
    fields.finish("a thread")?;
    let request = CreateThreadRequest { thread_id: thread_id.clone(), title: String::new(), metadata };
    let reply = edge.threads().create_thread(edge.grpc(&caller, request)).await?.into_inner();
    let thread = reply.thread.ok_or_else(|| ApiError::internal("CreateThread answered without a thread"))?;
    if !reply.created {
        if if_exists.as_deref() != Some("do_nothing") {
            return Err(ApiError::conflict(format!("thread {thread_id} already exists\nhint: send if_exists=do_nothing to get it back")));
        }
        return Ok(json_response(&full_thread(&edge, &caller, &thread.thread_id).await?));
    }
    Ok(json_response(&convert::thread(&thread, Value::Null, Value::Object(Map::new()))))
}

/// `GET /threads/{thread_id}`.
pub async fn get(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json_response(&full_thread(&edge, &caller, &thread_id).await?))
}

/// `PATCH /threads/{thread_id}`: merges `metadata` (a null value removes a key).
pub async fn patch(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let metadata = fields.object("metadata")?.map(struct_of);
    if fields.take("ttl").is_some() {
        return Err(ApiError::unsupported_option("ttl", "threads are kept until DELETE /threads/{id}"));
    }
    fields.finish("a thread update")?;
    let request = UpdateThreadRequest { thread_id: thread_id.clone(), title: None, metadata };
    edge.threads().update_thread(edge.grpc(&caller, request)).await?;
    Ok(json_response(&full_thread(&edge, &caller, &thread_id).await?))
}

/// `DELETE /threads/{thread_id}`: 409 while a run is active (cancel it first).
pub async fn delete(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
) -> Result<Response, ApiError> {
    let request = DeleteThreadRequest { thread_id, cancel_active_run: false };
    edge.threads().delete_thread(edge.grpc(&caller, request)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /threads/search`: sorted by `sort_by` (`created_at`, the default, or `updated_at`) in
/// `sort_order` (`desc`, the default, or `asc`); `metadata` and `values.title` match exactly, `status`
/// filters, `ids` picks threads. Sorted, filtered and paged in the runs service's SQL.
pub async fn search(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let limit =
        fields.integer("limit", 1, edge.config.max_page.into()).map_err(|e| e.naming_setting("edge.max_page"))?.unwrap_or(10) as usize;
    let offset =
        fields.integer("offset", 0, edge.config.max_offset.into()).map_err(|e| e.naming_setting("edge.max_offset"))?.unwrap_or(0) as usize;
    let metadata = fields.object("metadata")?;
    let status = match fields.choice("status", &["idle", "busy", "interrupted", "error"])?.as_deref() {
        Some("idle") => ThreadStatus::Idle,
        Some("busy") => ThreadStatus::Busy,
        Some("interrupted") => ThreadStatus::Interrupted,
        Some("error") => ThreadStatus::Error,
        _ => ThreadStatus::Unspecified,
    };
    let ids = string_list("ids", fields.take("ids"))?;
    let selected = string_list("select", fields.take("select"))?;
    // Matched in the runs service, which can match `title` only (and names any other channel).
    let values = fields.object("values")?.filter(|v| !v.is_empty());
    if fields.take("extract").is_some() {
        return Err(ApiError::unsupported_option("extract", "read the thread (GET /threads/{id}) for its state"));
    }
    let sort_by = match fields.choice("sort_by", &["thread_id", "status", "created_at", "updated_at", "state_updated_at"])?.as_deref() {
        None | Some("created_at") => ThreadSort::CreatedAt,
        // A thread's state changes with its runs, and so does updated_at: the two are one time here.
        Some("updated_at" | "state_updated_at") => ThreadSort::UpdatedAt,
        Some(other) => {
            return Err(ApiError::unsupported_option("sort_by", format!("threads are sorted by created_at or updated_at, not by {other}")));
        }
    };
    let order = match fields.choice("sort_order", &["asc", "desc"])?.as_deref() {
        Some("asc") => SortOrder::Asc,
        _ => SortOrder::Desc,
    };
    fields.finish("a thread search")?;

    let mut found = Vec::new();
    if !ids.is_empty() {
        // Each id is one GetThread: the list is bounded like a page.
        if ids.len() > edge.config.max_page as usize {
            return Err(ApiError::invalid("ids", format!("{} ids; at most {} (edge.max_page)", ids.len(), edge.config.max_page)));
        }
        for id in &ids {
            match edge.threads().get_thread(edge.grpc(&caller, GetThreadRequest { thread_id: id.clone() })).await {
                Ok(reply) => found.extend(reply.into_inner().thread),
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => return Err(status.into()),
            }
        }
        let wanted = metadata.clone().unwrap_or_default();
        let title = match values.as_ref().map(|v| v.iter().next()) {
            None => None,
            Some(Some((key, Value::String(title)))) if key == "title" && values.as_ref().is_some_and(|v| v.len() == 1) => {
                Some(title.clone())
            }
            Some(_) => {
                return Err(ApiError::unsupported_option("values", "threads can be matched on the `title` channel only"));
            }
        };
        found.retain(|t| {
            let meta = t.metadata.as_ref().map(antler_kit::json::struct_to_json).unwrap_or_default();
            (status == ThreadStatus::Unspecified || t.status == status as i32)
                && wanted.iter().all(|(k, v)| meta.get(k) == Some(v))
                && title.as_ref().is_none_or(|title| &t.title == title)
        });
        let key = |t: &Thread| {
            let at = if sort_by == ThreadSort::UpdatedAt { t.updated_at.as_ref() } else { t.created_at.as_ref() };
            (at.map(|a| (a.seconds, a.nanos)), t.thread_id.clone())
        };
        found.sort_by_key(key);
        if order == SortOrder::Desc {
            found.reverse();
        }
        found = found.into_iter().skip(offset).take(limit).collect();
    } else {
        let (edge_ref, caller_ref, metadata_ref, values_ref) = (&edge, &caller, &metadata, &values);
        found = crate::langgraph::paging::window(offset, limit, move |page| async move {
            let request = ListThreadsRequest {
                metadata: metadata_ref.clone().map(struct_of),
                status: status as i32,
                page: Some(page),
                include_values: true,
                sort_by: sort_by as i32,
                sort_order: order as i32,
                values: values_ref.clone().map(struct_of),
            };
            let reply = edge_ref.threads().list_threads(edge_ref.grpc(caller_ref, request)).await?.into_inner();
            Ok((reply.threads, reply.page.map(|p| p.next_page_token).unwrap_or_default()))
        })
        .await?;
    }
    let out: Vec<Value> =
        found.iter().map(|t| select(convert::thread(t, convert::listed_values(t), Value::Object(Map::new())), &selected)).collect();
    Ok(json_response(&Value::Array(out)))
}

/// `GET /threads/{thread_id}/state`.
pub async fn state(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let selected: Vec<String> = query.all("select").into_iter().map(str::to_owned).collect();
    let state = thread_state(&edge, &caller, &thread_id, "").await?;
    let (_, interrupts) = convert::interrupts(&state);
    Ok(json_response(&select(convert::state(&thread_id, state.checkpoint.as_ref(), interrupts), &selected)))
}

/// `GET /threads/{thread_id}/state/{checkpoint_id}`.
pub async fn state_at(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, checkpoint_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let selected: Vec<String> = query.all("select").into_iter().map(str::to_owned).collect();
    let state = thread_state(&edge, &caller, &thread_id, &checkpoint_id).await?;
    Ok(json_response(&select(convert::state(&thread_id, state.checkpoint.as_ref(), Value::Array(Vec::new())), &selected)))
}

/// `POST /threads/{thread_id}/state/checkpoint` with `{"checkpoint": {"checkpoint_id": …}}`.
pub async fn state_at_checkpoint(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let checkpoint_id = checkpoint_id_of(&mut fields, "checkpoint", &thread_id)?
        .ok_or_else(|| ApiError::invalid("checkpoint.checkpoint_id", "is required"))?;
    fields.bool("subgraphs")?;
    let selected = string_list("select", fields.take("select"))?;
    fields.finish("a state request")?;
    let state = thread_state(&edge, &caller, &thread_id, &checkpoint_id).await?;
    Ok(json_response(&select(convert::state(&thread_id, state.checkpoint.as_ref(), Value::Array(Vec::new())), &selected)))
}

/// `POST /threads/{thread_id}/state` (`threads.updateState`): UpdateThreadState — a new checkpoint
/// with `values` applied (the runs service writes `title`, and names any other channel it cannot),
/// on the head or on `checkpoint` / `checkpoint_id`. 409 while a run is active on the thread.
pub async fn update_state(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let values = match fields.take("values") {
        Some(Value::Object(map)) => map,
        Some(Value::Array(_)) => {
            return Err(ApiError::unsupported_option("values", "a list of updates (one per node) needs graph nodes; send one object"));
        }
        Some(_) => return Err(ApiError::invalid("values", "must be an object of channels, e.g. {\"title\": \"…\"}")),
        None => return Err(ApiError::invalid("values", "is required, e.g. {\"title\": \"…\"}")),
    };
    let named = checkpoint_id_of(&mut fields, "checkpoint", &thread_id)?;
    let checkpoint_id = match (fields.string("checkpoint_id")?, named) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid("checkpoint_id", "names another checkpoint than checkpoint.checkpoint_id"));
        }
        (a, b) => a.or(b).unwrap_or_default(),
    };
    if let Some(node) = fields.string("as_node")? {
        return Err(ApiError::unsupported_option(
            "as_node",
            format!(
                "Antler's agent is a loop without graph nodes to attribute `{node}` to; leave as_node out (the update is recorded with source `update`)"
            ),
        ));
    }
    fields.finish("a state update")?;
    let request = UpdateThreadStateRequest { thread_id: thread_id.clone(), values: Some(struct_of(values)), checkpoint_id };
    let reply = edge.threads().update_thread_state(edge.grpc(&caller, request)).await?.into_inner();
    let checkpoint = reply.checkpoint.ok_or_else(|| ApiError::internal("UpdateThreadState answered without a checkpoint"))?;
    Ok(json_response(&serde_json::json!({ "checkpoint": convert::checkpoint_ref(&thread_id, &checkpoint.checkpoint_id) })))
}

/// A checkpoint named by `key`: an id, `{checkpoint_id}` or `{configurable: {checkpoint_id}}`.
fn checkpoint_id_of(fields: &mut Fields, key: &str, thread_id: &str) -> Result<Option<String>, ApiError> {
    match fields.take(key) {
        None => Ok(None),
        Some(Value::String(id)) => Ok(Some(id)),
        Some(Value::Object(map)) => {
            let map = match map.get("configurable") {
                Some(Value::Object(inner)) => inner.clone(),
                _ => map,
            };
            let mut checkpoint = Fields::nested(key, map);
            if let Some(other) = checkpoint.string("thread_id")?
                && other != thread_id
            {
                return Err(ApiError::invalid(
                    &format!("{key}.thread_id"),
                    format!("`{other}` is not the thread of the path ({thread_id})"),
                ));
            }
            checkpoint.take("checkpoint_ns");
            checkpoint.take("checkpoint_map");
            let id = checkpoint.string("checkpoint_id")?;
            checkpoint.finish(key)?;
            Ok(id)
        }
        Some(_) => Err(ApiError::invalid(key, "must be a checkpoint id or {\"checkpoint_id\": …}")),
    }
}

/// `POST /threads/{thread_id}/history`: checkpoints newest first, each as a `ThreadState`.
pub async fn history(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let limit =
        fields.integer("limit", 1, edge.config.max_page.into()).map_err(|e| e.naming_setting("edge.max_page"))?.unwrap_or(10) as usize;
    let before = checkpoint_id_of(&mut fields, "before", &thread_id)?;
    let mut run_id = String::new();
    if let Some(metadata) = fields.object("metadata")? {
        let mut metadata = Fields::nested("metadata", metadata);
        run_id = metadata.string("run_id")?.unwrap_or_default();
        metadata.finish("a history filter (Antler filters checkpoints by run_id only)")?;
    }
    if fields.take("checkpoint").is_some() {
        return Err(ApiError::unsupported_option("checkpoint", "Antler has no subgraph checkpoint namespaces; page with `before`"));
    }
    let selected = string_list("select", fields.take("select"))?;
    fields.finish("a history request")?;
    read_history(&edge, &caller, &thread_id, limit, before, &run_id, &selected).await
}

/// `GET /threads/{thread_id}/history?limit=&before=`.
pub async fn history_get(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let limit =
        query.integer("limit", 1, edge.config.max_page.into()).map_err(|e| e.naming_setting("edge.max_page"))?.unwrap_or(10) as usize;
    let before = query.last("before").map(str::to_owned);
    read_history(&edge, &caller, &thread_id, limit, before, "", &[]).await
}

async fn read_history(
    edge: &Edge,
    caller: &Caller,
    thread_id: &str,
    limit: usize,
    before: Option<String>,
    run_id: &str,
    selected: &[String],
) -> Result<Response, ApiError> {
    // `before` is a checkpoint: the page starts after it, as a ListThreadHistory page token does.
    let mut token = match before {
        None => String::new(),
        Some(id) => {
            let state = thread_state(edge, caller, thread_id, &id).await?;
            let checkpoint = state.checkpoint.ok_or_else(|| ApiError::not_found(format!("checkpoint {id}")))?;
            let at = checkpoint.created_at.map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000).unwrap_or_default();
            antler_runs::paging::encode(at, &checkpoint.checkpoint_id)
        }
    };
    let mut out = Vec::new();
    loop {
        let page = antler_proto::common::PageRequest { page_size: (limit - out.len()).min(100) as u32, page_token: token };
        let request = ListThreadHistoryRequest {
            thread_id: thread_id.to_owned(),
            page: Some(page),
            include_messages: true,
            run_id: run_id.to_owned(),
        };
        let reply = edge.threads().list_thread_history(edge.grpc(caller, request)).await?.into_inner();
        out.extend(reply.checkpoints.iter().map(|c| select(convert::state(thread_id, Some(c), Value::Array(Vec::new())), selected)));
        token = reply.page.map(|p| p.next_page_token).unwrap_or_default();
        if token.is_empty() || out.len() >= limit {
            break;
        }
    }
    Ok(json_response(&Value::Array(out)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn select_keeps_named_fields_and_channels() {
        let state = json!({"values": {"title": "t", "messages": []}, "next": [], "checkpoint": {"checkpoint_id": "c"}});
        assert_eq!(select(state.clone(), &[]), state);
        assert_eq!(select(state.clone(), &["next".to_owned()]), json!({"next": []}));
        assert_eq!(select(state, &["values.title".to_owned()]), json!({"values": {"title": "t"}}));
    }
}
