//! TLS on the real binaries, with certificates generated per test: plaintext, unknown CAs and missing
//! client certificates are refused; the right CA gets served; runs work end to end with the services
//! calling each other over TLS (in one process and across processes); a rotated certificate is used by
//! new connections without a restart; grpcurl and `antler run` connect with the CA; start-up refuses bad
//! files and warns (or refuses) about plaintext on the network.

use std::process::Command;
use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::runs::*;
use antler_integration_tests::tls::{self, Ca, LOCAL_NAMES, server_tls_yaml, with_server_tls};
use antler_integration_tests::{ALL_SERVICES, Launch, Process, binary, health, start, try_start};
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{RunConfig, RunStatus};
use serde_json::json;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

const T: Duration = Duration::from_secs(60);
const REPORT: &str = "/mnt/user-data/outputs/report.md";

/// `antler up` with TLS from `leaf` (mTLS when `client_ca`), `extra_tls` lines in `server.tls`, and `config`
/// (an antler.yaml without TLS, or "").
fn start_up_tls(config: &str, leaf: &tls::Leaf, client_ca: Option<&Ca>, extra_tls: &str) -> anyhow::Result<Process> {
    start("antler", Launch::new(["up"]).config(with_server_tls(config, &server_tls_yaml(leaf, client_ca, extra_tls))))
}

/// Health of the whole server over `channel`, or the error's causes.
async fn served(channel: anyhow::Result<Channel>) -> Result<ServingStatus, String> {
    let channel = channel.map_err(|e| format!("{e:#}"))?;
    health(channel, "").await.map_err(|e| format!("{e:#}"))
}

async fn tls_health(ca: Option<&Ca>, identity: Option<&tls::Leaf>, server: &Process) -> Result<ServingStatus, String> {
    let client = tls::client(ca.map(|c| c.cert.as_path()), identity, None).map_err(|e| format!("{e:#}"))?;
    served(tls::channel(&client, server.addr).await).await
}

