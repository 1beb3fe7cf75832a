//! Sandbox: the run's sandbox from start to end. Nothing is acquired up front; the first tool that
//! needs the sandbox acquires it (see `RunEnv::sandbox`) and the id is kept in the thread state.
//! Before the run, this layer lists the outputs directory (SnapshotOutputs, which acquires nothing)
//! so the delivery receipt can tell what the run produced from what was already there; the listing
//! travels in checkpoints, so a resumed attempt compares against the same one. After the run, on
//! every ending but a fenced one, the loop releases the sandbox (`RunEnv::release_sandbox`); the
//! worker's final SnapshotOutputs reads a released sandbox just as well. An attempt that took the run
//! over announces itself first (`RunEnv::announce_attempt`), so the sandbox service fences the earlier
//! attempt's commands at once.

use futures::future::BoxFuture;

use crate::lead::pipeline::{LoopError, Middleware};
use crate::lead::run_env::RunEnv;
use crate::lead::state::ThreadState;

#[derive(Debug)]
pub struct SandboxMiddleware;

impl Middleware for SandboxMiddleware {
    fn name(&self) -> &'static str {
        "Sandbox"
    }

    fn before_agent<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        Box::pin(async move {
            // A takeover: the earlier attempt's commands die now, not when it next calls.
            if env.ctx.spec.attempt > 1 {
                env.announce_attempt().await;
            }
            // Only at the start of a run: an attempt resuming mid-run without a listing must not take
            // one now, or the files the earlier attempt made would look like they were already there.
            if state.outputs_before.is_none() && state.step == 0 {
                match env.snapshot_outputs().await {
                    Ok(files) => state.outputs_before = Some(files),
                    // Without a listing every file in the outputs directory counts as produced: stricter,
                    // never more lenient.
                    Err(error) => tracing::warn!(run_id = %env.ctx.spec.run_id, "outputs not listed before the run: {error}"),
                }
            }
            env.set_outputs_before(state.outputs_before.clone());
            Ok(())
        })
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
