//! Threads: the conversations runs belong to. A thread's status is derived from its runs when read
//! (busy while a run is active, else from its latest run), so it can never go stale.

use antler_proto::runs::{
    CancelAction, Checkpoint, ClarificationEvent, EventKind, RunEvent, SortOrder, Thread, ThreadSort, ThreadState, ThreadStatus, run_event,
};
use prost::Message;
use sea_orm::sea_query::{Condition, Expr};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, QueryFilter, QueryOrder, QuerySelect};

use crate::engine::Engine;
use crate::error::RunsError;
use crate::lifecycle::cancel;
use crate::status::Status;

use crate::paging;
use crate::store::entity::{checkpoint_blobs, checkpoints, feedback, run_events, run_inputs, runs, threads, tool_effects};
use crate::store::now_ms;
use crate::time::to_timestamp;
use antler_kit::json::{json_text_to_struct, struct_to_json};

pub fn valid_thread_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn sanitise_metadata(metadata: Option<prost_types::Struct>, max: u32) -> Result<serde_json::Map<String, serde_json::Value>, RunsError> {
    let mut metadata = metadata.unwrap_or_default();
    antler_kit::input_keys::check("metadata", &mut metadata, antler_kit::input_keys::Reserved::Refuse, &["thread_id"])?;
    if metadata.encoded_len() > max as usize {
        return Err(RunsError::invalid(
            "metadata",
            format!("{} bytes; the limit is {max} (runs.max_metadata_bytes)", metadata.encoded_len()),
        ));
    }
    match struct_to_json(&metadata) {
        serde_json::Value::Object(map) => Ok(map),
        _ => Ok(serde_json::Map::new()),
    }
}

pub async fn find(engine: &Engine, user_id: &str, thread_id: &str) -> Result<threads::Model, RunsError> {
    if !valid_thread_id(thread_id) {
        return Err(RunsError::NotFound(format!("thread {thread_id}")));
    }
    threads::Entity::find_by_id((user_id.to_owned(), thread_id.to_owned()))
        .one(engine.store().db())
        .await?
        .ok_or_else(|| RunsError::NotFound(format!("thread {thread_id}")))
}

/// Creates a thread, or returns the caller's existing one with that id (created = false).
pub async fn create(
    engine: &Engine,
    user_id: &str,
    thread_id: &str,
    title: &str,
    metadata: Option<prost_types::Struct>,
) -> Result<(threads::Model, bool), RunsError> {
    if !thread_id.is_empty() && !valid_thread_id(thread_id) {
        return Err(RunsError::invalid("thread_id", format!("`{thread_id}` must match ^[A-Za-z0-9_-]{{1,64}}$")));
    }
    if title.chars().count() > 256 {
        return Err(RunsError::invalid("title", "is longer than 256 characters"));
    }
    let metadata = sanitise_metadata(metadata, engine.config().max_metadata_bytes)?;
    let id = if thread_id.is_empty() { uuid::Uuid::now_v7().to_string() } else { thread_id.to_owned() };
    if let Some(existing) = threads::Entity::find_by_id((user_id.to_owned(), id.clone())).one(engine.store().db()).await? {
        return Ok((existing, false));
    }
    let now = now_ms();
    let model = threads::Model {
        user_id: user_id.to_owned(),
        thread_id: id.clone(),
        title: title.to_owned(),
        metadata: serde_json::Value::Object(metadata).to_string(),
        head_checkpoint_id: None,
        latest_run_id: None,
        created_at: now,
        updated_at: now,
        parent_thread_id: None,
    };
    let tx = engine.store().tx().await?;
    let inserted = threads::Entity::insert(threads::ActiveModel::from(model.clone())).exec_without_returning(&*tx).await;
    match inserted {
        Ok(_) => {
            tx.commit().await?;
            Ok((model, true))
        }
        // A concurrent create of the same id won: return its thread.
        Err(e) if crate::store::StoreError::Db(e.clone()).is_unique_violation() => {
            drop(tx);
            Ok((find(engine, user_id, &id).await?, false))
        }
        Err(e) => Err(e.into()),
    }
}

/// Merges `metadata` into the thread's (a null value removes a key) and sets the title if given.
pub async fn update(
    engine: &Engine,
    user_id: &str,
    thread_id: &str,
    title: Option<String>,
    metadata: Option<prost_types::Struct>,
) -> Result<threads::Model, RunsError> {
    let thread = find(engine, user_id, thread_id).await?;
    let patch = sanitise_metadata(metadata, engine.config().max_metadata_bytes)?;
    let mut current = match serde_json::from_str::<serde_json::Value>(&thread.metadata) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    for (key, value) in patch {
        if value.is_null() {
            current.remove(&key);
        } else {
            current.insert(key, value);
        }
    }
    let merged = serde_json::Value::Object(current).to_string();
    if merged.len() > engine.config().max_metadata_bytes as usize {
        return Err(RunsError::invalid(
            "metadata",
            format!("the merged metadata would be {} bytes; the limit is {}", merged.len(), engine.config().max_metadata_bytes),
        ));
    }
    if let Some(title) = &title
        && title.chars().count() > 256
    {
        return Err(RunsError::invalid("title", "is longer than 256 characters"));
    }
    let tx = engine.store().tx().await?;
    let mut update = threads::Entity::update_many()
        .col_expr(threads::Column::Metadata, Expr::value(merged))
        .col_expr(threads::Column::UpdatedAt, Expr::value(now_ms()))
        .filter(threads::Column::UserId.eq(user_id))
        .filter(threads::Column::ThreadId.eq(thread_id));
    if let Some(title) = title {
        update = update.col_expr(threads::Column::Title, Expr::value(title));
    }
    update.exec(&*tx).await?;
    tx.commit().await?;
    find(engine, user_id, thread_id).await
}

