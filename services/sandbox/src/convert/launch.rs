//! The parent side of a conversion: starts the [`worker`](crate::convert::worker) (under bwrap, or as
//! a plain child), hands it the document as its stdin, reads the Markdown from its stdout, and kills
//! its process group at the timeout. Whatever the child does — a parse error, an abort on a failed
//! allocation, a stack overflow, a CPU spin — becomes one [`ConvertError`] for that file; the service
//! itself is never at risk.
//!
//! Isolation (`sandbox.uploads.convert.isolation`): `bwrap` runs the worker in fresh user, pid, ipc,
//! uts, cgroup and network namespaces with no network, a read-only system view (the libraries the
//! executable needs) and the executable bound read-only at [`WORKER_PATH`] — no data directory, no
//! /tmp of the host; `process` runs it as a plain child. Both drop to `sandbox.bwrap.run_as_uid` when
//! the service is root and clear the environment; the worker limits itself (see its module). Under bwrap
//! the worker also gets the seccomp filter of [`crate::seccomp`] (`sandbox.seccomp: strict`): it parses
//! hostile documents, so it is where an exploit would start.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::sync::Semaphore;

use crate::config::{BwrapConfig, ConvertConfig, ConvertIsolation};
use crate::convert::Format;
use crate::convert::worker::{Exit, Job, MARKER};

/// Where the executable appears inside the bwrap sandbox.
pub const WORKER_PATH: &str = "/antler/convert";
/// Bytes of the worker's stderr kept for the message.
const STDERR_KEPT: u64 = 8 * 1024;
/// Slack above `max_output_bytes` for the truncation marker.
const MARKER_SLACK: u64 = 4 * 1024;

/// Why a document has no Markdown. The text is what the client reads (`conversion_error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// The file's format is not converted (a legacy binary Office format).
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Encrypted(String),
    #[error("{0}")]
    Broken(String),
    /// A size limit; the message names the setting.
    #[error("{0}")]
    TooLarge(String),
    #[error("the conversion did not finish within {secs} s (sandbox.uploads.convert.timeout_secs) and was stopped")]
    TimedOut { secs: u64 },
    #[error("the conversion ran out of memory (limit {limit} bytes, sandbox.uploads.convert.max_memory_bytes) and was stopped")]
    OutOfMemory { limit: u64 },
    /// The converter died on this file (a signal other than the limits above).
    #[error("the converter crashed on this file ({0}); the file is stored, but has no Markdown")]
    Crashed(String),
    /// The converter cannot run here (conversion disabled, bwrap unusable, the executable missing).
    #[error("{0}")]
    Unavailable(String),
}

impl ConvertError {
    /// A bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ConvertError::Unsupported(_) => "unsupported",
            ConvertError::Encrypted(_) => "encrypted",
            ConvertError::Broken(_) => "broken",
            ConvertError::TooLarge(_) => "too_large",
            ConvertError::TimedOut { .. } => "timeout",
            ConvertError::OutOfMemory { .. } => "out_of_memory",
            ConvertError::Crashed(_) => "crashed",
            ConvertError::Unavailable(_) => "unavailable",
        }
    }
}

/// How the worker is started.
#[derive(Debug, Clone)]
enum Sandboxing {
    Process,
    Bwrap { bwrap: PathBuf, prefix: Vec<OsString>, seccomp: Option<crate::seccomp::Filter> },
}

/// Runs conversions (see the module comment). One per service.
#[derive(Debug)]
pub struct Converter {
    config: ConvertConfig,
    program: PathBuf,
    sandboxing: Sandboxing,
    run_as: Option<(u32, u32)>,
    slots: Arc<Semaphore>,
    /// Set when conversions cannot run here; every conversion fails with it.
    unusable: Option<String>,
    /// How the converter runs, for the start-up log and metrics: `bwrap`, `process` or `off`.
    mode: &'static str,
}

impl Converter {
    /// A converter that refuses every conversion with `reason` (conversion switched off).
    pub fn disabled(config: &ConvertConfig, reason: &str) -> Self {
        Self {
            config: config.clone(),
            program: PathBuf::new(),
            sandboxing: Sandboxing::Process,
            run_as: None,
            slots: Arc::new(Semaphore::new(1)),
            unusable: Some(reason.to_owned()),
            mode: "off",
        }
    }

