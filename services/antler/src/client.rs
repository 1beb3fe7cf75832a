//! `antler run`: start a run and print its events as they arrive (also used by `antler up --demo`).

use std::io::Write;
use std::time::Duration;

use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{CreateRunRequest, RunStatus, StreamRunRequest};
use std::path::PathBuf;

use antler_kit::tls::{ClientTls, ClientTlsConfig, Fields};
use anyhow::{Result, bail};
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

/// A user message with `text`.
pub fn user_message(text: &str) -> Message {
    Message {
        role: Role::User as i32,
        content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: text.to_owned() })) }],
        ..Message::default()
    }
}

/// How a command reaches a TLS server (an `https://` address).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// PEM CA certificates the server's certificate must chain to (default: the system's roots). Needs
    /// an https:// address.
    #[arg(long, env = "ANTLER_CA", value_name = "FILE", global = true)]
    pub ca: Option<PathBuf>,
    /// PEM client certificate, for a server that asks for one (server.tls.client_ca).
    #[arg(long, env = "ANTLER_CLIENT_CERT", value_name = "FILE", global = true, requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, env = "ANTLER_CLIENT_KEY", value_name = "FILE", global = true, requires = "cert")]
    pub key: Option<PathBuf>,
    /// The name the server's certificate must carry (default: the host of the address).
    #[arg(long, env = "ANTLER_SERVER_NAME", global = true)]
    pub server_name: Option<String>,
}

impl TlsArgs {
    fn settings(&self) -> ClientTlsConfig {
        ClientTlsConfig {
            ca: self.ca.clone().unwrap_or_default(),
            cert: self.cert.clone().unwrap_or_default(),
            key: self.key.clone().unwrap_or_default(),
            server_name: self.server_name.clone().unwrap_or_default(),
        }
    }
}

/// Connects to `endpoint` (over TLS for `https://`, with `tls`), retrying for up to `wait` (the server
/// may still be starting).
pub async fn connect(endpoint: &str, wait: Duration, tls: &TlsArgs) -> Result<Channel> {
    let settings = tls.settings();
    let client = if endpoint.starts_with("https://") {
        settings.validate(&Fields::Flags)?;
        Some(ClientTls::load(&settings, &Fields::Flags, Duration::ZERO, None)?)
    } else if !settings.is_empty() {
        bail!(
            "--ca, --cert, --key and --server-name (or ANTLER_CA, ANTLER_CLIENT_CERT, ANTLER_CLIENT_KEY, ANTLER_SERVER_NAME) are for TLS, but {endpoint} is plaintext\nhint: use --addr https://…"
        );
    } else {
        None
    };
    connect_with(endpoint, wait, client.as_ref()).await
}

/// Connects to `endpoint` through `tls` (or plaintext), retrying for up to `wait`.
pub async fn connect_with(endpoint: &str, wait: Duration, tls: Option<&ClientTls>) -> Result<Channel> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let target = Endpoint::from_shared(endpoint.to_owned())?.connect_timeout(Duration::from_secs(5));
        let result = match tls {
            Some(tls) => tls.connect(target).await,
            None => target.connect().await,
        };
        match result {
            Ok(channel) => return Ok(channel),
            Err(error) if tokio::time::Instant::now() >= deadline => {
                // tonic says only "transport error"; the reason (refused, an unknown certificate) is in the sources.
                let mut reason = error.to_string();
                let mut source = std::error::Error::source(&error);
                while let Some(cause) = source {
                    reason = format!("{reason}: {cause}");
                    source = cause.source();
                }
                let hint = if reason.contains("certificate") {
                    "\nhint: name the server's CA with --ca (or ANTLER_CA); a server that asks for client certificates also needs --cert and --key"
                } else if tls.is_none()
                    && (reason.contains("connection reset") || reason.contains("broken pipe") || reason.contains("h2 protocol"))
                {
                    "\nhint: a TLS server needs an https:// address"
                } else {
                    ""
                };
                return Err(crate::cli::Failure::Connect(format!("cannot connect to {endpoint}: {reason}{hint}")).into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Streams a run and prints it; returns the final status.
pub async fn stream_and_print(channel: Channel, token: Option<&str>, create: CreateRunRequest) -> Result<RunStatus> {
    let mut request = tonic::Request::new(StreamRunRequest { create: Some(create) });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse()?);
    }
    let mut spinner = crate::spinner::Spinner::stdout();
    let mut stream = RunServiceClient::new(channel).stream_run(request).await?.into_inner();
    let mut printer = Printer::default();
    let mut ticker = tokio::time::interval(crate::spinner::TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = ticker.tick() => {
                spinner.tick(printer.open != Open::None)?;
                continue;
            }
        };
        let Some(item) = item else { break };
        let Some(event) = item?.event else { continue };
        let Some(kind) = event.kind else { continue };
        // Heartbeats keep the stream alive; they are not progress.
        if !matches!(kind, Kind::Heartbeat(_)) {
            spinner.clear()?;
            spinner.reset(waiting_for(&kind));
        }
        printer.print(event.seq, kind)?;
    }
    spinner.clear()?;
    Ok(printer.status)
}

