//! Subagent runs (DESIGN §5, issue #14 §2): the runs service's side of the lead agent's `task` tool.
//! Each task is a child run, admitted once per (parent run, task id) — the unique index
//! `runs_one_child_per_task` — started through the same `try_start` compare-and-set (in its admission's
//! transaction, `start::start_in`) and executed by the same
//! `worker::execute_with` as any run, in a task of its own under the parent's worker slot (the
//! dispatcher never starts a child, the sweeper never claims one). So a child has its own attempt,
//! lease, checkpoints, events and usage, and:
//!
//! - a parent resumed after a crash calls `task` again, finds its child by the index and waits on it;
//!   a child whose worker died (lease expired) is taken over here (attempt + 1) and resumes from its
//!   own checkpoint, like any run;
//! - a cancel of the parent reaches the child (`cancel::cancel_children`), and a parent that stops
//!   for any reason stops its children (see [`watch_parent`]): interrupted with it, or released for
//!   the parent's next owner to take over when the parent lost or released its lease;
//! - the parent's stream gets START / STEP / END `subagent` events (the first START written with the
//!   child's admission, the rest by the `task` tool from the updates sent here), and the child can be
//!   joined on its own.
//!
//! Deadlock-free by construction: the parent's `task` call only waits on a channel; nothing it holds
//! (a write-slot guard, a transaction, a pooled connection) is held while a child runs, and this
//! driver holds none across an await either — each store access here is one short statement or
//! transaction of its own.

use std::sync::Arc;
use std::time::Duration;

use antler_agent::{SubagentCall, SubagentEnd, SubagentUpdate};
use antler_proto::common::{Message, Role, Usage};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{CancelAction, CreateRunRequest, EventKind, RunConfig, RunError, RunUsage, SubagentStatus, SubagentTask};
use prost::Message as _;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, LocalRun, StopCause};
use crate::error::RunsError;
use crate::lifecycle::admission;
use crate::lifecycle::cancel::{self, CancelCause};
use crate::lifecycle::{Ending, end_by_service, lease, start};
use crate::status::Status;
use crate::store::entity::{checkpoints, runs, tool_effects};
use crate::store::now_ms;
use crate::stream::Subscription;

/// Updates queued for the parent's `task` call before the driver waits (the call reads them as they
/// come; a full queue makes the driver wait, never the child, which keeps running and writing).
const UPDATES: usize = 16;

/// The parent run, as its children need it.
#[derive(Debug, Clone)]
pub struct Parent {
    pub run_id: String,
    pub thread_id: String,
    pub user_id: String,
    /// The parent's attempt: its journal entry for the `task` call records it.
    pub attempt: u32,
    /// The parent's request secret names (the child gets the names; values stay in the vault).
    pub secret_names: Vec<String>,
    /// The parent's `config.context`, passed on to the child.
    pub context: Option<prost_types::Struct>,
    /// The parent's attempt here: when it stops, so do its children.
    pub local: LocalRun,
    /// Fired by the parent's worker once its agent returned: any child still running is interrupted.
    pub done: CancellationToken,
}

/// How long a parent that stopped (cancelled, timed out) waits for its child to end before it writes
/// the task's END without the child's own outcome.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Starts driving `call` for `parent`: returns the channel of updates at once; admission, start and
/// execution happen in the spawned task, whose handle the parent's worker joins before finalizing.
/// The task resolves to how the child ended when its parent's log owes a `subagent` END for it (a
/// START was written), which the parent's host writes unless the `task` call already did.
pub fn spawn(
    engine: Arc<Engine>,
    parent: Parent,
    call: SubagentCall,
) -> (mpsc::Receiver<SubagentUpdate>, tokio::task::JoinHandle<Option<SubagentEnd>>) {
    let (tx, rx) = mpsc::channel(UPDATES);
    let span = tracing::info_span!(parent: None, "subagent", parent_run_id = %parent.run_id, task_id = %call.task_id);
    let handle = tokio::spawn(tracing::Instrument::instrument(drive(engine, parent, call, tx), span));
    (rx, handle)
}

