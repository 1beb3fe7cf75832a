//! The `antler` binary where it meets a terminal, a pipe and a wrong address (issue #28): a reader that
//! leaves early ends a command quietly; an `http://` address to a TLS server, an `https://` one to a
//! plaintext server and a malformed one get the documented exit codes with a hint; `host:port` works
//! as well as `http://host:port`; the runs service's hints come out as the flags a user types, and those
//! flags work; `antler run` colours its lines and keeps a spinner going while a tool call's arguments
//! stream, on a real pseudo-terminal (`script`, util-linux).

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use antler_integration_tests::tls::{Ca, LOCAL_NAMES, server_tls_yaml, with_server_tls};
use antler_integration_tests::{Launch, Process, binary, start};
use anyhow::{Result, ensure};
use serde_json::Value;

/// Exit codes documented in the README (and services/antler/src/cli/mod.rs).
const USAGE: i32 = 2;
const CONNECT: i32 = 3;
const REFUSED: i32 = 6;
const INTERRUPTED: i32 = 11;

/// Three replay models: `quick` (the default) answers at once; `slow` talks for about 20 s (a run to
/// collide with); `args` streams a 600-byte tool call over about 4.5 s, then answers.
const MODELS: &str = r#"
models:
  - name: quick
    provider: replay
    replay:
      after_last: repeat_last
      turns:
        - text: Hello from the quick model.
  - name: slow
    provider: replay
    replay:
      after_last: repeat_last
      turns:
        - text: "{SLOW}"
          chunk_chars: 5
          chunk_delay_ms: 50
  - name: args
    provider: replay
    replay:
      after_last: error
      turns:
        - text: Writing it.
          chunk_chars: 8
          chunk_delay_ms: 60
          tool_calls:
            - name: write_file
              arguments: {path: /mnt/user-data/workspace/big.md, content: "{CONTENT}"}
        - text: Done.
"#;

fn models_yaml() -> String {
    MODELS.replace("{SLOW}", &"word ".repeat(400)).replace("{CONTENT}", &"0123456789".repeat(56))
}

