//! A subagent's child run: admitted once per (parent run, task id) — the unique index
//! `runs_one_child_per_task` — in one transaction with the parent's journal intent for its `task`
//! call and the parent's `subagent` START event, and started in it through the same compare-and-set
//! as every start (`start::start_in`).

use antler_proto::runs::CreateRunRequest;
use antler_proto::runs::run_event::Kind;
use sea_orm::EntityTrait;

use super::fingerprint;
use super::rows::{new_run, new_thread_row};
use crate::engine::Engine;
use crate::error::RunsError;
use crate::lifecycle::start;
use crate::store::entity::{run_inputs, runs, threads, tool_effects};
use crate::store::now_ms;
use crate::stream::{Writer, append_many, insert_rows};

/// What a parent's `task` call asks admission for.
#[derive(Debug)]
pub struct ChildOrder<'a> {
    pub user_id: &'a str,
    pub parent_run_id: &'a str,
    pub parent_thread_id: &'a str,
    /// The child's request; its `thread_id` is set here (a new thread, a child of the parent's).
    pub request: CreateRunRequest,
    /// The parent's journal intent for the `task` call (kept as it is when an earlier attempt of the
    /// parent wrote it).
    pub intent: tool_effects::Model,
}

/// Admits and starts the child run of `order`; `announce` makes the parent's START event from the
/// child's run id and model name. Returns the child (RUNNING under this worker, or PENDING if the
/// start lost), or None when the parent is no longer RUNNING under this worker (checked in the
/// transaction, as every journal write is). A unique violation (the child of this task was admitted
/// meanwhile) is returned as the error, for the caller to find that child.
pub async fn admit_child(
    engine: &Engine,
    order: ChildOrder<'_>,
    announce: impl FnOnce(&str, String) -> Kind,
) -> Result<Option<runs::Model>, RunsError> {
    let ChildOrder { user_id, parent_run_id, parent_thread_id, mut request, intent } = order;
    let now = now_ms();
    let run_id = uuid::Uuid::now_v7().to_string();
    let mut thread = new_thread_row(user_id, &run_id, now);
    thread.parent_thread_id = Some(parent_thread_id.to_owned());
    request.thread_id = thread.thread_id.clone();
    let fingerprint = fingerprint(&request);
    let strategy = antler_proto::runs::MultitaskStrategy::Reject;
    let planned = new_run(engine, user_id, &request, &fingerprint, run_id.clone(), &thread.thread_id, None, false, strategy, now);
    let start = announce(&run_id, planned.run.model_name.clone());
    let written = engine
        .store()
        .retry_busy(|| async {
            let tx = engine.store().tx().await?;
            // The parent's START event, first: its UPDATE checks that the parent is still this
            // worker's (as every journal write does), and written here it is durable with the child
            // (one commit sooner than the `task` call could write it).
            let Some(announced) =
                append_many(&*tx, parent_run_id, parent_thread_id, Writer::Owner(engine.worker_id()), vec![start.clone()]).await?
            else {
                return Ok(None);
            };
            // An intent an earlier attempt of the parent wrote stays as it was.
            tool_effects::Entity::insert(tool_effects::ActiveModel::from(intent.clone()))
                .on_conflict_do_nothing_on([tool_effects::Column::RunId, tool_effects::Column::ToolCallId])
                .exec_without_returning(&*tx)
                .await?;
            threads::Entity::insert(threads::ActiveModel::from(thread.clone())).exec_without_returning(&*tx).await?;
            runs::Entity::insert(runs::ActiveModel::from(planned.run.clone())).exec_without_returning(&*tx).await?;
            if let Some(input) = &planned.input {
                run_inputs::Entity::insert(run_inputs::ActiveModel::from(input.clone())).exec_without_returning(&*tx).await?;
            }
            insert_rows(&*tx, std::slice::from_ref(&planned.first), now).await?;
            // Started in the same transaction, through the same compare-and-set as every start: the
            // child is under way one commit sooner (the subagent driver executes a RUNNING child it
            // admitted).
            let started = start::start_in(&*tx, &start::Claimant::of(engine), std::slice::from_ref(&run_id)).await?.pop();
            tx.commit().await?;
            Ok::<_, RunsError>(Some((started, announced)))
        })
        .await?;
    let Some((started, announced)) = written else { return Ok(None) };
    engine.secrets().share(parent_run_id, &run_id);
    engine.hub().publish(&announced);
    engine.hub().publish(std::slice::from_ref(&planned.first));
    metrics::counter!("antler_runs_admitted_total", "strategy" => "SUBAGENT").increment(1);
    start::count_started(usize::from(started.is_some()));
    Ok(Some(started.unwrap_or(planned.run)))
}
