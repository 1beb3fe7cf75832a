//! Per-step runtime overhead of the lead agent: everything `antler up` runs (runs, models, sandbox
//! services, SQLite by default) in this process, a zero-latency model (the `replay` provider with no
//! delays, one chunk per answer) and a no-op tool (`write_todos`, which only updates the plan).
//!
//! A run is 10 model turns: 9 that call `write_todos`, then the answer — 19 steps (each model call and
//! each tool round is one). A step's wall time is the gap between the client's receipt of two
//! consecutive checkpoint (VALUES) events of a StreamRun; its overhead is that minus the model time
//! (the models service's own request duration, `antler_model_request_duration_seconds`) or minus the
//! tool time (ToolFinished.duration). The gRPC hops to the models and sandbox services, event and
//! checkpoint writes and the middlewares all count as overhead. The client is a separate process (this
//! binary run again, see `common/client_process.rs`): run by run, the server side pairs the steps it
//! reports with the model times recorded here.
//!
//! Run: `cargo bench -p antler --bench agent_step`. Environment: `BENCH_RUNS` (sequential runs, default
//! 200), `BENCH_CONCURRENT` (runs at once in the second part, default 100), `BENCH_DATABASE_URL` (a
//! `postgres://` URL to measure PostgreSQL instead of SQLite; the bench creates and drops a database),
//! `BENCH_SLOW` (print every sequential step over 4 ms, to look for periodic stalls).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{CreateRunRequest, RunConfig, RunStatus, StreamRunRequest};
use anyhow::{Context, anyhow, bail};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

#[path = "common/client_process.rs"]
mod client_process;
#[path = "common/services.rs"]
mod services;

use services::{Server, percentile};

/// Model turns per run (the last one answers).
const TURNS: usize = 10;
/// The goal for the p99 overhead per step.
const GOAL_P99_MS: f64 = 2.0;

/// Keeps the models service's request durations, in order; drops every other metric.
#[derive(Default, Clone)]
struct ModelTimes(Arc<Mutex<VecDeque<f64>>>);

struct Push(Arc<Mutex<VecDeque<f64>>>);

impl metrics::HistogramFn for Push {
    fn record(&self, value: f64) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push_back(value);
    }
}

impl metrics::Recorder for ModelTimes {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        if key.name() == "antler_model_request_duration_seconds" {
            metrics::Histogram::from_arc(Arc::new(Push(self.0.clone())))
        } else {
            metrics::Histogram::noop()
        }
    }
}

impl ModelTimes {
    fn take(&self) -> Option<f64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
    }

    fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// The replay script: nine plan updates, then the answer.
fn models_yaml() -> String {
    let mut turns = String::new();
    for i in 0..TURNS - 1 {
        turns.push_str(&format!(
            "          - tool_calls:\n              - {{id: t{i}, name: write_todos, arguments: {{todos: [{{content: \"step {i}\", status: completed}}]}}}}\n            usage: {{input_tokens: 100, output_tokens: 10}}\n"
        ));
    }
    turns.push_str("          - text: done\n            usage: {input_tokens: 100, output_tokens: 1}\n");
    format!(
        "models:\n  - name: zero\n    provider: replay\n    replay:\n      chunk_chars: 65536\n      after_last: cycle\n      turns:\n{turns}"
    )
}

/// What one run showed the client.
struct Observed {
    /// Per step: wall time and the tool time inside it (None for a model step).
    steps: Vec<(Duration, Option<Duration>)>,
    wall: Duration,
}

impl Observed {
    /// One line of the client's answer: milliseconds.
    fn to_line(&self) -> String {
        let steps: Vec<_> =
            self.steps.iter().map(|(wall, tool)| json!([wall.as_secs_f64() * 1e3, tool.map(|t| t.as_secs_f64() * 1e3)])).collect();
        json!({"steps": steps, "wall_ms": self.wall.as_secs_f64() * 1e3}).to_string()
    }

    fn from_line(line: &str) -> anyhow::Result<Self> {
        let value: serde_json::Value = serde_json::from_str(line).with_context(|| format!("client line {line:?}"))?;
        let ms = |v: &serde_json::Value| v.as_f64().map(|ms| Duration::from_secs_f64(ms / 1e3));
        let steps = value["steps"]
            .as_array()
            .ok_or_else(|| anyhow!("no steps in {line:?}"))?
            .iter()
            .map(|step| Ok((ms(&step[0]).ok_or_else(|| anyhow!("bad step in {line:?}"))?, ms(&step[1]))))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self { steps, wall: ms(&value["wall_ms"]).ok_or_else(|| anyhow!("no wall_ms in {line:?}"))? })
    }
}

