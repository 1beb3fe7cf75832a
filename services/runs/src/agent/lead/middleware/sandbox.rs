//! Sandbox: lazy acquisition. Nothing is acquired up front; the first tool that needs the sandbox
//! acquires it (see `RunEnv::sandbox`), and the id is kept in the thread state. The sandbox is not
//! released at the end of the run: the worker still reads its outputs (SnapshotOutputs) to verify
//! delivery afterwards, and the sandbox service releases idle sandboxes itself
//! (`sandbox.idle_release_secs`).

use futures::future::BoxFuture;

use crate::agent::lead::env::RunEnv;
use crate::agent::lead::pipeline::{LoopError, Middleware};
use crate::agent::lead::state::ThreadState;

#[derive(Debug)]
pub struct SandboxMiddleware;

impl Middleware for SandboxMiddleware {
    fn name(&self) -> &'static str {
        "Sandbox"
    }

    fn after_model<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        remember(env, state)
    }

    fn after_agent<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        remember(env, state)
    }
}

fn remember<'a>(env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
    if let Some(id) = env.sandbox_id() {
        state.sandbox_id = id;
    }
    Box::pin(async { Ok(()) })
}
