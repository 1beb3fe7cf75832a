//! The fencing token of a run's calls: the runs service's agents send the run id and the attempt
//! number as gRPC metadata (`x-antler-run-id`, `x-antler-run-attempt`). The service remembers the
//! highest attempt seen per (user, run); a call from a lower attempt — a worker whose run was taken
//! over, still running because it was paused, partitioned or slow to notice — is refused with
//! FAILED_PRECONDITION, and the first call of a higher attempt kills every command the lower ones
//! still have running, at once instead of at the old lease's deadline.
//!
//! The memory is this process's: a run's calls reach the sandbox service that holds its thread's
//! workspace. Entries not used for `sandbox.fence_retention_secs` are forgotten (a run's attempts
//! are minutes apart, not days), and past `sandbox.fence_max_runs` entries the least recently used
//! tenth goes at once: at a thousand runs a second a day's retention alone would keep 86 million.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tonic::metadata::MetadataMap;

use crate::error::{Result, SandboxError};

/// gRPC metadata naming the run a call is made for (what the kit's clients send).
pub const RUN_ID_HEADER: &str = antler_kit::client::RUN_ID_HEADER;
/// gRPC metadata naming the attempt of that run (1 for the first, +1 per takeover).
pub const ATTEMPT_HEADER: &str = antler_kit::client::ATTEMPT_HEADER;
/// Longest run id accepted in [`RUN_ID_HEADER`].
const MAX_RUN_ID: usize = 128;

/// One call's fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub run_id: String,
    pub attempt: u32,
}

impl Fence {
    /// The token of a request's metadata: None when it carries neither header (a call not made for a
    /// run: a client, the runs service's own checks); INVALID_ARGUMENT when only one is present or a
    /// value is malformed.
    pub fn from_metadata(metadata: &MetadataMap) -> Result<Option<Self>> {
        let text = |name: &str| -> Result<Option<String>> {
            match metadata.get(name) {
                None => Ok(None),
                Some(value) => {
                    value.to_str().map(|v| Some(v.trim().to_owned())).map_err(|_| SandboxError::invalid(name, "is not printable ASCII"))
                }
            }
        };
        match (text(RUN_ID_HEADER)?, text(ATTEMPT_HEADER)?) {
            (None, None) => Ok(None),
            (Some(run_id), Some(attempt)) => {
                if run_id.is_empty() || run_id.len() > MAX_RUN_ID {
                    return Err(SandboxError::invalid(RUN_ID_HEADER, format!("must be 1 to {MAX_RUN_ID} characters")));
                }
                let attempt =
                    attempt.parse::<u32>().ok().filter(|a| *a >= 1).ok_or_else(|| {
                        SandboxError::invalid(ATTEMPT_HEADER, format!("`{attempt}` is not an attempt number (1 or more)"))
                    })?;
                Ok(Some(Self { run_id, attempt }))
            }
            (Some(_), None) => Err(SandboxError::invalid(ATTEMPT_HEADER, format!("is required with {RUN_ID_HEADER}"))),
            (None, Some(_)) => Err(SandboxError::invalid(RUN_ID_HEADER, format!("is required with {ATTEMPT_HEADER}"))),
        }
    }
}

/// What [`Fences::admit`] decided for a call that may go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// The call's attempt is the highest seen (or the first seen) for its run.
    Current,
    /// The call's attempt is higher than `previous`: commands of lower attempts must die now.
    Advanced { previous: u32 },
}

#[derive(Debug)]
struct Entry {
    attempt: u32,
    seen: Instant,
}

/// The highest attempt seen per (user, run).
#[derive(Debug)]
pub struct Fences {
    entries: Mutex<HashMap<(String, String), Entry>>,
    retention: Duration,
    max_runs: usize,
}