/// The channels [`update_state`] may write, checked: the title (None: cleared).
fn writable_values(values: Option<&prost_types::Struct>) -> Result<Option<String>, RunsError> {
    use prost_types::value::Kind;
    let values = values
        .filter(|v| !v.fields.is_empty())
        .ok_or_else(|| RunsError::invalid("values", "is required: name at least one channel, e.g. {\"title\": \"…\"}"))?;
    let mut title = None;
    for (key, value) in &values.fields {
        match (key.as_str(), value.kind.as_ref()) {
            ("title", Some(Kind::StringValue(text))) if text.chars().count() > 256 => {
                return Err(RunsError::invalid("values.title", format!("is {} characters long; the limit is 256", text.chars().count())));
            }
            ("title", Some(Kind::StringValue(text))) => title = Some(text.clone()),
            ("title", None | Some(Kind::NullValue(_))) => title = Some(String::new()),
            ("title", _) => return Err(RunsError::invalid("values.title", "must be a string or null")),
            ("messages", _) => {
                return Err(RunsError::invalid(
                    "values.messages",
                    "messages change only through runs\nhint: send them as a run's input (CreateRunRequest.input)",
                ));
            }
            (other, _) => {
                return Err(RunsError::invalid(
                    format!("values.{other}"),
                    "only `title` can be written outside a run; the agent's other channels change as it runs",
                ));
            }
        }
    }
    Ok(title)
}

/// Writes a checkpoint with `values` applied over the thread's head (or `checkpoint_id`) and makes it
/// the head, in one transaction that first takes the thread's row and then checks that no run is
/// active (ABORTED naming it): a run's steps start from the head it was admitted on, so a change
/// written under it would be overwritten. The thread's title follows the `title` channel.
pub async fn update_state(
    engine: &Engine,
    user_id: &str,
    thread_id: &str,
    values: Option<prost_types::Struct>,
    checkpoint_id: &str,
) -> Result<(Checkpoint, threads::Model), RunsError> {
    let title = writable_values(values.as_ref())?;
    find(engine, user_id, thread_id).await?;
    let written = engine
        .store()
        .retry_busy(|| async {
            let tx = engine.store().tx().await?;
            let now = now_ms();
            // First the thread's row: on PostgreSQL this waits for (and then sees) an admission
            // that is writing the thread's latest run at this moment.
            threads::Entity::update_many()
                .col_expr(threads::Column::UpdatedAt, Expr::value(now))
                .filter(threads::Column::UserId.eq(user_id))
                .filter(threads::Column::ThreadId.eq(thread_id))
                .exec(&*tx)
                .await?;
            let active = runs::Entity::find()
                .filter(runs::Column::UserId.eq(user_id))
                .filter(runs::Column::ThreadId.eq(thread_id))
                .filter(runs::Column::Status.is_in(Status::ACTIVE))
                .one(&*tx)
                .await?;
            if let Some(active) = active {
                return Err(RunsError::Aborted(format!(
                    "thread {thread_id} has an active run {}: its next step would overwrite this change\nhint: retry once the run has ended, or cancel it first",
                    active.run_id
                )));
            }
            let thread = threads::Entity::find_by_id((user_id.to_owned(), thread_id.to_owned()))
                .one(&*tx)
                .await?
                .ok_or_else(|| RunsError::NotFound(format!("thread {thread_id}")))?;
            let parent_id = if checkpoint_id.is_empty() { thread.head_checkpoint_id.clone() } else { Some(checkpoint_id.to_owned()) };
            let parent = match &parent_id {
                Some(id) => Some(
                    crate::checkpoints::find(&*tx, user_id, thread_id, id, true)
                        .await?
                        .ok_or_else(|| RunsError::NotFound(format!("checkpoint {id} of thread {thread_id}")))?,
                ),
                None => None,
            };
            let (base, depth) = parent.unwrap_or_default();
            let mut channels = base.values.clone().unwrap_or_default();
            if let Some(title) = &title {
                channels.fields.insert("title".to_owned(), prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(title.clone())) });
            }
            let state = Checkpoint {
                checkpoint_id: uuid::Uuid::now_v7().to_string(),
                parent_checkpoint_id: parent_id.clone().unwrap_or_default(),
                // LangGraph counts an update as a step of its own.
                step: if parent_id.is_some() { base.step + 1 } else { 0 },
                values: Some(channels),
                created_at: Some(to_timestamp(now)),
                run_id: String::new(),
                messages: base.messages.clone(),
                source: "update".to_owned(),
            };
            let full = parent_id.as_ref().map(|id| crate::checkpoints::Full {
                checkpoint_id: id.clone(),
                messages: base.messages,
                values: base.values.unwrap_or_default(),
                depth,
            });
            let policy = crate::checkpoints::Policy {
                snapshot_every: engine.config().checkpoint_snapshot_every,
                blob_min_bytes: engine.config().checkpoint_blob_min_bytes,
            };
            // Stored as a delta over its parent (the messages are kept, only the title changes).
            let encoded = crate::checkpoints::encode(&state, full.as_ref(), policy);
            crate::checkpoints::insert_blobs(&*tx, user_id, thread_id, &encoded.blobs, now).await?;
            checkpoints::Entity::insert(checkpoints::ActiveModel::from(checkpoints::Model {
                checkpoint_id: state.checkpoint_id.clone(),
                user_id: user_id.to_owned(),
                thread_id: thread_id.to_owned(),
                parent_checkpoint_id: parent_id,
                run_id: None,
                step: state.step,
                state: encoded.state,
                created_at: now,
                encoding: crate::checkpoints::ENCODING_STORED,
            }))
            .exec_without_returning(&*tx)
            .await?;
            let mut update = threads::Entity::update_many()
                .col_expr(threads::Column::HeadCheckpointId, Expr::value(state.checkpoint_id.as_str()))
                .filter(threads::Column::UserId.eq(user_id))
                .filter(threads::Column::ThreadId.eq(thread_id));
            if let Some(title) = &title {
                update = update.col_expr(threads::Column::Title, Expr::value(title.as_str()));
            }
            update.exec(&*tx).await?;
            tx.commit().await?;
            Ok::<_, RunsError>(state)
        })
        .await?;
    tracing::info!(thread_id, checkpoint_id = %written.checkpoint_id, title = title.is_some(), "thread state updated outside a run");
    let mut checkpoint = written;
    checkpoint.messages = Vec::new();
    Ok((checkpoint, find(engine, user_id, thread_id).await?))
}

