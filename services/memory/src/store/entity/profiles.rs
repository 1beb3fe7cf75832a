//! `memory_profiles`: a user's summary sections (DeerMem v2: work context, personal context, top of
//! mind; recent months, earlier context, long-term background), each with its update time. One row per
//! user, shared by the user's agents as the proto and DeerMem have it.

use sea_orm::entity::prelude::*;

/// `Deserialize` reads a row from the JSON array of its columns in this order (see
/// [`crate::render_cache::Snapshot::load`]).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Deserialize)]
#[sea_orm(table_name = "memory_profiles")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub user_id: String,
    pub work_context: String,
    pub work_context_at: Option<i64>,
    pub personal_context: String,
    pub personal_context_at: Option<i64>,
    pub top_of_mind: String,
    pub top_of_mind_at: Option<i64>,
    pub recent_months: String,
    pub recent_months_at: Option<i64>,
    pub earlier_context: String,
    pub earlier_context_at: Option<i64>,
    pub long_term_background: String,
    pub long_term_background_at: Option<i64>,
    /// Increases on every change of a section.
    pub revision: i64,
    pub updated_at: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
