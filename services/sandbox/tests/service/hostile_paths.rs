//! The hostile-path corpus: every case is sent to every file RPC (ReadFile, WriteFile, EditFile, ListDir,
//! Glob, Grep, DownloadFile, UploadFiles file names, ExecuteCommand cwd) on a local-provider server and on
//! a bwrap server. Afterwards the host filesystem is compared with a snapshot taken before: nothing
//! outside the attacking thread's own directories may have changed, and no response or error message may
//! contain a canary's content or a host path the client did not send itself.
//!
//! The whole corpus runs under a rename storm (another thread renaming files on the host without pause),
//! which makes the kernel's RESOLVE_BENEATH lookups answer EAGAIN whenever they cross `..`: the answers
//! must be the same as on a quiet host.

use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::time::Duration;

use antler_proto::sandbox::*;
use tonic::Code;

use crate::common::{self, ALICE_KEY, Client, Server, bounded, req};

const OUTSIDE_CANARY: &str = "CANARY-OUTSIDE-7f3a";
const OTHER_CANARY: &str = "CANARY-OTHER-THREAD-91c2";
const ATTACKER: &str = "attacker";
const VICTIM: &str = "victim";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Must be refused by every RPC with PERMISSION_DENIED or INVALID_ARGUMENT.
    Refused,
    /// May succeed (it names something inside the sandbox) or fail with any code, but must not leak or
    /// touch anything outside.
    NoLeak,
}

struct Fixture {
    server: Server,
    client: Client,
    outside: PathBuf,
    tmp_root: String,
}

async fn fixture(sandbox_yaml: &str) -> anyhow::Result<Fixture> {
    let server = common::start(sandbox_yaml).await?;
    let mut client = server.client().await?;
    common::acquire(&mut client, ALICE_KEY, VICTIM).await?;
    common::write(&mut client, ALICE_KEY, VICTIM, "canary.txt", OTHER_CANARY).await?;
    common::acquire(&mut client, ALICE_KEY, ATTACKER).await?;
    common::write(&mut client, ALICE_KEY, ATTACKER, "plain.txt", "hello").await?;

    let outside = server.dir.path().join("outside");
    std::fs::create_dir_all(outside.join("sub"))?;
    std::fs::write(outside.join("secret.txt"), OUTSIDE_CANARY)?;
    std::fs::write(outside.join("sub/deeper.txt"), OUTSIDE_CANARY)?;

    // Links and special files an agent (or anyone with host access) might plant in the workspace.
    let ws = server.host_root("alice", ATTACKER, "workspace");
    let victim_ws = server.host_root("alice", VICTIM, "workspace");
    std::fs::create_dir_all(ws.join("sub"))?;
    symlink(outside.join("secret.txt"), ws.join("link-out-abs"))?;
    symlink("../../../../../../../outside/secret.txt", ws.join("link-out-rel"))?;
    symlink(&outside, ws.join("link-dir-out"))?;
    symlink("/", ws.join("link-root"))?;
    symlink("/etc", ws.join("link-etc"))?;
    symlink("loop-b", ws.join("loop-a"))?;
    symlink("loop-a", ws.join("loop-b"))?;
    symlink("self-loop", ws.join("self-loop"))?;
    symlink("link-chain2", ws.join("link-chain1"))?;
    symlink("link-out-abs", ws.join("link-chain2"))?;
    symlink(&victim_ws, ws.join("link-other-thread"))?;
    symlink("/proc/self/root", ws.join("link-proc"))?;
    symlink(outside.join("created-through-link.txt"), ws.join("dangling-out"))?;
    symlink("../..", ws.join("sub/link-up-up"))?;
    symlink("/mnt/user-data/workspace", ws.join("link-virtual-abs"))?;
    symlink("../workspace/plain.txt", server.host_root("alice", ATTACKER, "uploads").join("cross-root"))?;
    std::fs::hard_link(outside.join("secret.txt"), ws.join("hardlink-out"))?;
    rustix::fs::mknodat(rustix::fs::CWD, ws.join("fifo"), rustix::fs::FileType::Fifo, rustix::fs::Mode::from_raw_mode(0o644), 0)?;

    let tmp_root = server.dir.path().display().to_string();
    Ok(Fixture { server, client, outside, tmp_root })
}

