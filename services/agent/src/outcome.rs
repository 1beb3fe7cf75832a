//! How an agent's work ended, as the runs service's finalization reads it.

use antler_proto::runs::{OutputFile, RunError};

/// What the agent reported about files it made, completed by the worker from the sandbox's listing.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    /// Files created or changed in the outputs directory during the run.
    pub produced: Vec<OutputFile>,
    /// Paths passed to `present_files` (a directory covers every file under it).
    pub presented: Vec<String>,
    /// Every file in the outputs directory at the end of the run; declared outputs must be among them.
    pub existing: Vec<String>,
    /// The outputs directory when the run started (path → SHA-256), when the agent took that snapshot:
    /// a file still unchanged at the end was not produced by this run. Without it every file counts.
    pub baseline: Option<std::collections::BTreeMap<String, String>>,
}

impl Outputs {
    /// Whether `path` was presented, itself or through a presented directory.
    pub fn presents(&self, path: &str) -> bool {
        self.presented.iter().any(|p| {
            let dir = p.trim_end_matches('/');
            path == p || path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
        })
    }
}

/// How the agent's work ended, from the worker's point of view.
#[derive(Debug, Clone)]
pub enum Outcome {
    Completed {
        stop_reason: String,
        outputs: Outputs,
    },
    Failed(RunError),
    /// Stopped by a cancel request (the durable `cancel_action` says which).
    Cancelled {
        outputs: Outputs,
    },
    /// Stopped because `config.max_duration` passed.
    TimedOut {
        limit: std::time::Duration,
        outputs: Outputs,
    },
}
