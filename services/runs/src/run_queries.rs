//! Reading runs for the RunService handlers: one run of a user, and a page of a user's runs. Every
//! query is scoped by the caller's user id, so another user's run looks missing.

use sea_orm::sea_query::Condition;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

use crate::engine::Engine;
use crate::error::RunsError;
use crate::paging;
use crate::status::Status;
use crate::store::entity::runs;

/// `user`'s run `run_id`; with a `thread_id`, only if the run is on that thread. NOT_FOUND otherwise.
pub async fn find(engine: &Engine, user: &str, thread_id: &str, run_id: &str) -> Result<runs::Model, RunsError> {
    runs::Entity::find_by_id(run_id.to_owned())
        .filter(runs::Column::UserId.eq(user))
        .one(engine.store().db())
        .await?
        .filter(|r| thread_id.is_empty() || r.thread_id == thread_id)
        .ok_or_else(|| RunsError::NotFound(format!("run {run_id}")))
}

/// Which of a user's runs ListRuns returns.
#[derive(Debug, Default)]
pub struct ListQuery<'a> {
    /// The children of this run (takes precedence over `thread_id`).
    pub parent_run_id: &'a str,
    /// The runs of this thread (which must be the user's); empty: all of the user's runs.
    pub thread_id: &'a str,
    /// Only runs in one of these statuses; empty: any.
    pub statuses: Vec<Status>,
}

/// One page of `user`'s runs, newest first, and the token of the next page (empty after the last).
pub async fn list(
    engine: &Engine,
    user: &str,
    filter: &ListQuery<'_>,
    size: u64,
    page_token: &str,
) -> Result<(Vec<runs::Model>, String), RunsError> {
    let mut query = runs::Entity::find().filter(runs::Column::UserId.eq(user));
    if !filter.parent_run_id.is_empty() {
        query = query.filter(runs::Column::ParentRunId.eq(filter.parent_run_id));
    } else if !filter.thread_id.is_empty() {
        crate::threads::find(engine, user, filter.thread_id).await?;
        query = query.filter(runs::Column::ThreadId.eq(filter.thread_id));
    }
    let mut query = query.order_by_desc(runs::Column::CreatedAt).order_by_desc(runs::Column::RunId).limit(size);
    if !filter.statuses.is_empty() {
        query = query.filter(runs::Column::Status.is_in(filter.statuses.iter().copied()));
    }
    if let Some((at, id)) = paging::decode(page_token, "page.page_token")? {
        query = query.filter(
            Condition::any()
                .add(runs::Column::CreatedAt.lt(at))
                .add(Condition::all().add(runs::Column::CreatedAt.eq(at)).add(runs::Column::RunId.lt(id))),
        );
    }
    let rows = query.all(engine.store().db()).await?;
    let next = if rows.len() as u64 == size {
        rows.last().map(|r| paging::encode(r.created_at, &r.run_id)).unwrap_or_default()
    } else {
        String::new()
    };
    Ok((rows, next))
}
