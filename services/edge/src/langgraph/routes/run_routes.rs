//! Runs: create, stream, wait, list, get, cancel, join and join-stream — each the `RunService` call
//! the gRPC API makes for the same thing (StreamRun, CreateRun + JoinRun, CancelRun, …).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;

use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{
    CancelAction, Checkpoint, CreateRunResponse, EventKind, GetRunRequest, JoinRunRequest, ListRunsRequest, OnDisconnect, Run, RunEvent,
    RunStatus, StreamRunRequest,
};
use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::thread_routes::thread_state;
use crate::edge::{Caller, Edge};
use crate::error::{ApiError, http_status};
use crate::json::{json_response, json_text};
use crate::langgraph::convert;
use crate::langgraph::run_request::{self, RunRequest, stream_modes};
use crate::langgraph::stream::{
    CheckpointSource, Frame, Resume, StreamMode, Translator, encode, frame_ids, kinds_for, parse_last_event_id,
};
use crate::request::{Fields, Query, read_body};

type Events = Pin<Box<dyn Stream<Item = Result<RunEvent, tonic::Status>> + Send>>;

fn run_path(thread_id: &str, run_id: &str) -> String {
    format!("/threads/{thread_id}/runs/{run_id}")
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("/"))
}

/// The run request of a body, translated.
async fn run_request(edge: &Edge, thread_id: &str, headers: &HeaderMap, body: Body) -> Result<RunRequest, ApiError> {
    let mut fields = Fields::parse(&read_body(headers, body, edge.config.max_body_bytes).await?)?;
    let request = run_request::parse(&mut fields, thread_id, &edge.assistant, &edge.context_keys)?;
    fields.finish("a run request")?;
    Ok(request)
}

async fn get_run(edge: &Edge, caller: &Caller, thread_id: &str, run_id: &str) -> Result<Run, ApiError> {
    let request = GetRunRequest { thread_id: thread_id.to_owned(), run_id: run_id.to_owned() };
    let reply = edge.runs().get_run(edge.grpc(caller, request)).await?.into_inner();
    reply.run.ok_or_else(|| ApiError::internal("GetRun answered without a run"))
}

/// `POST /threads/{thread_id}/runs`: a background run (CreateRun).
pub async fn create(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let request = run_request(&edge, &thread_id, &headers, body).await?;
    let reply: CreateRunResponse = edge.runs().create_run(edge.grpc(&caller, request.create)).await?.into_inner();
    let run = reply.run.ok_or_else(|| ApiError::internal("CreateRun answered without a run"))?;
    let mut response = json_response(&convert::run(&run, edge.assistant.id()));
    response.headers_mut().insert(header::CONTENT_LOCATION, header_value(&run_path(&run.thread_id, &run.run_id)));
    Ok(response)
}

/// `POST /threads/{thread_id}/runs/stream`: StreamRun as SSE. The response starts once the run is
/// admitted (its first event, METADATA, names it), with `Content-Location` (the run) and `Location`
/// (its stream: the SDKs reconnect there with `Last-Event-ID`).
pub async fn stream(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let RunRequest { create, modes } = run_request(&edge, &thread_id, &headers, body).await?;
    let reply = edge.runs().stream_run(edge.grpc_stream(&caller, StreamRunRequest { create: Some(create) })).await?.into_inner();
    let mut events: Events =
        Box::pin(reply.map(|item| item.and_then(|r| r.event.ok_or_else(|| tonic::Status::internal("an empty stream item")))));
    let first = match events.next().await {
        Some(Ok(event)) => event,
        Some(Err(status)) => return Err(status.into()),
        None => return Err(ApiError::internal("the run's stream ended before its first event")),
    };
    let (run_id, run_thread) = match &first.kind {
        Some(Kind::Metadata(m)) => (m.run_id.clone(), m.thread_id.clone()),
        _ => (first.run_id.clone(), first.thread_id.clone()),
    };
    let translator = Translator::new(modes, &run_id, &run_thread, 0);
    let events: Events = Box::pin(futures::stream::iter([Ok(first)]).chain(events));
    let mut response = sse(edge, caller, run_thread.clone(), events, translator, Resume::default());
    let path = run_path(&run_thread, &run_id);
    response.headers_mut().insert(header::CONTENT_LOCATION, header_value(&path));
    response.headers_mut().insert(header::LOCATION, header_value(&format!("{path}/stream")));
    Ok(response)
}

