//! Setting the thread's title from inside a run (the Title middleware), refused like every other
//! agent write once this worker no longer owns the run.

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};

use super::{AgentContext, Fenced};
use crate::error::RunsError;
use crate::lifecycle::RUNNING;
use crate::store::entity::{runs, threads};
use crate::store::now_ms;

impl AgentContext {
    /// Sets the title of the run's thread (at most 256 characters are kept, the API's limit).
    pub async fn set_thread_title(&self, title: &str) -> Result<(), Fenced> {
        self.check()?;
        let engine = &self.engine;
        let title: String = title.chars().take(256).collect();
        let written = engine
            .store
            .retry_busy(|| async {
                let tx = engine.store.tx().await?;
                let owned = runs::Entity::find_by_id(self.spec.run_id.clone())
                    .filter(runs::Column::OwnerWorkerId.eq(engine.worker_id.as_str()))
                    .filter(runs::Column::Status.eq(RUNNING))
                    .one(&*tx)
                    .await?
                    .is_some();
                if !owned {
                    return Ok(false);
                }
                threads::Entity::update_many()
                    .col_expr(threads::Column::Title, Expr::value(title.clone()))
                    .col_expr(threads::Column::UpdatedAt, Expr::value(now_ms()))
                    .filter(threads::Column::UserId.eq(self.spec.user_id.as_str()))
                    .filter(threads::Column::ThreadId.eq(self.spec.thread_id.as_str()))
                    .exec(&*tx)
                    .await?;
                tx.commit().await?;
                Ok::<_, RunsError>(true)
            })
            .await;
        match written {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.fence()),
            Err(error) => {
                tracing::warn!(run_id = %self.spec.run_id, %error, "thread title not written");
                Err(self.fence())
            }
        }
    }
}
