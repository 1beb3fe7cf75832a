//! MCP test fixtures: the reference servers installed by `scripts/setup` (npm
//! `@modelcontextprotocol/server-everything` and `server-filesystem`), this crate's own Python MCP server
//! (`integration-tests/mcp/antler_test_server.py`, Python `mcp` package), and an `antler-mcp` started on
//! an extensions file the test owns.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use antler_proto::mcp::mcp_service_client::McpServiceClient;
use antler_proto::mcp::{CallToolRequest, CallToolResponse, tool_content};
use anyhow::{Context, Result, anyhow, bail};
use tonic::transport::Channel;

use crate::{Launch, Process};

/// Where `scripts/setup` put the tools (`$ANTLER_TOOLS`, else `<repo>/.tools`).
pub fn tools_dir() -> PathBuf {
    std::env::var_os("ANTLER_TOOLS").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(".tools"))
}

fn existing(path: PathBuf) -> Result<PathBuf> {
    if path.exists() {
        Ok(path)
    } else {
        bail!("{} is missing\nhint: run scripts/setup (it installs the MCP test servers under $ANTLER_TOOLS)", path.display())
    }
}

/// The venv's Python (it has the `mcp` package).
pub fn python() -> Result<PathBuf> {
    existing(tools_dir().join("venv").join("bin").join("python"))
}

/// server-everything's entry script (run with `node`).
pub fn everything_js() -> Result<PathBuf> {
    existing(tools_dir().join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"))
}

/// server-filesystem's entry script.
pub fn filesystem_js() -> Result<PathBuf> {
    existing(tools_dir().join("node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"))
}

/// This crate's Python MCP server.
pub fn test_server_py() -> Result<PathBuf> {
    existing(Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp").join("antler_test_server.py"))
}

/// A free loopback port (bound then released; the caller starts a server on it at once).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A stdio entry for the Python test server.
pub fn python_stdio_entry() -> Result<serde_json::Value> {
    Ok(serde_json::json!({"type": "stdio", "command": python()?, "args": [test_server_py()?, "stdio"]}))
}

/// An HTTP MCP server process the test owns (killed when dropped).
pub struct HttpServer {
    child: Child,
    pub port: u16,
    /// Path of the MCP endpoint (`/mcp`, or `/sse` for the legacy transport).
    pub path: &'static str,
}

impl HttpServer {
    /// The Python test server over streamable HTTP; `flags` as documented in the script.
    pub fn python(flags: &[&str], port: Option<u16>) -> Result<Self> {
        let port = port.map_or_else(free_port, Ok)?;
        let child = Command::new(python()?)
            .arg(test_server_py()?)
            .arg("http")
            .arg("--port")
            .arg(port.to_string())
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the Python MCP test server")?;
        let mut server = Self { child, port, path: "/mcp" };
        server.wait_for_line("listening on")?;
        Ok(server)
    }

    /// server-everything over `sse` (endpoint /sse) or `streamableHttp` (endpoint /mcp).
    pub fn everything(mode: &str) -> Result<Self> {
        let port = free_port()?;
        let child = Command::new("node")
            .arg(everything_js()?)
            .arg(mode)
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting server-everything")?;
        let path = if mode == "sse" { "/sse" } else { "/mcp" };
        let server = Self { child, port, path };
        server.wait_for_port()?;
        Ok(server)
    }

    fn wait_for_line(&mut self, needle: &str) -> Result<()> {
        let stdout = self.child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if rx.recv_timeout(Duration::from_millis(100)).is_ok_and(|line| line.contains(needle)) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the MCP test server exited before listening ({status})");
            }
        }
        bail!("the MCP test server did not start in 30 s")
    }

    fn wait_for_port(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("server on port {} did not listen in 30 s", self.port)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}{}", self.port, self.path)
    }

    /// GET /admin/stats of the Python server.
    pub async fn stats(&self) -> Result<serde_json::Value> {
        let url = format!("http://127.0.0.1:{}/admin/stats", self.port);
        Ok(reqwest::get(url).await?.error_for_status()?.json().await?)
    }

    /// POST /admin/<what> of the Python server.
    pub async fn admin(&self, what: &str) -> Result<()> {
        let url = format!("http://127.0.0.1:{}/admin/{what}", self.port);
        reqwest::Client::new().post(url).send().await?.error_for_status()?;
        Ok(())
    }

    /// Kills the server (a crash, from the client's point of view).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An `antler-mcp` process on an extensions file in `dir` (kept by the caller for edits).
pub struct McpProcess {
    pub process: Process,
    pub extensions: PathBuf,
    pub data_dir: PathBuf,
    _dir: tempfile::TempDir,
}

/// The `mcp` section every test needs: the venv's Python allowed as a stdio command, plus `extra` YAML
/// lines indented under `mcp:` (e.g. "  pool:\n    max_sessions: 2\n"). The file watcher keeps its
/// default interval (2 s) unless `extra` sets `reload_interval_ms`.
pub fn mcp_yaml(extensions: &Path, extra: &str) -> Result<String> {
    Ok(format!(
        "mcp:\n  extensions_config: {}\n  stdio:\n    command_allowlist: [node, npx, \"{}\"]\n{extra}",
        extensions.display(),
        python()?.display()
    ))
}

/// Starts `antler-mcp` with `servers` as the file's `mcpServers`. `yaml_extra`: more antler.yaml (top
/// level sections after `mcp:` and lines under it, see [`mcp_yaml`]); `env`: the service's environment.
pub fn start(servers: serde_json::Value, mcp_extra: &str, other_sections: &str, env: &[(&str, &str)]) -> Result<McpProcess> {
    let dir = tempfile::tempdir()?;
    let extensions = dir.path().join("extensions_config.json");
    write_servers(&extensions, &servers)?;
    let data_dir = dir.path().join("data");
    let yaml = format!("{}{other_sections}", mcp_yaml(&extensions, mcp_extra)?);
    let mut launch = Launch::default().config(yaml).data_dir(&data_dir);
    for (k, v) in env {
        launch = launch.env(*k, *v);
    }
    let process = crate::start("antler-mcp", launch)?;
    Ok(McpProcess { process, extensions, data_dir, _dir: dir })
}

/// Writes an extensions file.
pub fn write_servers(path: &Path, servers: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(&serde_json::json!({"mcpServers": servers}))?;
    // Write-then-rename, as editors and ConfigMaps do, so the watcher never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

impl McpProcess {
    pub async fn client(&self) -> Result<McpServiceClient<Channel>> {
        Ok(McpServiceClient::new(self.process.channel().await?))
    }
}

/// A CallTool request.
pub fn call(tool: &str, arguments: serde_json::Value) -> CallToolRequest {
    let arguments = match arguments {
        serde_json::Value::Object(map) => Some(antler_kit::json::map_to_struct(&map)),
        _ => None,
    };
    CallToolRequest { tool_name: tool.to_owned(), arguments, ..CallToolRequest::default() }
}

/// The text blocks of a result, joined by newlines.
pub fn text(response: &CallToolResponse) -> String {
    response
        .content
        .iter()
        .filter_map(|c| match &c.content {
            Some(tool_content::Content::Text(t)) => Some(t.text.clone()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Polls `check` every 50 ms until it holds or `timeout` passes.
pub async fn eventually<F: FnMut() -> bool>(timeout: Duration, mut check: F) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
