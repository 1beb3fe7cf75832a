//! The benchmarks' client in a process of its own. A bench binary runs itself again with
//! [`ADDR_ENV`] set: that copy is the client, the first one keeps the services. The client reads one
//! request per line on stdin, answers with any number of lines on stdout, then a line `done`. So the
//! client's work (decoding the stream, its timers) never shares a scheduler, an allocator or a
//! runtime with the services it measures, as with any real client — while the server side can still
//! pair what the client saw with what it recorded itself (the model times), one request at a time.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, anyhow, bail};

/// Set in the client process: the services' address.
pub const ADDR_ENV: &str = "ANTLER_BENCH_CLIENT_ADDR";

/// The address to reach when this process is the client; None in the server process.
pub fn client_addr() -> Option<String> {
    std::env::var(ADDR_ENV).ok()
}

/// The client process's runtime (one worker) and its channel to the services at `addr`.
pub fn connect(addr: &str) -> anyhow::Result<(tokio::runtime::Runtime, tonic::transport::Channel)> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let channel = runtime.block_on(tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect())?;
    Ok((runtime, channel))
}

/// The client process, seen from the server.
pub struct ClientProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ClientProcess {
    /// Starts this binary again as the client of `addr`.
    pub fn spawn(addr: std::net::SocketAddr) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating the bench binary")?;
        let mut child = Command::new(exe)
            .env(ADDR_ENV, addr.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the client process")?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("client stdin"))?;
        let stdout = BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("client stdout"))?);
        Ok(Self { child, stdin, stdout })
    }

    /// Sends one request; returns the client's answer lines (blocking: call it outside any runtime).
    pub fn request(&mut self, request: &str) -> anyhow::Result<Vec<String>> {
        writeln!(self.stdin, "{request}")?;
        self.stdin.flush()?;
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line)? == 0 {
                bail!("the client process exited during `{request}`");
            }
            let line = line.trim_end();
            if line == "done" {
                return Ok(lines);
            }
            if let Some(error) = line.strip_prefix("error ") {
                bail!("client: {error}");
            }
            lines.push(line.to_owned());
        }
    }

    /// Closes stdin (the client ends) and waits for it.
    pub fn finish(mut self) -> anyhow::Result<()> {
        drop(self.stdin);
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the client process ended with {status}");
        }
        Ok(())
    }
}

/// The client's loop: each stdin line goes to `handle`, whose lines are printed, then `done` (or one
/// `error …` line). Ends at the end of stdin.
pub fn serve(mut handle: impl FnMut(&str) -> anyhow::Result<Vec<String>>) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        match handle(line?.trim()) {
            Ok(lines) => {
                for answer in lines {
                    writeln!(stdout, "{answer}")?;
                }
                writeln!(stdout, "done")?;
            }
            Err(error) => writeln!(stdout, "error {}", format!("{error:#}").replace('\n', " | "))?,
        }
        stdout.flush()?;
    }
    Ok(())
}
