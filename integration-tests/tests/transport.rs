//! Limits and tracing on the wire: message size caps and W3C trace context.

use antler_integration_tests::{Launch, start};
use antler_proto::runs::{GetRunRequest, run_service_client::RunServiceClient};
use tonic::Code;

#[tokio::test]
async fn oversized_messages_are_refused_with_the_limit() -> anyhow::Result<()> {
    let process = start("antler", Launch::new(["up"]).config("server:\n  max_message_bytes: 2048\n"))?;
    let request = GetRunRequest { run_id: "x".repeat(8 * 1024), ..GetRunRequest::default() };
    let status = match RunServiceClient::new(process.channel().await?).get_run(request).await {
        Ok(_) => anyhow::bail!("an 8 KiB request passed a 2 KiB limit"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("2048"), "{}", status.message());
    Ok(())
}

#[tokio::test]
async fn the_callers_trace_id_appears_in_the_request_span() -> anyhow::Result<()> {
    let process = start(
        "antler",
        Launch::new(["up"]).config("server:\n  log:\n    filter: antler_kit=debug\n  auth:\n    enabled: true\n    api_keys:\n      - key: trace-test-key-0123456789\n        user: t\n"),
    )?;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut request = tonic::Request::new(GetRunRequest::default());
    request.metadata_mut().insert("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01").parse()?);
    let status = RunServiceClient::new(process.channel().await?).get_run(request).await.err();
    assert_eq!(status.map(|s| s.code()), Some(Code::Unauthenticated));
    // The refusal is logged inside the request's span, which carries the caller's trace id.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let logs = process.stderr();
        if logs.contains("request refused by authentication") && logs.lines().any(|l| l.contains("request refused") && l.contains(trace_id))
        {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("no log line with trace id {trace_id}:\n{logs}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