/// The corpus: (path as the client sends it, expectation). At least 50 cases.
fn corpus(f: &Fixture) -> Vec<(String, Expect)> {
    use Expect::*;
    let ws_host = f.server.host_root("alice", ATTACKER, "workspace").display().to_string();
    let victim_host = f.server.host_root("alice", VICTIM, "workspace").display().to_string();
    let outside = f.outside.display().to_string();
    let mut cases: Vec<(String, Expect)> = [
        ("../secret.txt", Refused),
        ("../../../../../../etc/passwd", Refused),
        ("/etc/passwd", Refused),
        ("/etc/shadow", Refused),
        ("/", Refused),
        ("/mnt", Refused),
        ("/mnt/user-data/../../etc/passwd", Refused),
        ("/mnt/user-data/workspace/../../../etc/passwd", Refused),
        ("/mnt/user-data/workspace/../uploads/../../x", Refused),
        ("/mnt/user-data/other/x", Refused),
        ("/mnt/user-data-evil/x", Refused),
        ("/mnt/skills/../user-data/workspace/plain.txt", Refused),
        ("/mnt/skills/../../etc/passwd", Refused),
        ("..\\..\\etc\\passwd", Refused),
        ("a/b/../../../x", Refused),
        ("./../x", Refused),
        ("/proc/self/root/etc/passwd", Refused),
        ("/proc/self/environ", Refused),
        ("/dev/null", Refused),
        ("/root/.ssh/id_rsa", Refused),
        ("//etc//passwd", Refused),
        ("/./etc/passwd", Refused),
        ("/mnt/./user-data/../user-data/workspace", Refused),
        ("link-dir-out/../link-dir-out/secret.txt", Refused),
        ("/MNT/USER-DATA/workspace/x", Refused),
        ("link-out-abs", Refused),
        ("link-out-rel", Refused),
        ("link-dir-out/secret.txt", Refused),
        ("link-dir-out/sub/deeper.txt", Refused),
        ("link-dir-out", Refused),
        ("link-dir-out/new.txt", Refused),
        ("/mnt/user-data/workspace/link-out-abs/", Refused),
        ("link-out-abs/.", Refused),
        ("link-root/etc/passwd", Refused),
        ("link-root", Refused),
        ("link-etc/passwd", Refused),
        ("loop-a", Refused),
        ("self-loop", Refused),
        ("link-chain1", Refused),
        ("link-other-thread/canary.txt", Refused),
        ("link-other-thread", Refused),
        ("link-proc/etc/passwd", Refused),
        ("dangling-out", Refused),
        ("sub/link-up-up/secret.txt", Refused),
        ("sub/link-up-up", Refused),
        ("link-virtual-abs/plain.txt", Refused),
        ("/mnt/user-data/uploads/cross-root", Refused),
        ("a\0b", Refused),
        ("/mnt/user-data/workspace/\0", Refused),
        ("cmd-abs", Refused),
        ("cmd-up/passwd", Refused),
        ("cmd-dir/up2/outside/secret.txt", Refused),
        ("cmd-virtual/plain.txt", Refused),
        ("hardlink-out", NoLeak),
        ("fifo", NoLeak),
        ("/mnt/user-data/workspace/%2e%2e/%2e%2e/etc/passwd", NoLeak),
        ("~/.bashrc", NoLeak),
        ("C:\\Windows\\system.ini", NoLeak),
        (" /etc/passwd", NoLeak),
        ("/mnt/skills/x", NoLeak),
        ("/mnt/user-data", NoLeak),
        ("plain.txt", NoLeak),
    ]
    .into_iter()
    .map(|(p, e)| (p.to_owned(), e))
    .collect();
    cases.push((format!("{outside}/secret.txt"), Refused));
    cases.push((format!("{ws_host}/plain.txt"), Refused));
    cases.push((format!("{victim_host}/canary.txt"), Refused));
    cases.push((format!("/mnt/user-data/workspace/{}", "n".repeat(256)), Refused));
    cases.push((format!("/mnt/user-data/workspace/{}", "d/".repeat(2100)), Refused));
    cases
}