#[tokio::test]
async fn a_tls_port_refuses_plaintext_and_unknown_cas_and_serves_the_right_ca() -> anyhow::Result<()> {
    let ca = Ca::new("antler test CA")?;
    let stranger = Ca::new("someone else's CA")?;
    let server = start_up_tls("", &ca.issue("server", &LOCAL_NAMES)?, None, "")?;

    let plaintext = served(server.channel().await).await;
    assert!(plaintext.is_err(), "a plaintext client was served on the TLS port: {plaintext:?}");

    let wrong = tls_health(Some(&stranger), None, &server).await;
    let error = wrong.err().unwrap_or_default();
    assert!(error.contains("certificate"), "a client trusting another CA must fail on the certificate: {error}");

    // No CA given: the system's roots, which do not hold the test CA.
    assert!(tls_health(None, None, &server).await.is_err(), "the test CA is not a system root");

    let client = tls::client(Some(&ca.cert), None, None)?;
    let channel = tls::channel(&client, server.addr).await?;
    for service in ALL_SERVICES {
        assert_eq!(health(channel.clone(), service).await?, ServingStatus::Serving, "{service}");
    }
    // The certificate's DNS name works too when it is named.
    let named = tls::client(Some(&ca.cert), None, Some("localhost"))?;
    assert_eq!(served(tls::channel(&named, server.addr).await).await, Ok(ServingStatus::Serving));
    Ok(())
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_and_in_process_calls_still_work() -> anyhow::Result<()> {
    let ca = Ca::new("antler test CA")?;
    let stranger = Ca::new("someone else's CA")?;
    let db = TestDb::new(Backend::Sqlite).await?;
    // One CA for the server and its clients; the in-process clients present the server's own certificate.
    let server = start_up_tls(&config(&db, ""), &ca.issue("server", &LOCAL_NAMES)?, Some(&ca), "")?;

    let anonymous = tls_health(Some(&ca), None, &server).await;
    assert!(anonymous.is_err(), "a client without a certificate was served: {anonymous:?}");
    let foreign = tls_health(Some(&ca), Some(&stranger.issue("alice", &["alice"])?), &server).await;
    assert!(foreign.is_err(), "a client certificate from another CA was accepted: {foreign:?}");
    let alice = ca.issue("alice", &["alice"])?;
    assert_eq!(tls_health(Some(&ca), Some(&alice), &server).await, Ok(ServingStatus::Serving));

    // A run whose admission asks the models service for the model and whose script writes through the
    // sandbox service: both in-process calls go over mTLS to the process's own listener.
    let channel = tls::channel(&tls::client(Some(&ca.cert), Some(&alice), None)?, server.addr).await?;
    let mut runs = RunServiceClient::new(channel);
    let mut request = run_request("", json!([{"produce": REPORT, "text": "over mTLS"}, {"present": REPORT}, {"say": "done"}]));
    request.config = Some(RunConfig { model_name: "demo".into(), ..Default::default() });
    request.expected_outputs = vec![REPORT.to_owned()];
    let run = run_to_end(&mut runs, request, T).await?;
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{events:#?}\n{}", run.error, server.stderr());
    assert!(run.delivery.unwrap_or_default().satisfied, "the sandbox did not see the file");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_run_works_end_to_end_with_the_models_service_in_another_process_over_mtls() -> anyhow::Result<()> {
    let server_ca = Ca::new("servers")?;
    let client_ca = Ca::new("service clients")?;
    // antler-models on its own, asking every caller for a client certificate from `client_ca`. Its one
    // model exists nowhere else, so a run that uses it reached this process.
    let models_yaml = format!(
        "server:\n  auth:\n    enabled: true\n    api_keys:\n      - key: {ALICE}\n        user: alice\n      - key: {SERVICE}\n        user: antler-runs\n        service: true\n\
         models:\n  models:\n    - name: tls-replay\n      provider: replay\n      replay:\n        after_last: repeat_last\n        turns:\n\
         \x20         - tool_calls:\n              - name: write_file\n                arguments: {{description: write it, path: {REPORT}, content: written over TLS}}\n\
         \x20         - tool_calls:\n              - name: present_files\n                arguments: {{filepaths: [{REPORT}]}}\n\
         \x20         - text: The report is written.\n"
    );
    let models_tls = server_tls_yaml(&server_ca.issue("models", &LOCAL_NAMES)?, Some(&client_ca), "");
    let models = start("antler-models", Launch::default().config(with_server_tls(&models_yaml, &models_tls)))?;

    // antler up over TLS too, its models client pointed at antler-models with the CA and a client certificate.
    let runs_identity = client_ca.issue("runs", &["antler-runs"])?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let models_client = format!(
        "  models:\n    service_token: {SERVICE}\n    endpoint: https://{}\n    tls:\n      ca: {:?}\n      cert: {:?}\n      key: {:?}\n",
        models.addr, server_ca.cert, runs_identity.cert, runs_identity.key
    );
    let yaml = agent_config(&db, "", "").replace(&format!("  models:\n    service_token: {SERVICE}\n"), &models_client);
    assert!(yaml.contains("endpoint: https://"), "the models client was not rewritten:\n{yaml}");
    let up = start_up_tls(&yaml, &server_ca.issue("up", &LOCAL_NAMES)?, None, "")?;

    let channel = tls::channel(&tls::client(Some(&server_ca.cert), None, None)?, up.addr).await?;
    let mut runs = RunServiceClient::new(channel);
    let mut request = prompt_request("", "Write the report");
    request.config = Some(RunConfig { model_name: "tls-replay".into(), ..Default::default() });
    request.expected_outputs = vec![REPORT.to_owned()];
    let run = run_to_end(&mut runs, request, T).await?;
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    assert_eq!(
        run.status(),
        RunStatus::Success,
        "{:?}\n{:#?}\n--- up ---\n{}\n--- models ---\n{}",
        run.error,
        tool_finished(&events),
        up.stderr(),
        models.stderr()
    );
    assert_eq!(run.model_name, "tls-replay");
    assert!(run.usage.unwrap_or_default().llm_calls >= 2, "the model was called through antler-models");
    let receipt = run.delivery.unwrap_or_default();
    assert!(receipt.satisfied, "{receipt:?}");
    let written = tool_finished(&events);
    assert!(written.iter().any(|f| f.name == "write_file" && !f.is_error), "{written:?}");
    Ok(())
}

#[tokio::test]
async fn a_rotated_certificate_is_used_by_new_connections_without_a_restart() -> anyhow::Result<()> {
    let old_ca = Ca::new("old CA")?;
    let new_ca = Ca::new("new CA")?;
    let leaf = old_ca.issue("server", &LOCAL_NAMES)?;
    let server = start_up_tls("", &leaf, None, "    reload_interval_ms: 100\n")?;
    let old_client = tls::client(Some(&old_ca.cert), None, None)?;
    let new_client = tls::client(Some(&new_ca.cert), None, None)?;
    let open = tls::channel(&old_client, server.addr).await?;
    assert_eq!(health(open.clone(), "").await?, ServingStatus::Serving);
    assert!(served(tls::channel(&new_client, server.addr).await).await.is_err(), "the new CA is not in use yet");

    // Rotate in place (the key first: a certificate without its key is refused and the old pair kept).
    let (cert, key) = new_ca.issue_pem(&LOCAL_NAMES)?;
    std::fs::write(&leaf.key, key)?;
    std::fs::write(&leaf.cert, cert)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if served(tls::channel(&new_client, server.addr).await).await == Ok(ServingStatus::Serving) {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the rotated certificate was not picked up\n{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served(tls::channel(&old_client, server.addr).await).await.is_err(), "a new connection still got the old certificate");
    // The connection made before the rotation keeps its session.
    assert_eq!(health(open, "").await?, ServingStatus::Serving);
    Ok(())
}

#[tokio::test]
async fn grpcurl_connects_with_the_ca_and_not_in_plaintext() -> anyhow::Result<()> {
    let grpcurl = tls::grpcurl()?;
    let ca = Ca::new("antler test CA")?;
    let server = start_up_tls("", &ca.issue("server", &LOCAL_NAMES)?, None, "")?;
    let addr = server.addr.to_string();
    let run = |args: &[&str]| Command::new(&grpcurl).args(args).output();

    let listed = run(&["-cacert", ca.cert.to_str().unwrap_or_default(), &addr, "list"])?;
    let stdout = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "grpcurl -cacert failed: {}", String::from_utf8_lossy(&listed.stderr));
    for service in ALL_SERVICES {
        assert!(stdout.lines().any(|l| l == service), "{service} missing from:\n{stdout}");
    }
    let checked = run(&["-cacert", ca.cert.to_str().unwrap_or_default(), "-d", "{}", &addr, "grpc.health.v1.Health/Check"])?;
    assert!(String::from_utf8_lossy(&checked.stdout).contains("SERVING"), "{}", String::from_utf8_lossy(&checked.stderr));

    let plaintext = run(&["-plaintext", "-max-time", "5", &addr, "list"])?;
    assert!(!plaintext.status.success(), "grpcurl -plaintext was served on the TLS port");
    let unknown = run(&["-max-time", "5", &addr, "list"])?;
    assert!(!unknown.status.success(), "grpcurl trusted the test CA without -cacert");
    Ok(())
}

#[tokio::test]
async fn antler_run_connects_with_the_ca_flag() -> anyhow::Result<()> {
    let ca = Ca::new("antler test CA")?;
    let server = start_up_tls("", &ca.issue("server", &LOCAL_NAMES)?, None, "")?;
    let antler = binary("antler")?;
    let addr = format!("https://{}", server.addr);
    let run = |extra: &[&str]| {
        let mut command = Command::new(&antler);
        command.args(["run", "hello over TLS", "--addr"]).args(extra).env_remove("ANTLER_CA").env_remove("ANTLER_TOKEN");
        command.output()
    };

    let ok = run(&[&addr, "--ca", ca.cert.to_str().unwrap_or_default()])?;
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "antler run --ca failed:\n{stdout}\n{}", String::from_utf8_lossy(&ok.stderr));
    assert!(stdout.contains("end: SUCCESS"), "{stdout}");

    let refused = run(&[&addr])?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "connected without the CA");
    assert!(stderr.contains("certificate") && stderr.contains("--ca"), "the error should name the certificate and the flag: {stderr}");

    let plaintext = run(&[&format!("http://{}", server.addr), "--ca", ca.cert.to_str().unwrap_or_default()])?;
    let stderr = String::from_utf8_lossy(&plaintext.stderr);
    assert!(!plaintext.status.success() && stderr.contains("https://"), "{stderr}");
    Ok(())
}

#[tokio::test]
async fn start_up_names_bad_certificate_files_and_guards_plaintext_on_the_network() -> anyhow::Result<()> {
    let ca = Ca::new("antler test CA")?;
    let leaf = ca.issue("server", &LOCAL_NAMES)?;

    let missing = tls::Leaf { cert: ca.dir().join("absent.pem"), key: leaf.key.clone() };
    let failure = try_start("antler", Launch::new(["up"]).config(with_server_tls("", &server_tls_yaml(&missing, None, ""))))?
        .err()
        .ok_or_else(|| anyhow::anyhow!("started with a missing certificate file"))?;
    assert!(failure.stderr.contains("server.tls.cert") && failure.stderr.contains("absent.pem"), "{}", failure.stderr);

    let swapped = tls::Leaf { cert: leaf.key.clone(), key: leaf.cert.clone() };
    let failure = try_start("antler", Launch::new(["up"]).config(with_server_tls("", &server_tls_yaml(&swapped, None, ""))))?
        .err()
        .ok_or_else(|| anyhow::anyhow!("started with the key as certificate"))?;
    assert!(failure.stderr.contains("server.tls.cert file") && failure.stderr.contains("no PEM certificate"), "{}", failure.stderr);

    // `antler config check` reads the files too.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("antler.yaml");
    std::fs::write(&path, with_server_tls("", &server_tls_yaml(&missing, None, "")))?;
    let check = Command::new(binary("antler")?).args(["config", "check", "--config"]).arg(&path).output()?;
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success() && stderr.contains("server.tls.cert") && stderr.contains("absent.pem"), "{stderr}");

    // On the network without TLS: refused with `required`, a warning without it.
    let auth = format!("server:\n  auth:\n    enabled: true\n    api_keys:\n      - key: {ALICE}\n        user: alice\n");
    let required = format!("{auth}  tls:\n    required: true\n");
    let failure = try_start("antler", Launch::new(["up"]).listen("0.0.0.0:0").config(required))?
        .err()
        .ok_or_else(|| anyhow::anyhow!("served plaintext on 0.0.0.0 with server.tls.required"))?;
    assert!(failure.stderr.contains("server.tls.required"), "{}", failure.stderr);

    let warned = start("antler", Launch::new(["up"]).listen("0.0.0.0:0").config(auth.clone()))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !warned.stderr().contains("serving plaintext gRPC on a non-loopback address") {
        anyhow::ensure!(Instant::now() < deadline, "no plaintext warning:\n{}", warned.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Loopback stays quiet, TLS on the network too.
    let quiet = start("antler", Launch::new(["up"]).config(auth.clone()))?;
    let network_tls =
        start("antler", Launch::new(["up"]).listen("0.0.0.0:0").config(with_server_tls(&auth, &server_tls_yaml(&leaf, None, ""))))?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for process in [&quiet, &network_tls] {
        assert!(!process.stderr().contains("serving plaintext gRPC"), "{}", process.stderr());
    }
    Ok(())
}