/// See the module documentation.
async fn drive(engine: Arc<Engine>, parent: Parent, call: SubagentCall, tx: mpsc::Sender<SubagentUpdate>) -> Option<SubagentEnd> {
    let started = std::time::Instant::now();
    let (child, found) = match admit(&engine, &parent, &call).await {
        Ok(Some(admitted)) => admitted,
        // The parent's attempt lost its run: closing the channel stops its `task` call.
        Ok(None) => {
            tracing::info!("subagent run not admitted: the parent run is no longer this worker's");
            return None;
        }
        Err(error) => {
            tracing::warn!(%error, "subagent run not admitted");
            let end = SubagentEnd {
                status: SubagentStatus::Failed,
                error: format!("the subagent run could not be admitted: {error}"),
                ..SubagentEnd::default()
            };
            // Not admitted, so no START was written: the `task` call's result is all there is.
            let _ = tx.send(SubagentUpdate::Ended(end)).await;
            return None;
        }
    };
    let child_id = child.run_id.clone();
    tracing::info!(child_run_id = %child_id, found, status = %child.status, "subagent run admitted");
    // Steps already forwarded by an earlier attempt of the parent are not forwarded again.
    let after_seq = if found { child.last_seq.max(0) as u64 } else { 0 };
    let mut follower: Option<tokio::task::JoinHandle<()>> = None;
    let mut first = true;
    // A child admitted here was started in its admission's transaction: execute it at once.
    let mut started_here = (!found && child.status == Status::Running).then(|| child.clone());
    // The row as admission returned it needs no second read.
    let mut known = Some(child);
    loop {
        if parent.local.token.is_cancelled() {
            break;
        }
        let read = match known.take() {
            Some(run) => Ok(Some(run)),
            None => runs::Entity::find_by_id(child_id.clone()).one(engine.store().db()).await,
        };
        let run = match read {
            Ok(Some(run)) => run,
            Ok(None) => {
                let end = SubagentEnd {
                    child_run_id: child_id.clone(),
                    status: SubagentStatus::Failed,
                    error: format!("subagent run {child_id} disappeared"),
                    ..Default::default()
                };
                let _ = tx.send(SubagentUpdate::Ended(end.clone())).await;
                if let Some(follower) = follower {
                    follower.abort();
                }
                return Some(end);
            }
            Err(error) => {
                tracing::warn!(child_run_id = %child_id, %error, "cannot read the subagent run; retrying");
                pause(&parent, Duration::from_millis(200)).await;
                continue;
            }
        };
        if run.status.is_terminal() {
            if let Some(follower) = follower.take() {
                // The follower ends with the child's END event; give it a moment to forward the last steps.
                let _ = tokio::time::timeout(Duration::from_secs(2), follower).await;
            }
            let end = ending(&engine, &run, &call).await;
            tracing::info!(child_run_id = %child_id, status = %run.status, elapsed_ms = started.elapsed().as_millis() as u64, "subagent run ended");
            // Received by a `task` call that is still waiting, it is written there; the parent's host
            // writes it otherwise (the call stopped with its parent in between).
            let _ = tx.send(SubagentUpdate::Ended(end.clone())).await;
            return Some(end);
        }
        let attempt = match started_here.take() {
            Some(run) => Ok(Some((run, false))),
            None => next_attempt(&engine, &run).await,
        };
        match attempt {
            Ok(Some((run, resumed))) => {
                if first || resumed {
                    let update = SubagentUpdate::Started {
                        child_run_id: child_id.clone(),
                        attempt: run.attempt as u32,
                        model_name: run.model_name.clone(),
                        // Admitted here: its admission wrote the parent's START event.
                        announced: first && !found,
                    };
                    // A closed channel means the parent's call stopped; the watcher stops the child.
                    let _ = tx.send(update).await;
                }
                first = false;
                if follower.is_none() {
                    follower = Some(tokio::spawn(forward_steps(engine.clone(), run.clone(), after_seq, tx.clone())));
                }
                let local = LocalRun::new();
                let watcher = tokio::spawn(watch_parent(engine.clone(), parent.clone(), run.clone(), local.clone()));
                Box::pin(crate::worker::execute_with(&engine, run, resumed, local, false)).await;
                watcher.abort();
            }
            // Not ours to run yet (its lease has not expired): look again shortly.
            Ok(None) => pause(&parent, Duration::from_millis(100)).await,
            Err(error) => {
                tracing::warn!(child_run_id = %child_id, %error, "cannot start the subagent run; retrying");
                pause(&parent, Duration::from_millis(200)).await;
            }
        }
    }
    if let Some(follower) = follower {
        follower.abort();
    }
    stopped_with_parent(&engine, &parent, &child_id, &call).await
}

