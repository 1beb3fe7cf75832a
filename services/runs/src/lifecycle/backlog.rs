//! How many runs wait PENDING, for `runs.max_pending_runs`, without counting them on every admission.
//!
//! Counting the PENDING rows is a scan of as many index entries as there are waiting runs: with
//! 10,000 of them it cost more than the admission itself. The count is taken at most every
//! [`REFRESH`], and the runs this replica admitted since are added to it, so the estimate errs high
//! (a run that started meanwhile is still counted) and the limit is never exceeded by more than what
//! other replicas admit within one refresh.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, PaginatorTrait, QueryFilter};

use crate::error::RunsError;
use crate::status::Status;
use crate::store::entity::runs;

/// How old the count may get before it is taken again.
pub const REFRESH: Duration = Duration::from_millis(250);

#[derive(Debug, Default)]
pub struct Backlog {
    state: Mutex<Option<(u64, Instant)>>,
}

impl Backlog {
    /// The PENDING runs to assume before admitting more (counting inside `db` when the last count is
    /// older than [`REFRESH`]).
    pub async fn pending(&self, db: &impl ConnectionTrait) -> Result<u64, RunsError> {
        let cached = *self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((count, at)) = cached
            && at.elapsed() < REFRESH
        {
            return Ok(count);
        }
        let count = runs::Entity::find().filter(runs::Column::Status.eq(Status::Pending)).count(db).await?;
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = Some((count, Instant::now()));
        Ok(count)
    }

    /// Records `n` runs this replica just admitted.
    pub fn admitted(&self, n: u64) {
        if let Some((count, _)) = self.state.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            *count += n;
        }
    }
}
