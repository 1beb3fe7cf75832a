//! The Summarization layer seen from outside, through the LLM upstream double: once the run's
//! messages meet the trigger, the summarizer is asked (caller `middleware:summarization`), the next
//! model call gets a shorter history with the summary in its system prompt and the user's request
//! still there, and the next run on the thread starts from the summary.

use std::time::Duration;

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call};
use antler_integration_tests::runs::*;
use antler_proto::runs::{GetTokenUsageRequest, RunStatus};
use anyhow::{Result, ensure};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// A listing of `dir` (a different one each turn, so loop detection stays quiet).
fn ls(id: &str, dir: &str) -> Turn {
    Turn::tools("Looking.", vec![call(id, "ls", json!({"description": "look", "path": format!("/mnt/user-data/{dir}")}))])
}

fn messages(request: &Value) -> Vec<Value> {
    request["messages"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_messages_become_a_summary_and_the_request_survives() -> Result<()> {
    let double = LlmDouble::start(
        vec![
            ls("a", "workspace"),
            ls("b", "uploads"),
            ls("c", "outputs"),
            Turn::text("SUMMARY: the user wants the workspace listed; it was listed twice and is empty."),
            Turn::text("Done: the workspace is empty."),
            Turn::text("Still empty."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let extra = "  lead:\n    summarization:\n      enabled: true\n      trigger: {type: messages, value: 7}\n      keep: {type: messages, value: 2}\n";
    let up = start_agent_up(&db, &double.models_yaml(), extra, None)?;
    let (mut runs, _) = clients(&up).await?;
    let first =
        runs.create_run(authed(prompt_request("", "List the three directories"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let first = wait_run(&mut runs, ALICE, &first.run_id, T, is_terminal).await?;
    ensure!(first.status() == RunStatus::Success, "{:?}\n{}", first.error, up.stderr());

    let requests = double.requests();
    ensure!(requests.len() == 5, "three tool turns, the summary, the answer: {}", requests.len());
    // Before the trigger (third model call): system, the user, two assistant/tool pairs.
    ensure!(messages(&requests[2]).len() == 6, "{}", messages(&requests[2]).len());
    let asked = messages(&requests[3]);
    ensure!(asked.len() == 1 && asked[0]["content"].to_string().contains("Condense the conversation"), "{asked:?}");
    let told = asked[0]["content"].to_string();
    ensure!(told.contains("(called ls") && !told.contains("List the three directories"), "the request is kept, not summarized: {told}");

    let after = messages(&requests[4]);
    ensure!(after.len() == 4, "system, the user's request, the last call and its result: {after:?}");
    let system = after[0]["content"].to_string();
    ensure!(system.contains("<conversation_summary>") && system.contains("SUMMARY: the user wants"), "{system}");
    ensure!(after[1]["content"].to_string().contains("List the three directories"), "{:?}", after[1]);
    ensure!(after[2]["tool_calls"][0]["id"] == "c" && after[3]["tool_call_id"] == "c", "the kept result keeps its call: {after:?}");

    // The next run on the thread starts from the summary, not from the dropped messages.
    let second = runs.create_run(authed(prompt_request(&first.thread_id, "And now?"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let second = wait_run(&mut runs, ALICE, &second.run_id, T, is_terminal).await?;
    ensure!(second.status() == RunStatus::Success, "{:?}", second.error);
    let next = messages(&double.requests()[5]);
    ensure!(next[0]["content"].to_string().contains("SUMMARY: the user wants") && next.len() == 6, "{next:?}");

    let usage = runs
        .get_token_usage(authed(GetTokenUsageRequest { thread_id: first.thread_id.clone(), ..Default::default() }, ALICE))
        .await?
        .into_inner();
    ensure!(usage.by_caller.is_some_and(|c| c.middleware_tokens > 0), "the summary's tokens are the middleware's: {usage:?}");
    Ok(())
}