impl Fences {
    /// Remembers runs for `retention` after their last call, and at most `max_runs` of them.
    pub fn new(retention: Duration, max_runs: usize) -> Self {
        Self { entries: Mutex::new(HashMap::new()), retention, max_runs: max_runs.max(1) }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `fence` for `user_id` and says whether the call may go ahead: FAILED_PRECONDITION
    /// naming both attempts when a higher one has been seen.
    pub fn admit(&self, user_id: &str, fence: &Fence) -> Result<Admitted> {
        let mut entries = self.entries();
        let now = Instant::now();
        let key = (user_id.to_owned(), fence.run_id.clone());
        if entries.len() >= self.max_runs && !entries.contains_key(&key) {
            forget_least_recent(&mut entries, self.max_runs);
        }
        let entry = entries.entry(key).or_insert(Entry { attempt: fence.attempt, seen: now });
        entry.seen = now;
        if fence.attempt < entry.attempt {
            metrics::counter!("antler_sandbox_fenced_calls_total").increment(1);
            return Err(refusal(fence, entry.attempt));
        }
        if fence.attempt > entry.attempt {
            let previous = entry.attempt;
            entry.attempt = fence.attempt;
            return Ok(Admitted::Advanced { previous });
        }
        Ok(Admitted::Current)
    }

    /// The refusal for `fence` if a higher attempt of its run has been seen since it was admitted.
    pub fn check(&self, user_id: &str, fence: &Fence) -> Result<()> {
        match self.entries().get(&(user_id.to_owned(), fence.run_id.clone())) {
            Some(entry) if entry.attempt > fence.attempt => {
                metrics::counter!("antler_sandbox_fenced_calls_total").increment(1);
                Err(refusal(fence, entry.attempt))
            }
            _ => Ok(()),
        }
    }

    /// Forgets runs not seen for the retention period; returns how many.
    pub fn forget_stale(&self) -> usize {
        let mut entries = self.entries();
        let before = entries.len();
        let retention = self.retention;
        entries.retain(|_, entry| entry.seen.elapsed() < retention);
        before - entries.len()
    }

    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Forgets the least recently seen entries until a tenth of `max_runs` is free: one pass over the
/// map per tenth of the bound, not one per new run. A run forgotten this way has not called for
/// longer than every remembered one; a late call of its old attempt would be taken as its first.
fn forget_least_recent(entries: &mut HashMap<(String, String), Entry>, max_runs: usize) {
    let keep = max_runs - max_runs.div_ceil(10);
    let excess = entries.len().saturating_sub(keep);
    if excess == 0 {
        return;
    }
    let mut seen: Vec<Instant> = entries.values().map(|e| e.seen).collect();
    let (_, cutoff, _) = seen.select_nth_unstable(excess - 1);
    let cutoff = *cutoff;
    let before = entries.len();
    // Entries seen at the cutoff instant itself may all go: the bound is kept, give or take ties.
    entries.retain(|_, entry| entry.seen > cutoff);
    let forgotten = before - entries.len();
    metrics::counter!("antler_sandbox_fences_forgotten_total").increment(forgotten as u64);
    tracing::warn!(
        forgotten,
        max_runs,
        "sandbox.fence_max_runs reached: the least recently used runs' fencing tokens were forgotten before sandbox.fence_retention_secs"
    );
}

fn refusal(fence: &Fence, current: u32) -> SandboxError {
    SandboxError::FailedPrecondition(format!(
        "run {} attempt {} is fenced: attempt {current} of the run has taken over ({ATTEMPT_HEADER} {} < {current})\nhint: this worker lost the run; stop working on it",
        fence.run_id, fence.attempt, fence.attempt
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(run_id: &str, attempt: u32) -> Fence {
        Fence { run_id: run_id.to_owned(), attempt }
    }

    #[test]
    fn a_lower_attempt_is_refused_once_a_higher_one_was_seen() {
        let fences = Fences::new(Duration::from_secs(60), 100);
        assert_eq!(fences.admit("u", &fence("r", 1)).ok(), Some(Admitted::Current));
        assert_eq!(fences.admit("u", &fence("r", 1)).ok(), Some(Admitted::Current));
        assert!(fences.check("u", &fence("r", 1)).is_ok());
        assert_eq!(fences.admit("u", &fence("r", 3)).ok(), Some(Admitted::Advanced { previous: 1 }));
        let refused = fences.admit("u", &fence("r", 2)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("run r attempt 2 is fenced: attempt 3"), "{refused}");
        assert!(fences.check("u", &fence("r", 1)).is_err());
        // Per user and per run.
        assert_eq!(fences.admit("v", &fence("r", 1)).ok(), Some(Admitted::Current));
        assert_eq!(fences.admit("u", &fence("s", 1)).ok(), Some(Admitted::Current));
    }

    #[test]
    fn stale_runs_are_forgotten() {
        let fences = Fences::new(Duration::ZERO, 100);
        fences.admit("u", &fence("r", 2)).ok();
        assert_eq!(fences.forget_stale(), 1);
        assert!(fences.is_empty());
    }

    #[test]
    fn past_the_bound_the_least_recently_used_runs_are_forgotten_first() {
        let fences = Fences::new(Duration::from_secs(3600), 20);
        fences.admit("u", &fence("kept", 2)).ok();
        for i in 0..19 {
            std::thread::sleep(Duration::from_millis(1));
            fences.admit("u", &fence(&format!("r{i}"), 1)).ok();
            std::thread::sleep(Duration::from_millis(1));
            // The oldest run keeps calling: it is the most recently used, whatever its age.
            fences.admit("u", &fence("kept", 2)).ok();
        }
        assert_eq!(fences.len(), 20);
        fences.admit("u", &fence("new", 1)).ok();
        assert_eq!(fences.len(), 19, "a tenth freed (two of twenty), then the new run");
        let refused = fences.admit("u", &fence("kept", 1));
        assert!(refused.is_err(), "the run still in use is remembered: its old attempt stays fenced");
        assert_eq!(fences.admit("u", &fence("r0", 1)).ok(), Some(Admitted::Current), "r0 was forgotten: first seen again");
        assert!(fences.len() <= 20);
    }

    #[test]
    fn headers_come_in_pairs_and_are_checked() {
        let mut metadata = MetadataMap::new();
        assert!(matches!(Fence::from_metadata(&metadata), Ok(None)));
        metadata.insert(RUN_ID_HEADER, "r-1".parse().unwrap_or_else(|_| unreachable!()));
        assert!(Fence::from_metadata(&metadata).is_err(), "an id without an attempt");
        metadata.insert(ATTEMPT_HEADER, "0".parse().unwrap_or_else(|_| unreachable!()));
        assert!(Fence::from_metadata(&metadata).is_err(), "attempts start at 1");
        metadata.insert(ATTEMPT_HEADER, "2".parse().unwrap_or_else(|_| unreachable!()));
        assert_eq!(Fence::from_metadata(&metadata).ok().flatten(), Some(fence("r-1", 2)));
    }
}
