//! The side-effect journal of [`RunHost`]: intent before a side-effecting tool call, result after,
//! keyed by (run, tool call id). Like every other write of the agent, both are refused once this
//! worker no longer owns the run.

use sea_orm::sea_query::Expr;
use std::sync::Arc;

use futures::future::BoxFuture;
use sea_orm::{ColumnTrait, DatabaseTransaction, EntityTrait, QueryFilter};

use antler_agent::{Effect, Fenced};

use super::RunHost;
use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::{runs, tool_effects};
use crate::store::{Priority, now_ms};

impl RunHost {
    /// What the journal holds for `tool_call_id` of this run.
    pub(super) async fn journal_effect(&self, tool_call_id: &str) -> Result<Effect, Fenced> {
        self.check()?;
        let row = tool_effects::Entity::find_by_id((self.spec.run_id.clone(), tool_call_id.to_owned())).one(self.engine.store().db()).await;
        match row {
            Ok(None) => Ok(Effect::None),
            Ok(Some(row)) => Ok(match row.result {
                Some(result) => Effect::Done { result, is_error: row.is_error },
                None => Effect::Unknown,
            }),
            Err(error) => {
                tracing::warn!(run_id = %self.spec.run_id, tool_call_id, %error, "journal not readable");
                Err(self.fence())
            }
        }
    }

    /// Records that `tool_call_id` is about to run (durable before the call starts).
    pub(super) async fn journal_intent(&self, tool_call_id: &str, tool_name: &str, arguments: &str) -> Result<(), Fenced> {
        self.check()?;
        let row = tool_effects::Model {
            run_id: self.spec.run_id.clone(),
            tool_call_id: tool_call_id.to_owned(),
            tool_name: tool_name.to_owned(),
            arguments: antler_kit::redact::redact(arguments).into_owned(),
            attempt: self.spec.attempt as i32,
            intent_at: 0,
            result: None,
            is_error: false,
            result_at: None,
        };
        let written = self
            .journal_write(move |tx, now| {
                let row = tool_effects::Model { intent_at: now, ..row.clone() };
                Box::pin(async move {
                    tool_effects::Entity::insert(tool_effects::ActiveModel::from(row))
                        // An intent written by an earlier attempt stays as it was.
                        .on_conflict_do_nothing_on([tool_effects::Column::RunId, tool_effects::Column::ToolCallId])
                        .exec_without_returning(tx)
                        .await?;
                    Ok(())
                })
            })
            .await;
        self.journal_outcome(tool_call_id, written)
    }

    /// Records the result of `tool_call_id`.
    pub(super) async fn journal_result(&self, tool_call_id: &str, result: &str, is_error: bool) -> Result<(), Fenced> {
        self.check()?;
        let result = antler_kit::redact::redact(result).into_owned();
        let (run_id, call) = (self.spec.run_id.clone(), tool_call_id.to_owned());
        let written = self
            .journal_write(move |tx, now| {
                let update = tool_effects::Entity::update_many()
                    .col_expr(tool_effects::Column::Result, Expr::value(result.clone()))
                    .col_expr(tool_effects::Column::IsError, Expr::value(is_error))
                    .col_expr(tool_effects::Column::ResultAt, Expr::value(now))
                    .filter(tool_effects::Column::RunId.eq(run_id.as_str()))
                    .filter(tool_effects::Column::ToolCallId.eq(call.as_str()));
                Box::pin(async move {
                    update.exec(tx).await?;
                    Ok(())
                })
            })
            .await;
        self.journal_outcome(tool_call_id, written)
    }

    /// One journal write, in a transaction that first checks that this worker still owns the run:
    /// Ok(false) when it does not (nothing written).
    async fn journal_write<F>(&self, write: F) -> Result<bool, RunsError>
    where
        F: for<'t> Fn(&'t DatabaseTransaction, i64) -> BoxFuture<'t, Result<(), RunsError>> + Send + Sync + 'static,
    {
        let (run_id, worker) = (self.spec.run_id.clone(), self.engine.worker_id().to_owned());
        let write = Arc::new(write);
        self.engine
            .store()
            .write(Priority::Lifecycle, move |tx| {
                let owned = owned(tx, run_id.clone(), worker.clone());
                let write = write.clone();
                Box::pin(async move {
                    if !owned.await? {
                        return Ok(false);
                    }
                    write(tx, now_ms()).await?;
                    Ok(true)
                })
            })
            .await
    }

    fn journal_outcome(&self, tool_call_id: &str, written: Result<bool, RunsError>) -> Result<(), Fenced> {
        match written {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.fence()),
            Err(error) => {
                tracing::warn!(run_id = %self.spec.run_id, tool_call_id, %error, "journal not written");
                Err(self.fence())
            }
        }
    }
}

/// Is the run still RUNNING under `worker`? (Checked inside the writing transaction.)
async fn owned(tx: &DatabaseTransaction, run_id: String, worker: String) -> Result<bool, RunsError> {
    let row = runs::Entity::find_by_id(run_id)
        .filter(runs::Column::OwnerWorkerId.eq(worker))
        .filter(runs::Column::Status.eq(Status::Running))
        .one(tx)
        .await?;
    Ok(row.is_some())
}
