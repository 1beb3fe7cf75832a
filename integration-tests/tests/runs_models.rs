//! The model allowlist at admission: names come from the models service; an unknown name is
//! INVALID_ARGUMENT listing the valid ones; an unreachable models service is UNAVAILABLE and nothing
//! is written.

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, start};
use antler_proto::runs::*;
use serde_json::json;
use tonic::Code;

const MODELS: &str = "models:\n  models:\n    - name: demo\n      provider: replay\n      replay:\n        turns:\n          - text: hi\n";

#[tokio::test]
async fn unknown_models_are_refused_with_the_valid_names() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start("antler", Launch::new(["up"]).config(format!("{}{MODELS}", config(&db, ""))))?;
    let (mut runs, mut threads) = clients(&server).await?;
    let mut request = run_request("", json!([{"say": "x"}]));
    request.config = Some(RunConfig { model_name: "gpt-nonexistent".into(), ..Default::default() });
    let status = runs.create_run(authed(request, ALICE)).await.err().ok_or_else(|| anyhow::anyhow!("unknown model admitted"))?;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("config.model_name") && status.message().contains("demo"), "{}", status.message());

    let mut request = run_request("", json!([{"say": "x"}]));
    request.config = Some(RunConfig { model_name: "demo".into(), ..Default::default() });
    let run = runs.create_run(authed(request, ALICE)).await?.into_inner().run.unwrap_or_default();
    assert_eq!(run.model_name, "demo");
    assert_eq!(
        threads.list_threads(authed(ListThreadsRequest::default(), ALICE)).await?.into_inner().threads.len(),
        1,
        "only the admitted run made a thread"
    );
    Ok(())
}

#[tokio::test]
async fn an_unreachable_models_service_is_unavailable_and_writes_nothing() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Sqlite).await?;
    // Port 1 on loopback: nothing listens there.
    let yaml = config(&db, "").replace(
        "clients:\n",
        "clients:\n  models:\n    endpoint: http://127.0.0.1:1\n    retries: 1\n    backoff_base_ms: 10\n    backoff_max_ms: 20\n",
    );
    let server = start("antler-runs", Launch::default().config(yaml))?;
    let (mut runs, mut threads) = clients(&server).await?;
    let mut request = run_request("", json!([{"say": "x"}]));
    request.config = Some(RunConfig { model_name: "demo".into(), ..Default::default() });
    let status =
        runs.create_run(authed(request, ALICE)).await.err().ok_or_else(|| anyhow::anyhow!("admitted without checking the model"))?;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.metadata().get("retry-after").is_some());
    assert!(threads.list_threads(authed(ListThreadsRequest::default(), ALICE)).await?.into_inner().threads.is_empty(), "nothing written");
    Ok(())
}