/// DeleteThread: with `cancel_active_run`, cancels the thread's active run (INTERRUPT) and waits for
/// it to end; FAILED_PRECONDITION while a run is still active; then deletes the thread's sandbox
/// workspace and the thread with its runs ([`delete`]). Returns how many runs were removed.
pub async fn delete_with_workspace(
    engine: &Engine,
    ctx: &antler_kit::CallContext,
    thread_id: &str,
    cancel_active_run: bool,
) -> Result<u64, RunsError> {
    let user_id = ctx.identity.user_id.as_str();
    let thread = find(engine, user_id, thread_id).await?;
    if cancel_active_run && let (_, Some(active)) = status(engine, &thread).await? {
        cancel::cancel(engine, user_id, thread_id, &active, CancelAction::Interrupt, cancel::CancelCause::Requested).await?;
        cancel::wait_terminal(engine, &active).await?;
    }
    if let (_, Some(active)) = status(engine, &thread).await? {
        return Err(RunsError::FailedPrecondition(format!(
            "thread {thread_id} has an active run {active}\nhint: cancel it first, or set cancel_active_run"
        )));
    }
    // The workspace first: if the sandbox service cannot be reached, nothing has been deleted yet
    // and the call can simply be retried.
    delete_workspace(engine, ctx, thread_id).await?;
    delete(engine, user_id, thread_id).await
}

/// Deletes the thread's sandbox (its files, its running commands, the sandbox itself). A thread that
/// never had a sandbox is fine; an unreachable sandbox service is UNAVAILABLE.
async fn delete_workspace(engine: &Engine, ctx: &antler_kit::CallContext, thread_id: &str) -> Result<(), RunsError> {
    use antler_proto::sandbox::ReleaseSandboxRequest;
    use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
    let Some(client) = engine.clients().get("sandbox") else { return Ok(()) };
    let mut grpc = SandboxServiceClient::new(client.channel());
    let delete = ReleaseSandboxRequest { thread_id: thread_id.to_owned(), terminate_processes: true, delete_workspace: true };
    match grpc.release_sandbox(client.request(ctx, delete)).await {
        Ok(_) => Ok(()),
        Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
        // No sandbox service at the configured endpoint (a runs-only deployment): nothing to delete.
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            tracing::warn!(thread_id, "no sandbox service at clients.sandbox; the thread's workspace (if any) was not deleted");
            Ok(())
        }
        // UNAVAILABLE with retry-after 1, as the handler answered it before.
        Err(status) => Err(RunsError::Unavailable(format!(
            "cannot delete the workspace of thread {thread_id}: the sandbox service answered {:?}: {}",
            status.code(),
            status.message()
        ))),
    }
}