async fn one_run(mut client: RunServiceClient<Channel>) -> anyhow::Result<Observed> {
    let create = CreateRunRequest {
        input: vec![Message {
            role: Role::User as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: "Do ten steps".to_owned() })) }],
            ..Message::default()
        }],
        config: Some(RunConfig { plan_mode: true, ..Default::default() }),
        ..CreateRunRequest::default()
    };
    let started = Instant::now();
    let mut stream = client.stream_run(StreamRunRequest { create: Some(create) }).await?.into_inner();
    let mut last_checkpoint: Option<Instant> = None;
    let mut tool_time: Option<Duration> = None;
    let mut steps = Vec::with_capacity(2 * TURNS);
    let mut status = RunStatus::Unspecified;
    while let Some(item) = stream.next().await {
        let Some(kind) = item?.event.and_then(|e| e.kind) else { continue };
        let now = Instant::now();
        match kind {
            Kind::ToolFinished(t) => {
                let d = t.duration.map(|d| Duration::new(d.seconds as u64, d.nanos as u32)).unwrap_or_default();
                tool_time = Some(tool_time.unwrap_or_default() + d);
            }
            Kind::Values(_) => {
                if let Some(previous) = last_checkpoint {
                    steps.push((now - previous, tool_time.take()));
                }
                tool_time = None;
                last_checkpoint = Some(now);
            }
            Kind::End(end) => status = end.status(),
            _ => {}
        }
    }
    if status != RunStatus::Success {
        bail!("a run ended {status:?}");
    }
    Ok(Observed { steps, wall: started.elapsed() })
}

fn env_usize(name: &str, default: usize) -> anyhow::Result<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().with_context(|| format!("{name} must be a number")))
        .transpose()
        .map(|v| v.unwrap_or(default))
}

fn main() -> anyhow::Result<()> {
    // The in-process sandbox probes its document converter at start-up by running this executable
    // with the converter's marker: convert and exit here, or each probe starts the whole bench again
    // (which probes again, a chain of processes that outlives the bench).
    antler_sandbox::convert::worker::run_if_requested();
    if let Some(addr) = client_process::client_addr() {
        return client_main(&addr);
    }
    let times = ModelTimes::default();
    metrics::set_global_recorder(times.clone()).map_err(|e| anyhow!("metrics recorder: {e}"))?;
    // The services on one runtime (2 workers, as `antler up` on this machine); the client in its own
    // process; this thread only pairs what the client saw with the model times.
    let services = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bench-server").enable_all().build()?;
    let db = services.block_on(services::database())?;
    let url = services::url(&db);
    let server = services.block_on(Server::start("agent_step", &url, "", &models_yaml()))?;
    let result = bench(times, &url, server.addr);
    services.block_on(server.stop())?;
    drop(db);
    result
}

/// The client process: `run` (one run, one line) and `concurrent N` (N runs at once, a line each).
fn client_main(addr: &str) -> anyhow::Result<()> {
    let (runtime, channel) = client_process::connect(addr)?;
    let client = RunServiceClient::new(channel);
    client_process::serve(|request| {
        runtime.block_on(async {
            match request.split_once(' ') {
                None if request == "run" => Ok(vec![one_run(client.clone()).await?.to_line()]),
                Some(("concurrent", n)) => {
                    let mut tasks = tokio::task::JoinSet::new();
                    for _ in 0..n.parse::<usize>()? {
                        tasks.spawn(one_run(client.clone()));
                    }
                    let mut lines = Vec::new();
                    while let Some(done) = tasks.join_next().await {
                        lines.push(done??.to_line());
                    }
                    Ok(lines)
                }
                _ => bail!("unknown request {request:?}"),
            }
        })
    })
}

fn one_line(lines: Vec<String>) -> anyhow::Result<Observed> {
    match &lines[..] {
        [line] => Observed::from_line(line),
        _ => bail!("expected one line from the client, got {}", lines.len()),
    }
}