    /// Picks the isolation and checks it works by converting a small HTML document (blocking: call it
    /// from a blocking thread inside a Tokio runtime). `bwrap_wanted` is whether commands run under
    /// bwrap here (what `auto` follows). Returns the converter and why it runs the way it does.
    pub fn start(
        config: &ConvertConfig,
        bwrap: &BwrapConfig,
        bwrap_wanted: bool,
        seccomp: Option<crate::seccomp::Filter>,
    ) -> (Self, String) {
        let run_as = rustix::process::geteuid().is_root().then_some((bwrap.run_as_uid, bwrap.run_as_gid));
        let program = if config.program.as_os_str().is_empty() {
            match std::env::current_exe() {
                Ok(exe) => exe,
                Err(e) => {
                    let why = format!("cannot find this service's executable to start the converter: {e}");
                    return (Self::disabled(config, &why), why);
                }
            }
        } else {
            config.program.clone()
        };
        let base = Self {
            config: config.clone(),
            program,
            sandboxing: Sandboxing::Process,
            run_as,
            slots: Arc::new(Semaphore::new(usize::try_from(config.max_concurrent).unwrap_or(1))),
            unusable: None,
            mode: "process",
        };
        let want_bwrap = match config.isolation {
            ConvertIsolation::Bwrap => true,
            ConvertIsolation::Auto => bwrap_wanted,
            ConvertIsolation::Process => false,
        };
        let mut bwrap_failure = None;
        if want_bwrap {
            match bwrap_sandboxing(bwrap, seccomp) {
                Ok(sandboxing) => {
                    let candidate = Self { sandboxing, mode: "bwrap", ..base.clone_settings() };
                    match candidate.probe() {
                        Ok(()) => {
                            let why = "the converter runs under bwrap (no network, no host files but the system libraries)".to_owned();
                            return (candidate, why);
                        }
                        Err(e) => bwrap_failure = Some(e),
                    }
                }
                Err(e) => bwrap_failure = Some(e),
            }
        }
        if let (Some(why), ConvertIsolation::Bwrap) = (&bwrap_failure, config.isolation) {
            let reason = format!(
                "document conversion is unavailable: sandbox.uploads.convert.isolation is bwrap but the converter cannot start under bwrap: {why}"
            );
            return (Self { unusable: Some(reason.clone()), mode: "off", ..base }, reason);
        }
        match base.probe() {
            Ok(()) => {
                let why = match bwrap_failure {
                    Some(failure) => format!("the converter runs as a plain child process: bwrap could not start it ({failure})"),
                    None if want_bwrap => "the converter runs as a plain child process".to_owned(),
                    None => "the converter runs as a plain child process (sandbox.uploads.convert.isolation, or commands do not use bwrap)"
                        .to_owned(),
                };
                (base, why)
            }
            Err(e) => {
                let reason = format!(
                    "document conversion is unavailable: the converter {} did not start: {e}\nhint: sandbox.uploads.convert.program must name an `antler` or `antler-sandbox` executable",
                    base.program.display()
                );
                (Self { unusable: Some(reason.clone()), mode: "off", ..base }, reason)
            }
        }
    }

    fn clone_settings(&self) -> Self {
        Self {
            config: self.config.clone(),
            program: self.program.clone(),
            sandboxing: self.sandboxing.clone(),
            run_as: self.run_as,
            slots: self.slots.clone(),
            unusable: self.unusable.clone(),
            mode: self.mode,
        }
    }

