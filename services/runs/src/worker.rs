//! The worker pool of one replica: a dispatcher that starts PENDING runs through `try_start` (within
//! `runs.max_concurrent_runs`), a sweeper that takes over expired leases, and the execution of each
//! run: build the agent, keep the lease alive, run, finalize.

use std::sync::Arc;
use std::time::Duration;

use antler_proto::runs::{Checkpoint, CreateRunRequest, RunError};
use prost::Message;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use crate::agent_host::{Inherited, RunHost, RunIds};
use crate::engine::{Engine, LocalRun, StopCause};
use crate::lifecycle::finalize::{self, Outcome, Outputs};
use crate::lifecycle::{lease, liveness, start};
use crate::status::Status;
use crate::store::entity::{checkpoints, run_inputs, runs};
use crate::store::now_ms;
use antler_agent::{AgentContext, RunSpec};

/// Starts the heartbeat, the dispatcher and the sweeper; all stop at shutdown. The first heartbeat
/// and the first sweep happen before this returns, so runs orphaned by a crash are claimed at
/// start-up and no run is admitted here before this replica is known to be alive.
pub async fn spawn(engine: Arc<Engine>) {
    if let Err(error) = liveness::beat(&engine).await {
        tracing::warn!(%error, "first heartbeat failed; retrying in a third of the lease");
    }
    tokio::spawn(liveness::keep_beating(engine.clone()).instrument(tracing::info_span!("heartbeat")));
    if let Err(error) = sweep_once(&engine).await {
        tracing::warn!(%error, "start-up sweep failed; the periodic sweep will retry");
    }
    tokio::spawn(dispatch(engine.clone()).instrument(tracing::info_span!("dispatcher")));
    tokio::spawn(sweeper(engine).instrument(tracing::info_span!("sweeper")));
}

