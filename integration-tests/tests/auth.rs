//! Authentication as a client meets it: accepted and refused credentials, and the refusal to expose an
//! unauthenticated server beyond loopback.

use std::time::{SystemTime, UNIX_EPOCH};

use antler_integration_tests::{Launch, Process, health, start, try_start};
use antler_proto::runs::{GetRunRequest, run_service_client::RunServiceClient};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

const ALICE_KEY: &str = "alice-integration-key-0001";
const SECRET: &str = "integration-hs256-secret-at-least-32-bytes";

fn config() -> String {
    format!(
        "server:\n  auth:\n    enabled: true\n    api_keys:\n      - key: $ALICE_KEY\n        user: alice\n    jwt:\n      algorithm: HS256\n      secret: \"{SECRET}\"\n      leeway_secs: 0\n"
    )
}

fn jwt(exp_offset: i64) -> anyhow::Result<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let claims = serde_json::json!({"sub": "bob", "exp": now + exp_offset});
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes())?;
    Ok(jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key)?)
}

async fn call(process: &Process, token: Option<&str>) -> anyhow::Result<tonic::Status> {
    let mut request = tonic::Request::new(GetRunRequest { run_id: "r-unknown".to_owned(), ..Default::default() });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse()?);
    }
    match RunServiceClient::new(process.channel().await?).get_run(request).await {
        Ok(_) => anyhow::bail!("GetRun succeeded"),
        Err(status) => Ok(status),
    }
}

#[tokio::test]
async fn credentials_are_checked_and_refusals_say_why() -> anyhow::Result<()> {
    let process = start("antler", Launch::new(["up"]).config(config()).env("ALICE_KEY", ALICE_KEY))?;

    let missing = call(&process, None).await?;
    assert_eq!(missing.code(), Code::Unauthenticated);
    assert!(missing.message().contains("missing `authorization`"), "{}", missing.message());

    let unknown = call(&process, Some("not-a-key-anyone-configured")).await?;
    assert_eq!(unknown.code(), Code::Unauthenticated);
    assert!(unknown.message().contains("unknown API key"), "{}", unknown.message());

    let expired = call(&process, Some(&jwt(-60)?)).await?;
    assert_eq!(expired.code(), Code::Unauthenticated);
    assert!(expired.message().contains("expired"), "{}", expired.message());

    // Accepted credentials get past authentication to the handler (which does not know the run).
    assert_eq!(call(&process, Some(ALICE_KEY)).await?.code(), Code::NotFound);
    assert_eq!(call(&process, Some(&jwt(300)?)).await?.code(), Code::NotFound);

    // Health probes need no token.
    assert_eq!(health(process.channel().await?, "").await?, ServingStatus::Serving);
    Ok(())
}

#[tokio::test]
async fn a_non_loopback_bind_without_auth_is_refused_unless_allowed() -> anyhow::Result<()> {
    let refused = match try_start("antler", Launch::new(["up"]).listen("0.0.0.0:0"))? {
        Ok(_) => anyhow::bail!("started on 0.0.0.0 without authentication"),
        Err(failure) => failure,
    };
    assert!(refused.status.is_some_and(|s| !s.success()), "{:?}", refused.status);
    assert!(refused.stderr.contains("refusing to listen on 0.0.0.0"), "{}", refused.stderr);

    let allowed = start("antler", Launch::new(["up"]).listen("0.0.0.0:0").config("server:\n  allow_insecure: true\n"))?;
    assert!(allowed.addr.ip().is_unspecified());
    Ok(())
}
