//! The lead agent's Memory layer with the real memory service on `antler up`: a fact said on one
//! thread is extracted after the run (through the LLM upstream double) and reaches the prompt of a
//! run on another thread.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn};
use antler_integration_tests::runs::*;
use antler_proto::memory::FlushUpdatesRequest;
use antler_proto::memory::memory_service_client::MemoryServiceClient;
use antler_proto::runs::RunStatus;
use anyhow::{Result, ensure};

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_thread_remembers_what_the_first_was_told() -> Result<()> {
    remembers(true).await
}

/// With auth on, the services of one process call each other without a configured `service_token`
/// (the process's internal mark): memory works with no `clients` section at all, where it used to
/// log a WARN per run and remember nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_one_process_remembers_without_service_tokens() -> Result<()> {
    remembers(false).await
}

async fn remembers(service_tokens: bool) -> Result<()> {
    let double = LlmDouble::start(
        vec![
            Turn::text("Noted: Rust for services."),
            // The extraction call of the memory service, in its strict JSON form.
            Turn::text(
                r#"{"operations": [{"op": "ADD", "content": "The user writes their services in Rust", "category": "preference", "confidence": 0.95}]}"#,
            ),
            Turn::text("A Rust service, then."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let mut yaml = agent_config(&db, &double.models_yaml(), "  lead:\n    memory:\n      enabled: true\n");
    if !service_tokens {
        let clients = format!(
            "clients:\n  sandbox:\n    service_token: {SERVICE}\n  models:\n    service_token: {SERVICE}\n  mcp:\n    service_token: {SERVICE}\n  memory:\n    service_token: {SERVICE}\n"
        );
        ensure!(yaml.contains(&clients), "the config's clients section changed: {yaml}");
        yaml = yaml.replace(&clients, "");
    }
    let up = antler_integration_tests::start("antler", antler_integration_tests::Launch::new(["up"]).config(yaml))?;
    let (mut runs, _) = clients(&up).await?;
    let first = runs
        .create_run(authed(prompt_request("", "I always write my services in Rust."), ALICE))
        .await?
        .into_inner()
        .run
        .unwrap_or_default();
    let first = wait_run(&mut runs, ALICE, &first.run_id, T, is_terminal).await?;
    ensure!(first.status() == RunStatus::Success, "{:?}\n{}", first.error, up.stderr());

    // Extraction is debounced; flush it now instead of waiting.
    let mut memory = MemoryServiceClient::new(up.channel().await?);
    let flushed = memory
        .flush_updates(authed(FlushUpdatesRequest { thread_id: first.thread_id.clone(), wait: true, ..Default::default() }, ALICE))
        .await?
        .into_inner();
    ensure!(double.requests().len() == 2, "the flush ran one extraction: {flushed:?}\n{}", up.stderr());
    ensure!(
        double.requests()[1].to_string().contains("I always write my services in Rust"),
        "the conversation was extracted from: {}",
        double.requests()[1]
    );

    let second =
        runs.create_run(authed(prompt_request("", "Start a new service for me."), ALICE)).await?.into_inner().run.unwrap_or_default();
    let second = wait_run(&mut runs, ALICE, &second.run_id, T, is_terminal).await?;
    ensure!(second.status() == RunStatus::Success && second.thread_id != first.thread_id, "{:?}", second.error);
    let prompt = double.requests()[2]["messages"][0]["content"].to_string();
    ensure!(prompt.contains("<memory>") && prompt.contains("The user writes their services in Rust"), "{prompt}");
    ensure!(!up.stderr().contains("memory service call failed"), "{}", up.stderr());
    Ok(())
}
