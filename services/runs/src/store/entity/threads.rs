//! `threads`: one conversation, owned by one user. Thread ids are scoped to their owner.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "threads")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub thread_id: String,
    pub title: String,
    /// Client metadata as a JSON object.
    pub metadata: String,
    /// The checkpoint the thread's state is at (None: empty state).
    pub head_checkpoint_id: Option<String>,
    pub latest_run_id: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// For a subagent run's thread: its parent run's thread (hidden from ListThreads, deleted with it).
    pub parent_thread_id: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
