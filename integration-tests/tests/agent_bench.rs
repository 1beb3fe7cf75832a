//! Per-step cost of the lead agent loop, measured through the real binaries (`antler up`) with a
//! zero-latency model double and a no-op tool (`write_todos`). Ignored by default; run with
//! `cargo test -p antler-integration-tests --test agent_bench -- --ignored --nocapture`.
//!
//! A step is one model call or one tool round; its time is the gap between the VALUES events of
//! consecutive checkpoints (server clock). With a model that answers at once and a tool that does
//! nothing, that gap is an upper bound of the loop's overhead: it still contains the models
//! service, the HTTP round trip to the double and the event and checkpoint writes.

use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Select, Turn, call};
use antler_integration_tests::runs::*;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{RunConfig, RunStatus};
use serde_json::json;

const T: Duration = Duration::from_secs(600);
/// Model turns per run: 9 with a tool call, then the answer (19 steps).
const TURNS: usize = 10;

fn script() -> Vec<Turn> {
    let mut turns: Vec<Turn> = (0..TURNS - 1)
        .map(|i| {
            Turn::tools(
                "",
                vec![call(&format!("t{i}"), "write_todos", json!({"todos": [{"content": format!("step {i}"), "status": "completed"}]}))],
            )
        })
        .collect();
    turns.push(Turn::text("done"));
    turns
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn millis(t: &Option<prost_types::Timestamp>) -> f64 {
    t.as_ref().map(|t| t.seconds as f64 * 1000.0 + f64::from(t.nanos) / 1e6).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly"]
async fn step_overhead_and_concurrent_throughput() -> anyhow::Result<()> {
    let double = LlmDouble::start_with(script(), AfterLast::Refuse, Select::ByHistory).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "  max_concurrent_runs: 128\n", None)?;
    let (runs, _) = clients(&server).await?;
    let request = || {
        let mut request = prompt_request("", "Do ten steps");
        request.config = Some(RunConfig { plan_mode: true, ..Default::default() });
        request
    };

    for (label, concurrency, count) in [("sequential", 1usize, 20usize), ("concurrent", 100, 100)] {
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let per_task = count / concurrency;
        for _ in 0..concurrency {
            let mut runs = runs.clone();
            tasks.spawn(async move {
                let started = Instant::now();
                let mut ids = Vec::new();
                for _ in 0..per_task {
                    let run = runs.create_run(authed(request(), ALICE)).await?.into_inner().run.unwrap_or_default();
                    // Poll gently: a hundred clients polling every 25 ms would measure the polling.
                    let run = loop {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        let get = antler_proto::runs::GetRunRequest { run_id: run.run_id.clone(), ..Default::default() };
                        let seen = runs.get_run(authed(get, ALICE)).await?.into_inner().run.unwrap_or_default();
                        if is_terminal(&seen) {
                            break seen;
                        }
                        anyhow::ensure!(started.elapsed() < T, "run {} did not finish", seen.run_id);
                    };
                    anyhow::ensure!(run.status() == RunStatus::Success, "{:?}", run.error);
                    ids.push(run.run_id);
                }
                Ok::<_, anyhow::Error>(ids)
            });
        }
        let mut ids = Vec::new();
        while let Some(done) = tasks.join_next().await {
            ids.extend(done??);
        }
        let elapsed = started.elapsed();
        let mut runs = runs.clone();
        let mut steps = Vec::new();
        for id in &ids {
            let events = run_events(&mut runs, ALICE, id).await?;
            let times: Vec<f64> = events.iter().filter(|e| matches!(e.kind, Some(Kind::Values(_)))).map(|e| millis(&e.time)).collect();
            steps.extend(times.windows(2).map(|w| w[1] - w[0]));
        }
        steps.sort_by(|a, b| a.total_cmp(b));
        println!(
            "{label}: {} runs × {} steps in {:.2} s = {:.1} runs/s; per-step wall time p50 {:.2} ms, p99 {:.2} ms",
            ids.len(),
            2 * TURNS - 1,
            elapsed.as_secs_f64(),
            ids.len() as f64 / elapsed.as_secs_f64(),
            percentile(&steps, 0.5),
            percentile(&steps, 0.99),
        );
    }
    Ok(())
}