/// What the run waits for after `kind` (the spinner's label).
fn waiting_for(kind: &Kind) -> String {
    match kind {
        Kind::ToolStarted(t) => format!("running {}", t.name),
        Kind::End(_) => "finishing".to_owned(),
        _ => "waiting for the model".to_owned(),
    }
}

/// What `antler memory` does.
#[derive(Debug)]
pub enum MemoryAction {
    Import(std::path::PathBuf),
    Export(String),
}

/// `antler memory import|export`: one ImportMemory / ExportMemory call.
pub async fn memory(conn: &crate::cli::Conn, agent: &str, action: MemoryAction) -> Result<()> {
    use antler_proto::memory::memory_service_client::MemoryServiceClient;
    use antler_proto::memory::{ExportMemoryRequest, ImportMemoryRequest};
    let channel = conn.channel().await?;
    let mut client = MemoryServiceClient::new(channel).max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20);
    match action {
        MemoryAction::Import(path) => {
            let document = if path.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?
            };
            let r = client.import_memory(conn.request(ImportMemoryRequest { agent_name: agent.to_owned(), document })?).await?.into_inner();
            println!(
                "imported memory.json v{}: {} facts, {} skipped (already known or not active), {} summary sections, {} evicted by the cap",
                r.version,
                r.facts_imported,
                r.facts_skipped,
                r.sections_imported,
                r.evicted_fact_ids.len()
            );
        }
        MemoryAction::Export(version) => {
            let r = client.export_memory(conn.request(ExportMemoryRequest { agent_name: agent.to_owned(), version })?).await?.into_inner();
            println!("{}", r.document);
        }
    }
    Ok(())
}

/// Which streamed text a line is in the middle of.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum Open {
    #[default]
    None,
    Text,
    Thinking,
}

/// Prints events as terminal lines: streamed text as it arrives, one line per tool call and result.
#[derive(Debug, Default)]
pub struct Printer {
    open: Open,
    status: RunStatus,
}

