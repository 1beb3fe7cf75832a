//! The built `antler-models` binary: DeerFlow's example model entries load as they are, a changed config
//! file is picked up while serving, and a streaming call works end to end against the upstream double.

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use antler_proto::models::ListModelsRequest;
use antler_proto::models::model_service_client::ModelServiceClient;
use support::upstream::{Reply, Upstream};
use support::*;
use tonic::transport::Channel;

/// A running binary, killed on drop.
struct Binary {
    child: Child,
    client: ModelServiceClient<Channel>,
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(config: &Path, env: &[(&str, &str)]) -> anyhow::Result<Binary> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_antler-models"));
    command.arg("--config").arg(config).arg("--listen").arg("127.0.0.1:0").arg("--data-dir").arg(config.with_file_name("data"));
    command.env_remove("ANTLER_CONFIG").env("RUST_LOG", "warn").stdout(Stdio::piped()).stderr(Stdio::inherit());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    // The ready line is `antler-models listening on ADDR`; read it on a thread so a silent child cannot hang us.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("antler-models listening on ") {
                let _ = tx.send(addr.trim().to_owned());
            }
        }
    });
    let addr = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(addr) => addr,
        Err(_) => {
            let _ = child.kill();
            let status = child.wait()?;
            anyhow::bail!("antler-models did not report its address (exit {status})");
        }
    };
    let channel = Channel::from_shared(format!("http://{addr}"))?.connect().await?;
    Ok(Binary { child, client: ModelServiceClient::new(channel) })
}

#[tokio::test]
async fn every_deerflow_example_model_entry_loads_in_the_binary() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, fixture("deerflow_config.yaml"))?;
    let keys = [
        "VOLCENGINE_API_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "GEMINI_API_KEY",
        "MIMO_API_KEY",
        "DEEPSEEK_API_KEY",
        "MOONSHOT_API_KEY",
        "NOVITA_API_KEY",
        "STEPFUN_API_KEY",
        "MINIMAX_API_KEY",
        "ATLASCLOUD_API_KEY",
        "VLLM_API_KEY",
    ];
    let env: Vec<(&str, &str)> = keys.iter().map(|k| (*k, "test-key")).collect();
    let binary = start(&path, &env).await?;
    let list = bounded("ListModels", binary.client.clone().list_models(ListModelsRequest {})).await?.into_inner();
    assert_eq!(list.models.len(), 24);
    assert_eq!(list.default_model_name, "doubao-seed-1.8");
    let claude = list.models.iter().find(|m| m.name == "claude-sonnet-4").cloned().unwrap_or_default();
    assert_eq!(
        (claude.provider(), claude.context_window, claude.max_output_tokens),
        (antler_proto::models::ProviderKind::Anthropic, 200000, 16000)
    );
    Ok(())
}

#[tokio::test]
async fn the_binary_streams_against_the_upstream_and_follows_config_changes() -> anyhow::Result<()> {
    let upstream = Upstream::start().await?;
    upstream.always(Reply::sse(&fixture("openai_text.sse")));
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("antler.yaml");
    let reload = "server:\n  reload_interval_ms: 100\n";
    std::fs::write(&path, format!("{reload}{}", config(&openai_model("first", &upstream.url(), ""))))?;
    let binary = start(&path, &[]).await?;

    let (deltas, finish) = stream(&binary.client, request("first", "hi")).await?;
    assert_eq!(text_of(&deltas), "Hello, world!");
    assert_eq!(finish.info.map(|i| i.model_name), Some("first".to_owned()));

    std::fs::write(&path, format!("{reload}{}", config(&openai_model("second", &upstream.url(), ""))))?;
    let started = Instant::now();
    loop {
        let list = binary.client.clone().list_models(ListModelsRequest {}).await?.into_inner();
        if list.default_model_name == "second" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the new config was not applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (deltas, _) = stream(&binary.client, request("second", "hi")).await?;
    assert_eq!(text_of(&deltas), "Hello, world!");

    // An invalid file is refused and the registry in force stays.
    std::fs::write(&path, format!("{reload}models:\n  - {{name: bad, provider: openai}}\n"))?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let list = binary.client.clone().list_models(ListModelsRequest {}).await?.into_inner();
    assert_eq!(list.default_model_name, "second");
    Ok(())
}
