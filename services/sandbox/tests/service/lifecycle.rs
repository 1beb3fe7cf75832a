//! Acquire / Get / Release / Reset, ownership between users, and the gRPC plumbing (auth, health).

use std::time::Duration;

use antler_proto::sandbox::*;
use tonic::Code;

use crate::common::{self, ALICE_KEY, BOB_KEY, bounded, expect_code, req};

#[tokio::test]
async fn acquire_is_idempotent_with_a_deterministic_id() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("provider: local").await?;
        let mut client = server.client().await?;
        expect_code(
            client.get_sandbox(req(ALICE_KEY, GetSandboxRequest { thread_id: "t1".into() })).await,
            Code::NotFound,
            "before acquire",
        );
        let first = common::acquire(&mut client, ALICE_KEY, "t1").await?;
        assert!(first.created);
        let second = common::acquire(&mut client, ALICE_KEY, "t1").await?;
        assert!(!second.created);
        let (a, b) = (first.sandbox.unwrap_or_default(), second.sandbox.unwrap_or_default());
        assert_eq!(a.sandbox_id, b.sandbox_id);
        assert_eq!(a.sandbox_id, antler_sandbox::ids::sandbox_id("alice", "t1"));
        assert_eq!(a.status, SandboxStatus::Active as i32);
        assert_eq!(a.acquired_at, b.acquired_at, "acquiring an ACTIVE sandbox leaves it unchanged");
        assert_eq!(a.provider, SandboxProviderKind::Local as i32);
        assert!(!a.exec_enabled, "local without allow_host_bash refuses commands");
        let limits = a.limits.unwrap_or_default();
        assert_eq!((limits.read_file_max_chars, limits.write_file_max_bytes, limits.upload_max_files), (50_000, 81_920, 10));
        assert_eq!(a.mounts.len(), 5);
        assert!(a.mounts.iter().any(|m| m.virtual_path == "/mnt/skills" && m.read_only));
        assert!(a.mounts.iter().any(|m| m.virtual_path == "/mnt/acp-workspace" && m.read_only));
        let bad = expect_code(common::acquire(&mut client, ALICE_KEY, "../etc").await, Code::InvalidArgument, "bad thread id");
        assert!(bad.message().starts_with("thread_id:"), "{}", bad.message());
        Ok(())
    })
    .await
}

#[tokio::test]
async fn two_users_with_one_thread_id_never_share_a_workspace() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("provider: local\nallow_host_bash: true").await?;
        let mut client = server.client().await?;
        let alice = common::acquire(&mut client, ALICE_KEY, "shared").await?.sandbox.unwrap_or_default();
        common::write(&mut client, ALICE_KEY, "shared", "mine.txt", "alice's").await?;
        // Bob has never acquired "shared": to him it does not exist, whatever Alice did.
        expect_code(client.get_sandbox(req(BOB_KEY, GetSandboxRequest { thread_id: "shared".into() })).await, Code::NotFound, "bob get");
        expect_code(common::read(&mut client, BOB_KEY, "shared", "mine.txt").await, Code::NotFound, "bob read");
        expect_code(
            client
                .release_sandbox(req(
                    BOB_KEY,
                    ReleaseSandboxRequest { thread_id: "shared".into(), terminate_processes: true, ..Default::default() },
                ))
                .await,
            Code::NotFound,
            "bob release",
        );
        let bob = common::acquire(&mut client, BOB_KEY, "shared").await?;
        assert!(bob.created, "bob gets a fresh workspace");
        let bob = bob.sandbox.unwrap_or_default();
        assert_ne!(alice.sandbox_id, bob.sandbox_id);
        expect_code(common::read(&mut client, BOB_KEY, "shared", "mine.txt").await, Code::NotFound, "bob read after acquire");
        let listing =
            client.list_dir(req(BOB_KEY, ListDirRequest { thread_id: "shared".into(), ..Default::default() })).await?.into_inner();
        assert!(listing.entries.is_empty(), "{listing:?}");
        let ran = common::exec(&mut client, BOB_KEY, "shared", "ls -A; cat mine.txt 2>&1; true", Duration::from_secs(10)).await?;
        assert!(!ran.stdout.contains("alice's") && ran.stdout.contains("No such file"), "{ran:?}");
        assert_eq!(common::read(&mut client, ALICE_KEY, "shared", "mine.txt").await?.content, "alice's");
        assert_ne!(server.host_root("alice", "shared", "workspace"), server.host_root("bob", "shared", "workspace"));
        Ok(())
    })
    .await
}

