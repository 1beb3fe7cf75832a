//! The sandbox fencing token end to end: a run whose worker is paused (SIGSTOP, so its connections stay
//! open and it never notices) is taken over by another replica, and the paused attempt's long command
//! in the sandbox (a separate `antler-sandbox` process) is killed as soon as the new attempt calls —
//! not when the old worker wakes up, nor at the command's end.

use std::time::{Duration, Instant};

use antler_integration_tests::db::{Backend, TestDb};
use antler_integration_tests::metrics::{metrics_url, scrape_until, with_metrics};
use antler_integration_tests::runs::*;
use antler_integration_tests::{Launch, start};
use antler_proto::runs::*;
use serde_json::json;

const T: Duration = Duration::from_secs(30);

/// The paused attempt's command, unique to this test process: with a fixed one, two suites running
/// at once on one machine found each other's command, and this test paused its worker before the run
/// had even started.
fn mark() -> String {
    format!("sleep 6123.{}", std::process::id())
}

/// Pids of processes whose command line is exactly [`mark`], and not zombies.
fn marked() -> Vec<u32> {
    let mark = mark();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'));
        if String::from_utf8_lossy(&cmdline).replace('\0', " ").trim() == mark && !zombie {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_worker_s_command_dies_when_its_run_is_taken_over() -> anyhow::Result<()> {
    let db = TestDb::new(Backend::Postgres).await?;
    let sandbox_yaml = format!(
        "server:\n  auth:\n    enabled: true\n    api_keys:\n      - key: {SERVICE}\n        user: antler-runs\n        service: true\nsandbox:\n  provider: local\n  allow_host_bash: true\n"
    );
    let sandbox = start("antler-sandbox", Launch::default().config(with_metrics(&sandbox_yaml, "[0.1, 1]")))?;
    let sandbox_metrics = metrics_url(&sandbox)?;
    let runs_yaml =
        config(&db, "").replacen("clients:\n  sandbox:\n", &format!("clients:\n  sandbox:\n    endpoint: {}\n", sandbox.url()), 1);

    let first = start("antler-runs", Launch::default().config(runs_yaml.clone()))?;
    let (mut runs, _) = clients(&first).await?;
    // Attempt 1 starts a command that would run for 6123 s; attempt 2 (after the checkpoint, finding
    // the marker file) only says so.
    let command = format!("if [ -e marker ]; then echo second; else touch marker; exec {}; fi", mark());
    let steps = json!([{"checkpoint": true}, {"exec": command}, {"say": "done"}]);
    let run = runs.create_run(authed(run_request("", steps), ALICE)).await?.into_inner().run.unwrap_or_default();
    let deadline = Instant::now() + T;
    let old = loop {
        if let [pid] = marked()[..] {
            break pid;
        }
        anyhow::ensure!(Instant::now() < deadline, "attempt 1's command never started\n{}\n{}", first.stderr(), sandbox.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Pause the worker: its lease stops being renewed, its ExecuteCommand stream stays open.
    first.signal(libc::SIGSTOP)?;
    let second = start("antler-runs", Launch::default().config(runs_yaml))?;
    let (mut runs, _) = clients(&second).await?;
    let done = wait_run(&mut runs, ALICE, &run.run_id, T, is_terminal).await?;
    assert_eq!((done.status(), done.attempt), (RunStatus::Success, 2), "{:?}\n{}", done.error, second.stderr());
    // Attempt 1's command is gone while its worker is still paused.
    let gone = Instant::now() + Duration::from_secs(5);
    while marked().contains(&old) {
        anyhow::ensure!(Instant::now() < gone, "attempt 1's command (pid {old}) still runs after the takeover\n{}", sandbox.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let scrape = scrape_until(&sandbox_metrics, T, |s| s.value("antler_sandbox_exec_kills_total", &[("reason", "fenced")]) >= 1.0).await?;
    assert_eq!(scrape.value("antler_sandbox_exec_kills_total", &[("reason", "fenced")]), 1.0);

    // Woken up, the old worker finds its command killed and its calls refused; the run stays attempt 2's.
    first.signal(libc::SIGCONT)?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = runs.get_run(authed(GetRunRequest { run_id: run.run_id.clone(), ..Default::default() }, ALICE)).await?.into_inner();
    let after = after.run.unwrap_or_default();
    assert_eq!((after.status(), after.attempt, after.last_seq), (RunStatus::Success, 2, done.last_seq), "the old attempt wrote nothing");
    assert_eq!(said(&mut runs, ALICE, &run.run_id).await?, 1, "only attempt 2 said `done`");
    Ok(())
}
