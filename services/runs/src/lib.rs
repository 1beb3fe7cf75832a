//! The Antler runs service: threads and runs — admission, the start gate, leases, cancellation,
//! finalization with delivery receipts, and durable event streams.
//!
//! Where things happen, by file: admission (`lifecycle/admission/`, one entry: `admission::admit`), PENDING → RUNNING
//! (`lifecycle/start.rs`), leases and takeover (`lifecycle/lease.rs`), the terminal transition
//! (`lifecycle/finalize.rs`), cancellation (`lifecycle/cancel.rs`), the event log (`stream.rs`),
//! its live fan-out and wake-ups (`hub.rs`, `notify.rs`), executing runs (`worker.rs`), the agents'
//! writes (`agent_host/`, the runs side of `antler_agent::Host`).
//!
//! Floors, bottom up (a file imports from its own floor or below, and no import runs in a circle): `status.rs`, `config.rs`, `hub.rs`, `time.rs`;
//! `store/` (entities, migrations with frozen copies of what they need, the write slot, `now_ms`,
//! `StoreError`); `error.rs`; what needs no engine (`stream.rs`, `checkpoints.rs`, `paging.rs`,
//! `stream_limits.rs`, `lifecycle/backlog.rs`, `lifecycle/user_caps.rs`); `engine.rs`; what takes
//! the engine (`notify.rs`, `threads.rs`, `run_queries.rs`, `feedback.rs`, `usage.rs`, `lifecycle/`); executing runs (`agent_host/mod.rs`,
//! `worker.rs`, `subagent.rs`, `agent_host/agent_calls.rs`: the worker hands the agent a `dyn Host`, whose
//! `task` calls start subagent runs that the worker executes); the `api/` handlers on top.

pub mod agent_host;
pub mod api;
pub mod checkpoints;
pub mod config;
pub mod engine;
pub mod error;
pub mod feedback;
pub mod hub;
pub mod lifecycle;
pub mod metrics_catalog;
pub mod notify;
pub mod paging;
pub mod run_queries;
pub mod script;
pub mod secret_vault;
pub mod status;
pub mod store;
pub mod stream;
pub mod stream_limits;
pub mod subagent;
pub mod threads;
pub mod time;
pub mod usage;
pub mod worker;

use std::sync::Arc;

use antler_kit::ServiceSet;
use antler_kit::cli::{BoxError, RegisterFuture, Registration, ServiceContext};
use antler_proto::runs::{run_service_server, thread_service_server};
use tracing::Instrument;

/// How `antler-runs` and `antler up` mount this service.
pub const SERVICE: Registration = Registration {
    name: "runs",
    validate: config::validate,
    register,
    metrics: &[metrics_catalog::CATALOGUE, antler_agent::metrics_catalog::CATALOGUE],
};

fn register<'a>(set: &'a mut ServiceSet, ctx: &'a ServiceContext) -> RegisterFuture<'a> {
    Box::pin(async move {
        mount(set, ctx, None).await?;
        Ok(())
    })
}

/// Opens the database, starts this replica's workers and mounts both gRPC services. `agents`
/// replaces the agent chosen by `runs.agent` (for benchmarks and embedding programs).
pub async fn mount(
    set: &mut ServiceSet,
    ctx: &ServiceContext,
    agents: Option<Arc<dyn antler_agent::AgentFactory>>,
) -> Result<Arc<engine::Engine>, BoxError> {
    let config = config::load(&ctx.config)?;
    let store = store::Store::open(&config.database, &ctx.config.server.data_dir).await?;
    let worker_id = format!("{}-{}", hostname(), uuid::Uuid::new_v4().simple());
    tracing::info!(worker_id, max_concurrent_runs = config.max_concurrent_runs, "runs worker starting");
    let agents = agents.unwrap_or_else(|| match config.agent {
        config::AgentKind::Script => Arc::new(script::ScriptFactory),
        config::AgentKind::Lead => {
            let mut lead = config.lead.clone();
            // The sandbox service keeps the ACP workspaces under its `{server.data_dir}/sandbox`; in one
            // process (`antler up`) or on a shared data directory that is this service's too.
            if lead.acp.workspace_root.is_empty() {
                lead.acp.workspace_root = ctx.config.server.data_dir.join("sandbox").to_string_lossy().into_owned();
            }
            // Hidden from a confined ACP agent: the database and every other thread's files live here.
            lead.acp.data_dir = ctx.config.server.data_dir.to_string_lossy().into_owned();
            Arc::new(antler_agent::lead::LeadFactory { config: lead, custom: Vec::new() })
        }
    });
    let (batcher, admissions) = lifecycle::admission::Batcher::channel();
    let engine = Arc::new(engine::Engine::new(store, config, worker_id, ctx.clients.clone(), agents, ctx.shutdown.child_token()));
    tokio::spawn(lifecycle::admission::run_batcher(engine.clone(), admissions).instrument(tracing::info_span!("admitter")));
    notify::spawn(engine.clone());
    worker::spawn(engine.clone()).await;
    let drain = engine.clone();
    set.on_drain(async move {
        drain.until_shutdown().await;
        worker::drain(drain.clone()).await;
        lifecycle::liveness::retire(&drain).await;
        drain.store().checkpoint_on_shutdown().await;
    });
    set.describe(antler_proto::FILE_DESCRIPTOR_SET);
    let threads = api::thread_service::ThreadApi { engine: engine.clone() };
    let runs = api::run_service::RunApi { engine: engine.clone(), batcher };
    antler_kit::add_service!(set, thread_service_server::ThreadServiceServer::new(threads));
    antler_kit::add_service!(set, run_service_server::RunServiceServer::new(runs));
    // A wait as long as the run (bounded by runs.max_run_duration_secs), not cut by the server's
    // default deadline for calls that set none.
    set.without_default_deadline("/antler.runs.v1.RunService/WaitRun");
    Ok(engine)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "runs".to_owned())
}
