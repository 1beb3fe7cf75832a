//! A user's feedback on a run: one row per (run, user), rewritten by a second submission.

use sea_orm::{ActiveModelTrait, EntityTrait};

use crate::engine::Engine;
use crate::error::RunsError;
use crate::store::entity::{feedback, runs};
use crate::store::now_ms;

/// What a user says about a run.
#[derive(Debug)]
pub struct Rating<'a> {
    pub message_id: &'a str,
    /// 1 (good) or -1 (bad), checked by the handler.
    pub rating: i32,
    pub comment: &'a str,
}

/// Records `user`'s feedback on `run`, replacing an earlier one (which keeps its id and creation
/// time). Returns the stored row and whether it is new.
pub async fn submit(engine: &Engine, user: &str, run: &runs::Model, rating: &Rating<'_>) -> Result<(feedback::Model, bool), RunsError> {
    let now = now_ms();
    let tx = engine.store().tx().await?;
    let existing = feedback::Entity::find_by_id((run.run_id.clone(), user.to_owned())).one(&*tx).await?;
    let created = existing.is_none();
    let model = feedback::Model {
        run_id: run.run_id.clone(),
        user_id: user.to_owned(),
        feedback_id: existing.as_ref().map(|f| f.feedback_id.clone()).unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
        thread_id: run.thread_id.clone(),
        message_id: rating.message_id.to_owned(),
        rating: rating.rating,
        comment: rating.comment.to_owned(),
        created_at: existing.as_ref().map(|f| f.created_at).unwrap_or(now),
        updated_at: now,
    };
    let active = feedback::ActiveModel::from(model.clone());
    if created {
        feedback::Entity::insert(active).exec_without_returning(&*tx).await?;
    } else {
        feedback::Entity::update(active.reset_all()).exec(&*tx).await?;
    }
    tx.commit().await?;
    Ok((model, created))
}

/// Removes `user`'s feedback on `run_id`; whether there was one.
pub async fn delete(engine: &Engine, user: &str, run_id: &str) -> Result<bool, RunsError> {
    let tx = engine.store().tx().await?;
    let removed = feedback::Entity::delete_by_id((run_id.to_owned(), user.to_owned())).exec(&*tx).await?;
    tx.commit().await?;
    Ok(removed.rows_affected > 0)
}