/// Deletes a thread with its runs, events, checkpoints, side-effect journal and feedback, and the
/// threads of its subagent runs with theirs. FAILED_PRECONDITION while a run is active. Returns how
/// many runs were removed.
pub async fn delete(engine: &Engine, user_id: &str, thread_id: &str) -> Result<u64, RunsError> {
    find(engine, user_id, thread_id).await?;
    let tx = engine.store().tx().await?;
    let mut thread_ids: Vec<String> = threads::Entity::find()
        .select_only()
        .column(threads::Column::ThreadId)
        .filter(threads::Column::UserId.eq(user_id))
        .filter(threads::Column::ParentThreadId.eq(thread_id))
        .into_tuple()
        .all(&*tx)
        .await?;
    thread_ids.push(thread_id.to_owned());
    let thread_ids = &thread_ids;
    let active = runs::Entity::find()
        .filter(runs::Column::UserId.eq(user_id))
        .filter(runs::Column::ThreadId.is_in(thread_ids.iter().map(String::as_str)))
        .filter(runs::Column::Status.is_in(Status::ACTIVE))
        .one(&*tx)
        .await?;
    if let Some(active) = active {
        return Err(RunsError::FailedPrecondition(format!(
            "thread {thread_id} has an active run {}\nhint: cancel it first, or set cancel_active_run",
            active.run_id
        )));
    }
    let run_ids: Vec<String> = runs::Entity::find()
        .select_only()
        .column(runs::Column::RunId)
        .filter(runs::Column::UserId.eq(user_id))
        .filter(runs::Column::ThreadId.is_in(thread_ids.iter().map(String::as_str)))
        .into_tuple()
        .all(&*tx)
        .await?;
    for chunk in run_ids.chunks(500) {
        run_events::Entity::delete_many().filter(run_events::Column::RunId.is_in(chunk.iter().cloned())).exec(&*tx).await?;
        feedback::Entity::delete_many().filter(feedback::Column::RunId.is_in(chunk.iter().cloned())).exec(&*tx).await?;
        tool_effects::Entity::delete_many().filter(tool_effects::Column::RunId.is_in(chunk.iter().cloned())).exec(&*tx).await?;
        run_inputs::Entity::delete_many().filter(run_inputs::Column::RunId.is_in(chunk.iter().cloned())).exec(&*tx).await?;
    }
    runs::Entity::delete_many()
        .filter(runs::Column::UserId.eq(user_id))
        .filter(runs::Column::ThreadId.is_in(thread_ids.iter().map(String::as_str)))
        .exec(&*tx)
        .await?;
    checkpoints::Entity::delete_many()
        .filter(checkpoints::Column::UserId.eq(user_id))
        .filter(checkpoints::Column::ThreadId.is_in(thread_ids.iter().map(String::as_str)))
        .exec(&*tx)
        .await?;
    checkpoint_blobs::Entity::delete_many()
        .filter(checkpoint_blobs::Column::UserId.eq(user_id))
        .filter(checkpoint_blobs::Column::ThreadId.is_in(thread_ids.iter().map(String::as_str)))
        .exec(&*tx)
        .await?;
    threads::Entity::delete_many()
        .filter(threads::Column::UserId.eq(user_id))
        .filter(threads::Column::ThreadId.is_in(thread_ids.iter().map(String::as_str)))
        .exec(&*tx)
        .await?;
    tx.commit().await?;
    Ok(run_ids.len() as u64)
}

/// The thread's status, derived from its runs.
pub async fn status(engine: &Engine, thread: &threads::Model) -> Result<(ThreadStatus, Option<String>), RunsError> {
    let active = runs::Entity::find()
        .filter(runs::Column::UserId.eq(thread.user_id.as_str()))
        .filter(runs::Column::ThreadId.eq(thread.thread_id.as_str()))
        .filter(runs::Column::Status.is_in(Status::ACTIVE))
        .filter(runs::Column::Queued.eq(false))
        .one(engine.store().db())
        .await?;
    if let Some(active) = active {
        return Ok((ThreadStatus::Busy, Some(active.run_id)));
    }
    let Some(latest) = &thread.latest_run_id else { return Ok((ThreadStatus::Idle, None)) };
    let latest = runs::Entity::find_by_id(latest.clone()).one(engine.store().db()).await?;
    let status = derived_status(false, latest.as_ref().map(|r| r.status), latest.as_ref().and_then(|r| r.stop_reason.as_deref()));
    Ok((status, None))
}

/// The one rule for a thread's status: BUSY while a run is active (admitted, not queued), else
/// ERROR when its latest run ended ERROR or TIMEOUT, INTERRUPTED when that run stopped for a
/// clarification or at a breakpoint, IDLE otherwise. [`status_sql`] is the same rule in SQL.
fn derived_status(active: bool, latest_status: Option<Status>, latest_stop_reason: Option<&str>) -> ThreadStatus {
    if active {
        return ThreadStatus::Busy;
    }
    match (latest_status, latest_stop_reason) {
        (Some(Status::Error | Status::Timeout), _) => ThreadStatus::Error,
        (_, Some("clarification")) => ThreadStatus::Interrupted,
        (Some(Status::Interrupted), Some("breakpoint")) => ThreadStatus::Interrupted,
        _ => ThreadStatus::Idle,
    }
}