/// How the child of a parent whose attempt stopped while it ran ended: the parent's log owes its END.
/// None when the parent lost or released its lease: its next owner's `task` call follows the child
/// and writes the END. The child is interrupted (again: a cancel is idempotent, and the watcher may
/// not have run while nobody here executed the child) and waited for, at most [`CLOSE_WAIT`].
async fn stopped_with_parent(engine: &Engine, parent: &Parent, child_id: &str, call: &SubagentCall) -> Option<SubagentEnd> {
    if matches!(parent.local.cause(), Some(StopCause::Fenced | StopCause::Release)) {
        return None;
    }
    if let Err(error) = cancel::cancel(engine, &parent.user_id, "", child_id, CancelAction::Interrupt, CancelCause::Requested).await {
        tracing::debug!(child_run_id = %child_id, %error, "subagent run not cancelled with its parent (it may have ended)");
    }
    match tokio::time::timeout(CLOSE_WAIT, cancel::wait_terminal(engine, child_id)).await {
        Ok(Ok(run)) => Some(ending(engine, &run, call).await),
        outcome => {
            let why = match outcome {
                Ok(Err(error)) => error.to_string(),
                _ => format!("it had not ended {} s after its parent stopped", CLOSE_WAIT.as_secs()),
            };
            tracing::warn!(child_run_id = %child_id, %why, "subagent outcome unknown; its END says so");
            Some(SubagentEnd {
                child_run_id: child_id.to_owned(),
                status: SubagentStatus::Cancelled,
                error: format!("the parent run stopped; the outcome of subagent run {child_id} is unknown: {why}"),
                ..SubagentEnd::default()
            })
        }
    }
}

/// Sleeps `period`, or less when the parent stops.
async fn pause(parent: &Parent, period: Duration) {
    tokio::select! {
        () = tokio::time::sleep(period) => {}
        () = parent.local.token.cancelled() => {}
    }
}

/// The child run of `call`: the one an earlier attempt of the parent admitted (true), or a new one,
/// admitted in one transaction with the `task` call's journal intent (the intent is never durable
/// without its child, nor the child without it) and the parent's `subagent` START event, and started
/// in it (RUNNING under this worker). None
/// when the parent is no longer RUNNING under this worker (checked in that transaction, as every
/// journal write is).
async fn admit(engine: &Engine, parent: &Parent, call: &SubagentCall) -> Result<Option<(runs::Model, bool)>, RunsError> {
    let find = || async {
        runs::Entity::find()
            .filter(runs::Column::ParentRunId.eq(parent.run_id.as_str()))
            .filter(runs::Column::ParentTaskId.eq(call.task_id.as_str()))
            .one(engine.store().db())
            .await
    };
    // Only an earlier attempt of the parent can have admitted this task's child; on the first, a
    // duplicate (the same call id twice) is caught by the unique index below, so no read is spent.
    if parent.attempt > 1
        && let Some(existing) = find().await?
    {
        return Ok(Some((existing, true)));
    }
    // Twice the turns (a model call and a tool round each), so the turn limit comes first.
    let recursion_limit = call.max_turns.saturating_mul(2).saturating_add(2).min(engine.config().recursion_limit_max);
    let max_duration = call.timeout.min(Duration::from_secs(engine.config().max_run_duration_secs));
    let request = CreateRunRequest {
        input: vec![Message {
            id: uuid::Uuid::now_v7().to_string(),
            role: Role::User as i32,
            content: vec![antler_proto::common::ContentPart {
                part: Some(antler_proto::common::content_part::Part::Text(antler_proto::common::TextPart { text: call.prompt.clone() })),
            }],
            ..Message::default()
        }],
        config: Some(RunConfig {
            model_name: call.model_name.clone(),
            recursion_limit,
            max_duration: prost_types::Duration::try_from(max_duration).ok(),
            token_budget: call.token_budget,
            clarification_disabled: true,
            context: parent.context.clone(),
            ..RunConfig::default()
        }),
        // Names only: the values stay in this replica's vault (shared with the parent's by admission).
        secrets: parent.secret_names.iter().map(|name| (name.clone(), String::new())).collect(),
        subagent: Some(SubagentTask {
            parent_run_id: parent.run_id.clone(),
            task_id: call.task_id.clone(),
            subagent_type: call.subagent_type.clone(),
            description: call.description.clone(),
            parent_thread_id: parent.thread_id.clone(),
        }),
        ..CreateRunRequest::default()
    };
    let intent = tool_effects::Model {
        run_id: parent.run_id.clone(),
        tool_call_id: call.task_id.clone(),
        tool_name: "task".to_owned(),
        arguments: antler_kit::redact::redact(&call.arguments).into_owned(),
        attempt: parent.attempt as i32,
        intent_at: now_ms(),
        result: None,
        is_error: false,
        result_at: None,
    };
    let order = admission::ChildOrder {
        user_id: &parent.user_id,
        parent_run_id: &parent.run_id,
        parent_thread_id: &parent.thread_id,
        request,
        intent,
    };
    let announce = |run_id: &str, model_name: String| {
        Kind::Subagent(antler_agent::lead::tools::task::start_event(
            &call.task_id,
            &call.subagent_type,
            &call.description,
            run_id,
            model_name,
        ))
    };
    match admission::admit_child(engine, order, announce).await {
        Ok(child) => Ok(child.map(|run| (run, false))),
        // Admitted meanwhile by another attempt of the parent: that one is the child.
        Err(RunsError::Store(e)) if e.is_unique_violation() => match find().await? {
            Some(existing) => Ok(Some((existing, true))),
            None => Err(RunsError::Store(e)),
        },
        Err(error) => Err(error),
    }
}

