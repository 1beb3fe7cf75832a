//! Crash resume of the lead agent: `kill -9` of the server in the middle of a side-effecting tool
//! call; after a restart on the same data directory and database the run resumes with attempt 2 and
//! the call is not executed twice.

use std::time::{Duration, Instant};

use antler_integration_tests::db::{BACKENDS, Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call};
use antler_integration_tests::runs::*;
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{CancelRunRequest, RunStatus};
use serde_json::json;

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_resumes_the_run_without_repeating_the_side_effect() -> anyhow::Result<()> {
    for backend in BACKENDS {
        killed_mid_command(backend).await?;
    }
    Ok(())
}

async fn killed_mid_command(backend: Backend) -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![
            Turn::tools(
                "Appending.",
                vec![call(
                    "append-1",
                    "bash",
                    json!({"description": "append", "command": "echo appended-line >> /mnt/user-data/workspace/log.txt && sleep 20"}),
                )],
            ),
            Turn::text("The outcome was unknown; I checked the file instead of appending again."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(backend).await?;
    let data = tempfile::tempdir()?;
    let first = start_agent_up(&db, &double.models_yaml(), "", Some(data.path()))?;
    let (mut runs, _) = clients(&first).await?;
    let run = runs.create_run(authed(prompt_request("", "Append a line to log.txt"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let log = data.path().join(format!("sandbox/users/alice/threads/{}/user-data/workspace/log.txt", run.thread_id));

    // Kill while the command sleeps: its line is written, its result is not.
    let deadline = Instant::now() + T;
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("appended-line")) {
        anyhow::ensure!(Instant::now() < deadline, "the command never ran\n{}", first.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut first = first;
    first.signal(libc::SIGKILL)?;
    first.wait_exit(Duration::from_secs(5))?;

    let second = start_agent_up(&db, &double.models_yaml(), "", Some(data.path()))?;
    let (mut runs, _) = clients(&second).await?;
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    assert_eq!(run.status(), RunStatus::Success, "{backend:?}: {:?}\n{}", run.error, second.stderr());
    assert_eq!(run.attempt, 2, "{backend:?}");
    assert_eq!(std::fs::read_to_string(&log)?.matches("appended-line").count(), 1, "the side effect happened once");

    let events = run_events(&mut runs, ALICE, &run.run_id).await?;
    let finished: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolFinished(f)) => Some(f.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert!(finished[0].outcome_unknown && finished[0].is_error, "{:?}", finished[0]);
    let requests = double.requests();
    assert_eq!(requests.len(), 2);
    let told = requests[1]["messages"].to_string();
    assert!(told.contains("outcome of this `bash` call is unknown"), "{told}");
    Ok(())
}

/// A cancel during a long tool call kills the command's process group (what it would have done
/// next never happens) and ends the run INTERRUPTED; the next run on the thread finds the call
/// without a result and the DanglingToolCall layer answers it before the model sees the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_a_long_tool_call_kills_it_and_the_next_run_repairs_the_dangling_call() -> anyhow::Result<()> {
    let double = LlmDouble::start(
        vec![
            Turn::tools(
                "",
                vec![call(
                    "long-1",
                    "bash",
                    json!({"description": "wait", "command": "echo started > /mnt/user-data/workspace/started && sleep 3 && echo late > /mnt/user-data/workspace/late"}),
                )],
            ),
            Turn::text("Understood."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let data = tempfile::tempdir()?;
    let server = start_agent_up(&db, &double.models_yaml(), "", Some(data.path()))?;
    let (mut runs, _) = clients(&server).await?;
    let run = runs.create_run(authed(prompt_request("", "Wait a bit"), ALICE)).await?.into_inner().run.unwrap_or_default();
    let workspace = data.path().join(format!("sandbox/users/alice/threads/{}/user-data/workspace", run.thread_id));
    let deadline = Instant::now() + T;
    while !workspace.join("started").exists() {
        anyhow::ensure!(Instant::now() < deadline, "the command never started\n{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    runs.cancel_run(authed(CancelRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE)).await?;
    let cancelled = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    assert_eq!(cancelled.status(), RunStatus::Interrupted, "{:?}", cancelled.error);
    assert!(started.elapsed() < Duration::from_secs(3), "the cancel did not wait for the command: {:?}", started.elapsed());
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!workspace.join("late").exists(), "the command's process group was killed");

    let next = run_to_end(&mut runs, prompt_request(&run.thread_id, "Never mind"), T).await?;
    assert_eq!(next.status(), RunStatus::Success, "{:?}\n{}", next.error, server.stderr());
    let requests = double.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1]["messages"].as_array().cloned().unwrap_or_default();
    let answer = messages.iter().find(|m| m["role"] == "tool" && m["tool_call_id"] == "long-1").cloned().unwrap_or_default();
    assert!(answer["content"].to_string().contains("[Tool call was interrupted and did not return a result.]"), "{messages:?}");
    Ok(())
}

/// A cancel while the model is still answering ends the run at once and aborts the upstream call
/// (the double sees its connection closed mid-stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_a_model_stream_aborts_the_upstream_call() -> anyhow::Result<()> {
    let long = "word ".repeat(200);
    let double = LlmDouble::start(vec![Turn::text(&long).slow(50)], AfterLast::Refuse).await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let server = start_agent_up(&db, &double.models_yaml(), "", None)?;
    let (mut runs, _) = clients(&server).await?;
    let run = runs.create_run(authed(prompt_request("", "Talk a lot"), ALICE)).await?.into_inner().run.unwrap_or_default();
    // Wait for the first streamed delta.
    wait_run(&mut runs, ALICE, &run.run_id, T, |r| r.last_seq >= 3).await?;
    let started = Instant::now();
    runs.cancel_run(authed(CancelRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE)).await?;
    let cancelled = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    assert_eq!(cancelled.status(), RunStatus::Interrupted, "{:?}", cancelled.error);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let deadline = Instant::now() + Duration::from_secs(5);
    while double.aborted() == 0 {
        anyhow::ensure!(Instant::now() < deadline, "the upstream stream was never abandoned\n{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
