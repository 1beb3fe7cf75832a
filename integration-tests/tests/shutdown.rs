//! SIGTERM: health turns NOT_SERVING on open watch streams, then the process drains and exits 0
//! within `server.shutdown_grace_secs`.

use std::time::{Duration, Instant};

use antler_integration_tests::{Launch, start};
use tokio_stream::StreamExt;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

#[tokio::test]
async fn sigterm_drains_an_open_stream_and_exits_zero_within_the_deadline() -> anyhow::Result<()> {
    let grace = Duration::from_secs(2);
    let mut process = start("antler", Launch::new(["up"]).config(format!("server:\n  shutdown_grace_secs: {}\n", grace.as_secs())))?;
    let mut watch = HealthClient::new(process.channel().await?).watch(HealthCheckRequest { service: String::new() }).await?.into_inner();
    let first = watch.next().await.ok_or_else(|| anyhow::anyhow!("watch ended"))??;
    assert_eq!(first.status(), ServingStatus::Serving);

    let signalled = Instant::now();
    process.signal(libc::SIGTERM)?;
    let next = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await?
        .ok_or_else(|| anyhow::anyhow!("watch ended before NOT_SERVING"))??;
    assert_eq!(next.status(), ServingStatus::NotServing, "the open stream is told the server is draining");

    let status = process.wait_exit(grace + Duration::from_secs(5))?;
    let elapsed = signalled.elapsed();
    assert!(status.is_some_and(|s| s.success()), "exit status {status:?}\n{}", process.stderr());
    assert!(elapsed < grace + Duration::from_secs(5), "took {elapsed:?}");
    // The stream was held open (drained), not cut at the signal.
    assert!(elapsed >= grace - Duration::from_millis(200), "exited after {elapsed:?}, before the grace period");
    Ok(())
}

/// `server.health_listen`: a plaintext listener with the main listener's health statuses (SERVING,
/// then NOT_SERVING from the signal on), serving nothing else.
#[tokio::test]
async fn the_health_only_listener_follows_the_server_and_serves_nothing_else() -> anyhow::Result<()> {
    // A free port for the second listener (the main one is picked by the binary).
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let config = format!("server:\n  shutdown_grace_secs: 2\n  health_listen: 127.0.0.1:{port}\n");
    let process = start("antler", Launch::new(["up"]).config(config))?;
    // Bound as serving starts, just after the ready line: a probe retries, and so does this.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let channel = loop {
        match endpoint.connect().await {
            Ok(channel) => break channel,
            Err(error) if Instant::now() > deadline => anyhow::bail!("no health-only listener: {error}\n{}", process.stderr()),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let mut health = HealthClient::new(channel.clone());
    let runs = HealthCheckRequest { service: "antler.runs.v1.RunService".to_owned() };
    assert_eq!(health.check(runs.clone()).await?.into_inner().status(), ServingStatus::Serving, "{}", process.stderr());
    let mut watch = health.watch(HealthCheckRequest { service: String::new() }).await?.into_inner();
    let first = watch.next().await.ok_or_else(|| anyhow::anyhow!("watch ended"))??;
    assert_eq!(first.status(), ServingStatus::Serving);

    // Nothing but health: RunService there is UNIMPLEMENTED (its requests never reach the runs service).
    let mut other = antler_proto::runs::run_service_client::RunServiceClient::new(channel);
    let refused = other.get_run(antler_proto::runs::GetRunRequest { run_id: "r".to_owned(), ..Default::default() }).await;
    assert_eq!(refused.err().map(|s| s.code()), Some(tonic::Code::Unimplemented));

    process.signal(libc::SIGTERM)?;
    let next = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await?
        .ok_or_else(|| anyhow::anyhow!("watch ended before NOT_SERVING"))??;
    assert_eq!(next.status(), ServingStatus::NotServing, "draining shows on the health-only listener too");
    Ok(())
}
