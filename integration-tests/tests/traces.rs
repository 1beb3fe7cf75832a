//! OTLP export (`server.tracing`): one lead run of `antler up` is one trace whose `run` span is the
//! ancestor of the models and sandbox calls it made, received by a stand-in collector over gRPC and
//! over HTTP.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call};
use antler_integration_tests::otlp::{Collector, ExportedSpan};
use antler_integration_tests::runs::*;
use antler_integration_tests::tls::{Ca, LOCAL_NAMES};
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

/// `tls` adds lines under `server.tracing` (each indented by four spaces).
async fn one_lead_run_is_one_trace(collector: Collector, protocol: &str, tls: &str) -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![Turn::tools("", vec![call("c1", "bash", json!({"description": "greet", "command": "echo traced"}))]), Turn::text("Done.")],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let tracing = format!(
        "server:\n  tracing:\n    otlp_endpoint: {}\n    otlp_protocol: {protocol}\n    batch_delay_ms: 100\n{tls}",
        collector.endpoint
    );
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
    one_lead_run_is_one_trace(Collector::grpc().await?, "grpc", "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lead_run_is_one_trace_over_otlp_http() -> anyhow::Result<()> {
    one_lead_run_is_one_trace(Collector::http().await?, "http", "").await
}

/// `server.tracing.tls`: a collector over gRPC with TLS that also asks for a client certificate
/// (mTLS), its CA and the client's certificate generated now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lead_run_is_one_trace_over_otlp_grpc_with_mutual_tls() -> anyhow::Result<()> {
    let ca = Ca::new("collector CA")?;
    let server = ca.issue("collector", &LOCAL_NAMES)?;
    let client = ca.issue("antler", &["antler"])?;
    let tls = format!("    tls:\n      ca: {:?}\n      cert: {:?}\n      key: {:?}\n", ca.cert, client.cert, client.key);
    one_lead_run_is_one_trace(Collector::grpc_tls(&server, Some(&ca)).await?, "grpc", &tls).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lead_run_is_one_trace_over_otlp_http_with_tls() -> anyhow::Result<()> {
    let ca = Ca::new("collector CA")?;
    let server = ca.issue("collector", &LOCAL_NAMES)?;
    let tls = format!("    tls:\n      ca: {:?}\n", ca.cert);
    one_lead_run_is_one_trace(Collector::http_tls(&server).await?, "http", &tls).await
}

/// Without the collector's CA the handshake fails: no span arrives, and the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_with_an_unknown_ca_receives_nothing() -> anyhow::Result<()> {
    let ca = Ca::new("collector CA")?;
    let other = Ca::new("another CA")?;
    let collector = Collector::grpc_tls(&ca.issue("collector", &LOCAL_NAMES)?, None).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let tracing = format!(
        "server:\n  tracing:\n    otlp_endpoint: {}\n    batch_delay_ms: 100\n    export_timeout_ms: 1000\n    tls:\n      ca: {:?}\n",
        collector.endpoint, other.cert
    );
    let server = start("antler-runs", Launch::default().config(config(&db, "").replacen("server:\n", &tracing, 1)))?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, run_request("", json!([{"say": "hi"}])), T).await?;
    assert_eq!(run.status(), RunStatus::Success);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(collector.spans().is_empty(), "spans crossed an untrusted TLS connection");
    Ok(())
}