/// `GET /threads/{thread_id}/runs/{run_id}/stream`: JoinRun as SSE from `Last-Event-ID` (none:
/// from the run's first event), in the `stream_mode`s given, else those the run was created with.
/// `cancel_on_disconnect=true` cancels the run if this client goes away.
pub async fn join_stream(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, run_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let resume = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => Resume::default(),
        Some(Ok(id)) if id.trim().is_empty() => Resume::default(),
        Some(Ok(id)) => parse_last_event_id(id).map_err(|why| ApiError::invalid("Last-Event-ID", why))?,
        Some(Err(_)) => return Err(ApiError::invalid("Last-Event-ID", "is not text")),
    };
    let cancel = query.bool("cancel_on_disconnect")?.unwrap_or(false);
    if query.last("action").is_some() {
        return Err(ApiError::unsupported_option("action", "cancel with POST /threads/{id}/runs/{run_id}/cancel, then join"));
    }
    let run = get_run(&edge, &caller, &thread_id, &run_id).await?;
    let asked = query.all("stream_mode");
    let modes = if asked.is_empty() {
        stored_modes(&run)
    } else {
        stream_modes("stream_mode", Some(Value::Array(asked.into_iter().map(|m| Value::String(m.to_owned())).collect())))?
    };
    let request = JoinRunRequest {
        thread_id: thread_id.clone(),
        run_id: run_id.clone(),
        after_seq: resume.after_seq,
        kinds: kinds_for(&modes),
        on_disconnect: if cancel { OnDisconnect::Cancel } else { OnDisconnect::Continue } as i32,
    };
    let reply = edge.runs().join_run(edge.grpc_stream(&caller, request)).await?.into_inner();
    let events: Events =
        Box::pin(reply.map(|item| item.and_then(|r| r.event.ok_or_else(|| tonic::Status::internal("an empty stream item")))));
    let translator = Translator::new(modes, &run_id, &run.thread_id, resume.after_seq);
    Ok(sse(edge, caller, run.thread_id.clone(), events, translator, resume))
}

/// The stream modes a run was created with (`Run.langgraph_stream_modes`); `values` for a run
/// created without any (through gRPC, say).
fn stored_modes(run: &Run) -> Vec<StreamMode> {
    let modes: Vec<StreamMode> = run.langgraph_stream_modes.iter().filter_map(|n| StreamMode::parse(n).ok()).collect();
    if modes.is_empty() { vec![StreamMode::Values] } else { modes }
}

/// Checkpoints read through ThreadService.GetThreadState, as the caller.
struct Checkpoints {
    edge: Arc<Edge>,
    caller: Caller,
    thread_id: String,
}

impl CheckpointSource for Checkpoints {
    async fn checkpoint(&self, checkpoint_id: &str) -> Option<Checkpoint> {
        match thread_state(&self.edge, &self.caller, &self.thread_id, checkpoint_id).await {
            Ok(state) => state.checkpoint,
            Err(error) => {
                // A rolled-back run's checkpoints are gone: its frames carry what the stream saw.
                tracing::debug!(checkpoint_id, detail = %error.detail, "checkpoint not readable for a values frame");
                None
            }
        }
    }
}