    /// `bwrap`, `process` or `off`.
    pub fn mode(&self) -> &'static str {
        self.mode
    }

    /// Why conversions fail here, when they all do.
    pub fn unusable(&self) -> Option<&str> {
        self.unusable.as_deref()
    }

    /// Converts one probe document, so a broken setup is known at start-up.
    fn probe(&self) -> Result<(), String> {
        let input = memfd(b"<h1>antler</h1><p>probe</p>").map_err(|e| format!("cannot create the probe input: {e}"))?;
        let handle = tokio::runtime::Handle::try_current().map_err(|e| format!("no async runtime: {e}"))?;
        match handle.block_on(self.run(input, Format::Html)) {
            Ok(markdown) if markdown.contains("# antler") && markdown.contains("probe") => Ok(()),
            Ok(markdown) => {
                Err(format!("the probe conversion gave unexpected output: {:?}", markdown.chars().take(200).collect::<String>()))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Converts `input` (an open file, read from its start) as `format`. Waits for a slot when
    /// `max_concurrent` conversions are running.
    pub async fn convert(&self, input: std::fs::File, size: u64, format: Format) -> Result<String, ConvertError> {
        if let Some(why) = &self.unusable {
            return Err(ConvertError::Unavailable(why.clone()));
        }
        if size > self.config.max_input_bytes {
            return Err(ConvertError::TooLarge(format!(
                "the file is {size} bytes, above the {} bytes converted (sandbox.uploads.convert.max_input_bytes)",
                self.config.max_input_bytes
            )));
        }
        let _slot = self.slots.acquire().await.map_err(|_| ConvertError::Unavailable("the converter is shutting down".to_owned()))?;
        let started = Instant::now();
        let result = self.run(input, format).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.label(),
        };
        metrics::counter!("antler_sandbox_conversions_total", "format" => format.label(), "outcome" => outcome).increment(1);
        metrics::histogram!("antler_sandbox_conversion_seconds", "format" => format.label()).record(started.elapsed().as_secs_f64());
        tracing::debug!(format = format.label(), outcome, elapsed_ms = started.elapsed().as_millis() as u64, "document converted");
        result
    }

    async fn run(&self, input: std::fs::File, format: Format) -> Result<String, ConvertError> {
        let c = &self.config;
        let job = Job { format, limits: c.limits(), max_memory_bytes: c.max_memory_bytes, cpu_secs: c.timeout_secs.saturating_add(1) };
        let mut command = match &self.sandboxing {
            Sandboxing::Process => {
                let mut command = tokio::process::Command::new(&self.program);
                command.arg(MARKER);
                command
            }
            Sandboxing::Bwrap { bwrap, prefix, seccomp } => {
                let mut command = tokio::process::Command::new(bwrap);
                if let Some(filter) = seccomp {
                    let args = filter
                        .attach(&mut command)
                        .map_err(|e| ConvertError::Unavailable(format!("cannot hand the seccomp filter to bwrap: {e}")))?;
                    command.args(args);
                }
                command.args(prefix).arg("--ro-bind").arg(&self.program).arg(WORKER_PATH).args([
                    "--remount-ro",
                    "/",
                    "--",
                    WORKER_PATH,
                    MARKER,
                ]);
                command
            }
        };
        command
            .args(job.args())
            .env_clear()
            .current_dir("/")
            .stdin(Stdio::from(input))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        let mut child = command.spawn().map_err(|e| ConvertError::Unavailable(format!("cannot start the converter: {e}")))?;
        let pid = child.id();
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(ConvertError::Unavailable("the converter's pipes are missing".to_owned()));
        };
        let output_cap = c.max_output_bytes.saturating_add(MARKER_SLACK);
        let work = async {
            let mut out = Vec::new();
            let mut err = Vec::new();
            let mut stdout = stdout.take(output_cap + 1);
            let mut stderr = stderr.take(STDERR_KEPT);
            let (read_out, _) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
            // More Markdown than the worker may write: stop it rather than wait on its full pipe.
            if read_out.is_ok() && out.len() as u64 > output_cap {
                return Err(out.len());
            }
            let status = child.wait().await;
            Ok((out, err, status))
        };
        let timeout = Duration::from_secs(c.timeout_secs);
        let result = tokio::time::timeout(timeout, work).await;
        let kill = |pid: Option<u32>| {
            if let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
        };
        match result {
            Err(_) => {
                kill(pid);
                let _ = child.wait().await;
                Err(ConvertError::TimedOut { secs: c.timeout_secs })
            }
            Ok(Err(bytes)) => {
                kill(pid);
                let _ = child.wait().await;
                Err(ConvertError::Crashed(format!("it wrote more than {bytes} bytes of Markdown, above the limit")))
            }
            Ok(Ok((out, err, status))) => {
                let status = status.map_err(|e| ConvertError::Unavailable(format!("waiting for the converter failed: {e}")))?;
                interpret(status, out, &err, c)
            }
        }
    }
}

/// Maps the worker's exit to the result.
fn interpret(status: ExitStatus, out: Vec<u8>, err: &[u8], config: &ConvertConfig) -> Result<String, ConvertError> {
    use std::os::unix::process::ExitStatusExt;
    let message = String::from_utf8_lossy(err).lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_owned();
    if let Some(code) = status.code() {
        return match Exit::from_code(code) {
            Some(Exit::Ok) => String::from_utf8(out).map_err(|_| ConvertError::Crashed("its output is not UTF-8".to_owned())),
            Some(Exit::Encrypted) => Err(ConvertError::Encrypted(message)),
            Some(Exit::Broken) => Err(ConvertError::Broken(message)),
            Some(Exit::TooLarge) => Err(ConvertError::TooLarge(message)),
            // bwrap reports its own setup failures with exit code 1; the worker never uses it.
            Some(Exit::Usage) | None => {
                Err(ConvertError::Unavailable(format!("the converter could not run (exit code {code}): {message}")))
            }
        };
    }
    let text = String::from_utf8_lossy(err);
    match status.signal() {
        _ if text.contains("memory allocation of") || text.contains("capacity overflow") => {
            Err(ConvertError::OutOfMemory { limit: config.max_memory_bytes })
        }
        _ if text.contains("has overflowed its stack") => {
            Err(ConvertError::Crashed("stack overflow: the document is nested too deeply".to_owned()))
        }
        Some(signal) if signal == libc_sigxcpu() => Err(ConvertError::TimedOut { secs: config.timeout_secs }),
        Some(signal) => Err(ConvertError::Crashed(format!(
            "signal {signal}{}",
            if message.is_empty() { String::new() } else { format!(": {message}") }
        ))),
        None => Err(ConvertError::Crashed(format!("{status}"))),
    }
}