/// [`derived_status`] as a SQL condition on the columns `active_run_id`, `latest_status` and
/// `latest_stop_reason` of [`list`]'s query. None for UNSPECIFIED (no filter).
fn status_sql(status: ThreadStatus) -> Option<String> {
    let error = format!("COALESCE(latest_status, '') IN ('{}', '{}')", Status::Error, Status::Timeout);
    let interrupted = format!(
        "(COALESCE(latest_stop_reason, '') = 'clarification' OR (COALESCE(latest_status, '') = '{}' AND COALESCE(latest_stop_reason, '') = 'breakpoint'))",
        Status::Interrupted
    );
    Some(match status {
        ThreadStatus::Unspecified => return None,
        ThreadStatus::Busy => "active_run_id IS NOT NULL".to_owned(),
        ThreadStatus::Error => format!("active_run_id IS NULL AND {error}"),
        ThreadStatus::Interrupted => format!("active_run_id IS NULL AND NOT {error} AND {interrupted}"),
        ThreadStatus::Idle => format!("active_run_id IS NULL AND NOT {error} AND NOT {interrupted}"),
    })
}

/// The head checkpoint (or a named one) of a thread; its messages left empty unless `with_messages`.
pub async fn checkpoint(
    engine: &Engine,
    thread: &threads::Model,
    checkpoint_id: Option<&str>,
    with_messages: bool,
) -> Result<Option<Checkpoint>, RunsError> {
    let id = match checkpoint_id {
        Some(id) => Some(id.to_owned()),
        None => thread.head_checkpoint_id.clone(),
    };
    let Some(id) = id else { return Ok(None) };
    let (checkpoint, _) = crate::checkpoints::find(engine.store().db(), &thread.user_id, &thread.thread_id, &id, with_messages)
        .await?
        .ok_or_else(|| RunsError::NotFound(format!("checkpoint {id}")))?;
    Ok(Some(checkpoint))
}

pub async fn to_proto(engine: &Engine, thread: &threads::Model, include_values: bool) -> Result<Thread, RunsError> {
    let (status, active) = status(engine, thread).await?;
    to_proto_with(engine, thread, status, active, include_values).await
}

/// [`to_proto`] with the status already known (as [`list`] derives it).
pub async fn to_proto_with(
    engine: &Engine,
    thread: &threads::Model,
    status: ThreadStatus,
    active: Option<String>,
    include_values: bool,
) -> Result<Thread, RunsError> {
    let values = if include_values { checkpoint(engine, thread, None, false).await?.and_then(|c| c.values) } else { None };
    Ok(Thread {
        thread_id: thread.thread_id.clone(),
        status: status as i32,
        title: thread.title.clone(),
        metadata: Some(json_text_to_struct(&thread.metadata)),
        created_at: Some(to_timestamp(thread.created_at)),
        updated_at: Some(to_timestamp(thread.updated_at)),
        values,
        active_run_id: active.unwrap_or_default(),
        latest_run_id: thread.latest_run_id.clone().unwrap_or_default(),
    })
}

/// Which of a checkpoint's messages a state answer carries: the newest `limit` (0: any number)
/// before `page_token`'s position (empty: the end), within `runs.state_max_message_bytes`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MessagePage<'a> {
    pub limit: u32,
    pub page_token: &'a str,
}

/// The thread's state at `checkpoint_id` (None: its head), its messages bounded by `page`.
pub async fn state(
    engine: &Engine,
    thread: &threads::Model,
    checkpoint_id: Option<&str>,
    page: MessagePage<'_>,
) -> Result<ThreadState, RunsError> {
    let (status, _) = status(engine, thread).await?;
    // A page token names the checkpoint and the index the page ends before.
    let cursor = paging::decode(page.page_token, "messages_page_token")?;
    let checkpoint_id = match &cursor {
        Some((_, id)) => Some(id.as_str()),
        None => checkpoint_id,
    };
    let mut checkpoint = checkpoint(engine, thread, checkpoint_id, true).await?;
    let (mut total, mut offset, mut next_token) = (0, 0, String::new());
    if let Some(checkpoint) = &mut checkpoint {
        total = checkpoint.messages.len();
        let end = match cursor {
            Some((end, _)) if end >= 0 && end as usize <= total => end as usize,
            Some(_) => return Err(RunsError::invalid("messages_page_token", "is not a token returned by this service")),
            None => total,
        };
        let start = page_start(&checkpoint.messages[..end], page.limit, engine.config().state_max_message_bytes as usize);
        checkpoint.messages.truncate(end);
        checkpoint.messages.drain(..start);
        offset = start;
        if start > 0 {
            next_token = paging::encode(start as i64, &checkpoint.checkpoint_id);
        }
    }
    Ok(ThreadState {
        thread_id: thread.thread_id.clone(),
        checkpoint,
        // The lead agent finishes each turn before its run ends (no breakpoints yet), so nothing is
        // ever left to run: an empty list is the truth, not a placeholder.
        next: Vec::new(),
        pending_clarification: pending_clarification(engine, thread).await?,
        status: status as i32,
        messages_total: total as u64,
        messages_offset: offset as u64,
        messages_next_page_token: next_token,
    })
}