#[tokio::test]
async fn released_sandboxes_keep_files_refuse_writes_and_come_back() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("provider: local\nallow_host_bash: true").await?;
        let mut client = server.client().await?;
        common::acquire(&mut client, ALICE_KEY, "t").await?;
        common::write(&mut client, ALICE_KEY, "t", "a.txt", "kept").await?;
        let released = client
            .release_sandbox(req(
                ALICE_KEY,
                ReleaseSandboxRequest { thread_id: "t".into(), terminate_processes: false, ..Default::default() },
            ))
            .await?
            .into_inner();
        let sandbox = released.sandbox.unwrap_or_default();
        assert_eq!(sandbox.status, SandboxStatus::Released as i32);
        assert!(sandbox.released_at.is_some());
        let refused =
            expect_code(common::write(&mut client, ALICE_KEY, "t", "b.txt", "x").await, Code::FailedPrecondition, "write when released");
        assert!(refused.message().contains("AcquireSandbox"), "{}", refused.message());
        expect_code(
            common::exec(&mut client, ALICE_KEY, "t", "true", Duration::from_secs(5)).await,
            Code::FailedPrecondition,
            "exec when released",
        );
        assert_eq!(common::read(&mut client, ALICE_KEY, "t", "a.txt").await?.content, "kept", "reads still work");
        let again = common::acquire(&mut client, ALICE_KEY, "t").await?;
        assert!(!again.created);
        assert_eq!(again.sandbox.unwrap_or_default().status, SandboxStatus::Active as i32);
        common::write(&mut client, ALICE_KEY, "t", "b.txt", "x").await?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn release_with_delete_workspace_kills_removes_and_forgets_the_sandbox() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("provider: local\nallow_host_bash: true").await?;
        let mut client = server.client().await?;
        common::acquire(&mut client, ALICE_KEY, "gone").await?;
        common::write(&mut client, ALICE_KEY, "gone", "/mnt/user-data/outputs/a.txt", "data").await?;
        let mut runner = client.clone();
        let running =
            tokio::spawn(async move { common::exec(&mut runner, ALICE_KEY, "gone", "echo up; sleep 30", Duration::from_secs(60)).await });
        wait_running(&mut client, "gone", 1).await?;
        let thread_dir = server.host_root("alice", "gone", "outputs").parent().and_then(|p| p.parent()).map(|p| p.to_path_buf());
        let thread_dir = thread_dir.ok_or_else(|| anyhow::anyhow!("no thread directory"))?;
        assert!(thread_dir.is_dir(), "{thread_dir:?}");
        let deleted = client
            .release_sandbox(req(
                ALICE_KEY,
                ReleaseSandboxRequest { thread_id: "gone".into(), delete_workspace: true, ..Default::default() },
            ))
            .await?
            .into_inner();
        assert_eq!(deleted.killed_processes, 1, "deleting kills, also without terminate_processes");
        assert!(running.await??.exit.killed);
        assert!(!thread_dir.exists(), "the thread's directories are gone: {thread_dir:?}");
        expect_code(
            client.get_sandbox(req(ALICE_KEY, GetSandboxRequest { thread_id: "gone".into() })).await,
            Code::NotFound,
            "a deleted sandbox is forgotten",
        );
        let again = common::acquire(&mut client, ALICE_KEY, "gone").await?;
        assert!(again.created, "a later acquire starts a new, empty sandbox");
        expect_code(common::read(&mut client, ALICE_KEY, "gone", "/mnt/user-data/outputs/a.txt").await, Code::NotFound, "old file");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn release_with_terminate_kills_running_commands() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("provider: local\nallow_host_bash: true").await?;
        let mut client = server.client().await?;
        common::acquire(&mut client, ALICE_KEY, "t").await?;
        let mut runner = client.clone();
        let running =
            tokio::spawn(async move { common::exec(&mut runner, ALICE_KEY, "t", "echo up; sleep 30", Duration::from_secs(60)).await });
        wait_running(&mut client, "t", 1).await?;
        let released = client
            .release_sandbox(req(
                ALICE_KEY,
                ReleaseSandboxRequest { thread_id: "t".into(), terminate_processes: true, ..Default::default() },
            ))
            .await?
            .into_inner();
        assert_eq!(released.killed_processes, 1);
        let ran = running.await??;
        assert!(ran.exit.killed && ran.exit.kill_reason == KillReason::Release as i32, "{ran:?}");
        assert!(ran.exit.duration.map(|d| d.seconds).unwrap_or(99) < 10);
        Ok(())
    })
    .await
}

#[tokio::test]
async fn reset_kills_commands_and_clears_chosen_directories() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("provider: local\nallow_host_bash: true").await?;
        let mut client = server.client().await?;
        common::acquire(&mut client, ALICE_KEY, "t").await?;
        common::write(&mut client, ALICE_KEY, "t", "a/b/c.txt", "x").await?;
        common::write(&mut client, ALICE_KEY, "t", "/mnt/user-data/outputs/keep.md", "x").await?;
        let mut runner = client.clone();
        let running = tokio::spawn(async move { common::exec(&mut runner, ALICE_KEY, "t", "sleep 30", Duration::from_secs(60)).await });
        wait_running(&mut client, "t", 1).await?;
        let reset = client
            .reset_sandbox(req(ALICE_KEY, ResetSandboxRequest { thread_id: "t".into(), clear_workspace: true, ..Default::default() }))
            .await?
            .into_inner();
        assert_eq!(reset.killed_processes, 1);
        assert_eq!(reset.removed_entries, 3, "a/, a/b/, a/b/c.txt");
        let ran = running.await??;
        assert_eq!(ran.exit.kill_reason, KillReason::Reset as i32);
        expect_code(common::read(&mut client, ALICE_KEY, "t", "a/b/c.txt").await, Code::NotFound, "cleared");
        assert_eq!(common::read(&mut client, ALICE_KEY, "t", "/mnt/user-data/outputs/keep.md").await?.content, "x");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn calls_without_a_valid_token_are_refused() -> anyhow::Result<()> {
    bounded(async {
        let server = common::start("").await?;
        let mut client = server.client().await?;
        let status = client.acquire_sandbox(AcquireSandboxRequest { thread_id: "t".into() }).await;
        expect_code(status, Code::Unauthenticated, "no token");
        expect_code(common::acquire(&mut client, "not-a-configured-key-0000", "t").await, Code::Unauthenticated, "bad token");
        Ok(())
    })
    .await
}

/// Polls GetSandbox until `n` commands run (a command is registered before its first output).
pub async fn wait_running(client: &mut common::Client, thread: &str, n: u32) -> anyhow::Result<()> {
    for _ in 0..500 {
        let sandbox = client
            .get_sandbox(req(ALICE_KEY, GetSandboxRequest { thread_id: thread.into() }))
            .await?
            .into_inner()
            .sandbox
            .unwrap_or_default();
        if sandbox.running_commands >= n {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("the command never started")
}