/// What one call returned, as text for the leak check, and its status code.
fn outcome<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> (Code, String) {
    match result {
        Ok(value) => (Code::Ok, format!("{value:?}")),
        Err(status) => (status.code(), status.message().to_owned()),
    }
}

async fn run_rpc(client: &mut Client, rpc: &str, path: &str) -> (Code, String) {
    let thread = ATTACKER.to_owned();
    let label = path.chars().take(80).collect::<String>();
    let path = path.to_owned();
    let call = async {
        match rpc {
            "ReadFile" => {
                outcome(client.read_file(req(ALICE_KEY, ReadFileRequest { thread_id: thread, path, ..Default::default() })).await)
            }
            "WriteFile" => outcome(
                client
                    .write_file(req(
                        ALICE_KEY,
                        WriteFileRequest {
                            thread_id: thread,
                            path,
                            content: Some(write_file_request::Content::Text("PWNED".into())),
                            append: false,
                        },
                    ))
                    .await,
            ),
            "AppendFile" => outcome(
                client
                    .write_file(req(
                        ALICE_KEY,
                        WriteFileRequest {
                            thread_id: thread,
                            path,
                            content: Some(write_file_request::Content::Text("PWNED".into())),
                            append: true,
                        },
                    ))
                    .await,
            ),
            "EditFile" => outcome(
                client
                    .edit_file(req(
                        ALICE_KEY,
                        EditFileRequest { thread_id: thread, path, old_str: "CANARY".into(), new_str: "PWNED".into(), replace_all: true },
                    ))
                    .await,
            ),
            "ListDir" => outcome(client.list_dir(req(ALICE_KEY, ListDirRequest { thread_id: thread, path, ..Default::default() })).await),
            "Glob" => outcome(
                client.glob(req(ALICE_KEY, GlobRequest { thread_id: thread, path, pattern: "**/*".into(), ..Default::default() })).await,
            ),
            "Grep" => outcome(
                client.grep(req(ALICE_KEY, GrepRequest { thread_id: thread, path, pattern: "CANARY".into(), ..Default::default() })).await,
            ),
            "DownloadFile" => {
                match client.download_file(req(ALICE_KEY, DownloadFileRequest { thread_id: thread, path, chunk_size: 0 })).await {
                    Err(status) => (status.code(), status.message().to_owned()),
                    Ok(response) => {
                        let mut stream = response.into_inner();
                        let mut text = String::new();
                        loop {
                            match stream.message().await {
                                Ok(Some(message)) => text.push_str(&format!("{message:?}")),
                                Ok(None) => break (Code::Ok, text),
                                Err(status) => break (status.code(), status.message().to_owned()),
                            }
                        }
                    }
                }
            }
            "ExecuteCommand.cwd" => {
                let request = ExecuteCommandRequest {
                    thread_id: thread,
                    command: "pwd; ls".into(),
                    cwd: path,
                    timeout: prost_types::Duration::try_from(Duration::from_secs(10)).ok(),
                    ..Default::default()
                };
                match common::exec_with(client, ALICE_KEY, request).await {
                    Ok(ran) => (Code::Ok, format!("{ran:?}")),
                    Err(status) => (status.code(), status.message().to_owned()),
                }
            }
            "UploadFiles.filename" => {
                let messages = vec![
                    UploadFilesRequest {
                        payload: Some(upload_files_request::Payload::Header(UploadHeader {
                            thread_id: thread,
                            files: vec![UploadFileSpec { filename: path, size_bytes: 5, ..Default::default() }],
                            convert_documents: false,
                        })),
                    },
                    UploadFilesRequest {
                        payload: Some(upload_files_request::Payload::Chunk(UploadChunk { file_index: 0, data: b"PWNED".to_vec() })),
                    },
                ];
                outcome(client.upload_files(req(ALICE_KEY, tokio_stream::iter(messages))).await)
            }
            other => (Code::Unknown, format!("unknown rpc {other}")),
        }
    };
    tokio::time::timeout(Duration::from_secs(20), call).await.unwrap_or((Code::DeadlineExceeded, format!("{rpc} on {label:?} hung")))
}