/// Where the page of `messages` that ends with the last one starts: at most `limit` of them
/// (0: any number) and `max_bytes` of encoding, but at least one.
fn page_start(messages: &[antler_proto::common::Message], limit: u32, max_bytes: usize) -> usize {
    let mut start = messages.len();
    let mut bytes = 0usize;
    while start > 0 {
        if limit > 0 && messages.len() - start >= limit as usize {
            break;
        }
        // The field tag and length prefix of each repeated message, counted generously.
        let size = messages[start - 1].encoded_len() + 8;
        if bytes + size > max_bytes && start < messages.len() {
            break;
        }
        bytes += size;
        start -= 1;
    }
    start
}

/// The question the thread waits on: the last clarification of its latest run, when that run ended
/// SUCCESS with stop_reason `clarification` (a newer run answers or supersedes it).
async fn pending_clarification(engine: &Engine, thread: &threads::Model) -> Result<Option<ClarificationEvent>, RunsError> {
    let Some(run_id) = &thread.latest_run_id else { return Ok(None) };
    let Some(run) = runs::Entity::find_by_id(run_id.clone()).one(engine.store().db()).await? else { return Ok(None) };
    if run.status != Status::Success || run.stop_reason.as_deref() != Some("clarification") {
        return Ok(None);
    }
    let event = run_events::Entity::find()
        .filter(run_events::Column::RunId.eq(run_id.clone()))
        .filter(run_events::Column::Kind.eq(EventKind::Clarification as i32))
        .order_by_desc(run_events::Column::Seq)
        .one(engine.store().db())
        .await?;
    let Some(event) = event else { return Ok(None) };
    let event = RunEvent::decode(event.payload.as_slice()).map_err(|e| RunsError::Store(e.into()))?;
    Ok(match event.kind {
        Some(run_event::Kind::Clarification(clarification)) => Some(clarification),
        _ => None,
    })
}

/// One row of [`list`]: the thread, its status and its active run (derived in the same query).
#[derive(Debug, Clone)]
pub struct Listed {
    pub thread: threads::Model,
    pub status: ThreadStatus,
    pub active_run_id: Option<String>,
}

/// What ListThreads orders by, and which way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sort {
    pub by: ThreadSort,
    pub ascending: bool,
}

impl Sort {
    /// The sort a request asks for (UNSPECIFIED: created_at, newest first).
    pub fn of(by: ThreadSort, order: SortOrder) -> Self {
        let by = if by == ThreadSort::Unspecified { ThreadSort::CreatedAt } else { by };
        Self { by, ascending: order == SortOrder::Asc }
    }

    fn column(self) -> &'static str {
        if self.by == ThreadSort::UpdatedAt { "updated_at" } else { "created_at" }
    }

    /// The mark a page token carries, so a token is only read back under the sort it was made for.
    /// Newest created first has none: its tokens are the ones this service has always written.
    fn tag(self) -> Option<&'static str> {
        match (self.by == ThreadSort::UpdatedAt, self.ascending) {
            (false, false) => None,
            (false, true) => Some("ca"),
            (true, false) => Some("ud"),
            (true, true) => Some("ua"),
        }
    }

    fn encode(self, thread: &threads::Model) -> String {
        let at = if self.by == ThreadSort::UpdatedAt { thread.updated_at } else { thread.created_at };
        match self.tag() {
            None => paging::encode(at, &thread.thread_id),
            // Thread ids never hold ':', so the mark reads back unambiguously.
            Some(tag) => paging::encode(at, &format!("{tag}:{}", thread.thread_id)),
        }
    }

    /// The position a token names (after this time and thread id), refusing a token of another sort.
    fn decode(self, token: &str) -> Result<Option<(i64, String)>, RunsError> {
        let Some((at, rest)) = paging::decode(token, "page.page_token")? else { return Ok(None) };
        let (tag, id) = match rest.split_once(':') {
            Some((tag, id)) => (Some(tag), id.to_owned()),
            None => (None, rest),
        };
        if tag != self.tag() {
            return Err(RunsError::invalid(
                "page.page_token",
                "was returned for another sort_by / sort_order\nhint: pass the sort the first page was asked with, or start again without a token",
            ));
        }
        Ok(Some((at, id)))
    }
}

/// The filters and order of [`list`].
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Exact match on top-level metadata keys.
    pub metadata: Option<prost_types::Struct>,
    /// Exact match on state channels: only `title` can be matched (see [`title_filter`]).
    pub values: Option<prost_types::Struct>,
    pub status: ThreadStatus,
    pub sort: Sort,
}

