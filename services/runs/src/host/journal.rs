//! The side-effect journal of [`RunHost`]: intent before a side-effecting tool call, result after,
//! keyed by (run, tool call id). Like every other write of the agent, both are refused once this
//! worker no longer owns the run.

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use antler_agent::{Effect, Fenced};

use super::RunHost;
use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::{runs, tool_effects};
use crate::store::now_ms;

impl RunHost {
    /// What the journal holds for `tool_call_id` of this run.
    pub(super) async fn journal_effect(&self, tool_call_id: &str) -> Result<Effect, Fenced> {
        self.check()?;
        let row = tool_effects::Entity::find_by_id((self.spec.run_id.clone(), tool_call_id.to_owned())).one(self.engine.store.db()).await;
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
        self.journal_write(tool_call_id, |now| {
            tool_effects::Entity::insert(tool_effects::ActiveModel::from(tool_effects::Model {
                run_id: self.spec.run_id.clone(),
                tool_call_id: tool_call_id.to_owned(),
                tool_name: tool_name.to_owned(),
                arguments: antler_kit::redact::redact(arguments).into_owned(),
                attempt: self.spec.attempt as i32,
                intent_at: now,
                result: None,
                is_error: false,
                result_at: None,
            }))
            // An intent written by an earlier attempt stays as it was.
            .on_conflict_do_nothing_on([tool_effects::Column::RunId, tool_effects::Column::ToolCallId])
        })
        .await
    }

    /// Records the result of `tool_call_id`.
    pub(super) async fn journal_result(&self, tool_call_id: &str, result: &str, is_error: bool) -> Result<(), Fenced> {
        let engine = &self.engine;
        self.check()?;
        let result = antler_kit::redact::redact(result);
        let written = engine
            .store
            .retry_busy(|| async {
                let tx = engine.store.tx().await?;
                if !self.owned(&tx).await? {
                    return Ok(false);
                }
                tool_effects::Entity::update_many()
                    .col_expr(tool_effects::Column::Result, Expr::value(result.clone().into_owned()))
                    .col_expr(tool_effects::Column::IsError, Expr::value(is_error))
                    .col_expr(tool_effects::Column::ResultAt, Expr::value(now_ms()))
                    .filter(tool_effects::Column::RunId.eq(self.spec.run_id.as_str()))
                    .filter(tool_effects::Column::ToolCallId.eq(tool_call_id))
                    .exec(&*tx)
                    .await?;
                tx.commit().await?;
                Ok::<_, RunsError>(true)
            })
            .await;
        self.journal_outcome(tool_call_id, written)
    }

    async fn journal_write<F>(&self, tool_call_id: &str, insert: F) -> Result<(), Fenced>
    where
        F: Fn(i64) -> sea_orm::TryInsert<tool_effects::ActiveModel>,
    {
        let engine = &self.engine;
        self.check()?;
        let written = engine
            .store
            .retry_busy(|| async {
                let tx = engine.store.tx().await?;
                if !self.owned(&tx).await? {
                    return Ok(false);
                }
                insert(now_ms()).exec_without_returning(&*tx).await?;
                tx.commit().await?;
                Ok::<_, RunsError>(true)
            })
            .await;
        self.journal_outcome(tool_call_id, written)
    }

    /// Is the run still RUNNING under this worker? (Checked inside the writing transaction.)
    async fn owned(&self, tx: &crate::store::WriteTx) -> Result<bool, RunsError> {
        let row = runs::Entity::find_by_id(self.spec.run_id.clone())
            .filter(runs::Column::OwnerWorkerId.eq(self.engine.worker_id.as_str()))
            .filter(runs::Column::Status.eq(Status::Running))
            .one(&**tx)
            .await?;
        Ok(row.is_some())
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
