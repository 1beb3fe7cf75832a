//! `memory_facts`: one version of one fact. Rows are never rewritten: a new version is a new row, and
//! the old one only gets `invalidated_at` / `invalidation_reason` / `superseded_by` set once (and its
//! confirmation counter bumped while live). The full-text index (`memory_facts_fts` on SQLite, the
//! generated `tsv` column on PostgreSQL) covers live rows only.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "memory_facts")]
pub struct Model {
    /// Numeric key: the full-text index's row id on SQLite.
    #[sea_orm(primary_key)]
    pub doc: i64,
    pub fact_id: String,
    pub user_id: String,
    pub agent_name: String,
    /// A token naming (user, agent) in the SQLite full-text index, so a search reads one scope's postings.
    pub scope_key: String,
    pub content: String,
    /// Content lower-cased with whitespace collapsed: the exact-duplicate key.
    pub norm: String,
    pub category: String,
    pub category_label: String,
    pub confidence: f64,
    pub source_kind: String,
    pub source_thread_id: String,
    pub source_run_id: String,
    pub source_message_id: String,
    pub source_error: String,
    /// cl100k tokens of the fact's rendered injection line.
    pub line_tokens: i32,
    pub created_at: i64,
    pub valid_from: i64,
    pub invalidated_at: Option<i64>,
    pub invalidation_reason: String,
    pub superseded_by: String,
    pub supersedes: String,
    pub confirmation_count: i32,
    pub last_confirmed_at: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
