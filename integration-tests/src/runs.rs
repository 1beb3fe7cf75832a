//! Helpers for driving the runs service: users, requests, waiting for a status.

use std::time::{Duration, Instant};

use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::thread_service_client::ThreadServiceClient;
use antler_proto::runs::{CreateRunRequest, GetRunRequest, Run, RunStatus};
use anyhow::{Result, bail};
use tonic::transport::Channel;

use crate::db::TestDb;
use crate::{Launch, Process, start};

pub const ALICE: &str = "alice-runs-key-0123456789";
pub const BOB: &str = "bob-runs-key-0123456789";
/// The runs service's own key (a service principal): how its workers call the sandbox for a user.
pub const SERVICE: &str = "runs-service-key-0123456789";

/// `antler.yaml` for a runs server on `db`, with users alice and bob and short leases, plus `extra`
/// lines for the `runs:` section (each indented by two spaces, e.g. `"  max_concurrent_runs: 1\n"`).
pub fn config(db: &TestDb, extra: &str) -> String {
    format!(
        "server:\n  shutdown_grace_secs: 5\n  auth:\n    enabled: true\n    api_keys:\n      - key: {ALICE}\n        user: alice\n      - key: {BOB}\n        user: bob\n      - key: {SERVICE}\n        user: antler-runs\n        service: true\nclients:\n  sandbox:\n    service_token: {SERVICE}\nruns:\n  database:\n    url: \"{}\"\n  lease_secs: 3\n  lease_grace_secs: 0\n  sweep_interval_secs: 1\n  heartbeat_secs: 1\n  drain_secs: 1\n  agent: script\n{extra}",
        db.url
    )
}

/// Starts `antler-runs` on `db`.
pub fn start_runs(db: &TestDb, extra: &str) -> Result<Process> {
    start("antler-runs", Launch::default().config(config(db, extra)))
}

/// Starts `antler up` (every service in one process) on `db`: runs whose outputs the sandbox checks.
pub fn start_up(db: &TestDb, extra: &str) -> Result<Process> {
    start("antler", Launch::new(["up"]).config(config(db, extra)))
}

