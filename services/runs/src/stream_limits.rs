//! Open event streams per replica: `runs.max_streams` in all and `runs.max_streams_per_user` per
//! user. A stream holds no request permit once its response head is out (the server's concurrency
//! limit bounds requests in flight, not streams), so without these an idle client could hold
//! thousands of subscriptions open. Calls of the services themselves (in-process, service principals:
//! `antler_kit::limit::is_internal_call`) are not counted: the services' own streams are bounded by
//! the runs they belong to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::RunsError;

#[derive(Debug, Default)]
struct Open {
    total: u64,
    by_user: HashMap<String, u64>,
}

#[derive(Debug, Clone)]
pub struct StreamLimits {
    open: Arc<Mutex<Open>>,
    max: u64,
    per_user: u64,
}

/// One open stream, counted until dropped.
#[derive(Debug)]
pub struct StreamPermit {
    open: Arc<Mutex<Open>>,
    user_id: String,
}

impl StreamLimits {
    pub fn new(max: u64, per_user: u64) -> Self {
        Self { open: Default::default(), max, per_user }
    }

    /// Counts one more stream of `user_id`, or RESOURCE_EXHAUSTED naming the limit it would pass.
    pub fn acquire(&self, user_id: &str) -> Result<StreamPermit, RunsError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.total >= self.max {
            metrics::counter!("antler_runs_streams_refused_total", "limit" => "replica").increment(1);
            return Err(RunsError::ResourceExhausted(format!(
                "this server already has {} event streams open; the limit is {} (runs.max_streams)\nhint: close streams you no longer read, or retry after the retry-after delay",
                open.total, self.max
            )));
        }
        let mine = open.by_user.get(user_id).copied().unwrap_or(0);
        if mine >= self.per_user {
            metrics::counter!("antler_runs_streams_refused_total", "limit" => "user").increment(1);
            return Err(RunsError::ResourceExhausted(format!(
                "you already have {mine} event streams open on this server; the limit is {} per user (runs.max_streams_per_user)\nhint: close streams you no longer read (one JoinRun per run is enough), or poll with ListRunEvents",
                self.per_user
            )));
        }
        open.total += 1;
        *open.by_user.entry(user_id.to_owned()).or_default() += 1;
        Ok(StreamPermit { open: self.open.clone(), user_id: user_id.to_owned() })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_user.get_mut(&self.user_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_user.remove(&self.user_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_counted_per_user_and_in_all_until_dropped() {
        let limits = StreamLimits::new(3, 2);
        let a1 = limits.acquire("a");
        let a2 = limits.acquire("a");
        assert!(a1.is_ok() && a2.is_ok());
        let refused = limits.acquire("a").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("runs.max_streams_per_user") && refused.contains("limit is 2"), "{refused}");
        let b1 = limits.acquire("b");
        assert!(b1.is_ok());
        let refused = limits.acquire("c").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("(runs.max_streams)") && refused.contains("limit is 3"), "{refused}");
        drop(a1);
        assert!(limits.acquire("a").is_ok(), "a closed stream frees its room");
    }
}
