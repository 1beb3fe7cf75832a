//! `invoke_acp_agent` (`runs.lead.acp_agents`) in lead-agent runs on `antler up`, with the ACP agent
//! double (`integration-tests/acp/acp_agent_double.py`, JSON-RPC on stdio) as the external agent: its
//! streamed updates become `acp_agent` events and its text the tool result; its permission request is
//! denied by default and granted when allowlisted; its write inside the ACP workspace lands and the
//! lead agent reads it at /mnt/acp-workspace but cannot write there; its write outside is refused; a
//! call that hangs is cancelled at the timeout and when the run is cancelled, and its process group
//! (a grandchild that ignores SIGTERM included) is killed. The agent runs under bwrap
//! (`runs.lead.acp.isolation`, default): its own writes land in its workspace only, the host is
//! read-only to it and the data directory (the runs database) invisible.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::llm_double::{AfterLast, LlmDouble, Turn, call};
use antler_integration_tests::metrics::{metrics_url, scrape_until, with_metrics};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, start};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::{CancelRunRequest, RunStatus};
use anyhow::{Result, bail, ensure};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

fn double_py() -> String {
    format!("{}/acp/acp_agent_double.py", env!("CARGO_MANIFEST_DIR"))
}

/// The `runs.lead` lines: the double as agent `double`, plus `acp` settings. `mark` goes on the
/// command line of the double and of the grandchild it starts (see [`marked`]).
fn lead(mark: &str, acp: &str) -> String {
    format!(
        "  lead:\n    acp_agents:\n      double:\n        command: python3\n        args: ['{}', '{mark}']\n        description: A test agent.\n    acp:\n{acp}",
        double_py()
    )
}

fn new_mark() -> String {
    format!("acp-mark-{}", uuid::Uuid::new_v4().simple())
}

fn acp_workspace(data: &Path, thread_id: &str) -> PathBuf {
    data.join("sandbox/users/alice/threads").join(thread_id).join("acp-workspace")
}

/// The `acp_agent` events of a run, as JSON.
fn acp_events(events: &[antler_proto::runs::RunEvent]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::Custom(c)) if c.name == "acp_agent" => Some(antler_kit::json::value_to_json(&c.data.clone().unwrap_or_default())),
            _ => None,
        })
        .collect()
}

/// The host's running processes (zombies nobody reaped run no more) with `mark` as an argument: bwrap,
/// the double and its grandchild. Found by command line because pids inside the sandbox's pid namespace
/// are not the host's.
fn marked(mark: &str) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let zombie = stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
            (!zombie && args.iter().any(|a| a == mark)).then(|| (pid, args.join(" ")))
        })
        .collect()
}