/// The title a `values` filter asks for (None: no filter). Every other channel lives in the
/// checkpoints' encoded state, which no index (and no SQL) can read, so it is refused by name.
pub fn title_filter(values: Option<&prost_types::Struct>) -> Result<Option<String>, RunsError> {
    let Some(values) = values else { return Ok(None) };
    let mut title = None;
    for (key, value) in &values.fields {
        match (key.as_str(), value.kind.as_ref()) {
            ("title", Some(prost_types::value::Kind::StringValue(s))) => title = Some(s.clone()),
            ("title", _) => return Err(RunsError::invalid("values.title", "must be a string")),
            (other, _) => {
                return Err(RunsError::invalid(
                    format!("values.{other}"),
                    "threads can be matched on the `title` channel only: the other channels live inside checkpoints, which are not indexed\nhint: filter on metadata, or read the threads and match their values yourself",
                ));
            }
        }
    }
    Ok(title)
}

/// The caller's threads in `query.sort` order, filtered by metadata, title and status in SQL: a
/// page holds `page_size` matching threads (fewer only on the last page) however few of the
/// caller's threads match, and the token names the last one returned (its sort time and id), so
/// threads that do not change between pages are neither repeated nor skipped.
///
/// Metadata: every key of the filter must be present with an equal value (JSON equality of the
/// top-level value). PostgreSQL compares `jsonb` values; SQLite compares `json_each` rows by type and
/// value (objects and arrays by their JSON text, which this service always writes the same way).
pub async fn list(
    engine: &Engine,
    user_id: &str,
    query: &ListQuery,
    page_size: u64,
    token: &str,
) -> Result<(Vec<Listed>, String), RunsError> {
    let wanted = match query.metadata.as_ref().map(struct_to_json) {
        Some(serde_json::Value::Object(map)) if !map.is_empty() => Some(serde_json::Value::Object(map).to_string()),
        _ => None,
    };
    let title = title_filter(query.values.as_ref())?;
    let sort = query.sort;
    let cursor = sort.decode(token)?;
    let backend = engine.store().backend();
    // The threads of subagent runs belong to their parent's thread, not to the user's list.
    let mut inner = format!(
        "SELECT t.*, \
           (SELECT a.run_id FROM runs a WHERE a.user_id = t.user_id AND a.thread_id = t.thread_id \
              AND a.status IN ({}) AND a.queued = FALSE LIMIT 1) AS active_run_id, \
           l.status AS latest_status, l.stop_reason AS latest_stop_reason \
         FROM threads t LEFT JOIN runs l ON l.run_id = t.latest_run_id \
         WHERE t.user_id = ? AND t.parent_thread_id IS NULL",
        Status::ACTIVE.map(|s| format!("'{s}'")).join(", ")
    );
    let mut values: Vec<sea_orm::Value> = vec![user_id.into()];
    let (column, direction, past) = (sort.column(), if sort.ascending { "ASC" } else { "DESC" }, if sort.ascending { ">" } else { "<" });
    if let Some((at, id)) = cursor {
        inner.push_str(&format!(" AND (t.{column} {past} ? OR (t.{column} = ? AND t.thread_id {past} ?))"));
        values.extend([at.into(), at.into(), id.into()]);
    }
    if let Some(title) = title {
        inner.push_str(" AND t.title = ?");
        values.push(title.into());
    }
    if let Some(wanted) = wanted {
        inner.push_str(match backend {
            sea_orm::DbBackend::Postgres => {
                " AND NOT EXISTS (SELECT 1 FROM jsonb_each(CAST(? AS jsonb)) w \
                   WHERE (CAST(t.metadata AS jsonb) -> w.key) IS DISTINCT FROM w.value)"
            }
            _ => {
                " AND NOT EXISTS (SELECT 1 FROM json_each(?) w WHERE NOT EXISTS \
                   (SELECT 1 FROM json_each(t.metadata) j WHERE j.key = w.key AND j.type = w.type AND j.value IS w.value))"
            }
        });
        values.push(wanted.into());
    }
    let filter = status_sql(query.status).map(|c| format!(" WHERE {c}")).unwrap_or_default();
    let sql = format!("SELECT * FROM ({inner}) x{filter} ORDER BY {column} {direction}, thread_id {direction} LIMIT ?");
    values.push(i64::try_from(page_size).unwrap_or(i64::MAX).into());
    let rows = engine.store().db().query_all_raw(crate::store::statement(backend, &sql, values)).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let thread = threads::Model::from_query_result(&row, "")?;
        let active_run_id: Option<String> = row.try_get("", "active_run_id")?;
        let latest_status: Option<Status> = row.try_get("", "latest_status")?;
        let latest_stop_reason: Option<String> = row.try_get("", "latest_stop_reason")?;
        let status = derived_status(active_run_id.is_some(), latest_status, latest_stop_reason.as_deref());
        out.push(Listed { thread, status, active_run_id });
    }
    let next = if out.len() as u64 == page_size { out.last().map(|t| sort.encode(&t.thread)).unwrap_or_default() } else { String::new() };
    Ok((out, next))
}

