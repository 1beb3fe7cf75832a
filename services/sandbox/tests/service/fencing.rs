//! The fencing token (`x-antler-run-id`, `x-antler-run-attempt`): once a higher attempt of a run
//! calls, the lower attempt's running commands are killed at once and its further calls refused,
//! on both providers; calls without a token, and other runs, are untouched.

use std::time::{Duration, Instant};

use antler_proto::sandbox::*;
use tonic::{Code, Request};

use crate::common::{self, ALICE_KEY, BOB_KEY, bounded, expect_code, req};

const T: &str = "fenced-thread";

/// `message` from `key`, made for `attempt` of run `run_id`.
fn fenced<M>(key: &str, run_id: &str, attempt: &str, message: M) -> Request<M> {
    let mut request = req(key, message);
    if let (Ok(run), Ok(attempt)) = (run_id.parse(), attempt.parse()) {
        request.metadata_mut().insert("x-antler-run-id", run);
        request.metadata_mut().insert("x-antler-run-attempt", attempt);
    }
    request
}

fn exec_request(command: &str) -> ExecuteCommandRequest {
    ExecuteCommandRequest {
        thread_id: T.to_owned(),
        command: command.to_owned(),
        timeout: prost_types::Duration::try_from(Duration::from_secs(60)).ok(),
        ..Default::default()
    }
}

async fn a_takeover_kills_the_old_attempt_s_commands_and_refuses_it(provider: &str) -> anyhow::Result<()> {
    let server = common::start(provider).await?;
    let mut c = server.client().await?;
    common::acquire(&mut c, ALICE_KEY, T).await?;
    // Attempt 1 starts a long command; another run's command and a call without a token run beside it.
    let mut old = c.execute_command(fenced(ALICE_KEY, "run-1", "1", exec_request("sleep 50; echo survived"))).await?.into_inner();
    let mut other = c.clone();
    let bystander = tokio::spawn(async move {
        other.execute_command(fenced(ALICE_KEY, "run-2", "1", exec_request("sleep 3; echo bystander"))).await.map(|r| r.into_inner())
    });
    let first = old.message().await?.and_then(|m| m.event);
    assert!(matches!(first, Some(execute_command_response::Event::Started(_))), "{first:?}");

    // Attempt 2's first call (any RPC) fences attempt 1: its command dies now, not in 50 s.
    let fenced_at = Instant::now();
    c.get_sandbox(fenced(ALICE_KEY, "run-1", "2", GetSandboxRequest { thread_id: T.to_owned() })).await?;
    let mut exit = None;
    while let Some(message) = tokio::time::timeout(Duration::from_secs(10), old.message()).await?? {
        if let Some(execute_command_response::Event::Exit(e)) = message.event {
            exit = Some(e);
        }
    }
    let exit = exit.ok_or_else(|| anyhow::anyhow!("the old attempt's command reported no exit"))?;
    assert!(fenced_at.elapsed() < Duration::from_secs(5), "killed at once, not at its end: {:?}", fenced_at.elapsed());
    assert!(exit.killed && exit.kill_reason == KillReason::Fenced as i32, "{exit:?}");

    // Attempt 1's next calls are refused, naming the fence; attempt 2, other runs and calls without a
    // token go on.
    let refused = expect_code(
        c.get_sandbox(fenced(ALICE_KEY, "run-1", "1", GetSandboxRequest { thread_id: T.to_owned() })).await,
        Code::FailedPrecondition,
        "fenced GetSandbox",
    );
    assert!(refused.message().contains("run run-1 attempt 1 is fenced: attempt 2"), "{}", refused.message());
    let refused = expect_code(
        c.execute_command(fenced(ALICE_KEY, "run-1", "1", exec_request("echo late"))).await.map(|r| r.into_inner()),
        Code::FailedPrecondition,
        "fenced ExecuteCommand",
    );
    assert!(refused.message().contains("x-antler-run-attempt"), "{}", refused.message());
    let write = WriteFileRequest {
        thread_id: T.to_owned(),
        path: "/mnt/user-data/workspace/late.txt".to_owned(),
        content: Some(write_file_request::Content::Text("late".to_owned())),
        append: false,
    };
    expect_code(c.write_file(fenced(ALICE_KEY, "run-1", "1", write.clone())).await, Code::FailedPrecondition, "fenced WriteFile");
    assert!(!server.host_root("alice", T, "workspace").join("late.txt").exists(), "nothing written by the fenced attempt");
    let mut stream = c.execute_command(fenced(ALICE_KEY, "run-1", "2", exec_request("echo current"))).await?.into_inner();
    let mut out = String::new();
    while let Some(message) = stream.message().await? {
        if let Some(execute_command_response::Event::Output(o)) = message.event {
            out.push_str(&o.text);
        }
    }
    assert_eq!(out, "current\n");
    c.write_file(req(ALICE_KEY, write)).await?;
    let bystander = bystander.await??;
    let ran = collect(bystander).await?;
    assert!(ran.contains("bystander") && !ran.contains("killed"), "another run's command is untouched: {ran}");

    // Per user: bob's run with the same id is another run.
    common::acquire(&mut c, BOB_KEY, T).await?;
    c.get_sandbox(fenced(BOB_KEY, "run-1", "1", GetSandboxRequest { thread_id: T.to_owned() })).await?;

    // Malformed tokens are INVALID_ARGUMENT naming the header.
    let mut half = req(ALICE_KEY, GetSandboxRequest { thread_id: T.to_owned() });
    half.metadata_mut().insert("x-antler-run-id", "run-1".parse()?);
    let status = expect_code(c.get_sandbox(half).await, Code::InvalidArgument, "id without attempt");
    assert!(status.message().contains("x-antler-run-attempt"), "{}", status.message());
    let status = expect_code(
        c.get_sandbox(fenced(ALICE_KEY, "run-1", "zero", GetSandboxRequest { thread_id: T.to_owned() })).await,
        Code::InvalidArgument,
        "bad attempt",
    );
    assert!(status.message().contains("x-antler-run-attempt"), "{}", status.message());
    Ok(())
}

/// The stdout of a command's stream, plus `killed` if it was.
async fn collect(mut stream: tonic::Streaming<ExecuteCommandResponse>) -> anyhow::Result<String> {
    let mut out = String::new();
    while let Some(message) = stream.message().await? {
        match message.event {
            Some(execute_command_response::Event::Output(o)) => out.push_str(&o.text),
            Some(execute_command_response::Event::Exit(e)) if e.killed => out.push_str("killed"),
            _ => {}
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_kills_and_refuses_the_old_attempt_with_the_local_provider() -> anyhow::Result<()> {
    bounded(a_takeover_kills_the_old_attempt_s_commands_and_refuses_it("provider: local\nallow_host_bash: true")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_kills_and_refuses_the_old_attempt_with_the_bwrap_provider() -> anyhow::Result<()> {
    if !common::bwrap_usable("a_takeover_kills_and_refuses_the_old_attempt_with_the_bwrap_provider") {
        return Ok(());
    }
    bounded(a_takeover_kills_the_old_attempt_s_commands_and_refuses_it("provider: bwrap")).await
}
