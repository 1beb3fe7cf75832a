//! bwrap containment: host files outside the mounts, the host's loopback, the process limit, grandchildren
//! at the timeout, and other threads' workspaces. Each check has a control run on the local provider (or
//! on the host) showing the same command does reach the thing, so a pass means containment and not a
//! broken test.

use std::io::Read;
use std::time::{Duration, Instant};

use antler_proto::sandbox::*;

use crate::common::{self, ALICE_KEY, bounded, req};

/// Fails the test where the kernel refuses bwrap's namespaces, unless skipping was allowed
/// explicitly (see [`common::bwrap_usable`]).
macro_rules! skip_unless_bwrap {
    ($name:literal) => {
        if !common::bwrap_usable($name) {
            return Ok(());
        }
    };
}

const T: &str = "box";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_commands_cannot_read_host_files_outside_their_mounts() -> anyhow::Result<()> {
    skip_unless_bwrap!("bwrap_commands_cannot_read_host_files_outside_their_mounts");
    bounded(async {
        let server = common::start("provider: bwrap").await?;
        let mut c = server.client().await?;
        let sandbox = common::acquire(&mut c, ALICE_KEY, T).await?.sandbox.unwrap_or_default();
        assert_eq!(sandbox.provider, SandboxProviderKind::Bwrap as i32);
        assert!(sandbox.exec_enabled && !sandbox.network_enabled);
        let secret = server.dir.path().join("host-secret.txt");
        std::fs::write(&secret, "HOST-CANARY-55")?;
        let command = format!(
            "cat {} 2>&1; cat /etc/shadow 2>&1; ls {} 2>&1; ls /root 2>&1; cat /proc/1/environ 2>&1 | tr '\\0' ' '; id -u; echo done",
            secret.display(),
            server.data().display()
        );
        let ran = common::exec(&mut c, ALICE_KEY, T, &command, Duration::from_secs(20)).await?;
        assert!(ran.stdout.ends_with("done\n"), "{ran:?}");
        assert!(!ran.all_output().contains("HOST-CANARY"), "a host file was read: {ran:?}");
        assert!(!ran.all_output().contains("root:"), "/etc/shadow was readable: {ran:?}");
        assert!(ran.stdout.contains("No such file or directory"));
        // Writes outside the mounts fail too (read-only root, no host paths).
        let ran = common::exec(&mut c, ALICE_KEY, T, "touch /etc/x /usr/x /x 2>&1; echo done", Duration::from_secs(20)).await?;
        assert_eq!(ran.stdout.matches("Read-only file system").count() + ran.stdout.matches("No such file").count(), 3, "{ran:?}");

        // Control: the same read works on the host, so the file was really there.
        let local = common::start("provider: local\nallow_host_bash: true").await?;
        let mut lc = local.client().await?;
        common::acquire(&mut lc, ALICE_KEY, T).await?;
        let control = common::exec(&mut lc, ALICE_KEY, T, &format!("cat {}", secret.display()), Duration::from_secs(20)).await?;
        assert!(control.stdout.contains("HOST-CANARY-55"), "{control:?}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_commands_cannot_reach_the_hosts_loopback() -> anyhow::Result<()> {
    skip_unless_bwrap!("bwrap_commands_cannot_reach_the_hosts_loopback");
    bounded(async {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let connect = format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED' 2>&1; echo done");

        let server = common::start("provider: bwrap").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let ran = common::exec(&mut c, ALICE_KEY, T, &connect, Duration::from_secs(20)).await?;
        assert!(!ran.stdout.contains("CONNECTED") && ran.stdout.contains("done"), "{ran:?}");
        assert!(listener.accept().is_err(), "the listener saw a connection from the sandbox");
        let ran =
            common::exec(&mut c, ALICE_KEY, T, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '", Duration::from_secs(20)).await?;
        assert_eq!(ran.stdout.trim(), "lo", "only a loopback interface: {ran:?}");

        // Control: the local provider reaches the listener, so the check can fail.
        let local = common::start("provider: local\nallow_host_bash: true").await?;
        let mut lc = local.client().await?;
        common::acquire(&mut lc, ALICE_KEY, T).await?;
        let control = common::exec(&mut lc, ALICE_KEY, T, &connect, Duration::from_secs(20)).await?;
        assert!(control.stdout.contains("CONNECTED"), "{control:?}");
        Ok(())
    })
    .await
}

/// Host processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let mut cmdline = Vec::new();
        if std::fs::File::open(entry.path().join("cmdline")).and_then(|mut f| f.read_to_end(&mut cmdline)).is_ok() {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) && !text.contains("sh -c") {
                found.push(pid);
            }
        }
    }
    found
}

async fn wait_gone(marker: &str) -> Vec<u32> {
    for _ in 0..100 {
        let left = processes_with(marker);
        if left.is_empty() {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    processes_with(marker)
}

async fn grandchildren_die_at_the_timeout(sandbox_yaml: &str, marker_seconds: &str) -> anyhow::Result<()> {
    let server = common::start(sandbox_yaml).await?;
    let mut c = server.client().await?;
    common::acquire(&mut c, ALICE_KEY, T).await?;
    // Two levels below the shell: a subshell that starts sleepers in the background and waits.
    let command = format!("(sleep {marker_seconds} & sleep {marker_seconds} & wait) & echo started; wait");
    let started = Instant::now();
    let ran = common::exec(&mut c, ALICE_KEY, T, &command, Duration::from_secs(2)).await?;
    assert!(ran.exit.timed_out && ran.exit.killed, "{ran:?}");
    assert!(ran.stdout.contains("started"));
    assert!(started.elapsed() < Duration::from_secs(10));
    let left = wait_gone(&format!("sleep {marker_seconds}")).await;
    assert!(left.is_empty(), "grandchildren survived the timeout: {left:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_timeouts_kill_grandchildren() -> anyhow::Result<()> {
    skip_unless_bwrap!("bwrap_timeouts_kill_grandchildren");
    bounded(grandchildren_die_at_the_timeout("provider: bwrap", "4711.25")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_timeouts_kill_the_process_group() -> anyhow::Result<()> {
    bounded(grandchildren_die_at_the_timeout("provider: local\nallow_host_bash: true", "4712.25")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_ends_and_the_service_stays_healthy() -> anyhow::Result<()> {
    skip_unless_bwrap!("a_fork_bomb_ends_and_the_service_stays_healthy");
    bounded(async {
        let server = common::start("provider: bwrap\nbwrap:\n  max_processes: 64").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        // The limit holds: a loop of background sleeps stops being able to fork well before 200.
        let ran = common::exec(
            &mut c,
            ALICE_KEY,
            T,
            "n=0; while [ $n -lt 200 ]; do sleep 4713.5 >/dev/null 2>&1 & n=$((n+1)); done; echo forked",
            Duration::from_secs(20),
        )
        .await?;
        assert!(ran.all_output().contains("Cannot fork") || ran.all_output().contains("Resource temporarily unavailable"), "{ran:?}");
        assert!(wait_gone("sleep 4713.5").await.is_empty(), "sleepers outlived their command");

        let started = Instant::now();
        let bomb = common::exec(&mut c, ALICE_KEY, T, "bomb() { bomb | bomb & }; bomb; sleep 30", Duration::from_secs(5)).await?;
        assert!(bomb.exit.timed_out || bomb.exit.exit_code != 0, "{:?}", bomb.exit);
        assert!(started.elapsed() < Duration::from_secs(20), "the bomb ran for {:?}", started.elapsed());

        // The service and the sandbox still work, and nothing of the bomb is left on the host.
        let after = common::exec(&mut c, ALICE_KEY, T, "echo alive", Duration::from_secs(20)).await?;
        assert_eq!(after.stdout, "alive\n");
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))?.connect().await?;
        let health = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest { service: "antler.sandbox.v1.SandboxService".into() })
            .await?
            .into_inner();
        assert_eq!(health.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
        let sandbox =
            c.get_sandbox(req(ALICE_KEY, GetSandboxRequest { thread_id: T.into() })).await?.into_inner().sandbox.unwrap_or_default();
        assert_eq!(sandbox.running_commands, 0);
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_commands_cannot_see_another_threads_workspace() -> anyhow::Result<()> {
    skip_unless_bwrap!("bwrap_commands_cannot_see_another_threads_workspace");
    bounded(async {
        let server = common::start("provider: bwrap").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, "thread-a").await?;
        common::acquire(&mut c, ALICE_KEY, "thread-b").await?;
        common::write(&mut c, ALICE_KEY, "thread-a", "/mnt/user-data/outputs/private-a.txt", "THREAD-A-CANARY").await?;
        let host_a = server.host_root("alice", "thread-a", "outputs");
        let command = format!(
            "ls -R /mnt 2>&1; cat {}/private-a.txt 2>&1; find / -name 'private-a.txt' 2>/dev/null; grep -r THREAD-A-CANARY /mnt /tmp /proc/self/root/mnt 2>/dev/null | head -1; echo done",
            host_a.display()
        );
        let ran = common::exec(&mut c, ALICE_KEY, "thread-b", &command, Duration::from_secs(60)).await?;
        assert!(ran.stdout.ends_with("done\n"), "{ran:?}");
        assert!(!ran.all_output().contains("THREAD-A-CANARY") && !ran.stdout.contains("private-a.txt\n"), "{ran:?}");
        // Control: thread A itself sees its file.
        let own = common::exec(&mut c, ALICE_KEY, "thread-a", "cat /mnt/user-data/outputs/private-a.txt", Duration::from_secs(20)).await?;
        assert_eq!(own.stdout, "THREAD-A-CANARY");
        Ok(())
    })
    .await
}

/// `/mnt/acp-workspace` (what the ACP agents the lead agent calls wrote) is mounted read-only: a command
/// reads a file put there on the host and cannot change or add one; ReadFile reads it and WriteFile is
/// refused. Control: the same write works in the thread's workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_mounts_the_acp_workspace_read_only() -> anyhow::Result<()> {
    skip_unless_bwrap!("bwrap_mounts_the_acp_workspace_read_only");
    bounded(async {
        let server = common::start("provider: bwrap").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let acp = server.host_root("alice", T, "workspace").parent().and_then(|p| p.parent()).map(|t| t.join("acp-workspace"));
        let acp = acp.ok_or_else(|| anyhow::anyhow!("no thread directory"))?;
        assert!(acp.is_dir(), "AcquireSandbox creates {}", acp.display());
        std::fs::write(acp.join("result.txt"), "ACP-RESULT-7")?;
        let command = "cat /mnt/acp-workspace/result.txt; echo; echo x > /mnt/acp-workspace/result.txt 2>&1; \
                       touch /mnt/acp-workspace/new 2>&1; echo y > /mnt/user-data/workspace/ok.txt && echo wrote; echo done";
        let ran = common::exec(&mut c, ALICE_KEY, T, command, Duration::from_secs(20)).await?;
        assert!(ran.stdout.starts_with("ACP-RESULT-7\n") && ran.stdout.contains("wrote\ndone"), "{ran:?}");
        assert_eq!(ran.all_output().matches("Read-only file system").count(), 2, "{ran:?}");
        assert_eq!(std::fs::read_to_string(acp.join("result.txt"))?, "ACP-RESULT-7");
        assert!(!acp.join("new").exists());
        let read = common::read(&mut c, ALICE_KEY, T, "/mnt/acp-workspace/result.txt").await?;
        assert!(read.content.contains("ACP-RESULT-7"), "{read:?}");
        let refused = common::write(&mut c, ALICE_KEY, T, "/mnt/acp-workspace/x.txt", "x").await.err().map(|s| s.code());
        assert_eq!(refused, Some(tonic::Code::PermissionDenied));
        Ok(())
    })
    .await
}
