//! Every binary serves its services with health and reflection (v1 and v1alpha).

use antler_integration_tests::{ALL_SERVICES, Launch, health, reflection_list, start};
use tonic_health::pb::health_check_response::ServingStatus;

async fn assert_serves(binary: &str, launch: Launch, expected: &[&str]) -> anyhow::Result<()> {
    let process = start(binary, launch)?;
    for v1alpha in [false, true] {
        let listed = reflection_list(process.channel().await?, v1alpha).await?;
        for name in expected.iter().chain(&["grpc.health.v1.Health"]) {
            assert!(listed.iter().any(|s| s == name), "{binary} (v1alpha={v1alpha}) does not list {name}: {listed:?}");
        }
    }
    assert_eq!(health(process.channel().await?, "").await?, ServingStatus::Serving);
    for name in expected {
        assert_eq!(health(process.channel().await?, name).await?, ServingStatus::Serving, "{binary}: {name}");
    }
    Ok(())
}

#[tokio::test]
async fn antler_up_serves_every_service() -> anyhow::Result<()> {
    assert_serves("antler", Launch::new(["up"]), &ALL_SERVICES).await
}

#[tokio::test]
async fn each_service_binary_serves_its_own_services() -> anyhow::Result<()> {
    assert_serves("antler-runs", Launch::default(), &ALL_SERVICES[..2]).await?;
    assert_serves("antler-sandbox", Launch::default(), &ALL_SERVICES[2..4]).await?;
    assert_serves("antler-mcp", Launch::default(), &["antler.mcp.v1.McpService"]).await?;
    assert_serves("antler-models", Launch::default(), &["antler.models.v1.ModelService"]).await?;
    assert_serves("antler-memory", Launch::default(), &["antler.memory.v1.MemoryService"]).await
}

#[tokio::test]
async fn antler_serve_mounts_only_the_named_service() -> anyhow::Result<()> {
    let process = start("antler", Launch::new(["serve", "models"]))?;
    let listed = reflection_list(process.channel().await?, false).await?;
    assert!(listed.iter().any(|s| s == "antler.models.v1.ModelService"), "{listed:?}");
    assert!(!listed.iter().any(|s| s == "antler.runs.v1.RunService"), "{listed:?}");
    // An unmounted service is unknown to health, not SERVING.
    assert!(health(process.channel().await?, "antler.runs.v1.RunService").await.is_err());
    Ok(())
}