/// SIGXCPU: the CPU limit (timeout + 1 s) was hit before the wall-clock timeout noticed.
fn libc_sigxcpu() -> i32 {
    rustix::process::Signal::XCPU.as_raw()
}

/// The bwrap arguments for the worker: a fresh namespace of every kind, no network, a read-only
/// system view and nothing else of the host.
fn bwrap_sandboxing(config: &BwrapConfig, seccomp: Option<crate::seccomp::Filter>) -> Result<Sandboxing, String> {
    let bwrap = if config.path.is_empty() {
        find_on_path("bwrap").ok_or_else(|| "bwrap is not installed (Debian package `bubblewrap`) or not on PATH".to_owned())?
    } else {
        PathBuf::from(&config.path)
    };
    let mut prefix: Vec<OsString> = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "convert",
        "--clearenv",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    for path in &config.system_paths {
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    prefix.extend(["--symlink".into(), target.into_os_string(), path.clone().into_os_string()]);
                }
            }
            Ok(_) => prefix.extend(["--ro-bind".into(), path.clone().into_os_string(), path.clone().into_os_string()]),
            Err(_) => {}
        }
    }
    prefix.extend(["--proc", "/proc", "--dev", "/dev"].iter().map(OsString::from));
    Ok(Sandboxing::Bwrap { bwrap, prefix, seccomp })
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| is_file(candidate))
}

fn is_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// An anonymous in-memory file holding `bytes` (the probe's input), positioned at its start.
fn memfd(bytes: &[u8]) -> std::io::Result<std::fs::File> {
    use std::io::{Seek, Write};
    let fd = rustix::fs::memfd_create("antler-convert-probe", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    file.rewind()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    fn exit(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn every_way_the_worker_ends_is_one_error() {
        let config = ConvertConfig::default();
        let run = |status, err: &str| interpret(status, b"# md\n".to_vec(), err.as_bytes(), &config);
        assert_eq!(run(exit(0), ""), Ok("# md\n".to_owned()));
        assert_eq!(run(exit(10), "the PDF is encrypted\n"), Err(ConvertError::Encrypted("the PDF is encrypted".to_owned())));
        assert_eq!(run(exit(11), "not a valid PDF"), Err(ConvertError::Broken("not a valid PDF".to_owned())));
        assert_eq!(run(exit(12), "too big"), Err(ConvertError::TooLarge("too big".to_owned())));
        assert!(
            matches!(run(exit(1), "bwrap: Can't mount proc"), Err(ConvertError::Unavailable(m)) if m.contains("bwrap: Can't mount proc"))
        );
        let abort = ExitStatus::from_raw(6);
        assert_eq!(
            run(abort, "memory allocation of 1073741824 bytes failed\n"),
            Err(ConvertError::OutOfMemory { limit: config.max_memory_bytes })
        );
        assert!(
            matches!(run(abort, "\nthread 'main' has overflowed its stack\nfatal runtime error: stack overflow"), Err(ConvertError::Crashed(m)) if m.contains("stack overflow"))
        );
        assert_eq!(run(ExitStatus::from_raw(24), ""), Err(ConvertError::TimedOut { secs: config.timeout_secs }));
        assert!(matches!(run(ExitStatus::from_raw(11), ""), Err(ConvertError::Crashed(m)) if m.contains("signal 11")));
    }

    #[test]
    fn a_converter_that_is_off_refuses_with_its_reason() {
        let converter = Converter::disabled(&ConvertConfig::default(), "switched off");
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a current-thread runtime builds");
        let file = memfd(b"<p>x</p>").expect("memfd");
        let result = runtime.block_on(converter.convert(file, 8, Format::Html));
        assert_eq!(result, Err(ConvertError::Unavailable("switched off".to_owned())));
        assert_eq!(converter.mode(), "off");
    }
}