async fn wait_gone(mark: &str, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let left = marked(mark);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("still running: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for the hanging double to have started its grandchild, and checks both run.
async fn wait_hanging(workspace: &Path, mark: &str, up: &antler_integration_tests::Process) -> Result<()> {
    let deadline = Instant::now() + T;
    while !workspace.join("hanging").is_file() {
        ensure!(Instant::now() < deadline, "the agent never started\n{}", up.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let running = marked(mark);
    // bwrap's own command line names both programs too.
    let runs = |what: &str| running.iter().any(|(_, args)| !args.starts_with("bwrap") && !args.contains("/bwrap ") && args.contains(what));
    ensure!(runs("acp_agent_double.py"), "the double runs: {running:?}");
    ensure!(runs("time.sleep(300)"), "its grandchild runs: {running:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_agent_works_in_its_workspace_and_the_lead_reads_the_result() -> Result<()> {
    let double = LlmDouble::start(
        vec![
            Turn::tools("Delegating.", vec![call("a1", "invoke_acp_agent", json!({"agent": "double", "prompt": "Write result.txt."}))]),
            Turn::tools(
                "Reading.",
                vec![
                    call("r1", "read_file", json!({"description": "read", "path": "/mnt/acp-workspace/result.txt"})),
                    call("w1", "write_file", json!({"description": "tamper", "path": "/mnt/acp-workspace/result.txt", "content": "x"})),
                ],
            ),
            Turn::text("Done."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let data = tempfile::tempdir()?;
    let config = agent_config(&db, &double.models_yaml(), &lead(&new_mark(), "      timeout_seconds: 30\n"));
    let up = start("antler", Launch::new(["up"]).config(with_metrics(&config, "[0.1, 1]")).data_dir(data.path()))?;
    let metrics = metrics_url(&up)?;
    let (mut runs, _) = clients(&up).await?;
    let run = runs.create_run(authed(prompt_request("", "Delegate."), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, up.stderr());

    let requests = double.requests();
    let offered = requests[0]["tools"].to_string();
    ensure!(offered.contains("invoke_acp_agent") && offered.contains("- double: A test agent."), "{offered}");
    let result = requests[1]["messages"].to_string();
    ensure!(result.contains("ACP agent `double` finished (stop reason: end_turn)"), "{result}");
    ensure!(result.contains("Working on it."), "the streamed text is the answer: {result}");
    ensure!(result.contains("permission: denied (reject)"), "denied by default, with the reject option: {result}");
    ensure!(result.contains("Permission requests: 0 granted, 1 denied"), "{result}");
    ensure!(result.contains("inside write: ok") && result.contains("read back: ACP-DOUBLE-RESULT"), "{result}");
    ensure!(result.contains("outside write: refused:") && result.contains("outside the ACP workspace"), "{result}");
    ensure!(result.contains("Files it wrote (read-only for you): /mnt/acp-workspace/result.txt"), "{result}");
    let after = requests[2]["messages"].to_string();
    ensure!(after.contains("ACP-DOUBLE-RESULT"), "the lead reads the result: {after}");
    ensure!(after.contains("/mnt/acp-workspace is read-only"), "and cannot write it: {after}");

    let workspace = acp_workspace(data.path(), &run.thread_id);
    ensure!(std::fs::read_to_string(workspace.join("result.txt"))? == "ACP-DOUBLE-RESULT\n", "not tampered with");
    ensure!(!workspace.parent().is_some_and(|t| t.join("escape.txt").exists()), "the write outside did not land");
    let cwd = std::fs::read_to_string(workspace.join("session-cwd"))?;
    ensure!(Path::new(&cwd) == std::fs::canonicalize(&workspace)?, "session/new names the workspace: {cwd}");

    let events = acp_events(&run_events(&mut runs, ALICE, &run.run_id).await?);
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    ensure!(types.first() == Some(&"started") && types.last() == Some(&"finished"), "{types:?}");
    for wanted in ["message", "tool_call", "permission", "file_write", "file_read"] {
        ensure!(types.contains(&wanted), "no {wanted} event: {types:?}");
    }
    ensure!(events.iter().all(|e| e["tool_call_id"] == "a1" && e["agent"] == "double"), "{events:?}");
    ensure!(events.iter().any(|e| e["type"] == "permission" && e["granted"] == false && e["kind"] == "edit"), "{events:?}");
    ensure!(events.iter().any(|e| e["type"] == "file_write" && e["error"].as_str().is_some_and(|m| m.contains("outside"))), "{events:?}");
    ensure!(events.iter().any(|e| e["type"] == "finished" && e["outcome"] == "ok"), "{events:?}");

    let scrape = scrape_until(&metrics, T, |s| s.value("antler_agent_acp_calls_total", &[("outcome", "ok")]) >= 1.0).await?;
    ensure!(scrape.value("antler_agent_acp_calls_total", &[("outcome", "ok")]) == 1.0, "{}", scrape.text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlisted_permission_is_granted_and_a_hung_agent_is_killed_at_the_timeout() -> Result<()> {
    let double = LlmDouble::start(
        vec![
            Turn::tools("Delegating.", vec![call("a1", "invoke_acp_agent", json!({"agent": "double", "prompt": "Edit."}))]),
            Turn::tools("Again.", vec![call("a2", "invoke_acp_agent", json!({"agent": "double", "prompt": "HANG please."}))]),
            Turn::text("Done."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let data = tempfile::tempdir()?;
    let mark = new_mark();
    let extra = lead(&mark, "      timeout_seconds: 2\n      permissions: [edit]\n");
    let up = start_agent_up(&db, &double.models_yaml(), &extra, Some(data.path()))?;
    let (mut runs, _) = clients(&up).await?;
    let started = Instant::now();
    let run = runs.create_run(authed(prompt_request("", "Delegate."), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, up.stderr());
    ensure!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());

    let requests = double.requests();
    let first = requests[1]["messages"].to_string();
    ensure!(first.contains("permission: granted (allow)") && first.contains("1 granted, 0 denied"), "{first}");
    let second = requests[2]["messages"].to_string();
    ensure!(second.contains("did not finish within 2 s (runs.lead.acp.timeout_seconds)"), "{second}");
    ensure!(second.contains("Working on it."), "what it said before: {second}");

    let workspace = acp_workspace(data.path(), &run.thread_id);
    ensure!(workspace.join("cancel-received").is_file(), "session/cancel was sent before the kill");
    ensure!(workspace.join("hanging").is_file(), "the hung agent had started its grandchild");
    wait_gone(&mark, Duration::from_secs(10)).await?;
    let events = acp_events(&run_events(&mut runs, ALICE, &run.run_id).await?);
    ensure!(events.iter().any(|e| e["type"] == "finished" && e["outcome"] == "timeout" && e["tool_call_id"] == "a2"), "{events:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_run_ends_the_acp_session_and_kills_the_agent() -> Result<()> {
    let double = LlmDouble::start(
        vec![Turn::tools("Delegating.", vec![call("a1", "invoke_acp_agent", json!({"agent": "double", "prompt": "HANG."}))])],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    let data = tempfile::tempdir()?;
    let mark = new_mark();
    let up = start_agent_up(&db, &double.models_yaml(), &lead(&mark, "      timeout_seconds: 600\n"), Some(data.path()))?;
    let (mut runs, _) = clients(&up).await?;
    let run = runs.create_run(authed(prompt_request("", "Delegate."), ALICE)).await?.into_inner().run.unwrap_or_default();
    let workspace = acp_workspace(data.path(), &run.thread_id);
    wait_hanging(&workspace, &mark, &up).await?;
    runs.cancel_run(authed(CancelRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE)).await?;
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Interrupted, "{:?}", run.status());
    wait_gone(&mark, Duration::from_secs(10)).await?;
    ensure!(workspace.join("cancel-received").is_file(), "session/cancel was sent first");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confined_agent_writes_only_its_workspace_and_cannot_see_the_data_directory() -> Result<()> {
    let data = tempfile::tempdir()?;
    // Outside /tmp (the sandbox has a /tmp of its own): the agent sees this directory, read-only.
    let outside = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    std::fs::write(outside.path().join("visible.txt"), "HOST-FILE")?;
    let task = format!("CONFINE outside={} data={}", outside.path().display(), data.path().display());
    let double = LlmDouble::start(
        vec![
            Turn::tools("Delegating.", vec![call("a1", "invoke_acp_agent", json!({"agent": "double", "prompt": task}))]),
            Turn::text("Done."),
        ],
        AfterLast::Refuse,
    )
    .await?;
    let db = TestDb::new(Backend::Sqlite).await?;
    // The runs database where it lives by default: in the data directory.
    let database = data.path().join("runs.db");
    let config = agent_config(&db, &double.models_yaml(), &lead(&new_mark(), "      timeout_seconds: 30\n"))
        .replace(&db.url, &format!("sqlite://{}?mode=rwc", database.display()));
    let up = start("antler", Launch::new(["up"]).config(config).data_dir(data.path()))?;
    let (mut runs, _) = clients(&up).await?;
    let run = runs.create_run(authed(prompt_request("", "Delegate."), ALICE)).await?.into_inner().run.unwrap_or_default();
    let run = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    ensure!(run.status() == RunStatus::Success, "{:?}\n{}", run.error, up.stderr());

    let result = double.requests()[1]["messages"].to_string();
    ensure!(result.contains("ACP agent `double` finished"), "{result}");
    ensure!(result.contains("cwd write: ok"), "{result}");
    ensure!(result.contains("outside read: HOST-FILE"), "the host is readable: {result}");
    ensure!(result.contains("outside write: refused (Read-only file system)"), "{result}");
    ensure!(result.contains("data db: missing"), "{result}");
    ensure!(result.contains("data list: sandbox\\n"), "only the way to its workspace: {result}");
    ensure!(result.contains("data write: refused (Read-only file system)"), "{result}");

    // What the host sees.
    let workspace = acp_workspace(data.path(), &run.thread_id);
    ensure!(std::fs::read_to_string(workspace.join("direct.txt"))? == "DIRECT\n", "its own write landed in its workspace");
    ensure!(!outside.path().join("escape.txt").exists(), "nothing written outside");
    ensure!(!data.path().join("escape.txt").exists(), "nothing written in the data directory");
    ensure!(database.is_file(), "the database it could not see is there");
    Ok(())
}
