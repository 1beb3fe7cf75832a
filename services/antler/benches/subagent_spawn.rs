//! Subagent spawn latency: how long after a lead agent's `task` call starts its child run is under
//! way, as a client of the parent's stream sees it. Everything `antler up` runs (runs, models,
//! sandbox) is in this process on 2 tokio workers with SQLite by default; zero-latency models (the
//! `replay` provider) for the lead agent and the subagent; the client in a separate process (this
//! binary run again, see `common/client_process.rs`).
//!
//! Each run: the lead calls `write_todos` (the baseline: a no-op tool, TOOL_STARTED → TOOL_FINISHED;
//! its item is completed, so the todo middleware's reminder never sends the lead round again), then
//! `task` (a custom subagent type `quick` on its own replay model, which answers at once), then
//! answers. A run with more than one `task` call is refused, not measured. Measured from the parent's TOOL_STARTED of `task`:
//! - spawn → START: the child run admitted, started through `try_start`'s compare-and-set, and the
//!   parent's START event written, all in one transaction (with its thread, run row and first event);
//! - spawn → first STEP: the child's agent built, its input written, one model call, its checkpoint,
//!   and the assistant message relayed to the parent's log;
//! - spawn → END: the child finalized and the parent's END event (with the result and usage) written.
//!
//! Run: `cargo bench -p antler --bench subagent_spawn`. Environment: `BENCH_RUNS` (default 200),
//! `BENCH_DATABASE_URL` (a `postgres://` admin URL to measure PostgreSQL; a database is created and dropped),
//! `BENCH_SLOW` (print every run whose spawn → START is over the goal).

use std::time::Instant;

use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{CreateRunRequest, RunConfig, RunStatus, StreamRunRequest, SubagentPhase};
use anyhow::{Context, bail};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

#[path = "common/client_process.rs"]
mod client_process;
#[path = "common/services.rs"]
mod services;

use services::{Server, percentile};

/// The goal for the p99 of spawn → first child event.
const GOAL_P99_MS: f64 = 5.0;

/// The bench's `runs:` settings: no title call, one custom subagent on the `child` model.
const RUNS_EXTRA: &str = "  lead:\n    title:\n      enabled: false\n    subagents:\n      custom_agents:\n        quick:\n          description: Answers at once\n          model: child\n";

fn models_yaml() -> String {
    "models:\n\
     \x20 - name: zero\n    provider: replay\n    replay:\n      chunk_chars: 65536\n      after_last: cycle\n      turns:\n\
     \x20         - tool_calls:\n              - {id: plan, name: write_todos, arguments: {todos: [{content: \"delegate\", status: completed}]}}\n            usage: {input_tokens: 100, output_tokens: 10}\n\
     \x20         - tool_calls:\n              - {id: delegate, name: task, arguments: {description: \"quick task\", prompt: \"do it\", subagent_type: quick}}\n            usage: {input_tokens: 100, output_tokens: 10}\n\
     \x20         - text: done\n            usage: {input_tokens: 100, output_tokens: 1}\n\
     \x20 - name: child\n    provider: replay\n    replay:\n      chunk_chars: 65536\n      after_last: cycle\n      turns:\n\
     \x20         - text: child done\n            usage: {input_tokens: 50, output_tokens: 5}\n"
        .to_owned()
}

/// What one run showed the client, in milliseconds.
#[derive(Debug, Default)]
struct Observed {
    baseline: f64,
    start: f64,
    first_step: f64,
    end: f64,
}

impl Observed {
    fn to_line(&self) -> String {
        json!([self.baseline, self.start, self.first_step, self.end]).to_string()
    }

    fn from_line(line: &str) -> anyhow::Result<Self> {
        let [baseline, start, first_step, end]: [f64; 4] = serde_json::from_str(line).with_context(|| format!("client line {line:?}"))?;
        Ok(Self { baseline, start, first_step, end })
    }
}