/// A request carrying `key`.
pub fn authed<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(value) = format!("Bearer {key}").parse() {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

pub fn user_text(text: &str) -> Message {
    Message {
        role: Role::User as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
        ..Message::default()
    }
}

/// A user message that makes the script agent follow `steps`.
pub fn script(steps: serde_json::Value) -> Message {
    user_text(&serde_json::json!({ "script": steps }).to_string())
}

/// A CreateRunRequest on `thread_id` (empty: a new thread) following `steps`.
pub fn run_request(thread_id: &str, steps: serde_json::Value) -> CreateRunRequest {
    CreateRunRequest { thread_id: thread_id.to_owned(), input: vec![script(steps)], ..CreateRunRequest::default() }
}

pub async fn clients(process: &Process) -> Result<(RunServiceClient<Channel>, ThreadServiceClient<Channel>)> {
    let channel = process.channel().await?;
    Ok((RunServiceClient::new(channel.clone()), ThreadServiceClient::new(channel)))
}

/// Polls GetRun until `done` holds (at most `timeout`).
pub async fn wait_run(
    runs: &mut RunServiceClient<Channel>,
    key: &str,
    run_id: &str,
    timeout: Duration,
    done: impl Fn(&Run) -> bool,
) -> Result<Run> {
    let deadline = Instant::now() + timeout;
    loop {
        let run = runs
            .get_run(authed(GetRunRequest { run_id: run_id.to_owned(), ..Default::default() }, key))
            .await?
            .into_inner()
            .run
            .unwrap_or_default();
        if done(&run) {
            return Ok(run);
        }
        if Instant::now() > deadline {
            bail!("run {run_id} did not reach the expected state in {timeout:?}; last seen {:?} ({})", run.status(), run.stop_reason);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Creates `request` as alice and waits until the run is terminal (at most `timeout`).
pub async fn run_to_end(runs: &mut RunServiceClient<Channel>, request: CreateRunRequest, timeout: Duration) -> Result<Run> {
    let run = runs.create_run(authed(request, ALICE)).await?.into_inner().run.unwrap_or_default();
    wait_run(runs, ALICE, &run.run_id, timeout, is_terminal).await
}

pub fn is_terminal(run: &Run) -> bool {
    matches!(run.status(), RunStatus::Success | RunStatus::Error | RunStatus::Interrupted | RunStatus::Timeout)
}

/// How many complete assistant messages the run's stored events hold. Each `say` step of the script
/// agent writes one, so it tells from the store (not from a log line) how often a script ran.
pub async fn said(runs: &mut RunServiceClient<Channel>, key: &str, run_id: &str) -> Result<usize> {
    let events = run_events(runs, key, run_id).await?;
    Ok(events.iter().filter(|e| matches!(&e.kind, Some(antler_proto::runs::run_event::Kind::Message(_)))).count())
}

/// `antler.yaml` for `antler up` running the lead agent (`runs.agent: lead`) against the model
/// upstream double `models` (a `models:` section), with the local sandbox provider and host bash on.
/// `extra` adds lines to the `runs:` section, as in [`config`].
pub fn agent_config(db: &TestDb, models: &str, extra: &str) -> String {
    format!(
        "server:\n  shutdown_grace_secs: 5\n  auth:\n    enabled: true\n    api_keys:\n      - key: {ALICE}\n        user: alice\n      - key: {BOB}\n        user: bob\n      - key: {SERVICE}\n        user: antler-runs\n        service: true\nclients:\n  sandbox:\n    service_token: {SERVICE}\n  models:\n    service_token: {SERVICE}\n  mcp:\n    service_token: {SERVICE}\n  memory:\n    service_token: {SERVICE}\nruns:\n  database:\n    url: \"{}\"\n  lease_secs: 3\n  lease_grace_secs: 0\n  sweep_interval_secs: 1\n  heartbeat_secs: 1\n  drain_secs: 1\n  agent: lead\n{extra}sandbox:\n  provider: local\n  allow_host_bash: true\n{models}",
        db.url
    )
}

/// Starts `antler up` with [`agent_config`]; `data_dir` fixed when a restarted process must find
/// its predecessor's sandbox files.
pub fn start_agent_up(db: &TestDb, models: &str, extra: &str, data_dir: Option<&std::path::Path>) -> Result<Process> {
    let mut launch = Launch::new(["up"]).config(agent_config(db, models, extra));
    if let Some(dir) = data_dir {
        launch = launch.data_dir(dir);
    }
    start("antler", launch)
}

/// A CreateRunRequest on `thread_id` (empty: a new thread) with a plain text prompt.
pub fn prompt_request(thread_id: &str, text: &str) -> CreateRunRequest {
    CreateRunRequest { thread_id: thread_id.to_owned(), input: vec![user_text(text)], ..CreateRunRequest::default() }
}

/// Every stored event of `run_id`, in order.
pub async fn run_events(runs: &mut RunServiceClient<Channel>, key: &str, run_id: &str) -> Result<Vec<antler_proto::runs::RunEvent>> {
    let mut events = Vec::new();
    let mut after_seq = 0;
    loop {
        let page = runs
            .list_run_events(authed(
                antler_proto::runs::ListRunEventsRequest { run_id: run_id.to_owned(), after_seq, ..Default::default() },
                key,
            ))
            .await?
            .into_inner();
        let more = page.page.is_some_and(|p| !p.next_page_token.is_empty());
        if let Some(last) = page.events.last() {
            after_seq = last.seq;
        }
        let empty = page.events.is_empty();
        events.extend(page.events);
        if empty || !more {
            return Ok(events);
        }
    }
}

/// Starts a run that waits to be cancelled and returns once it is RUNNING: with
/// `max_concurrent_runs: 1` it holds the only worker slot, so later runs stay PENDING.
pub async fn hold_the_only_slot(runs: &mut RunServiceClient<Channel>) -> Result<Run> {
    let blocker = runs
        .create_run(authed(run_request("", serde_json::json!([{"wait_cancel": true}])), ALICE))
        .await?
        .into_inner()
        .run
        .unwrap_or_default();
    wait_run(runs, ALICE, &blocker.run_id, Duration::from_secs(20), |r| r.status() == RunStatus::Running).await
}

/// The TOOL_FINISHED events among `events`, in order.
pub fn tool_finished(events: &[antler_proto::runs::RunEvent]) -> Vec<antler_proto::runs::ToolFinished> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(antler_proto::runs::run_event::Kind::ToolFinished(f)) => Some(f.clone()),
            _ => None,
        })
        .collect()
}