/// Checkpoints of a thread, newest first.
pub async fn history(
    engine: &Engine,
    thread: &threads::Model,
    run_id: &str,
    page_size: u64,
    token: &str,
    include_messages: bool,
) -> Result<(Vec<Checkpoint>, String), RunsError> {
    let mut query = checkpoints::Entity::find()
        .filter(checkpoints::Column::UserId.eq(thread.user_id.as_str()))
        .filter(checkpoints::Column::ThreadId.eq(thread.thread_id.as_str()))
        .order_by_desc(checkpoints::Column::CreatedAt)
        .order_by_desc(checkpoints::Column::CheckpointId)
        .limit(page_size);
    if !run_id.is_empty() {
        query = query.filter(checkpoints::Column::RunId.eq(run_id));
    }
    if let Some((at, id)) = paging::decode(token, "page.page_token")? {
        query = query.filter(
            Condition::any()
                .add(checkpoints::Column::CreatedAt.lt(at))
                .add(Condition::all().add(checkpoints::Column::CreatedAt.eq(at)).add(checkpoints::Column::CheckpointId.lt(id))),
        );
    }
    let rows = query.all(engine.store().db()).await?;
    let mut next = if rows.len() as u64 == page_size {
        rows.last().map(|r| paging::encode(r.created_at, &r.checkpoint_id)).unwrap_or_default()
    } else {
        String::new()
    };
    let mut out = Vec::with_capacity(rows.len());
    // A page also ends before `runs.state_max_message_bytes` (it always holds one checkpoint), so
    // an answer with messages stays under the gRPC message limit.
    let mut bytes = 0usize;
    for (index, row) in rows.iter().enumerate() {
        let checkpoint = crate::checkpoints::read(engine.store().db(), row, include_messages).await?.0;
        bytes += checkpoint.encoded_len();
        if bytes > engine.config().state_max_message_bytes as usize && !out.is_empty() {
            let last = &rows[index - 1];
            next = paging::encode(last.created_at, &last.checkpoint_id);
            break;
        }
        out.push(checkpoint);
    }
    Ok((out, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(id: &str, created_at: i64, updated_at: i64) -> threads::Model {
        threads::Model {
            user_id: "u".to_owned(),
            thread_id: id.to_owned(),
            title: String::new(),
            metadata: "{}".to_owned(),
            head_checkpoint_id: None,
            latest_run_id: None,
            created_at,
            updated_at,
            parent_thread_id: None,
        }
    }

    #[test]
    fn a_page_token_reads_back_only_under_its_own_sort() {
        let t = thread("t-1", 10, 20);
        let default = Sort::of(ThreadSort::Unspecified, SortOrder::Unspecified);
        let updated = Sort::of(ThreadSort::UpdatedAt, SortOrder::Asc);
        // Newest created first writes the tokens this service always wrote, so they still read.
        assert_eq!(default.encode(&t), paging::encode(10, "t-1"));
        assert!(matches!(default.decode(&paging::encode(10, "t-1")), Ok(Some((10, ref id))) if id == "t-1"));
        assert!(matches!(updated.decode(&updated.encode(&t)), Ok(Some((20, ref id))) if id == "t-1"));
        assert!(updated.decode(&default.encode(&t)).is_err());
        assert!(default.decode(&updated.encode(&t)).is_err());
        assert!(Sort::of(ThreadSort::CreatedAt, SortOrder::Asc).decode(&updated.encode(&t)).is_err());
    }

    #[test]
    fn only_the_title_channel_is_matched_or_written() {
        let string = |s: &str| prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(s.to_owned())) };
        let of = |key: &str, value: prost_types::Value| prost_types::Struct { fields: [(key.to_owned(), value)].into_iter().collect() };
        assert!(matches!(title_filter(Some(&of("title", string("T")))), Ok(Some(ref t)) if t == "T"));
        assert!(
            matches!(title_filter(Some(&of("todos", string("x")))), Err(RunsError::InvalidArgument { ref field, .. }) if field == "values.todos")
        );
        assert!(matches!(writable_values(Some(&of("title", string("T")))), Ok(Some(ref t)) if t == "T"));
        let null = prost_types::Value { kind: Some(prost_types::value::Kind::NullValue(0)) };
        assert!(matches!(writable_values(Some(&of("title", null))), Ok(Some(ref t)) if t.is_empty()));
        for key in ["messages", "todos", "lead_step"] {
            let refused = writable_values(Some(&of(key, string("x"))));
            assert!(matches!(refused, Err(RunsError::InvalidArgument { ref field, .. }) if field == &format!("values.{key}")), "{key}");
        }
        assert!(writable_values(None).is_err());
        assert!(writable_values(Some(&of("title", string(&"é".repeat(257))))).is_err());
        assert!(writable_values(Some(&of("title", string(&"é".repeat(256))))).is_ok());
    }
}
