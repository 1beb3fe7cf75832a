//! A harness that starts real Antler binaries on free loopback ports and tears them down, also when a
//! test fails (the child is killed when [`Process`] drops).
//!
//! The binaries must be built first (`cargo build --workspace --bins`, which `scripts/test` does); the
//! harness finds them next to the test executable's `deps/` folder, or in `ANTLER_BIN_DIR`.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tonic::transport::Channel;

pub mod db;
pub mod inproc;
pub mod llm_double;
pub mod mcp;
pub mod memory;
pub mod metrics;
pub mod otlp;
pub mod percentile;
pub mod procfs;
pub mod provider_doubles;
pub mod runs;
pub mod tls;
pub mod web_double;

/// Where the built binaries are.
pub fn bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("ANTLER_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    // target/<profile>/deps/<test-binary> → target/<profile>
    let exe = std::env::current_exe()?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("cannot locate the target directory from {}", exe.display()))
}

/// The path of one built binary, with a hint when it is missing.
pub fn binary(name: &str) -> Result<PathBuf> {
    let path = bin_dir()?.join(name);
    if !path.exists() {
        bail!("{} does not exist\nhint: run `cargo build --workspace --bins` before the integration tests", path.display());
    }
    Ok(path)
}

/// How to start a process.
#[derive(Debug, Default, Clone)]
pub struct Launch {
    /// Arguments before the harness's own `--listen` / `--data-dir` / `--config`.
    pub args: Vec<String>,
    /// `antler.yaml` contents, written to a temporary file and passed with `--config`.
    pub config: Option<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Listen address (default `127.0.0.1:0`, a free port).
    pub listen: Option<String>,
    /// Data directory (default: a fresh temporary one). A fixed one lets a restarted process find
    /// what its predecessor left (sandbox workspaces, the SQLite database).
    pub data_dir: Option<PathBuf>,
}

impl Launch {
    pub fn new<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self { args: args.into_iter().map(Into::into).collect(), ..Self::default() }
    }

    pub fn config(mut self, yaml: impl Into<String>) -> Self {
        self.config = Some(yaml.into());
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = Some(addr.into());
        self
    }

    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }
}

/// A running service binary.
pub struct Process {
    child: Child,
    pub addr: SocketAddr,
    /// Lines the process printed on stdout after the ready line.
    stdout: mpsc::Receiver<String>,
    stderr_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process").field("pid", &self.child.id()).field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// What a process that failed to start printed.
#[derive(Debug)]
pub struct StartFailure {
    pub status: Option<ExitStatus>,
    pub stderr: String,
}

/// Starts `binary` and waits until it prints its listening line (at most 30 s).
pub fn start(binary_name: &str, launch: Launch) -> Result<Process> {
    match try_start(binary_name, launch)? {
        Ok(process) => Ok(process),
        Err(failure) => bail!("{binary_name} did not start ({:?}):\n{}", failure.status, failure.stderr),
    }
}

/// Like [`start`], but a process that exits before listening is reported rather than an error, for
/// tests that expect start-up to fail.
pub fn try_start(binary_name: &str, launch: Launch) -> Result<std::result::Result<Process, StartFailure>> {
    let dir = tempfile::tempdir()?;
    let stderr_path = dir.path().join("stderr.log");
    let mut command = Command::new(binary(binary_name)?);
    command.args(&launch.args);
    command.arg("--listen").arg(launch.listen.as_deref().unwrap_or("127.0.0.1:0"));
    command.arg("--data-dir").arg(launch.data_dir.clone().unwrap_or_else(|| dir.path().join("data")));
    if let Some(yaml) = &launch.config {
        let path = dir.path().join("antler.yaml");
        std::fs::write(&path, yaml)?;
        command.arg("--config").arg(path);
    }
    command.env_remove("ANTLER_CONFIG").env_remove("RUST_LOG");
    for (key, value) in &launch.env {
        command.env(key, value);
    }
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(std::fs::File::create(&stderr_path)?);
    let mut child = command.spawn().with_context(|| format!("spawning {binary_name}"))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout pipe"))?;
    let lines = forward_lines(stdout);

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match lines.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => {
                if let Some(addr) = line.split(" listening on ").nth(1) {
                    let addr = addr.trim().parse().with_context(|| format!("bad listening line {line:?}"))?;
                    return Ok(Ok(Process { child, addr, stdout: lines, stderr_path, _dir: dir }));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {}
        }
        if let Some(status) = child.try_wait()? {
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            return Ok(Err(StartFailure { status: Some(status), stderr }));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            return Ok(Err(StartFailure { status: None, stderr }));
        }
    }
}

fn forward_lines(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

impl Process {
    /// `http://addr` for tonic.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A connected channel.
    pub async fn channel(&self) -> Result<Channel> {
        Ok(Channel::from_shared(self.url())?.connect_timeout(Duration::from_secs(5)).connect().await?)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (e.g. `libc::SIGTERM`).
    pub fn signal(&self, signal: i32) -> Result<()> {
        let pid = i32::try_from(self.child.id())?;
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, signal) };
        if rc != 0 {
            bail!("kill({pid}, {signal}) failed: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits for the process to exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the process wrote to stderr so far (its logs).
    pub fn stderr(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(&self.stderr_path) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// Lines printed on stdout after the listening line.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.try_iter().collect()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The six Antler services, by fully qualified name.
pub const ALL_SERVICES: [&str; 7] = [
    "antler.runs.v1.ThreadService",
    "antler.runs.v1.RunService",
    "antler.sandbox.v1.SandboxService",
    "antler.sandbox.v1.SkillService",
    "antler.mcp.v1.McpService",
    "antler.models.v1.ModelService",
    "antler.memory.v1.MemoryService",
];

/// Lists services through reflection v1 (`v1alpha = false`) or v1alpha; both must work.
pub async fn reflection_list(channel: Channel, v1alpha: bool) -> Result<Vec<String>> {
    // The two protocol versions have identical shapes in different modules.
    macro_rules! list_services {
        ($pb:path) => {{
            use tokio_stream::StreamExt;
            use $pb as pb;
            let request = pb::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(pb::server_reflection_request::MessageRequest::ListServices(String::new())),
            };
            let mut stream = pb::server_reflection_client::ServerReflectionClient::new(channel)
                .server_reflection_info(tokio_stream::iter([request]))
                .await?
                .into_inner();
            let response = stream.next().await.ok_or_else(|| anyhow!("empty reflection stream"))??;
            match response.message_response {
                Some(pb::server_reflection_response::MessageResponse::ListServicesResponse(list)) => {
                    Ok(list.service.into_iter().map(|s| s.name).collect())
                }
                other => bail!("unexpected reflection answer {other:?}"),
            }
        }};
    }
    if v1alpha { list_services!(tonic_reflection::pb::v1alpha) } else { list_services!(tonic_reflection::pb::v1) }
}

/// Health status of `service` ("" for the whole server).
pub async fn health(channel: Channel, service: &str) -> Result<tonic_health::pb::health_check_response::ServingStatus> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let response = HealthClient::new(channel).check(HealthCheckRequest { service: service.to_owned() }).await?.into_inner();
    Ok(response.status())
}
