//! `run_inputs`: the input messages of runs whose request is too large to keep in the `runs` row.
//! Every event append updates that row (its sequence counter), and SQLite rewrites a whole row on
//! update, so a megabyte of input there made every event of the run a megabyte write. The row's
//! `request` then holds the rest of the request with an empty `input` and no `resume`, a combination
//! admission never accepts inline — which is how readers know to look here.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "run_inputs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: String,
    /// A CreateRunRequest holding only `input`, protobuf-encoded.
    pub input: Vec<u8>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
