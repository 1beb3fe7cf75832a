//! What an agent is built from.

use std::sync::Arc;

use antler_proto::runs::{Checkpoint, CreateRunRequest};

use crate::RunSecrets;

#[derive(Debug, Clone)]
pub struct RunSpec {
    pub run_id: String,
    pub thread_id: String,
    pub user_id: String,
    pub attempt: u32,
    /// The admitted request (secret values removed; their names are kept).
    pub request: CreateRunRequest,
    /// The run's secrets, as far as this replica has them.
    pub secrets: Arc<RunSecrets>,
    /// The checkpoint to start from: the run's own latest one when resuming after a takeover, else
    /// the thread's state when the run was admitted.
    pub resume_from: Option<Checkpoint>,
    /// True when this attempt continues a run another worker started.
    pub resumed: bool,
    /// Tokens earlier attempts of the run spent (their usage is in the run's totals).
    pub tokens_before: u64,
}

impl RunSpec {
    /// A first attempt of `request` on a thread with no state yet (tests and embedding programs).
    pub fn new(run_id: &str, thread_id: &str, user_id: &str, request: CreateRunRequest) -> Self {
        Self {
            run_id: run_id.to_owned(),
            thread_id: thread_id.to_owned(),
            user_id: user_id.to_owned(),
            attempt: 1,
            request,
            secrets: Arc::new(RunSecrets::none()),
            resume_from: None,
            resumed: false,
            tokens_before: 0,
        }
    }
}
