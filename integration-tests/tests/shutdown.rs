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
