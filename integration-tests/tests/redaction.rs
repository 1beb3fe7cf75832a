//! No configured secret leaves `antler up`: a provider key that the upstream echoes in its 401 is
//! redacted from the models service's statuses (Chat and ChatStream, for each provider, also a key
//! read from `api_key_env`), from the run's stored error (GetRun), its events and the server log; a
//! status of any other service that would quote a secret is redacted too; and a run's `secrets`
//! reach its sandbox commands as environment variables but never its events, state or log.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, Process, start};
use antler_proto::models::model_service_client::ModelServiceClient;
use antler_proto::models::{ChatRequest, ChatStreamRequest};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{GetRunRequest, GetThreadRequest, GetThreadStateRequest, RunConfig, RunStatus};
use serde_json::json;

const T: Duration = Duration::from_secs(60);
const OPENAI_KEY: &str = "sk-proj-itest-redaction-4f3e2d1c0b";
const ANTHROPIC_KEY: &str = "sk-ant-itest-from-env-9a8b7c6d5e";
const RUN_SECRET: &str = "ghp_itestRunSecretValue0123456789";

/// `antler up` with an OpenAI-compatible model (key in the file) and an Anthropic one (key from the
/// environment), both pointing at `double`.
fn start_with_models(db: &TestDb, double: &LlmDouble) -> anyhow::Result<Process> {
    let models = format!(
        "models:\n  - name: gpt\n    provider: openai\n    model: gpt-4o\n    base_url: {}\n    api_key: {OPENAI_KEY}\n    max_retries: 0\n  - name: claude\n    provider: anthropic\n    model: claude-sonnet-4-5\n    base_url: http://{}\n    api_key_env: ANTLER_ITEST_CLAUDE_KEY\n    max_tokens: 1000\n    max_retries: 0\n",
        double.base_url(),
        double.addr
    );
    start("antler", Launch::new(["up"]).config(agent_config(db, &models, "")).env("ANTLER_ITEST_CLAUDE_KEY", ANTHROPIC_KEY))
}

fn assert_no_key(text: &str, what: &str) {
    for key in [OPENAI_KEY, ANTHROPIC_KEY] {
        assert!(!text.contains(key), "{what} carries the key: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_provider_key_reaches_no_status_stored_error_event_or_log_line() -> anyhow::Result<()> {
    let double = LlmDouble::start(vec![Turn::refuse_echoing_key(401)], AfterLast::Repeat).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_with_models(&db, &double)?;
    let channel = server.channel().await?;
    let mut models = ModelServiceClient::new(channel.clone());
    let (mut runs, mut threads) = clients(&server).await?;

    for model in ["gpt", "claude"] {
        let chat = ChatRequest { model_name: model.to_owned(), messages: vec![user_text("hi")], ..Default::default() };
        let status = models.chat(authed(chat.clone(), ALICE)).await.err().unwrap_or_else(|| tonic::Status::ok(""));
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{model}: {status:?}");
        assert_no_key(status.message(), &format!("{model} Chat status"));
        assert!(status.message().contains("[redacted]"), "{model}: the upstream's echo should be there, redacted: {}", status.message());
        let stream = models.chat_stream(authed(ChatStreamRequest { request: Some(chat) }, ALICE)).await;
        let status = match stream {
            Err(status) => status,
            Ok(stream) => stream.into_inner().message().await.err().unwrap_or_else(|| tonic::Status::ok("")),
        };
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{model}: {status:?}");
        assert_no_key(status.message(), &format!("{model} ChatStream status"));

        let mut request = prompt_request("", "hello");
        request.config = Some(RunConfig { model_name: model.to_owned(), ..Default::default() });
        let run = run_to_end(&mut runs, request, T).await?;
        assert_eq!(run.status(), RunStatus::Error, "{model}: {run:?}");
        let stored = runs
            .get_run(authed(GetRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        let message = stored.error.clone().unwrap_or_default().message;
        assert_no_key(&message, &format!("{model} run error"));
        assert!(message.contains("[redacted]"), "{model}: {message}");
        for event in run_events(&mut runs, ALICE, &run.run_id).await? {
            assert_no_key(&format!("{event:?}"), &format!("{model} event"));
        }
    }

    // A status of another service that would quote a configured secret back (here the runs service
    // naming the thread it did not find) is redacted by the server's status layer.
    let status = threads
        .get_thread(authed(GetThreadRequest { thread_id: OPENAI_KEY.to_owned() }, ALICE))
        .await
        .err()
        .unwrap_or_else(|| tonic::Status::ok(""));
    assert_eq!(status.code(), tonic::Code::NotFound);
    assert_no_key(status.message(), "GetThread status");

    // The failures are logged (so this check can fail), with the echo redacted.
    assert!(server.stderr().contains("[redacted]"), "expected the upstream's refusal in the log:\n{}", server.stderr());
    assert_no_key(&server.stderr(), "the server log");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_secrets_reach_commands_but_never_events_state_or_logs() -> anyhow::Result<()> {
    let command = "echo \"token=$DEPLOY_TOKEN\"; printf %s \"$DEPLOY_TOKEN\" | wc -c";
    let double = LlmDouble::start(
        vec![
            Turn::tools("", vec![call("c1", "bash", json!({"description": "use the token", "command": command}))]),
            Turn::text(&format!("I used the token {RUN_SECRET} as asked.")),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, mut threads) = clients(&server).await?;
    let mut request = prompt_request("", "deploy it");
    request.secrets = [("deploy_token".to_owned(), RUN_SECRET.to_owned())].into();
    let run = run_to_end(&mut runs, request, T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());

    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let output = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::ToolFinished(f)) if f.name == "bash" => Some(format!("{f:?}")),
            _ => None,
        })
        .unwrap_or_default();
    assert!(output.contains("token=[redacted]"), "the command saw the variable, masked in its output: {output}");
    assert!(output.contains(&RUN_SECRET.len().to_string()), "the command got the whole value: {output}");
    for event in &events {
        assert!(!format!("{event:?}").contains(RUN_SECRET), "event {event:?}");
    }
    let state = threads
        .get_thread_state(authed(GetThreadStateRequest { thread_id: run.thread_id.clone(), ..Default::default() }, ALICE))
        .await?
        .into_inner();
    let state = format!("{state:?}");
    assert!(!state.contains(RUN_SECRET), "thread state: {state}");
    assert!(state.contains("I used the token [redacted] as asked."), "{state}");
    assert!(!server.stderr().contains(RUN_SECRET), "server log");
    Ok(())
}