/// Makes the child runnable here: starts it if PENDING, takes it over (attempt + 1) if its worker's
/// lease expired, ends it if a cancel or too many attempts say so. Returns the run to execute and
/// whether it resumes, or None when it is not ours to run yet.
async fn next_attempt(engine: &Engine, run: &runs::Model) -> Result<Option<(runs::Model, bool)>, RunsError> {
    if run.status == Status::Pending {
        return Ok(start::try_start(engine, &run.run_id).await?.map(|run| (run, false)));
    }
    if run.status != Status::Running && run.status != Status::Finalizing {
        return Ok(None);
    }
    if engine.local_run(&run.run_id).is_some() {
        // Still winding down here (an earlier execution of this driver).
        return Ok(None);
    }
    let expired_before = now_ms() - engine.config().grace().as_millis() as i64;
    if run.lease_expires_at.is_some_and(|at| at >= expired_before) {
        return Ok(None);
    }
    let tx = engine.store().tx().await?;
    let ended = if run.status == Status::Finalizing || run.cancel_action.is_some() || run.attempt >= engine.config().max_attempts as i32 {
        // The sweeper's rules (it closes these children too): nothing to execute.
        let ending = if run.cancel_action.is_some() {
            cancel::ending_of(run)
        } else if run.status == Status::Finalizing {
            Ending {
                status: run.final_status.filter(|s| s.is_terminal()).unwrap_or(Status::Error),
                stop_reason: run.stop_reason.clone().unwrap_or_default(),
                error: lease::stored_error(run),
                rollback: false,
            }
        } else {
            let error = RunError {
                code: "max_attempts_exceeded".to_owned(),
                message: format!(
                    "the subagent run was taken over {} times without finishing (runs.max_attempts = {})",
                    run.attempt,
                    engine.config().max_attempts
                ),
                retryable: false,
                details: None,
            };
            Ending { status: Status::Error, stop_reason: "max_attempts_exceeded".to_owned(), error: Some(error), rollback: false }
        };
        end_by_service(&*tx, run, &[Status::Running, Status::Finalizing], &ending).await?
    } else {
        let claimed = lease::claim(&*tx, engine, run, expired_before).await?;
        tx.commit().await?;
        return Ok(claimed.map(|(model, event)| {
            engine.hub().publish(&[event]);
            (model, true)
        }));
    };
    tx.commit().await?;
    if let Some(end) = ended {
        engine.hub().publish(&[end]);
    }
    Ok(None)
}

/// Stops `child` when its parent's attempt stops: interrupted (durably, like CancelRun) when the
/// parent was cancelled, timed out or finished; released for the parent's next owner to take over
/// when the parent lost or released its lease.
async fn watch_parent(engine: Arc<Engine>, parent: Parent, child: runs::Model, local: LocalRun) {
    tokio::select! {
        () = parent.local.token.cancelled() => {}
        () = parent.done.cancelled() => {}
        () = local.token.cancelled() => return,
    }
    match parent.local.cause() {
        Some(StopCause::Fenced | StopCause::Release) => {
            local.stop(StopCause::Release);
            if let Err(error) = lease::release(&engine, &child.run_id).await {
                tracing::warn!(child_run_id = %child.run_id, %error, "subagent lease not released; it expires on its own");
            }
        }
        _ => {
            let cause = CancelCause::Requested;
            if let Err(error) = cancel::cancel(&engine, &parent.user_id, "", &child.run_id, CancelAction::Interrupt, cause).await {
                tracing::debug!(child_run_id = %child.run_id, %error, "subagent run not cancelled with its parent");
                local.stop(StopCause::Cancel);
            }
        }
    }
}

