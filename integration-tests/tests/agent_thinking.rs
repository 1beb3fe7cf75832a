//! Thinking asked of a model without `supports_thinking` (issue #33): DeerFlow's web UI asks for it on
//! every run but in "flash" mode, whatever the model. By default (`runs.lead.thinking_unsupported:
//! ignore`) the run goes on without thinking and says so once — a CUSTOM event
//! `antler.thinking_unsupported` naming the model and one WARN line — as DeerFlow does; `refuse`
//! keeps the models service's refusal (ERROR `model_error`). A model that can think is not touched.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn};
use antler_integration_tests::runs::*;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{CreateRunRequest, RunConfig, RunEvent, RunStatus};

const T: Duration = Duration::from_secs(60);
const WARNING: &str = "thinking requested on a model without supports_thinking";

fn thinking_request(model: &str) -> CreateRunRequest {
    let mut request = prompt_request("", "Say hi");
    request.config = Some(RunConfig { model_name: model.to_owned(), thinking_enabled: Some(true), ..RunConfig::default() });
    request
}

/// The data of the run's `antler.thinking_unsupported` events.
fn dropped_events(events: &[RunEvent]) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Custom(c)) if c.name == "antler.thinking_unsupported" => {
                Some(c.data.as_ref().map(antler_kit::json::value_to_json).unwrap_or_default())
            }
            _ => None,
        })
        .collect()
}

/// The double as two models: `double` (no thinking, the default) and `thinker` (supports_thinking).
fn models(double: &LlmDouble) -> String {
    let base = double.base_url();
    format!(
        "models:\n  - name: double\n    provider: openai\n    model: double-1\n    base_url: {base}\n    api_key: sk-double\n    max_retries: 0\n  - name: thinker\n    provider: openai\n    model: double-1\n    base_url: {base}\n    api_key: sk-double\n    max_retries: 0\n    supports_thinking: true\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_on_a_model_without_it_is_dropped_with_one_event_and_one_warning() -> anyhow::Result<()> {
    let double = LlmDouble::start(vec![Turn::text("Hi there.")], AfterLast::Repeat).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &models(&double), "", None)?;
    let (mut runs, _) = clients(&server).await?;

    let run = run_to_end(&mut runs, thinking_request("double"), T).await?;
    assert_eq!(run.status(), RunStatus::Success, "{:?}\n{}", run.error, server.stderr());
    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let dropped = dropped_events(&events);
    assert_eq!(dropped.len(), 1, "one event per run: {dropped:?}");
    assert_eq!(dropped[0]["model_name"], "double");
    assert!(dropped[0]["hint"].as_str().is_some_and(|h| h.contains("runs.lead.thinking_unsupported")), "{dropped:?}");
    let warnings = server.stderr().lines().filter(|l| l.contains(WARNING) && l.contains(&run.run_id)).count();
    assert_eq!(warnings, 1, "{}", server.stderr());

    // A model that can think gets the request as it was, and nothing is said.
    let thought = run_to_end(&mut runs, thinking_request("thinker"), T).await?;
    assert_eq!(thought.status(), RunStatus::Success, "{:?}", thought.error);
    assert!(dropped_events(&run_events(&mut runs, ALICE, &thought.run_id).await?).is_empty());
    assert!(!server.stderr().lines().any(|l| l.contains(WARNING) && l.contains(&thought.run_id)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_refuse_the_run_ends_model_error_as_before() -> anyhow::Result<()> {
    let double = LlmDouble::start(vec![Turn::text("Hi there.")], AfterLast::Repeat).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &models(&double), "  lead:\n    thinking_unsupported: refuse\n", None)?;
    let (mut runs, _) = clients(&server).await?;
    let run = run_to_end(&mut runs, thinking_request("double"), T).await?;
    assert_eq!(run.status(), RunStatus::Error, "{}", server.stderr());
    let error = run.error.clone().unwrap_or_default();
    assert_eq!(error.code, "model_error", "{error:?}");
    assert!(error.message.contains("does not support thinking"), "{error:?}");
    assert!(dropped_events(&run_events(&mut runs, ALICE, &run.run_id).await?).is_empty());
    assert!(double.requests().is_empty(), "the refused call never reached the upstream");
    Ok(())
}
