//! ExecuteCommand behaviours, run on both providers where the behaviour is the provider's job too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use antler_proto::sandbox::*;
use tonic::Code;

use crate::common::{self, ALICE_KEY, bounded, expect_code};

const T: &str = "exec";

async fn behaviours(sandbox_yaml: &str) -> anyhow::Result<()> {
    let server = common::start(sandbox_yaml).await?;
    let mut c = server.client().await?;
    common::acquire(&mut c, ALICE_KEY, T).await?;

    // Output streams in order, a non-zero exit is a result not an error, and the cwd is the workspace.
    let ran = common::exec(&mut c, ALICE_KEY, T, "echo out; echo err >&2; pwd; exit 3", Duration::from_secs(20)).await?;
    assert_eq!(ran.stdout, "out\n/mnt/user-data/workspace\n", "{ran:?}");
    assert_eq!(ran.stderr, "err\n");
    assert_eq!((ran.exit.exit_code, ran.exit.signal, ran.exit.timed_out, ran.exit.killed), (3, 0, false, false));
    assert_eq!(ran.started.as_ref().map(|s| s.cwd.as_str()), Some("/mnt/user-data/workspace"));

    // Virtual paths work in the command line, and files written by commands are seen by the file tools.
    let ran = common::exec(
        &mut c,
        ALICE_KEY,
        T,
        "echo made > /mnt/user-data/outputs/o.txt && cat /mnt/user-data/outputs/o.txt",
        Duration::from_secs(20),
    )
    .await?;
    assert_eq!(ran.stdout, "made\n", "{ran:?}");
    assert_eq!(common::read(&mut c, ALICE_KEY, T, "/mnt/user-data/outputs/o.txt").await?.content, "made\n");

    // The timeout kills the command and says so; the sandbox stays usable.
    let started = Instant::now();
    let ran = common::exec(&mut c, ALICE_KEY, T, "echo before; sleep 30", Duration::from_secs(1)).await?;
    assert!(ran.exit.timed_out && ran.exit.killed && ran.exit.kill_reason == KillReason::Timeout as i32, "{ran:?}");
    assert_eq!(ran.exit.signal, 9);
    assert!(ran.stdout.contains("before"));
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());

    // A background process does not hold the call open.
    let started = Instant::now();
    let ran = common::exec(&mut c, ALICE_KEY, T, "sleep 6 & echo spawned", Duration::from_secs(60)).await?;
    assert_eq!(ran.stdout, "spawned\n");
    assert!(started.elapsed() < Duration::from_secs(4), "the background sleep held the call for {:?}", started.elapsed());

    // Long output is cut in the middle with an explicit marker; the tail is the real end.
    let ran = common::exec(&mut c, ALICE_KEY, T, "seq 1 20000", Duration::from_secs(20)).await?;
    assert!(ran.stdout.starts_with("1\n2\n3\n") && ran.stdout.ends_with("19999\n20000\n"), "{}", &ran.stdout[..100]);
    assert!(ran.stdout.contains("[middle truncated:"), "no marker");
    assert!(ran.exit.output_chars_skipped > 0);
    assert!(ran.stdout.chars().count() < 20_100);
    assert_eq!(ran.exit.stdout_bytes, 108_894, "every byte is counted");

    // Injected secrets are masked; only allowlisted host variables reach the command.
    let env = HashMap::from([("API_TOKEN".to_owned(), "sk-live-0123456789".to_owned()), ("SHORT".to_owned(), "abc".to_owned())]);
    let ran = common::exec_with(
        &mut c,
        ALICE_KEY,
        ExecuteCommandRequest {
            thread_id: T.into(),
            command: "echo token=$API_TOKEN short=$SHORT; env | cut -d= -f1 | sort".into(),
            env,
            ..Default::default()
        },
    )
    .await?;
    assert!(ran.stdout.starts_with("token=[redacted] short=abc\n"), "{}", ran.stdout);
    let allowed =
        ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "HOME", "TMPDIR", "PWD", "SHLVL", "OLDPWD", "_", "API_TOKEN", "SHORT"];
    for name in ran.stdout.lines().skip(1) {
        assert!(allowed.contains(&name), "variable {name} leaked into the command's environment");
    }
    let bad_env = HashMap::from([("BAD-NAME".to_owned(), "x".to_owned())]);
    let refused = common::exec_with(
        &mut c,
        ALICE_KEY,
        ExecuteCommandRequest { thread_id: T.into(), command: "true".into(), env: bad_env, ..Default::default() },
    )
    .await;
    expect_code(refused, Code::InvalidArgument, "bad env name");
    let too_long = common::exec(&mut c, ALICE_KEY, T, "true", Duration::from_secs(100_000)).await;
    expect_code(too_long, Code::InvalidArgument, "timeout above the maximum");
    expect_code(common::exec(&mut c, ALICE_KEY, T, "   ", Duration::from_secs(5)).await, Code::InvalidArgument, "empty command");

    // The per-stream byte cap.
    let capped = common::exec_with(
        &mut c,
        ALICE_KEY,
        ExecuteCommandRequest {
            thread_id: T.into(),
            command: "head -c 5000 /dev/zero | tr '\\0' x".into(),
            max_output_bytes: 1024,
            ..Default::default()
        },
    )
    .await?;
    assert!(capped.exit.truncated && capped.exit.stdout_bytes == 5000, "{:?}", capped.exit);
    assert!(capped.stdout.contains("[output truncated after 1024 of 5000 bytes"), "{}", capped.stdout);

    // A cwd under another root, and one that is not a directory.
    let ran = common::exec_with(
        &mut c,
        ALICE_KEY,
        ExecuteCommandRequest { thread_id: T.into(), command: "pwd".into(), cwd: "/mnt/user-data/outputs".into(), ..Default::default() },
    )
    .await?;
    assert_eq!(ran.stdout, "/mnt/user-data/outputs\n");
    let not_dir = common::exec_with(
        &mut c,
        ALICE_KEY,
        ExecuteCommandRequest {
            thread_id: T.into(),
            command: "pwd".into(),
            cwd: "/mnt/user-data/outputs/o.txt".into(),
            ..Default::default()
        },
    )
    .await;
    expect_code(not_dir, Code::FailedPrecondition, "cwd is a file");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_behave_as_documented_with_the_local_provider() -> anyhow::Result<()> {
    bounded(behaviours("provider: local\nallow_host_bash: true")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_behave_as_documented_with_the_bwrap_provider() -> anyhow::Result<()> {
    if !common::bwrap_usable("commands_behave_as_documented_with_the_bwrap_provider") {
        return Ok(());
    }
    bounded(behaviours("provider: bwrap")).await
}

#[tokio::test]
async fn host_commands_are_off_unless_allowed() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("provider: local").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let refused =
            expect_code(common::exec(&mut c, ALICE_KEY, T, "id", Duration::from_secs(5)).await, Code::FailedPrecondition, "host bash");
        assert!(refused.message().contains("allow_host_bash"), "{}", refused.message());
        // The file tools still work.
        common::write(&mut c, ALICE_KEY, T, "a.txt", "ok").await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn concurrent_commands_per_sandbox_are_capped() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("provider: local\nallow_host_bash: true\ncommands:\n  max_concurrent: 1").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let mut first = c.clone();
        let running = tokio::spawn(async move { common::exec(&mut first, ALICE_KEY, T, "sleep 2", Duration::from_secs(30)).await });
        crate::lifecycle::wait_running(&mut c, T, 1).await?;
        let second = expect_code(
            common::exec(&mut c, ALICE_KEY, T, "true", Duration::from_secs(5)).await,
            Code::ResourceExhausted,
            "second command",
        );
        assert!(second.message().contains("max_concurrent = 1"), "{}", second.message());
        assert_eq!(running.await??.exit.exit_code, 0);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn cancelling_the_call_kills_the_command() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("provider: local\nallow_host_bash: true").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let marker = format!("/tmp/antler-cancel-{}", std::process::id());
        let request = ExecuteCommandRequest {
            thread_id: T.into(),
            command: "sleep 3; touch $M".into(),
            env: HashMap::from([("M".to_owned(), marker.clone())]),
            ..Default::default()
        };
        let mut stream = c.execute_command(common::req(ALICE_KEY, request)).await?.into_inner();
        let first = stream.message().await?;
        assert!(matches!(first.and_then(|m| m.event), Some(execute_command_response::Event::Started(_))));
        drop(stream);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!std::path::Path::new(&marker).exists(), "the command ran on after the call was cancelled");
        let sandbox = c
            .get_sandbox(common::req(ALICE_KEY, GetSandboxRequest { thread_id: T.into() }))
            .await?
            .into_inner()
            .sandbox
            .unwrap_or_default();
        assert_eq!(sandbox.running_commands, 0);
        Ok(())
    })
    .await
}
