//! OTLP export (`server.tracing`): one lead run of `antler up` is one trace whose `run` span is the
//! ancestor of the models and sandbox calls it made, received by a stand-in collector over gRPC and
//! over HTTP.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call};
use antler_integration_tests::otlp::{Collector, ExportedSpan};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, start};
use antler_proto::runs::RunStatus;
use serde_json::json;

const T: Duration = Duration::from_secs(60);

/// Whether `span` has `ancestor` among its parents (within the spans received).
fn descends_from(span: &ExportedSpan, ancestor: &ExportedSpan, by_id: &HashMap<&str, &ExportedSpan>) -> bool {
    let mut current = span;
    for _ in 0..64 {
        if current.parent_span_id == ancestor.span_id {
            return true;
        }
        match by_id.get(current.parent_span_id.as_str()) {
            Some(parent) => current = parent,
            None => return false,
        }
    }
    false
}

async fn one_lead_run_is_one_trace(collector: Collector, protocol: &str) -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![Turn::tools("", vec![call("c1", "bash", json!({"description": "greet", "command": "echo traced"}))]), Turn::text("Done.")],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let tracing =
        format!("server:\n  tracing:\n    otlp_endpoint: {}\n    otlp_protocol: {protocol}\n    batch_delay_ms: 100\n", collector.endpoint);
    let yaml = agent_config(&db, &double.models_yaml(), "").replacen("server:\n", &tracing, 1);
    let server = start("antler", Launch::new(["up"]).config(yaml))?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, prompt_request("", "Say hello"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());

    // The run's span closes after its finalization; the exporter sends it within a batch delay.
    let deadline = Instant::now() + T;
    let (spans, root) = loop {
        let spans = collector.spans();
        if let Some(root) = spans.iter().find(|s| s.name == "run" && s.attribute("run_id") == Some(run.run_id.as_str())).cloned() {
            let in_trace = |service: &str| spans.iter().any(|s| s.trace_id == root.trace_id && s.attribute("rpc.service") == Some(service));
            if in_trace("antler.models.v1.ModelService") && in_trace("antler.sandbox.v1.SandboxService") {
                break (spans, root);
            }
        }
        if Instant::now() > deadline {
            anyhow::bail!("no complete trace of run {} arrived; received {:#?}\n{}", run.run_id, collector.spans(), server.stderr());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(root.parent_span_id, "", "a run's span is the root of its trace");
    assert_eq!(root.service, "antler");
    let trace: Vec<&ExportedSpan> = spans.iter().filter(|s| s.trace_id == root.trace_id).collect();
    let by_id: HashMap<&str, &ExportedSpan> = trace.iter().map(|s| (s.span_id.as_str(), *s)).collect();
    let calls = |service: &str, method: &str| {
        trace
            .iter()
            .filter(|s| s.name == "rpc" && s.attribute("rpc.service") == Some(service) && s.attribute("rpc.method") == Some(method))
            .copied()
            .collect::<Vec<_>>()
    };
    let model_calls = calls("antler.models.v1.ModelService", "ChatStream");
    assert_eq!(model_calls.len(), 2, "one per turn: {trace:#?}");
    let execs = calls("antler.sandbox.v1.SandboxService", "ExecuteCommand");
    assert_eq!(execs.len(), 1, "{trace:#?}");
    for span in model_calls.iter().chain(&execs) {
        assert!(descends_from(span, &root, &by_id), "{span:#?} is not inside the run's span");
    }
    let creates: Vec<&ExportedSpan> = spans.iter().filter(|s| s.attribute("rpc.method") == Some("CreateRun")).collect();
    assert!(creates.iter().all(|s| s.trace_id != root.trace_id), "the client's CreateRun is its own trace");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lead_run_is_one_trace_over_otlp_grpc() -> anyhow::Result<()> {
    one_lead_run_is_one_trace(Collector::grpc().await?, "grpc").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lead_run_is_one_trace_over_otlp_http() -> anyhow::Result<()> {
    one_lead_run_is_one_trace(Collector::http().await?, "http").await
}