fn bench(times: ModelTimes, url: &str, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let sequential = env_usize("BENCH_RUNS", 200)?;
    let concurrent = env_usize("BENCH_CONCURRENT", 100)?;
    let backend = if url.is_empty() { "SQLite" } else { "PostgreSQL" };
    let mut client = client_process::ClientProcess::spawn(addr)?;
    println!(
        "lead agent per-step overhead: {backend}, in-process runs + models (replay, zero latency) + sandbox on 2 tokio workers, the client in a separate process"
    );
    println!("each run: {TURNS} model turns, {} write_todos rounds = {} steps", TURNS - 1, 2 * TURNS - 1);

    // Warm-up: connections, prepared statements, the replay script.
    for _ in 0..3 {
        one_line(client.request("run")?)?;
    }
    times.clear();

    // Sequential runs: each model step's model time is the next recorded model request duration.
    let mut overhead = Vec::new();
    let mut wall = Vec::new();
    let (mut model_steps, mut tool_steps) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for _ in 0..sequential {
        let observed = one_line(client.request("run")?)?;
        // The first model call precedes the first checkpoint: its sample has no step.
        times.take();
        for (index, (step, tool)) in observed.steps.into_iter().enumerate() {
            if std::env::var_os("BENCH_SLOW").is_some() && step > Duration::from_millis(4) {
                eprintln!("slow step {index} ({}) {:?}", if tool.is_some() { "tool" } else { "model" }, step);
            }
            let spent = match tool {
                Some(tool) => tool.as_secs_f64(),
                None => times.take().unwrap_or(0.0),
            };
            let step_overhead = (step.as_secs_f64() - spent).max(0.0) * 1e3;
            wall.push(step.as_secs_f64() * 1e3);
            overhead.push(step_overhead);
            if tool.is_some() { tool_steps.push(step_overhead) } else { model_steps.push(step_overhead) }
        }
        times.clear();
    }
    let elapsed = started.elapsed();
    model_steps.sort_by(f64::total_cmp);
    tool_steps.sort_by(f64::total_cmp);
    overhead.sort_by(f64::total_cmp);
    wall.sort_by(f64::total_cmp);
    println!(
        "sequential: {sequential} runs in {:.2} s ({:.1} runs/s); per step: wall p50 {:.3} ms p99 {:.3} ms; overhead (wall − model − tool) p50 {:.3} ms p99 {:.3} ms, goal p99 < {GOAL_P99_MS} ms: {}",
        elapsed.as_secs_f64(),
        sequential as f64 / elapsed.as_secs_f64(),
        percentile(&wall, 0.5),
        percentile(&wall, 0.99),
        percentile(&overhead, 0.5),
        percentile(&overhead, 0.99),
        if percentile(&overhead, 0.99) < GOAL_P99_MS { "met" } else { "NOT met" }
    );

    println!(
        "  model steps: overhead p50 {:.3} ms p99 {:.3} ms max {:.3} ms; tool steps: p50 {:.3} ms p99 {:.3} ms max {:.3} ms",
        percentile(&model_steps, 0.5),
        percentile(&model_steps, 0.99),
        model_steps.last().copied().unwrap_or(f64::NAN),
        percentile(&tool_steps, 0.5),
        percentile(&tool_steps, 0.99),
        tool_steps.last().copied().unwrap_or(f64::NAN),
    );

    // Concurrent runs: throughput and per-step wall time under load.
    let started = Instant::now();
    let answers = client.request(&format!("concurrent {concurrent}"))?;
    let elapsed = started.elapsed();
    client.finish()?;
    let mut steps = Vec::new();
    let mut run_walls = Vec::new();
    for line in answers {
        let observed = Observed::from_line(&line)?;
        run_walls.push(observed.wall.as_secs_f64());
        steps.extend(observed.steps.into_iter().map(|(d, _)| d.as_secs_f64() * 1e3));
    }
    steps.sort_by(f64::total_cmp);
    run_walls.sort_by(f64::total_cmp);
    println!(
        "concurrent: {concurrent} runs at once in {:.2} s = {:.1} runs/s ({:.0} steps/s); per-step wall p50 {:.2} ms p99 {:.2} ms; run wall p50 {:.2} s",
        elapsed.as_secs_f64(),
        concurrent as f64 / elapsed.as_secs_f64(),
        steps.len() as f64 / elapsed.as_secs_f64(),
        percentile(&steps, 0.5),
        percentile(&steps, 0.99),
        percentile(&run_walls, 0.5),
    );
    Ok(())
}