/// `antler ARGS` with stdout and stderr captured, no colour unless asked for.
async fn antler(args: &[&str], env: &[(&str, &str)]) -> Result<Output> {
    let mut command = tokio::process::Command::new(binary("antler")?);
    command.args(args).env_remove("ANTLER_ADDR").env_remove("NO_COLOR").env("TERM", "xterm");
    for (key, value) in env {
        command.env(key, value);
    }
    Ok(command.output().await?)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn shown(output: &Output) -> String {
    format!("status {:?}\nstdout:\n{}\nstderr:\n{}", output.status, String::from_utf8_lossy(&output.stdout), stderr(output))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_leaves_early_ends_the_command_quietly() -> Result<()> {
    let server = start("antler", Launch::new(["up"]).config(models_yaml()))?;
    let addr = server.url();
    for args in [
        vec!["memory", "export"],
        vec!["threads", "list"],
        vec!["models", "list"],
        vec!["runs", "list", "--json"],
        vec!["run", "Say hello"],
        vec!["config", "check"],
    ] {
        // The reading end is closed before the command starts, so its first write fails: as `| head -0`,
        // without a race with the reader.
        let (reader, writer) = std::io::pipe()?;
        drop(reader);
        let output = tokio::process::Command::new(binary("antler")?)
            .args(&args)
            .args(if args[0] == "config" { vec![] } else { vec!["--addr", &addr] })
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .await?;
        let text = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "antler {args:?}: {text}");
        assert!(!text.contains("panicked") && !text.contains("error"), "antler {args:?} said: {text}");
    }
    drop(server);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_with_and_without_a_scheme_work_and_a_malformed_one_is_a_usage_error() -> Result<()> {
    let server = start("antler", Launch::new(["up"]).config(models_yaml()))?;
    let host_port = server.addr.to_string();
    let url = server.url();
    for (args, env) in [
        (vec!["models", "list", "--addr", host_port.as_str()], vec![]),
        (vec!["models", "list", "--addr", url.as_str()], vec![]),
        (vec!["models", "list"], vec![("ANTLER_ADDR", host_port.as_str())]),
        (vec!["models", "list"], vec![("ANTLER_ADDR", url.as_str())]),
        (vec!["run", "Say hello"], vec![("ANTLER_ADDR", host_port.as_str())]),
    ] {
        let output = antler(&args, &env).await?;
        assert_eq!(output.status.code(), Some(0), "{args:?} {env:?}\n{}", shown(&output));
    }
    for bad in ["ftp://127.0.0.1:1", "http://[bad", "127.0.0.1:notaport", "http://127.0.0.1:1/some/path", ""] {
        let output = antler(&["threads", "list", "--addr", bad], &[]).await?;
        assert_eq!(output.status.code(), Some(USAGE), "--addr {bad:?}\n{}", shown(&output));
        assert!(stderr(&output).contains("host:port, http://host:port or https://host:port"), "{}", shown(&output));
        // An empty variable counts as unset (clap), so only the others are tried from the environment.
        if !bad.is_empty() {
            let output = antler(&["threads", "list"], &[("ANTLER_ADDR", bad)]).await?;
            assert_eq!(output.status.code(), Some(USAGE), "ANTLER_ADDR={bad:?}\n{}", shown(&output));
        }
    }
    // https:// to a plaintext server: cannot connect (3), and the hint says which way round it is.
    let ca = Ca::new("antler cli test CA")?;
    let ca_path = ca.cert.to_string_lossy().into_owned();
    let output = antler(&["threads", "list", "--addr", &format!("https://{host_port}"), "--ca", &ca_path], &[]).await?;
    assert_eq!(output.status.code(), Some(CONNECT), "{}", shown(&output));
    assert!(stderr(&output).contains("hint: the server does not speak TLS: use http://"), "{}", shown(&output));
    drop(server);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_address_to_a_tls_server_exits_3_and_says_the_server_speaks_tls() -> Result<()> {
    let ca = Ca::new("antler cli test CA")?;
    let leaf = ca.issue("server", &LOCAL_NAMES)?;
    let server = start("antler", Launch::new(["up"]).config(with_server_tls(&models_yaml(), &server_tls_yaml(&leaf, None, ""))))?;
    let host_port = server.addr.to_string();
    for args in [
        vec!["threads", "list", "--addr", &format!("http://{host_port}")],
        vec!["memory", "list", "--addr", &host_port],
        vec!["run", "Say hello", "--addr", &host_port],
    ] {
        let output = antler(&args, &[]).await?;
        assert_eq!(output.status.code(), Some(CONNECT), "{args:?}\n{}", shown(&output));
        let text = stderr(&output);
        assert!(text.contains("hint: the server speaks TLS: use https:// and --ca"), "{args:?}\n{text}");
        assert!(!text.contains("(UNKNOWN)") && !text.contains("(INTERNAL)"), "not a server status: {text}");
    }
    // The same server, addressed as the hint says: https:// and its CA, by flag or by environment.
    let ca_path = ca.cert.to_string_lossy().into_owned();
    let https = format!("https://{host_port}");
    let output = antler(&["models", "list", "--addr", &https, "--ca", &ca_path], &[]).await?;
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    let output = antler(&["run", "Say hello"], &[("ANTLER_ADDR", &https), ("ANTLER_CA", &ca_path)]).await?;
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    drop(server);
    Ok(())
}

/// The run of the first `running` run with at least `min_seq` events, as (run id, thread id).
async fn running_run(server: &Process, min_seq: u64) -> Result<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let output = antler(&["runs", "list", "--status", "running", "--json", "--addr", &server.url()], &[]).await?;
        ensure!(output.status.success(), "{}", shown(&output));
        let listed: Value = serde_json::from_slice(&output.stdout)?;
        let found = listed["runs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["lastSeq"].as_str().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0) >= min_seq);
        if let Some(run) = found {
            return Ok((run["runId"].as_str().unwrap_or_default().to_owned(), run["threadId"].as_str().unwrap_or_default().to_owned()));
        }
        ensure!(Instant::now() < deadline, "no running run in 60 s\n{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_hints_name_the_flags_and_the_flags_work() -> Result<()> {
    let server = start("antler", Launch::new(["up"]).config(models_yaml()))?;
    let addr = server.url();
    let first = tokio::process::Command::new(binary("antler")?)
        .args(["run", "Talk a lot", "--model", "slow", "--addr", &addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let (run_id, thread) = running_run(&server, 3).await?;

    // A second run on the busy thread is refused; the hint is the flag, not the request field.
    let refused = antler(&["run", "Again", "--thread", &thread, "--addr", &addr], &[]).await?;
    assert_eq!(refused.status.code(), Some(REFUSED), "{}", shown(&refused));
    let text = stderr(&refused);
    assert!(text.contains("--multitask enqueue") && text.contains("--multitask interrupt"), "{text}");
    assert!(!text.contains("multitask_strategy") && !text.contains("MULTITASK_STRATEGY"), "{text}");

    // Deleting the busy thread is refused the same way.
    let refused = antler(&["threads", "delete", &thread, "--addr", &addr], &[]).await?;
    assert_eq!(refused.status.code(), Some(REFUSED), "{}", shown(&refused));
    let text = stderr(&refused);
    assert!(text.contains("--cancel-active-run") && text.contains(&format!("antler runs cancel {run_id}")), "{text}");
    assert!(!text.contains("cancel_active_run"), "{text}");

    // --multitask interrupt: the new run takes the thread, the first one ends INTERRUPTED (exit 11).
    let second = tokio::process::Command::new(binary("antler")?)
        .args(["run", "Again", "--thread", &thread, "--model", "slow", "--multitask", "interrupt", "--addr", &addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let first = tokio::time::timeout(Duration::from_secs(60), first.wait_with_output()).await??;
    assert_eq!(first.status.code(), Some(INTERRUPTED), "{}", shown(&first));
    assert!(String::from_utf8_lossy(&first.stdout).contains("(superseded)"), "{}", shown(&first));

    // --cancel-active-run: the thread goes, with the second run (which ends INTERRUPTED too).
    running_run(&server, 3).await?;
    let deleted = antler(&["threads", "delete", &thread, "--cancel-active-run", "--addr", &addr], &[]).await?;
    assert_eq!(deleted.status.code(), Some(0), "{}", shown(&deleted));
    let second = tokio::time::timeout(Duration::from_secs(60), second.wait_with_output()).await??;
    assert_eq!(second.status.code(), Some(INTERRUPTED), "{}", shown(&second));
    drop(server);
    Ok(())
}

/// Runs `command` under `script` (util-linux), which gives it a pseudo-terminal as stdout; returns
/// what the terminal received.
async fn on_a_terminal(command: &str, env: &[(&str, &str)]) -> Result<Output> {
    let script = ["/usr/bin/script", "/bin/script"].into_iter().find(|p| std::path::Path::new(p).exists());
    let Some(script) = script else { anyhow::bail!("`script` (util-linux / bsdutils) is needed to give antler a terminal") };
    let mut child = tokio::process::Command::new(script);
    child.args(["-qfec", command, "/dev/null"]).env_remove("NO_COLOR").env_remove("ANTLER_ADDR").env("TERM", "xterm");
    for (key, value) in env {
        child.env(key, value);
    }
    Ok(tokio::time::timeout(Duration::from_secs(90), child.stdin(Stdio::null()).output()).await??)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn antler_run_colours_its_lines_and_spins_while_tool_arguments_stream() -> Result<()> {
    let server = start("antler", Launch::new(["up"]).config(models_yaml()))?;
    let antler_bin = binary("antler")?.to_string_lossy().into_owned();
    let run = format!("{antler_bin} run 'Write a big file' --model args --addr {}", server.url());

    // A terminal: coloured lines, and while the 600 bytes of arguments arrive (about 4.5 s, the spinner
    // shows after 0.4 s) a spinner line naming the call and the bytes so far.
    let tty = on_a_terminal(&run, &[]).await?;
    let out = String::from_utf8_lossy(&tty.stdout).into_owned();
    assert!(tty.status.success(), "{}", shown(&tty));
    assert!(out.contains("\x1b[36massistant:\x1b[0m Writing it."), "{out:?}");
    assert!(out.contains("end: \x1b[32mSUCCESS\x1b[0m"), "{out:?}");
    let frames: Vec<&str> = out.split('\r').filter(|f| f.contains("write_file: receiving its arguments, ")).collect();
    assert!(frames.len() >= 3, "spinner frames while the arguments streamed: {frames:?}\n{out:?}");
    // The byte count grows from frame to frame; the arguments themselves are never printed as they arrive.
    let bytes = |frame: &str| -> u64 {
        frame.split("arguments, ").nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(u64::MAX)
    };
    let counts: Vec<u64> = frames.iter().map(|f| bytes(f)).filter(|&n| n != u64::MAX).collect();
    assert!(counts.len() >= 2 && counts.first() < counts.last(), "{counts:?}\n{frames:?}");
    assert_eq!(out.matches("0123456789012345678901234567890123456789").count(), 1, "only the cut-down tool line shows the content");

    // NO_COLOR on the same terminal: neither colour nor spinner.
    let plain = on_a_terminal(&run, &[("NO_COLOR", "1")]).await?;
    let out = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(plain.status.success(), "{}", shown(&plain));
    assert!(!out.contains('\x1b') && !out.contains("receiving its arguments"), "{out:?}");
    assert!(out.contains("end: SUCCESS"), "{out:?}");

    // Piped, --color always colours the lines but draws no spinner into the pipe; --color never is plain.
    let piped = antler(&["run", "Write a big file", "--model", "args", "--color", "always", "--addr", &server.url()], &[]).await?;
    let out = String::from_utf8_lossy(&piped.stdout).into_owned();
    assert!(out.contains("end: \x1b[32mSUCCESS\x1b[0m") && !out.contains("receiving its arguments"), "{out:?}");
    let piped = antler(&["run", "Say hello", "--color", "never", "--addr", &server.url()], &[]).await?;
    assert!(!String::from_utf8_lossy(&piped.stdout).contains('\x1b'), "{}", shown(&piped));
    drop(server);
    Ok(())
}
