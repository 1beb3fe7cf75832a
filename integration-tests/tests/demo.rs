//! The README's first command, as a user meets it: `antler up --demo` with no configuration streams a
//! lead-agent run played by the built-in `demo` model (plan → write → check → present → answer) that
//! ends SUCCESS because the sandbox holds the file; `antler run` then does the same against the
//! running server and exits 0.

use std::time::{Duration, Instant};

use antler_integration_tests::{Launch, binary, start};

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn antler_up_demo_streams_a_delivered_lead_agent_run_and_antler_run_repeats_it() -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let server = start("antler", Launch::new(["up", "--demo"]).listen(addr.clone()).data_dir(data.path()))?;

    let deadline = Instant::now() + Duration::from_secs(90);
    let mut stdout = String::new();
    let finished = loop {
        for line in server.stdout_lines() {
            stdout.push_str(&line);
            stdout.push('\n');
        }
        if stdout.contains("demo finished") || stdout.contains("demo run failed") {
            break stdout;
        }
        anyhow::ensure!(Instant::now() < deadline, "no demo result in 90 s\nstdout:\n{stdout}\nstderr:\n{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let shown = format!("stdout:\n{finished}\nstderr:\n{}", server.stderr());
    // --demo logs at WARN, so the run's progress is not interleaved with INFO lines (a plain `antler
    // up` logs "serving" and each run's lifecycle at INFO).
    assert!(!server.stderr().contains(" INFO "), "{shown}");
    assert!(finished.contains("demo finished: RUN_STATUS_SUCCESS"), "{shown}");
    for step in ["tool write_todos(", "tool write_file(", "path=\"/mnt/user-data/outputs/hello.md\")", "tool bash(", "tool present_files("]
    {
        assert!(finished.contains(step), "{step:?} missing\n{shown}");
    }
    assert!(finished.contains("delivery receipt: satisfied"), "{shown}");
    assert!(finished.contains("/mnt/user-data/outputs/hello.md ("), "the receipt lists the file\n{shown}");
    assert!(finished.contains("usage: 7303 tokens in 5 model calls"), "usage of the five scripted turns\n{shown}");
    let written: Vec<_> = glob_outputs(data.path())?;
    assert_eq!(written.len(), 1, "one thread wrote hello.md: {written:?}");

    // A second run from the command line on a new thread: the same transcript, exit status 0.
    let output = tokio::process::Command::new(binary("antler")?)
        .args(["run", "Write me a note", "--addr", &format!("http://{addr}"), "--plan", "--expect", "/mnt/user-data/outputs/hello.md"])
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "antler run failed: {:?}\n{stdout}\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    // A plain final answer has no stop reason to show.
    assert!(stdout.lines().any(|l| l.trim_end().ends_with("end: SUCCESS")), "{stdout}");

    // Declaring an output the transcript never writes: the run cannot succeed, and the exit status says so.
    let output = tokio::process::Command::new(binary("antler")?)
        .args(["run", "Write me a note", "--addr", &format!("http://{addr}"), "--plan", "--expect", "/mnt/user-data/outputs/report.md"])
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The documented exit code of a run that ended ERROR.
    assert_eq!(output.status.code(), Some(10), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("NOT satisfied, missing /mnt/user-data/outputs/report.md"), "{stdout}");
    assert!(stdout.contains("end: ERROR (delivery_incomplete)"), "{stdout}");
    Ok(())
}

/// Every `hello.md` under the sandbox data of `root`.
fn glob_outputs(root: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                stack.push(path);
            } else if path.ends_with("user-data/outputs/hello.md") {
                found.push(path);
            }
        }
    }
    Ok(found)
}