/// An SSE response fed by a task that translates `events` until END, the client going away (then
/// the run service applies on_disconnect when the task drops the stream) or shutdown.
fn sse(edge: Arc<Edge>, caller: Caller, thread_id: String, mut events: Events, mut translator: Translator, resume: Resume) -> Response {
    // Bounded: a slow client makes the task wait, and the run service's subscription behind it
    // re-reads the store when it falls behind — the run itself never waits for a client.
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    let shutdown = edge.shutdown.clone();
    tokio::spawn(async move {
        let source = Checkpoints { edge, caller, thread_id };
        let mut skip = resume.skip;
        loop {
            let item = tokio::select! {
                () = shutdown.cancelled() => break,
                () = tx.closed() => break,
                item = events.next() => item,
            };
            let event = match item {
                None => break,
                Some(Ok(event)) => event,
                Some(Err(status)) => {
                    let (_, code) = http_status(status.code());
                    let frame = Frame::Event { name: "error".to_owned(), data: json!({ "error": code, "message": status.message() }) };
                    let _ = tx.send(Ok(Bytes::from(encode(&frame, "")))).await;
                    break;
                }
            };
            let frames = translator.translate(&event, &source).await;
            let ids = frame_ids(event.seq, frames.len());
            let mut text = String::new();
            for (i, (frame, id)) in frames.iter().zip(&ids).enumerate() {
                // The frames of the first event after a `N.k` id the client already has.
                if event.seq == resume.after_seq + 1 && i < skip {
                    continue;
                }
                text.push_str(&encode(frame, id));
            }
            if event.seq > resume.after_seq {
                skip = 0;
            }
            if !text.is_empty() && tx.send(Ok(Bytes::from(text))).await.is_err() {
                break;
            }
            if matches!(event.kind, Some(Kind::End(_))) {
                break;
            }
        }
        drop(source.caller.permit);
    });
    let mut response = Body::from_stream(ReceiverStream::new(rx)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// Follows a run to its END through JoinRun (only END, and heartbeats, are delivered), writing a
/// newline per heartbeat so proxies keep the connection, then the thread's final state. The 200 and
/// the headers go out at once; an error found later is the body's `__error__`.
fn wait_response(edge: Arc<Edge>, caller: Caller, run: Run, on_disconnect: OnDisconnect, location: Option<String>) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(4);
    let shutdown = edge.shutdown.clone();
    let path = run_path(&run.thread_id, &run.run_id);
    tokio::spawn(async move {
        let request = JoinRunRequest {
            thread_id: run.thread_id.clone(),
            run_id: run.run_id.clone(),
            after_seq: 0,
            kinds: vec![EventKind::End as i32],
            on_disconnect: on_disconnect as i32,
        };
        let body = async {
            let mut events = edge.runs().join_run(edge.grpc_stream(&caller, request)).await?.into_inner();
            loop {
                let item = tokio::select! {
                    () = shutdown.cancelled() => return Err(ApiError::from(tonic::Status::unavailable("the server is shutting down; join the run again"))),
                    () = tx.closed() => return Ok(None),
                    item = events.next() => item,
                };
                match item {
                    None => break,
                    Some(Err(status)) => return Err(status.into()),
                    Some(Ok(reply)) => match reply.event.and_then(|e| e.kind) {
                        // Whitespace before the JSON value: the SDKs' JSON parser skips it.
                        Some(Kind::Heartbeat(_)) if tx.send(Ok(Bytes::from_static(b"\n"))).await.is_err() => return Ok(None),
                        Some(Kind::End(_)) => break,
                        _ => {}
                    },
                }
            }
            let finished = get_run(&edge, &caller, &run.thread_id, &run.run_id).await?;
            let state = thread_state(&edge, &caller, &run.thread_id, "").await?;
            Ok(Some(final_values(&finished, state.checkpoint.as_ref())))
        };
        let value = match body.await {
            Ok(Some(value)) => value,
            Ok(None) => return,
            Err(error) => json!({ "__error__": { "error": error.code, "message": error.detail } }),
        };
        let _ = tx.send(Ok(Bytes::from(json_text(&value)))).await;
        drop(caller.permit);
    });
    let mut response = Body::from_stream(ReceiverStream::new(rx)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::CONTENT_LOCATION, header_value(&path));
    if let Some(location) = location {
        headers.insert(header::LOCATION, header_value(&location));
    }
    response
}

/// What `/wait` and `/join` answer: the thread's final values, with `__error__` (which the SDKs
/// raise) when the run ended ERROR or TIMEOUT.
fn final_values(run: &Run, checkpoint: Option<&Checkpoint>) -> Value {
    let mut values = crate::langgraph::stream::state_values(checkpoint);
    let status = RunStatus::try_from(run.status).unwrap_or(RunStatus::Unspecified);
    if matches!(status, RunStatus::Error | RunStatus::Timeout) {
        let error = run.error.clone().unwrap_or_default();
        values["__error__"] = json!({ "error": error.code, "message": error.message });
    }
    values
}

/// `POST /threads/{thread_id}/runs/wait`: CreateRun, then JoinRun until END.
pub async fn wait(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let RunRequest { create, .. } = run_request(&edge, &thread_id, &headers, body).await?;
    let on_disconnect = OnDisconnect::try_from(create.on_disconnect).unwrap_or(OnDisconnect::Continue);
    let reply = edge.runs().create_run(edge.grpc(&caller, create)).await?.into_inner();
    let run = reply.run.ok_or_else(|| ApiError::internal("CreateRun answered without a run"))?;
    let location = format!("{}/join", run_path(&run.thread_id, &run.run_id));
    Ok(wait_response(edge, caller, run, on_disconnect, Some(location)))
}

/// `GET /threads/{thread_id}/runs/{run_id}/join`: waits for the run's END, then its final values.
pub async fn join(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, run_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let cancel = query.bool("cancel_on_disconnect")?.unwrap_or(false);
    let run = get_run(&edge, &caller, &thread_id, &run_id).await?;
    Ok(wait_response(edge, caller, run, if cancel { OnDisconnect::Cancel } else { OnDisconnect::Continue }, None))
}

/// `GET /threads/{thread_id}/runs?limit=&offset=&status=`: newest first.
pub async fn list(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let limit =
        query.integer("limit", 1, edge.config.max_page.into()).map_err(|e| e.naming_setting("edge.max_page"))?.unwrap_or(10) as usize;
    let offset =
        query.integer("offset", 0, edge.config.max_offset.into()).map_err(|e| e.naming_setting("edge.max_offset"))?.unwrap_or(0) as usize;
    let statuses: Vec<i32> = match query.last("status") {
        None => Vec::new(),
        Some("pending") => vec![RunStatus::Pending as i32],
        Some("running") => vec![RunStatus::Running as i32, RunStatus::Finalizing as i32],
        Some("success") => vec![RunStatus::Success as i32],
        Some("error") => vec![RunStatus::Error as i32],
        Some("timeout") => vec![RunStatus::Timeout as i32],
        Some("interrupted") => vec![RunStatus::Interrupted as i32],
        Some(other) => {
            return Err(ApiError::invalid(
                "status",
                format!("`{other}` is not one of pending, running, success, error, timeout, interrupted"),
            ));
        }
    };
    let selected: Vec<&str> = query.all("select");
    let (edge_ref, caller_ref, thread_ref, statuses_ref) = (&edge, &caller, &thread_id, &statuses);
    let found = crate::langgraph::paging::window(offset, limit, move |page| async move {
        let request =
            ListRunsRequest { thread_id: thread_ref.clone(), statuses: statuses_ref.clone(), page: Some(page), ..Default::default() };
        let reply = edge_ref.runs().list_runs(edge_ref.grpc(caller_ref, request)).await?.into_inner();
        Ok((reply.runs, reply.page.map(|p| p.next_page_token).unwrap_or_default()))
    })
    .await?;
    let out: Vec<Value> = found
        .iter()
        .map(|r| {
            let mut run = convert::run(r, edge.assistant.id());
            if !selected.is_empty()
                && let Value::Object(map) = &mut run
            {
                map.retain(|k, _| selected.contains(&k.as_str()));
            }
            run
        })
        .collect();
    Ok(json_response(&Value::Array(out)))
}

/// `GET /threads/{thread_id}/runs/{run_id}`.
pub async fn get(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let run = get_run(&edge, &caller, &thread_id, &run_id).await?;
    Ok(json_response(&convert::run(&run, edge.assistant.id())))
}

/// `DELETE /threads/{thread_id}/runs/{run_id}`: not served.
pub async fn delete(edge: State<Arc<Edge>>, headers: HeaderMap, body: Body) -> ApiError {
    crate::edge::unsupported(
        edge,
        headers,
        body,
        "deleting single runs: a run's record is kept with its thread (DELETE /threads/{id} removes both)",
    )
    .await
}

/// `POST /threads/{thread_id}/runs/{run_id}/cancel?wait=&action=`: CancelRun; 202 at once, or 204
/// once the run is terminal with `wait=1`. A run that already finished otherwise is 409.
pub async fn cancel(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, run_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let wait = query.bool("wait")?.unwrap_or(false);
    let action = match query.last("action") {
        None | Some("interrupt") => CancelAction::Interrupt,
        Some("rollback") => CancelAction::Rollback,
        Some(other) => return Err(ApiError::invalid("action", format!("`{other}` is not one of interrupt, rollback"))),
    };
    let request = antler_proto::runs::CancelRunRequest { thread_id, run_id, action: action as i32, wait };
    edge.runs().cancel_run(edge.grpc(&caller, request)).await?;
    Ok(if wait { StatusCode::NO_CONTENT } else { StatusCode::ACCEPTED }.into_response())
}