impl Printer {
    /// Prints one event (`seq` is its place in the run's log).
    pub fn print(&mut self, seq: u64, kind: Kind) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        let streaming = match &kind {
            Kind::MessageDelta(d) if !d.thinking.is_empty() => Open::Thinking,
            Kind::MessageDelta(d) if !d.text.is_empty() => Open::Text,
            Kind::MessageDelta(_) | Kind::Heartbeat(_) | Kind::Message(_) => self.open,
            _ => Open::None,
        };
        if self.open != Open::None && streaming != self.open {
            writeln!(out)?;
            self.open = Open::None;
        }
        match kind {
            Kind::Metadata(m) => writeln!(out, "[{seq:>3}] run {} on thread {} (attempt {})", m.run_id, m.thread_id, m.attempt)?,
            Kind::MessageDelta(d) => {
                let (piece, label) = if d.thinking.is_empty() { (d.text, "assistant") } else { (d.thinking, "thinking") };
                if piece.is_empty() {
                    return Ok(());
                }
                if self.open == Open::None {
                    write!(out, "[{seq:>3}] {label}: ")?;
                    self.open = streaming;
                }
                write!(out, "{piece}")?;
            }
            Kind::Message(_) | Kind::Heartbeat(_) => {}
            Kind::Values(v) => writeln!(out, "[{seq:>3}] checkpoint (step {})", v.step)?,
            Kind::ToolStarted(t) => writeln!(out, "[{seq:>3}] tool {}({})", t.name, arguments(t.arguments.as_ref(), &t.raw_arguments))?,
            Kind::ToolFinished(t) => {
                let verdict = if t.outcome_unknown {
                    "outcome unknown (not re-run)"
                } else if t.is_error {
                    "failed"
                } else {
                    "ok"
                };
                let ms = t.duration.map(|d| d.seconds as f64 * 1000.0 + f64::from(d.nanos) / 1e6).unwrap_or(0.0);
                writeln!(out, "[{seq:>3}]   → {} {verdict} in {ms:.0} ms: {}", t.name, one_line(&t.result_summary, 100))?
            }
            Kind::Clarification(c) => {
                writeln!(out, "[{seq:>3}] the agent asks: {}", c.question)?;
                for option in &c.options {
                    writeln!(out, "        {}. {}", option.id, option.label)?;
                }
                for field in &c.fields {
                    let kind = field.kind().as_str_name().trim_start_matches("FORM_FIELD_KIND_").to_ascii_lowercase();
                    let required = if field.required { ", required" } else { "" };
                    writeln!(out, "        [{}] {} ({kind}{required})", field.name, field.label)?;
                }
                writeln!(out, "        (answer with: antler run \"…\" --thread <this thread>)")?;
            }
            Kind::Custom(c) => writeln!(out, "[{seq:>3}] {}", c.name)?,
            Kind::Delivery(d) => {
                writeln!(
                    out,
                    "[{seq:>3}] delivery receipt: {}",
                    if d.satisfied { "satisfied".to_owned() } else { format!("NOT satisfied, missing {}", d.missing.join(", ")) }
                )?;
                for file in &d.produced {
                    let presented = if d.presented.contains(&file.path) { "presented" } else { "not presented" };
                    let sha = file.sha256.get(..12).unwrap_or(&file.sha256);
                    writeln!(out, "        {} ({} bytes, sha256 {sha}…, {presented})", file.path, file.size)?;
                }
            }
            Kind::Error(e) => writeln!(out, "[{seq:>3}] error: {}", e.error.map(|e| e.message).unwrap_or_default())?,
            Kind::End(end) => {
                self.status = end.status();
                let usage = end.usage.unwrap_or_default();
                let reason = if end.stop_reason.is_empty() { String::new() } else { format!(" ({})", end.stop_reason) };
                writeln!(out, "[{seq:>3}] end: {}{reason}", self.status.as_str_name().trim_start_matches("RUN_STATUS_"))?;
                writeln!(
                    out,
                    "        usage: {} tokens in {} model calls ({} in, {} out; lead agent {}, middlewares {})",
                    usage.total_tokens,
                    usage.llm_calls,
                    usage.input_tokens,
                    usage.output_tokens,
                    usage.lead_agent_tokens,
                    usage.middleware_tokens
                )?;
                if let Some(error) = end.error {
                    writeln!(out, "        {}: {}", error.code, error.message)?;
                }
            }
            other => writeln!(out, "[{seq:>3}] {other:?}")?,
        }
        out.flush()
    }
}

/// Tool arguments on one line, without the `description` the model adds for humans.
fn arguments(arguments: Option<&prost_types::Struct>, raw: &str) -> String {
    let Some(arguments) = arguments else { return one_line(raw, 80) };
    let parts: Vec<String> = arguments
        .fields
        .iter()
        .filter(|(name, _)| name.as_str() != "description")
        .map(|(name, value)| format!("{name}={}", one_line(&value_text(value), 60)))
        .collect();
    parts.join(", ")
}

fn value_text(value: &prost_types::Value) -> String {
    use prost_types::value::Kind as V;
    match &value.kind {
        Some(V::StringValue(s)) => format!("{s:?}"),
        Some(V::NumberValue(n)) => n.to_string(),
        Some(V::BoolValue(b)) => b.to_string(),
        Some(V::ListValue(l)) => format!("[{} items]", l.values.len()),
        Some(V::StructValue(s)) => format!("{{{} fields}}", s.fields.len()),
        Some(V::NullValue(_)) | None => "null".to_owned(),
    }
}

/// `text` on one line, cut to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

/// Where the demo run must deliver its file (the shipped transcript of the built-in `demo` model writes it).
pub const DEMO_OUTPUT: &str = "/mnt/user-data/outputs/hello.md";

/// The run `antler up --demo` streams: a lead-agent work order in plan mode with a declared output,
/// played by the built-in `demo` model when no models are configured.
pub fn demo_request() -> CreateRunRequest {
    CreateRunRequest {
        input: vec![user_message("Write a short hello note to /mnt/user-data/outputs/hello.md, check it, and present it to me.")],
        expected_outputs: vec![DEMO_OUTPUT.to_owned()],
        config: Some(antler_proto::runs::RunConfig { plan_mode: true, ..Default::default() }),
        ..CreateRunRequest::default()
    }
}
