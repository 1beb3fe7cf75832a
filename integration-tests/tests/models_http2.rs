//! The models service on an HTTP/2 upstream: with `http2_prior_knowledge` (h2c) the lead runs' model
//! calls are streams on one shared connection, not a connection each as over HTTP/1.1 — the case of
//! OpenAI and Anthropic, which negotiate HTTP/2 over TLS. Both protocols carry the same runs to SUCCESS.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Select, Turn};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, start};
use antler_proto::runs::RunStatus;

const RUNS: usize = 12;

/// Starts RUNS lead runs at once on a slow model, waits until every one has its model stream open, and
/// returns how many connections the double had accepted by then; then lets them all finish.
async fn connections_for_concurrent_runs(double: &LlmDouble, models: &str) -> anyhow::Result<usize> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start("antler", Launch::new(["up"]).config(agent_config(&db, models, "")))?;
    let (runs, _) = clients(&server).await?;
    let mut ids = Vec::new();
    for _ in 0..RUNS {
        let mut runs = runs.clone();
        ids.push(runs.create_run(authed(prompt_request("", "hi"), ALICE)).await?.into_inner().run.unwrap_or_default().run_id);
    }
    // Every run has streamed its first delta: all RUNS model calls are open at once.
    for id in &ids {
        let mut runs = runs.clone();
        wait_run(&mut runs, ALICE, id, Duration::from_secs(60), |r| r.last_seq >= 3).await?;
    }
    let open = double.requests().len();
    anyhow::ensure!(open == RUNS, "{open} model calls made for {RUNS} runs");
    let connections = double.connections();
    for id in &ids {
        let mut runs = runs.clone();
        let run = wait_run(&mut runs, ALICE, id, Duration::from_secs(60), |r| r.status() == RunStatus::Success).await?;
        anyhow::ensure!(run.status() == RunStatus::Success, "{run:?}");
    }
    Ok(connections)
}

#[tokio::test]
async fn model_calls_share_one_http2_connection_and_take_one_each_over_http1() -> anyhow::Result<()> {
    // Six chunks, 300 ms apart: the calls overlap for well over a second.
    let turn = || Turn::text("a slow answer in a few pieces, forty chars").slow(300);
    let h2 = LlmDouble::start_h2(vec![turn()], AfterLast::Repeat, Select::ByHistory, 100).await?;
    let shared = connections_for_concurrent_runs(&h2, &h2.models_yaml_h2()).await?;
    assert_eq!(shared, 1, "{RUNS} concurrent model calls over HTTP/2 use one connection");
    assert_eq!(h2.aborted(), 0);

    let h1 = LlmDouble::start_with(vec![turn()], AfterLast::Repeat, Select::ByHistory).await?;
    let separate = connections_for_concurrent_runs(&h1, &h1.models_yaml()).await?;
    assert_eq!(separate, RUNS, "over HTTP/1.1 each call in flight has a connection of its own");
    Ok(())
}