async fn dispatch(engine: Arc<Engine>) {
    loop {
        tokio::select! {
            () = engine.until_shutdown() => return,
            () = engine.dispatcher_woken() => {}
            // Runs admitted by other replicas (or whose admitting replica died) are found by polling.
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        loop {
            let mut free = engine.free_slots();
            if free == 0 {
                break;
            }
            // Runs taken over from a dead replica come before PENDING ones (and among those, the
            // ones a dead replica admitted come first: `start::startable`).
            if engine.takeovers_waiting() {
                match lease::take_over(&engine, free).await {
                    Ok(claimed) => launch_claimed(&engine, claimed).await,
                    Err(error) => tracing::warn!(%error, "cannot take over expired runs"),
                }
                free = engine.free_slots();
                if free == 0 {
                    break;
                }
            }
            let candidates = match start::startable(&engine, free as u64).await {
                Ok(c) => c,
                Err(error) => {
                    tracing::warn!(%error, "cannot list startable runs");
                    break;
                }
            };
            if candidates.is_empty() {
                break;
            }
            // One permit per candidate first, then one statement starts them all.
            let mut permits = Vec::new();
            while permits.len() < candidates.len() {
                let Some(permit) = engine.take_slot() else { break };
                permits.push(permit);
            }
            let candidates = &candidates[..permits.len()];
            let started = match start::try_start_many(&engine, candidates).await {
                Ok(started) => started,
                Err(error) => {
                    tracing::warn!(%error, runs = candidates.len(), "try_start failed");
                    break;
                }
            };
            if started.is_empty() {
                break;
            }
            // Unused permits go back when dropped.
            for (run, permit) in started.into_iter().zip(permits) {
                launch(engine.clone(), run, permit, false);
            }
        }
    }
}

async fn sweeper(engine: Arc<Engine>) {
    let period = Duration::from_secs(engine.config().sweep_interval_secs);
    loop {
        tokio::select! {
            () = engine.until_shutdown() => return,
            () = tokio::time::sleep(period) => {}
        }
        if let Err(error) = sweep_once(&engine).await {
            tracing::warn!(%error, "sweep failed");
        }
    }
}

async fn sweep_once(engine: &Arc<Engine>) -> Result<(), crate::error::RunsError> {
    let swept = lease::sweep(engine, engine.free_slots()).await?;
    launch_claimed(engine, swept.claimed).await;
    // The PENDING runs of replicas that died go before our own (see `start::startable`).
    liveness::find_dead(engine).await?;
    engine.wake_dispatcher();
    forget_ended_secrets(engine).await?;
    Ok(())
}

/// Drops the secrets of runs admitted here that ended without this replica executing them to the
/// end (cancelled while PENDING, superseded, closed by another replica).
async fn forget_ended_secrets(engine: &Engine) -> Result<(), crate::error::RunsError> {
    let kept = engine.secrets().run_ids();
    if kept.is_empty() {
        return Ok(());
    }
    let active: Vec<String> = runs::Entity::find()
        .select_only()
        .column(runs::Column::RunId)
        .filter(runs::Column::RunId.is_in(kept.iter().map(String::as_str)))
        .filter(runs::Column::Status.is_in(Status::ACTIVE))
        .into_tuple()
        .all(engine.store().db())
        .await?;
    for run_id in kept.iter().filter(|id| !active.contains(id)) {
        engine.secrets().forget(run_id);
    }
    Ok(())
}

/// Executes runs taken over from a dead owner.
async fn launch_claimed(engine: &Arc<Engine>, claimed: Vec<runs::Model>) {
    for run in claimed {
        match engine.take_slot() {
            Some(permit) => launch(engine.clone(), run, permit, true),
            // Capacity went away meanwhile: let the lease lapse so another worker (or a later pass)
            // claims the run again.
            None => {
                if let Err(error) = lease::release(engine, &run.run_id).await {
                    tracing::warn!(run_id = %run.run_id, %error, "cannot release a claimed run; it is claimed again when its lease expires");
                }
            }
        }
    }
}

/// Runs `run` under `permit`, then each run its closing commit started (the slot handed over, see
/// `start::start_next_in`); the permit goes back when a run ends without a successor.
fn launch(engine: Arc<Engine>, run: runs::Model, permit: OwnedSemaphorePermit, resumed: bool) {
    tokio::spawn(async move {
        let (mut run, mut resumed) = (run, resumed);
        loop {
            let span = tracing::info_span!(parent: None, "run", run_id = %run.run_id, attempt = run.attempt);
            match execute_with(&engine, run, resumed, LocalRun::new(), true).instrument(span).await {
                Some(next) => (run, resumed) = (next, false),
                None => break,
            }
        }
        drop(permit);
        engine.wake_dispatcher();
    });
}

/// Executes one attempt of `run` (started or claimed by this worker) under `local`, to its
/// finalization: what the dispatcher does with a run, and a parent's `task` call with a child run.
/// With `hand_over`, returns the run its closing commit started in its place (the dispatcher's runs;
/// a subagent's child runs under its parent's slot and hands nothing over).
pub(crate) async fn execute_with(
    engine: &Arc<Engine>,
    run: runs::Model,
    resumed: bool,
    local: LocalRun,
    hand_over: bool,
) -> Option<runs::Model> {
    engine.track(&run.run_id, local.clone());
    metrics::gauge!("antler_runs_active").increment(1.0);
    let keep_alive = tokio::spawn(lease::keep_alive(engine.clone(), run.run_id.clone(), local.clone()));

    // Boxed: what it holds while it loads the request and the checkpoint (the request, the decoded
    // checkpoint, the spec) would otherwise take room in this future for the whole run, since an
    // async fn is as large as its largest await.
    let Prepared { declared, limit, timer, agent } = Box::pin(prepare(engine, &run, resumed, &local)).await;
    let outcome = match agent {
        Err(outcome) => *outcome,
        Ok((running, host)) => {
            let outcome = running.await;
            // Subagent runs end before their parent is finalized.
            host.join_children().await;
            match outcome {
                Ok(outcome) => outcome,
                Err(join) => Outcome::Failed(RunError {
                    code: "agent_panicked".to_owned(),
                    message: join.to_string(),
                    retryable: false,
                    details: None,
                }),
            }
        }
    };

    // Boxed for the same reason as `prepare`.
    let next = Box::pin(conclude(engine, &run, &declared, (limit, timer), &local, outcome, hand_over)).await;
    local.token.cancel();
    keep_alive.abort();
    engine.untrack(&run.run_id);
    metrics::gauge!("antler_runs_active").decrement(1.0);
    engine.secrets().forget(&run.run_id);
    next
}

/// Checks the outputs of a completed attempt, names how it ended (a cancel or the time limit stops
/// it as such), and finalizes the run unless the attempt no longer owns it.
async fn conclude(
    engine: &Arc<Engine>,
    run: &runs::Model,
    declared: &[String],
    (limit, timer): (Duration, tokio::task::JoinHandle<()>),
    local: &LocalRun,
    outcome: Outcome,
    hand_over: bool,
) -> Option<runs::Model> {
    let outcome = match outcome {
        Outcome::Completed { stop_reason, outputs } => Box::pin(verify_outputs(engine, run, declared, stop_reason, outputs)).await,
        other => other,
    };
    timer.abort();
    let outcome = match local.cause() {
        Some(StopCause::Cancel) => match outcome {
            Outcome::Failed(_) | Outcome::Cancelled { .. } => Outcome::Cancelled { outputs: Outputs::default() },
            completed => completed,
        },
        // An agent that finished anyway keeps its outcome; one stopped by the limit times out.
        Some(StopCause::Timeout) => match outcome {
            Outcome::Failed(_) | Outcome::Cancelled { .. } => Outcome::TimedOut { limit, outputs: Outputs::default() },
            completed => completed,
        },
        _ => outcome,
    };
    match local.cause() {
        // Fenced or released: another worker owns the run's future. Write nothing.
        Some(StopCause::Fenced) | Some(StopCause::Release) => {
            tracing::info!(run_id = %run.run_id, "stopped without finalizing (lease lost or released)");
            None
        }
        _ => match Box::pin(finalize::finalize(engine, run, declared, outcome, hand_over)).await {
            Ok(Some(finalized)) => {
                engine.hub().publish(&finalized.events);
                finalized.next
            }
            Ok(None) => {
                tracing::info!(run_id = %run.run_id, "fenced at finalization: nothing written");
                None
            }
            Err(error) => {
                tracing::error!(run_id = %run.run_id, %error, "finalization failed: nothing written; the run is taken over once its lease expires");
                None
            }
        },
    }
}

/// What [`prepare`] leaves for the rest of an attempt.
struct Prepared {
    declared: Vec<String>,
    limit: Duration,
    /// Stops the attempt at its wall-clock limit.
    timer: tokio::task::JoinHandle<()>,
    /// The agent's task and its host, or the outcome that stopped the attempt before it.
    agent: Result<(tokio::task::JoinHandle<Outcome>, Arc<RunHost>), Box<Outcome>>,
}

/// Decodes the stored request, starts the wall-clock timer, loads the resume point and the input,
/// and starts the agent.
async fn prepare(engine: &Arc<Engine>, run: &runs::Model, resumed: bool, local: &LocalRun) -> Prepared {
    // A stored request that does not decode fails the run: running an empty request in its place
    // would do something nobody asked for.
    let decoded = CreateRunRequest::decode(run.request.as_slice());
    let corrupt = decoded.as_ref().err().map(|error| RunError {
        code: "corrupt_request".to_owned(),
        message: format!(
            "the run's stored request could not be decoded ({error}); the run was not started\nhint: this is a storage fault: check the runs database, then submit the run again"
        ),
        retryable: false,
        details: None,
    });
    if let Some(error) = &corrupt {
        tracing::error!(run_id = %run.run_id, code = %error.code, "stored request is corrupt; failing the run");
    }
    let mut request = decoded.unwrap_or_default();
    let declared = request.expected_outputs.clone();
    // The wall-clock limit counts from the first RUNNING, so a resumed attempt inherits what is left.
    let limit = request
        .config
        .as_ref()
        .and_then(|c| c.max_duration)
        .and_then(|d| std::time::Duration::try_from(d).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(engine.config().max_run_duration_secs));
    let elapsed = Duration::from_millis(run.started_at.map(|s| (now_ms() - s).max(0) as u64).unwrap_or(0));
    let timer = tokio::spawn({
        let local = local.clone();
        let left = limit.saturating_sub(elapsed);
        async move {
            tokio::time::sleep(left).await;
            local.stop(StopCause::Timeout);
        }
    });
    let agent = if let Some(error) = corrupt {
        Err(Box::new(Outcome::Failed(error)))
    } else {
        match (Box::pin(resume_point(engine, run, resumed)).await, Box::pin(load_input(engine, &run.run_id, &mut request)).await) {
            (Err(error), _) | (_, Err(error)) => Err(Box::new(Outcome::Failed(RunError {
                code: "resume_failed".to_owned(),
                message: error.to_string(),
                retryable: true,
                details: None,
            }))),
            (Ok(resume_from), Ok(())) => start_agent(engine, run, request, resume_from, resumed, local),
        }
    };
    Prepared { declared, limit, timer, agent }
}

/// Builds the run's agent and starts it in a task of its own (a panicking agent must not take the
/// worker down with it). Not async: what it builds moves into that task and takes no room in the
/// caller's future.
fn start_agent(
    engine: &Arc<Engine>,
    run: &runs::Model,
    request: CreateRunRequest,
    resume_from: Option<(Checkpoint, u32)>,
    resumed: bool,
    local: &LocalRun,
) -> Result<(tokio::task::JoinHandle<Outcome>, Arc<RunHost>), Box<Outcome>> {
    let secrets = engine.secrets().for_attempt(&run.run_id, request.secrets.keys().cloned().collect());
    if !secrets.missing().is_empty() {
        tracing::warn!(
            run_id = %run.run_id,
            missing = ?secrets.missing(),
            "this attempt runs without the run's secrets: they were never stored and were held by the replica that admitted the run"
        );
    }
    // Where the attempt starts is the thread's head while the run is active: its first checkpoint's
    // write checks that instead of reading the head first, and is encoded against this state
    // instead of reading it again.
    let start = resume_from.as_ref().map(|(c, depth)| crate::checkpoints::Full {
        checkpoint_id: c.checkpoint_id.clone(),
        messages: c.messages.clone(),
        values: c.values.clone().unwrap_or_default(),
        depth: *depth,
    });
    let resume_from = resume_from.map(|(c, _)| c);
    let spec = RunSpec {
        run_id: run.run_id.clone(),
        thread_id: run.thread_id.clone(),
        user_id: run.user_id.clone(),
        attempt: run.attempt as u32,
        request,
        secrets,
        resume_from,
        resumed,
        tokens_before: <antler_proto::runs::RunUsage as prost::Message>::decode(run.usage.as_slice()).map(|u| u.total_tokens).unwrap_or(0),
    };
    let (agent, n) = engine.build_agent(&spec).map_err(|error| Box::new(Outcome::Failed(error)))?;
    // DEBUG, not INFO: at the default level a run logs one line, `run finished` (#32).
    tracing::debug!(run_id = %run.run_id, constructed_total = n, "agent constructed");
    let ids =
        RunIds { run_id: spec.run_id.clone(), thread_id: spec.thread_id.clone(), user_id: spec.user_id.clone(), attempt: spec.attempt };
    let inherit = Inherited {
        secret_names: spec.request.secrets.keys().cloned().collect(),
        context: spec.request.config.as_ref().and_then(|c| c.context.clone()),
    };
    let mut host = RunHost::inheriting(engine.clone(), ids, local.clone(), inherit).with_start(start);
    if run.attempt == 1 {
        // Only this attempt writes a first attempt's usage: the admitted row's totals (none) are
        // the current ones, and the first step's write need not read them back.
        host = host.with_usage_total(<antler_proto::runs::RunUsage as prost::Message>::decode(run.usage.as_slice()).unwrap_or_default());
    }
    let host = Arc::new(host);
    let ctx = AgentContext::new(spec, host.clone(), local.token.clone(), engine.clients().clone());
    Ok((tokio::spawn(agent.run(ctx).instrument(tracing::Span::current())), host))
}

/// Success cannot rest on words: what counts as produced is what the sandbox's outputs directory
/// holds (SnapshotOutputs), not what the agent says — minus what was already there, unchanged, when
/// the run started (the agent's `baseline`, itself a SnapshotOutputs listing). When there is something to deliver and the
/// sandbox cannot be asked, the run cannot be verified and ends ERROR `delivery_unverifiable`.
async fn verify_outputs(engine: &Engine, run: &runs::Model, declared: &[String], stop_reason: String, outputs: Outputs) -> Outcome {
    use antler_proto::sandbox::SnapshotOutputsRequest;
    use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
    let snapshot = match engine.clients().get("sandbox") {
        None => Err("no sandbox client is configured".to_owned()),
        Some(client) => {
            let ctx = antler_kit::CallContext::background(run.user_id.clone());
            let request = client.request(&ctx, SnapshotOutputsRequest { thread_id: run.thread_id.clone() });
            match SandboxServiceClient::new(client.channel()).snapshot_outputs(request).await {
                Ok(response) => Ok(response.into_inner().files),
                // The thread never had a sandbox: nothing was produced.
                Err(status) if status.code() == tonic::Code::NotFound => Ok(Vec::new()),
                Err(status) => Err(format!("the sandbox service answered {:?}: {}", status.code(), status.message())),
            }
        }
    };
    match snapshot {
        Ok(files) => {
            let existing = files.iter().map(|f| f.path.clone()).collect();
            // Unchanged since the run started (same content hash): not this run's doing.
            let unchanged =
                |f: &antler_proto::sandbox::OutputFile| outputs.baseline.as_ref().is_some_and(|b| b.get(&f.path) == Some(&f.sha256));
            let produced = files
                .into_iter()
                .filter(|f| !unchanged(f))
                .map(|f| antler_proto::runs::OutputFile { path: f.path, size: f.size_bytes, sha256: f.sha256, mime_type: f.mime_type })
                .collect();
            Outcome::Completed { stop_reason, outputs: Outputs { produced, existing, ..outputs } }
        }
        Err(_) if declared.is_empty() && outputs.presented.is_empty() => Outcome::Completed { stop_reason, outputs: Outputs::default() },
        Err(reason) => Outcome::Failed(RunError {
            code: "delivery_unverifiable".to_owned(),
            message: format!("the run's outputs could not be checked: {reason}\nhint: check clients.sandbox (endpoint, service_token)"),
            retryable: true,
            details: None,
        }),
    }
}

/// Puts back the input of a run admitted with a large one (kept in `run_inputs`, see that entity).
/// Admission never stores an empty input without `resume` inline, so that pair marks it.
async fn load_input(engine: &Engine, run_id: &str, request: &mut CreateRunRequest) -> Result<(), crate::error::RunsError> {
    if !request.input.is_empty() || request.resume.is_some() {
        return Ok(());
    }
    if let Some(row) = run_inputs::Entity::find_by_id(run_id.to_owned()).one(engine.store().db()).await? {
        let stored = CreateRunRequest::decode(row.input.as_slice()).map_err(|e| crate::error::RunsError::Store(e.into()))?;
        request.input = stored.input;
    }
    Ok(())
}

/// Where the agent starts: on a resumed attempt, the run's own latest checkpoint; otherwise the
/// thread's state when the run was admitted.
async fn resume_point(engine: &Engine, run: &runs::Model, resumed: bool) -> Result<Option<(Checkpoint, u32)>, crate::error::RunsError> {
    let row = if resumed {
        checkpoints::Entity::find()
            .filter(checkpoints::Column::RunId.eq(run.run_id.as_str()))
            .order_by_desc(checkpoints::Column::CreatedAt)
            .order_by_desc(checkpoints::Column::CheckpointId)
            .one(engine.store().db())
            .await?
    } else {
        None
    };
    let row = match (row, &run.base_checkpoint_id) {
        (Some(row), _) => Some(row),
        (None, Some(base)) => checkpoints::Entity::find_by_id(base.clone()).one(engine.store().db()).await?,
        (None, None) => None,
    };
    match row {
        Some(row) => Ok(Some(crate::checkpoints::read(engine.store().db(), &row, true).await?)),
        None => Ok(None),
    }
}

/// Shutdown: stop admitting, give local runs `runs.drain_secs` to finish, then release their leases so
/// another replica (or the next start) resumes them instead of marking them failed.
pub async fn drain(engine: Arc<Engine>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(engine.config().drain_secs);
    while tokio::time::Instant::now() < deadline {
        if engine.local_runs().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let remaining: Vec<(String, LocalRun)> = engine.local_runs();
    for (run_id, local) in remaining {
        local.stop(StopCause::Release);
        if let Err(error) = lease::release(&engine, &run_id).await {
            tracing::warn!(run_id, %error, "could not release the lease; it expires on its own");
        } else {
            tracing::info!(run_id, "lease released for resumption elsewhere");
        }
    }
}