/// Forwards the child's assistant messages to the parent's `task` call as they become durable
/// (replay after `after_seq`, then live, as any subscriber), until the child's END event.
async fn forward_steps(engine: Arc<Engine>, child: runs::Model, after_seq: u64, tx: mpsc::Sender<SubagentUpdate>) {
    let (out, mut events) = mpsc::channel(64);
    let subscription = Subscription {
        run_id: child.run_id.clone(),
        thread_id: child.thread_id.clone(),
        after_seq,
        kinds: vec![EventKind::Message as i32],
        // No client reads this stream: heartbeats only cost a wake-up.
        heartbeat: Duration::from_secs(3600),
    };
    let follow = tokio::spawn(crate::stream::follow(engine.store().clone(), engine.hub().clone(), subscription, out));
    while let Some(Ok(event)) = events.recv().await {
        match event.kind {
            Some(Kind::Message(m)) => {
                let Some(message) = m.message.filter(|m| m.role == Role::Assistant as i32) else { continue };
                if tx.send(SubagentUpdate::Step { message }).await.is_err() {
                    break;
                }
            }
            Some(Kind::End(_)) => break,
            _ => {}
        }
    }
    follow.abort();
}

/// How the child ended, for the parent: its status, final answer and usage.
async fn ending(engine: &Engine, run: &runs::Model, call: &SubagentCall) -> SubagentEnd {
    let usage = RunUsage::decode(run.usage.as_slice()).unwrap_or_default();
    let result = final_answer(engine, &run.run_id).await.unwrap_or_else(|error| {
        tracing::warn!(child_run_id = %run.run_id, %error, "subagent answer not readable");
        String::new()
    });
    let stop_reason = run.stop_reason.clone().unwrap_or_default();
    let error_text = run.error_message.clone().filter(|m| !m.is_empty()).or_else(|| run.error_code.clone()).unwrap_or_default();
    let (status, error) = match run.status {
        Status::Success if stop_reason == "turn_capped" && result.is_empty() => {
            (SubagentStatus::Failed, format!("the subagent reached its limit of {} turns without an answer", call.max_turns))
        }
        Status::Success => (SubagentStatus::Completed, String::new()),
        Status::Timeout => (SubagentStatus::TimedOut, format!("Execution timed out after {} seconds", call.timeout.as_secs())),
        Status::Interrupted if stop_reason == "cancelled" => (SubagentStatus::Cancelled, "Cancelled by user".to_owned()),
        Status::Interrupted => (SubagentStatus::Cancelled, format!("Cancelled ({stop_reason})")),
        _ => (SubagentStatus::Failed, error_text),
    };
    SubagentEnd {
        child_run_id: run.run_id.clone(),
        status,
        result,
        error,
        stop_reason: if status == SubagentStatus::Completed { stop_reason } else { String::new() },
        usage: Usage {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens,
            cache_read_tokens: usage.cache_read_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            ..Usage::default()
        },
        model_name: usage.by_model.keys().next().cloned().unwrap_or_else(|| run.model_name.clone()),
    }
}

/// The text of the child's last assistant message that has any, from its latest checkpoint.
async fn final_answer(engine: &Engine, run_id: &str) -> Result<String, RunsError> {
    let row = checkpoints::Entity::find()
        .filter(checkpoints::Column::RunId.eq(run_id))
        .order_by_desc(checkpoints::Column::CreatedAt)
        .order_by_desc(checkpoints::Column::CheckpointId)
        .one(engine.store().db())
        .await?;
    let Some(row) = row else { return Ok(String::new()) };
    let (checkpoint, _) = crate::checkpoints::read(engine.store().db(), &row, true).await?;
    Ok(checkpoint
        .messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::Assistant as i32)
        .map(antler_agent::lead::tools::task::message_text)
        .find(|text| !text.trim().is_empty())
        .unwrap_or_default())
}