async fn one_run(mut client: RunServiceClient<Channel>) -> anyhow::Result<Observed> {
    let create = CreateRunRequest {
        input: vec![Message {
            role: Role::User as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: "Delegate one task".to_owned() })) }],
            ..Message::default()
        }],
        config: Some(RunConfig { plan_mode: true, subagents_enabled: true, ..Default::default() }),
        ..CreateRunRequest::default()
    };
    let mut stream = client.stream_run(StreamRunRequest { create: Some(create) }).await?.into_inner();
    let (mut todo_started, mut task_started) = (None, None);
    let mut observed = Observed::default();
    let mut status = RunStatus::Unspecified;
    let ms = |from: Option<Instant>, now: Instant| from.map(|f| (now - f).as_secs_f64() * 1e3).unwrap_or(f64::NAN);
    while let Some(item) = stream.next().await {
        let Some(kind) = item?.event.and_then(|e| e.kind) else { continue };
        let now = Instant::now();
        match kind {
            Kind::ToolStarted(t) if t.name == "write_todos" => todo_started = Some(now),
            Kind::ToolStarted(t) if t.name == "task" => {
                if task_started.is_some() {
                    bail!("a run called `task` twice: the bench's script is wrong");
                }
                task_started = Some(now)
            }
            Kind::ToolFinished(t) if t.name == "write_todos" => observed.baseline = ms(todo_started, now),
            Kind::Subagent(s) => match s.phase() {
                SubagentPhase::Start => observed.start = ms(task_started, now),
                SubagentPhase::Step if observed.first_step == 0.0 => observed.first_step = ms(task_started, now),
                SubagentPhase::End => observed.end = ms(task_started, now),
                _ => {}
            },
            Kind::End(end) => status = end.status(),
            _ => {}
        }
    }
    if status != RunStatus::Success {
        bail!("a run ended {status:?}");
    }
    if observed.start.is_nan() || observed.start == 0.0 || observed.end == 0.0 {
        bail!("a run showed no subagent events: {observed:?}");
    }
    Ok(observed)
}

fn summary(name: &str, mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let p99 = percentile(&values, 0.99);
    println!(
        "  {name:<28} p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms",
        percentile(&values, 0.5),
        p99,
        values.last().copied().unwrap_or(f64::NAN)
    );
    p99
}

fn main() -> anyhow::Result<()> {
    // The in-process sandbox probes its document converter at start-up by running this executable
    // with the converter's marker: convert and exit here, or each probe starts the whole bench again
    // (which probes again, a chain of processes that outlives the bench).
    antler_sandbox::convert::worker::run_if_requested();
    if let Some(addr) = client_process::client_addr() {
        return client_main(&addr);
    }
    let runs: usize =
        std::env::var("BENCH_RUNS").ok().map(|v| v.parse().context("BENCH_RUNS must be a number")).transpose()?.unwrap_or(200);
    let services = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bench-server").enable_all().build()?;
    let db = services.block_on(services::database())?;
    let url = services::url(&db);
    let server = services.block_on(Server::start("subagent_spawn", &url, RUNS_EXTRA, &models_yaml()))?;
    let result = bench(runs, &url, server.addr);
    services.block_on(server.stop())?;
    drop(db);
    result
}

/// The client process: `run` makes one run and answers one line.
fn client_main(addr: &str) -> anyhow::Result<()> {
    let (runtime, channel) = client_process::connect(addr)?;
    let client = RunServiceClient::new(channel);
    client_process::serve(|request| {
        if request != "run" {
            bail!("unknown request {request:?}");
        }
        Ok(vec![runtime.block_on(one_run(client.clone()))?.to_line()])
    })
}

fn run(client: &mut client_process::ClientProcess) -> anyhow::Result<Observed> {
    match &client.request("run")?[..] {
        [line] => Observed::from_line(line),
        lines => bail!("expected one line from the client, got {}", lines.len()),
    }
}

fn bench(runs: usize, url: &str, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let backend = if url.is_empty() { "SQLite" } else { "PostgreSQL" };
    let mut client = client_process::ClientProcess::spawn(addr)?;
    println!(
        "subagent spawn latency: {backend}, in-process runs + models (replay, zero latency) + sandbox on 2 tokio workers, the client in a separate process"
    );
    for _ in 0..3 {
        run(&mut client)?;
    }
    let mut all = Vec::with_capacity(runs);
    let started = Instant::now();
    for _ in 0..runs {
        let observed = run(&mut client)?;
        if std::env::var_os("BENCH_SLOW").is_some() && observed.start > GOAL_P99_MS {
            eprintln!("slow spawn: {observed:?}");
        }
        all.push(observed);
    }
    client.finish()?;
    println!("{runs} sequential runs (each: write_todos, one task, an answer) in {:.2} s", started.elapsed().as_secs_f64());
    let baseline = summary("baseline: no-op tool", all.iter().map(|o| o.baseline).collect());
    let start = summary("spawn -> child START", all.iter().map(|o| o.start).collect());
    summary("spawn -> first child STEP", all.iter().map(|o| o.first_step).collect());
    summary("spawn -> child END", all.iter().map(|o| o.end).collect());
    println!(
        "spawn -> first child event p99 {start:.3} ms ({:.1}x the no-op tool's p99), goal < {GOAL_P99_MS} ms: {}",
        start / baseline,
        if start < GOAL_P99_MS { "met" } else { "NOT met" }
    );
    Ok(())
}
