//! Test harness: a real sandbox gRPC server (the kit's server stack: auth, limits, health) started
//! in-process on 127.0.0.1:0 with two API-key users, and helpers to call it.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use antler_kit::{Authenticator, Config, ServiceSet};
use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
use antler_proto::sandbox::sandbox_service_server::SandboxServiceServer;
use antler_proto::sandbox::*;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

pub const ALICE_KEY: &str = "alice-key-0123456789abcdef";
pub const BOB_KEY: &str = "bob-key-0123456789abcdefgh";

/// Upper bound of any single test: a hung test fails instead of blocking CI.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(120);

pub type Client = SandboxServiceClient<Channel>;

/// A running server and its data directory; stopped (commands killed) on drop.
pub struct Server {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts a server whose `sandbox:` section is `sandbox_yaml` (indented under `sandbox:`).
pub async fn start(sandbox_yaml: &str) -> anyhow::Result<Server> {
    let dir = tempfile::tempdir()?;
    // bwrap may run as an unprivileged user (when the tests run as root): it must be able to traverse
    // the data directory's parents to mount a thread's directories.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
    let data = dir.path().join("data");
    let yaml = format!(
        "server:\n  listen: 127.0.0.1:0\n  data_dir: {}\n  shutdown_grace_secs: 1\n  reload_interval_ms: 0\n  auth:\n    enabled: true\n    api_keys:\n      - key: {ALICE_KEY}\n        user: alice\n      - key: {BOB_KEY}\n        user: bob\nsandbox:\n{}\n",
        data.display(),
        indent(sandbox_yaml)
    );
    let config = Config::parse(&yaml, "test.yaml", &|_| None)?;
    let auth = Authenticator::new(&config.server.auth)?;
    let listener = antler_kit::server::bind(&config.server, &auth).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let (build_config, build_shutdown) = (config.clone(), shutdown.clone());
    let sandboxes = tokio::task::spawn_blocking(move || antler_sandbox::build(&build_config, build_shutdown))
        .await?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    sandboxes.spawn_background(shutdown.clone());
    let mut set = ServiceSet::new(&config.server);
    set.describe(antler_proto::FILE_DESCRIPTOR_SET);
    let skills = antler_sandbox::skills::api::SkillApi::new(sandboxes.skills().clone(), sandboxes.config());
    antler_kit::add_service!(set, SandboxServiceServer::new(antler_sandbox::api::SandboxApi::new(sandboxes)));
    antler_kit::add_service!(set, antler_proto::sandbox::skill_service_server::SkillServiceServer::new(skills));
    let server_config = config.server.clone();
    let serve_shutdown = shutdown.clone();
    tokio::spawn(async move { antler_kit::server::serve(listener, set, &server_config, auth, serve_shutdown).await });
    Ok(Server { addr, dir, shutdown })
}

fn indent(yaml: &str) -> String {
    if yaml.trim().is_empty() {
        return "  {}".to_owned();
    }
    yaml.lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

impl Server {
    /// A client that authenticates as the user of `key`.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let mut last = None;
        for _ in 0..50 {
            match Channel::from_shared(format!("http://{}", self.addr))?.connect().await {
                Ok(channel) => return Ok(SandboxServiceClient::new(channel)),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(anyhow::anyhow!("cannot connect: {last:?}"))
    }

    /// A SkillService client on the same server.
    pub async fn skills(&self) -> anyhow::Result<antler_proto::sandbox::skill_service_client::SkillServiceClient<Channel>> {
        let channel = Channel::from_shared(format!("http://{}", self.addr))?.connect().await?;
        Ok(antler_proto::sandbox::skill_service_client::SkillServiceClient::new(channel))
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Host directory of a thread's root (`workspace`, `uploads`, `outputs`).
    pub fn host_root(&self, user: &str, thread: &str, root: &str) -> PathBuf {
        self.data().join("sandbox/users").join(user).join("threads").join(thread).join("user-data").join(root)
    }
}

/// Wraps a message with the bearer token of `key`.
pub fn req<T>(key: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    if let Ok(value) = format!("Bearer {key}").parse() {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

pub async fn acquire(client: &mut Client, key: &str, thread: &str) -> Result<AcquireSandboxResponse, Status> {
    client.acquire_sandbox(req(key, AcquireSandboxRequest { thread_id: thread.to_owned() })).await.map(|r| r.into_inner())
}

pub async fn write(client: &mut Client, key: &str, thread: &str, path: &str, text: &str) -> Result<WriteFileResponse, Status> {
    let message = WriteFileRequest {
        thread_id: thread.to_owned(),
        path: path.to_owned(),
        content: Some(write_file_request::Content::Text(text.to_owned())),
        append: false,
    };
    client.write_file(req(key, message)).await.map(|r| r.into_inner())
}

pub async fn read(client: &mut Client, key: &str, thread: &str, path: &str) -> Result<ReadFileResponse, Status> {
    client
        .read_file(req(key, ReadFileRequest { thread_id: thread.to_owned(), path: path.to_owned(), ..Default::default() }))
        .await
        .map(|r| r.into_inner())
}

/// The collected result of an ExecuteCommand stream.
#[derive(Debug, Default)]
pub struct Ran {
    pub started: Option<CommandStarted>,
    pub stdout: String,
    pub stderr: String,
    pub exit: CommandExit,
    /// Every message in arrival order, for order checks.
    pub events: usize,
}

impl Ran {
    pub fn all_output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

pub async fn exec(client: &mut Client, key: &str, thread: &str, command: &str, timeout: Duration) -> Result<Ran, Status> {
    exec_with(
        client,
        key,
        ExecuteCommandRequest {
            thread_id: thread.to_owned(),
            command: command.to_owned(),
            timeout: prost_types::Duration::try_from(timeout).ok(),
            ..Default::default()
        },
    )
    .await
}

pub async fn exec_with(client: &mut Client, key: &str, request: ExecuteCommandRequest) -> Result<Ran, Status> {
    let mut stream = client.execute_command(req(key, request)).await?.into_inner();
    let mut ran = Ran::default();
    let mut exited = false;
    while let Some(message) = stream.message().await? {
        ran.events += 1;
        match message.event {
            Some(execute_command_response::Event::Started(started)) => {
                assert!(ran.started.is_none() && ran.events == 1, "`started` must come first and once");
                ran.started = Some(started);
            }
            Some(execute_command_response::Event::Output(output)) => {
                assert!(!exited, "no output after `exit`");
                if output.stream == OutputStream::Stderr as i32 {
                    ran.stderr.push_str(&output.text);
                } else {
                    ran.stdout.push_str(&output.text);
                }
            }
            Some(execute_command_response::Event::Exit(exit)) => {
                assert!(!exited, "exactly one `exit`");
                exited = true;
                ran.exit = exit;
            }
            None => panic!("empty ExecuteCommand message"),
        }
    }
    assert!(exited, "the stream ended without `exit`");
    Ok(ran)
}

/// Asserts a call failed with `code`.
pub fn expect_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, what: &str) -> Status {
    match result {
        Err(status) if status.code() == code => status,
        other => panic!("{what}: expected {code:?}, got {other:?}"),
    }
}

/// Only a kernel (or container) that refuses bwrap's namespaces is a reason to skip a bwrap test; a
/// missing binary or any other failure is a test failure.
pub fn bwrap_refused_by_kernel() -> Option<String> {
    let output = std::process::Command::new("bwrap")
        .args(["--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"])
        .output()
        .unwrap_or_else(|e| panic!("bwrap must be installed for these tests (Debian package bubblewrap): {e}"));
    if output.status.success() {
        None
    } else {
        Some(format!("bwrap --unshare-all failed here: {}", String::from_utf8_lossy(&output.stderr).trim()))
    }
}

/// The variable that lets bwrap tests be skipped where the kernel refuses user namespaces. CI
/// (`.ci/run`, `scripts/test`) never sets it, so there a refused namespace fails the tests.
pub const ALLOW_BWRAP_SKIP: &str = "ANTLER_ALLOW_BWRAP_SKIP";

/// Whether the bwrap test `name` can run. Where the kernel refuses bwrap's namespaces the test fails
/// (panics with the reason), unless `ANTLER_ALLOW_BWRAP_SKIP=1`: then it is reported as skipped
/// (a `SKIPPED` line, and a line appended to the file `ANTLER_BWRAP_SKIP_REPORT` names, if set, so a
/// harness can count them) and returns false.
pub fn bwrap_usable(name: &str) -> bool {
    let Some(reason) = bwrap_refused_by_kernel() else { return true };
    if std::env::var(ALLOW_BWRAP_SKIP).as_deref() != Ok("1") {
        panic!(
            "{name}: bwrap is installed but cannot create its namespaces here: {reason}\n\
             hint: run on a host that allows unprivileged user namespaces; to skip the bwrap tests knowingly set {ALLOW_BWRAP_SKIP}=1 (CI never does)"
        );
    }
    println!("SKIPPED {name}: {reason} ({ALLOW_BWRAP_SKIP}=1)");
    if let Ok(report) = std::env::var("ANTLER_BWRAP_SKIP_REPORT") {
        use std::io::Write;
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(report) {
            let _ = writeln!(file, "{name}");
        }
    }
    false
}

/// Runs `body` with the test timeout.
pub async fn bounded<F: std::future::Future<Output = anyhow::Result<()>>>(body: F) -> anyhow::Result<()> {
    tokio::time::timeout(TEST_TIMEOUT, body).await.map_err(|_| anyhow::anyhow!("the test did not finish within {TEST_TIMEOUT:?}"))?
}

/// Every regular file under `dir` with its content hash, skipping `exclude` trees.
pub fn tree_hashes(dir: &Path, exclude: &[PathBuf]) -> std::collections::BTreeMap<PathBuf, String> {
    use sha2::Digest;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        if exclude.iter().any(|e| current.starts_with(e)) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&current) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else if exclude.iter().any(|e| path.starts_with(e)) {
                continue;
            } else if meta.file_type().is_symlink() {
                out.insert(
                    path.clone(),
                    format!("link:{}", std::fs::read_link(&path).map(|t| t.display().to_string()).unwrap_or_default()),
                );
            } else if meta.is_file() {
                let bytes = std::fs::read(&path).unwrap_or_default();
                out.insert(path, hex::encode(sha2::Sha256::digest(&bytes)));
            } else {
                out.insert(path, "special".to_owned());
            }
        }
    }
    out
}