const RPCS: &[&str] = &[
    "ReadFile",
    "WriteFile",
    "AppendFile",
    "EditFile",
    "ListDir",
    "Glob",
    "Grep",
    "DownloadFile",
    "ExecuteCommand.cwd",
    "UploadFiles.filename",
];

/// Renames two files back and forth on the host until dropped. Every rename bumps the kernel's global
/// rename sequence, which is what makes an openat2 walk that crosses `..` fail with EAGAIN.
struct RenameStorm {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    worker: Option<std::thread::JoinHandle<u64>>,
    _dir: tempfile::TempDir,
}

impl RenameStorm {
    fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "x")?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let worker = std::thread::spawn(move || {
            let mut renames = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                if std::fs::rename(&a, &b).and_then(|()| std::fs::rename(&b, &a)).is_ok() {
                    renames += 2;
                }
                // Leave the other core some room: the storm only has to be frequent, not total.
                if renames.is_multiple_of(512) {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            renames
        });
        Ok(Self { stop, worker: Some(worker), _dir: dir })
    }

    /// Stops the storm; returns how many renames it made.
    fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.worker.take().and_then(|w| w.join().ok()).unwrap_or(0)
    }
}

async fn run_corpus(sandbox_yaml: &str) -> anyhow::Result<()> {
    let mut f = fixture(sandbox_yaml).await?;
    let storm = RenameStorm::start()?;
    let fallbacks_before = antler_sandbox::resolve::userspace_fallbacks();
    let retries_before = antler_sandbox::resolve::eagain_retries();
    // Links made by the agent's own commands (inside bwrap they point at what the sandbox sees; the file
    // tools resolve them on the host, beneath the root).
    let made = common::exec(
        &mut f.client,
        ALICE_KEY,
        ATTACKER,
        "ln -s /etc/passwd cmd-abs && ln -s ../../../../../../../../../etc cmd-up && mkdir cmd-dir && ln -s ../../.. cmd-dir/up2 && ln -s /mnt/user-data/workspace cmd-virtual && echo made",
        Duration::from_secs(20),
    )
    .await?;
    assert!(made.stdout.contains("made"), "the agent could not create its links: {made:?}");

    let exclude = vec![f.server.data().join("sandbox/users/alice/threads").join(ATTACKER).join("user-data")];
    let before = common::tree_hashes(f.server.dir.path(), &exclude);
    let host_files_before = common::tree_hashes(std::path::Path::new("/etc"), &[]);
    let cases = corpus(&f);
    assert!(cases.len() >= 50, "the corpus has {} cases", cases.len());
    let mut failures = Vec::new();
    for (path, expect) in &cases {
        for rpc in RPCS {
            let (code, text) = run_rpc(&mut f.client, rpc, path).await;
            let label = format!("{rpc}({})", path.escape_debug().to_string().chars().take(80).collect::<String>());
            if text.contains("CANARY") {
                failures.push(format!("{label}: a canary leaked: {}", text.chars().take(300).collect::<String>()));
            }
            if text.contains(&f.tmp_root) && !path.contains(&f.tmp_root) {
                failures.push(format!("{label}: a host path leaked: {}", text.chars().take(300).collect::<String>()));
            }
            if code == Code::DeadlineExceeded || code == Code::Internal || code == Code::Unknown {
                failures.push(format!("{label}: {code:?}: {text}"));
            }
            // Upload names are reduced to a basename and stored inside uploads: refusal is not expected.
            let refusal_applies = *expect == Expect::Refused && *rpc != "UploadFiles.filename";
            if refusal_applies && !matches!(code, Code::PermissionDenied | Code::InvalidArgument) {
                failures.push(format!(
                    "{label}: expected PERMISSION_DENIED or INVALID_ARGUMENT, got {code:?}: {}",
                    text.chars().take(200).collect::<String>()
                ));
            }
            if refusal_applies && code == Code::PermissionDenied && !text.contains("permission denied") {
                failures.push(format!("{label}: the refusal does not say why: {text}"));
            }
        }
    }
    // The attacker's uploads never leave the uploads directory.
    let after = common::tree_hashes(f.server.dir.path(), &exclude);
    for (path, hash) in &before {
        match after.get(path) {
            Some(now) if now == hash => {}
            Some(_) => failures.push(format!("{} was modified", path.display())),
            None => failures.push(format!("{} was removed", path.display())),
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        failures.push(format!("{} was created outside the attacker's roots", path.display()));
    }
    if host_files_before != common::tree_hashes(std::path::Path::new("/etc"), &[]) {
        failures.push("/etc changed".to_owned());
    }
    if f.outside.join("created-through-link.txt").exists() {
        failures.push("a dangling link was written through".to_owned());
    }
    if std::fs::read_to_string(f.outside.join("secret.txt")).ok().as_deref() != Some(OUTSIDE_CANARY) {
        failures.push("the outside canary changed".to_owned());
    }
    let renames = storm.stop();
    println!(
        "hostile-path corpus: {} cases x {} RPCs, {} failures; under {renames} host renames ({} EAGAIN retried, {} lookups finished in user space)",
        cases.len(),
        RPCS.len(),
        failures.len(),
        antler_sandbox::resolve::eagain_retries() - retries_before,
        antler_sandbox::resolve::userspace_fallbacks() - fallbacks_before
    );
    assert!(renames > 1000, "the rename storm did not run ({renames} renames)");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_paths_are_refused_with_the_local_provider() -> anyhow::Result<()> {
    bounded(run_corpus("provider: local\nallow_host_bash: true")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_paths_are_refused_with_the_bwrap_provider() -> anyhow::Result<()> {
    if !common::bwrap_usable("hostile_paths_are_refused_with_the_bwrap_provider") {
        return Ok(());
    }
    bounded(run_corpus("provider: bwrap")).await
}

/// The user-space walk that takes over when openat2 keeps answering EAGAIN gives the kernel's answers on
/// every case of the corpus that is a path relative to the workspace (the rest never reach a lookup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_and_user_space_lookups_agree_on_the_corpus() -> anyhow::Result<()> {
    use antler_sandbox::resolve::{open_beneath, open_resolving_in_userspace, open_root};
    use rustix::fs::{Mode, OFlags};
    bounded(async {
        let mut f = fixture("provider: local\nallow_host_bash: true").await?;
        common::exec(
            &mut f.client,
            ALICE_KEY,
            ATTACKER,
            "mkdir cmd-dir && ln -s ../../.. cmd-dir/up2 && ln -s ../../../../../../../../../etc cmd-up",
            Duration::from_secs(20),
        )
        .await?;
        let root = open_root(&f.server.host_root("alice", ATTACKER, "workspace"))?;
        let mut compared = 0;
        for (path, _) in corpus(&f) {
            let relative = !path.starts_with('/') && !path.contains('\0') && !path.split('/').any(|c| c == "..");
            if !relative {
                continue;
            }
            for flags in [OFlags::RDONLY | OFlags::NONBLOCK, OFlags::PATH | OFlags::DIRECTORY, OFlags::PATH] {
                let kernel = open_beneath(&root, &path, flags, Mode::empty()).map(|_| ());
                let by_hand = open_resolving_in_userspace(&root, &path, flags | OFlags::CLOEXEC, Mode::empty()).map(|_| ());
                assert_eq!(kernel, by_hand, "{path:?} with {flags:?}");
                compared += 1;
            }
        }
        for rel in ["cmd-dir/up2/plain.txt", "sub/../plain.txt", "cmd-dir/up2/outside/secret.txt", "sub/link-up-up/secret.txt"] {
            let kernel = open_beneath(&root, rel, OFlags::RDONLY, Mode::empty()).map(|_| ());
            let by_hand = open_resolving_in_userspace(&root, rel, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map(|_| ());
            assert_eq!(kernel, by_hand, "{rel}");
            compared += 1;
        }
        println!("kernel and user-space lookups compared on {compared} (path, flags) pairs");
        assert!(compared > 60, "only {compared} comparisons");
        Ok(())
    })
    .await
}
