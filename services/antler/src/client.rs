//! `antler run`: start a run and print its events as they arrive (also used by `antler up --demo`).

use std::io::Write;
use std::time::Duration;

use antler_proto::common::{ContentPart, Message, Role, TextPart, content_part};
use antler_proto::runs::run_event::Kind;
use antler_proto::runs::run_service_client::RunServiceClient;
use antler_proto::runs::{CreateRunRequest, RunStatus, StreamRunRequest};
use std::path::PathBuf;

use crate::output::{ColorChoice, Style};
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

/// A failure the exit code distinguishes, besides a gRPC status (which is carried as itself).
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The server could not be reached.
    #[error("{0}")]
    Connect(String),
    /// The run ended with a status other than SUCCESS.
    #[error("the run ended {}", .0.as_str_name().trim_start_matches("RUN_STATUS_"))]
    RunEnded(RunStatus),
}

/// Where the CLI connects without `--addr` / `ANTLER_ADDR`.
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";

/// A server address as `--addr` / `ANTLER_ADDR` take it: `http://host:port`, `https://host:port` (TLS),
/// or `host:port`, which means `http://host:port` (what grpcurl and the gRPC libraries take).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr {
    url: String,
}

impl Addr {
    /// The address as a URL with its scheme (`http://127.0.0.1:50051`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the address asks for TLS (`https://`).
    pub fn is_tls(&self) -> bool {
        self.url.starts_with("https://")
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

/// Reads `--addr` / `ANTLER_ADDR` (clap's value parser: a bad address is a usage error, exit code 2).
pub fn parse_addr(text: &str) -> std::result::Result<Addr, String> {
    const FORMS: &str = "give host:port, http://host:port or https://host:port (--addr or ANTLER_ADDR)";
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("the address is empty; {FORMS}"));
    }
    let url = match text.split_once("://") {
        Some(("http" | "https", _)) => text.to_owned(),
        Some((scheme, _)) => return Err(format!("{scheme}:// is not a scheme Antler speaks; {FORMS}")),
        None => format!("http://{text}"),
    };
    let endpoint = Endpoint::from_shared(url.clone()).map_err(|e| format!("{text} is not an address ({e}); {FORMS}"))?;
    let uri = endpoint.uri();
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{text} names no host; {FORMS}"));
    }
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    let after_host = authority.rsplit_once(']').map_or(authority, |(_, rest)| rest);
    if let Some((_, port)) = after_host.rsplit_once(':')
        && port.parse::<u16>().is_err()
    {
        return Err(format!("{text}: `{port}` is not a port number; {FORMS}"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("{text} has a path; {FORMS}"));
    }
    Ok(Addr { url: url.trim_end_matches('/').to_owned() })
}

/// The plaintext address this process connected to, for naming a TLS server behind it when a call fails.
static PLAINTEXT: std::sync::OnceLock<Addr> = std::sync::OnceLock::new();

/// Connects to `addr` (over TLS for `https://`, with `tls`), retrying for up to `wait` (the server
/// may still be starting).
pub async fn connect(addr: &Addr, wait: Duration, tls: &TlsArgs) -> Result<Channel> {
    let settings = tls.settings();
    let client = if addr.is_tls() {
        settings.validate(&Fields::Flags)?;
        Some(ClientTls::load(&settings, &Fields::Flags, Duration::ZERO, None)?)
    } else if !settings.is_empty() {
        bail!(
            "--ca, --cert, --key and --server-name (or ANTLER_CA, ANTLER_CLIENT_CERT, ANTLER_CLIENT_KEY, ANTLER_SERVER_NAME) are for TLS, but {addr} is plaintext\nhint: use --addr https://…"
        );
    } else {
        let _ = PLAINTEXT.set(addr.clone());
        None
    };
    connect_with(addr.url(), wait, client.as_ref()).await
}

/// The hint for a plaintext address whose server answered in TLS.
const SPEAKS_TLS: &str = "\nhint: the server speaks TLS: use https:// and --ca (or ANTLER_CA) with the CA of its certificate";

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
                let reason = chain(&error);
                let hint = if tls.is_none() && speaks_tls(endpoint) {
                    SPEAKS_TLS
                } else if tls.is_some() && reason.contains("InvalidContentType") {
                    "\nhint: the server does not speak TLS: use http://"
                } else if reason.contains("certificate") {
                    "\nhint: name the server's CA with --ca (or ANTLER_CA); a server that asks for client certificates also needs --cert and --key"
                } else {
                    ""
                };
                return Err(Failure::Connect(format!("cannot connect to {endpoint}: {reason}{hint}")).into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// An error and its sources on one line.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut reason = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !reason.ends_with(&said) {
            reason = format!("{reason}: {said}");
        }
        source = cause.source();
    }
    reason
}

/// When `status` is not the server's answer but the connection failing under the call (tonic makes
/// such a status from the transport error, which it keeps as the source; a server's own status has
/// none): the message for exit code 3, naming a TLS server behind a plaintext address.
pub fn transport_failure(status: &tonic::Status) -> Option<String> {
    let source = std::error::Error::source(status)?;
    let reason = chain(source);
    Some(match PLAINTEXT.get() {
        Some(addr) if speaks_tls(addr.url()) => format!("cannot talk to the server at {addr}: {reason}{SPEAKS_TLS}"),
        Some(addr) => format!("lost the connection to the server at {addr}: {reason}"),
        None => format!("lost the connection to the server: {reason}"),
    })
}

/// Whether the server at the plaintext `url` answers in TLS: sends the HTTP/2 preface a plaintext
/// client opens with and looks at the first byte back, a TLS record (alert 0x15 or handshake 0x16,
/// version 3.x) rather than an HTTP/2 frame. Only on a failure path, bounded by short timeouts.
fn speaks_tls(url: &str) -> bool {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let Ok(endpoint) = Endpoint::from_shared(url.to_owned()) else { return false };
    let uri = endpoint.uri();
    let Some(host) = uri.host() else { return false };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    let Some(addr) = (host, port).to_socket_addrs().ok().and_then(|mut a| a.next()) else { return false };
    let probe = || -> std::io::Result<[u8; 2]> {
        let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.set_write_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")?;
        let mut first = [0u8; 2];
        stream.read_exact(&mut first)?;
        Ok(first)
    };
    matches!(probe(), Ok([0x15 | 0x16, 0x03]))
}

/// Streams a run and prints it; returns the final status.
pub async fn stream_and_print(channel: Channel, token: Option<&str>, create: CreateRunRequest, color: ColorChoice) -> Result<RunStatus> {
    let mut request = tonic::Request::new(StreamRunRequest { create: Some(create) });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse()?);
    }
    let mut spinner = crate::spinner::Spinner::stdout(color);
    let mut stream = RunServiceClient::new(channel).stream_run(request).await?.into_inner();
    let mut printer = Printer::new(Style::stdout(color));
    let mut arguments = crate::spinner::ToolArguments::default();
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
        match &kind {
            // Heartbeats keep the stream alive; they are not progress.
            Kind::Heartbeat(_) => {}
            // Tool-call arguments are not printed (the call is, once it starts): the wait goes on, and
            // the spinner says how much of which call has arrived instead of a frozen screen.
            Kind::MessageDelta(d) if d.text.is_empty() && d.thinking.is_empty() && !d.tool_calls.is_empty() => {
                // Nothing is printed for them (an open text line ends, where the spinner was not drawn),
                // so the spinner stays and its next tick redraws it with the new label.
                arguments.add(&d.message_id, &d.tool_calls);
                spinner.progress(arguments.label());
            }
            _ => {
                arguments = crate::spinner::ToolArguments::default();
                spinner.clear()?;
                spinner.reset(waiting_for(&kind));
            }
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

/// Which streamed text a line is in the middle of.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum Open {
    #[default]
    None,
    Text,
    Thinking,
}

/// Prints events as terminal lines: streamed text as it arrives, one line per tool call and result.
#[derive(Debug)]
pub struct Printer {
    style: Style,
    open: Open,
    status: RunStatus,
}

impl Printer {
    /// A printer in `style` (colours or plain text).
    pub fn new(style: Style) -> Self {
        Self { style, open: Open::None, status: RunStatus::default() }
    }

    /// Prints one event (`seq` is its place in the run's log) to stdout.
    pub fn print(&mut self, seq: u64, kind: Kind) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        self.write(&mut out, seq, kind)?;
        out.flush()
    }

    /// Writes one event to `out`.
    fn write(&mut self, out: &mut impl Write, seq: u64, kind: Kind) -> std::io::Result<()> {
        let style = self.style;
        let streaming = match &kind {
            Kind::MessageDelta(d) if !d.thinking.is_empty() => Open::Thinking,
            Kind::MessageDelta(d) if !d.text.is_empty() => Open::Text,
            // The model moved on to tool calls: the text line is done (and the spinner may draw).
            Kind::MessageDelta(d) if !d.tool_calls.is_empty() => Open::None,
            Kind::MessageDelta(_) | Kind::Heartbeat(_) | Kind::Message(_) => self.open,
            _ => Open::None,
        };
        if self.open != Open::None && streaming != self.open {
            writeln!(out)?;
            self.open = Open::None;
        }
        let at = style.dim(&format!("[{seq:>3}]"));
        match kind {
            Kind::Metadata(m) => writeln!(out, "{at} run {} on thread {} (attempt {})", m.run_id, m.thread_id, m.attempt)?,
            Kind::MessageDelta(d) => {
                let thinking = !d.thinking.is_empty();
                let piece = if thinking { d.thinking } else { d.text };
                if piece.is_empty() {
                    return Ok(());
                }
                if self.open == Open::None {
                    let label = if thinking { style.dim("thinking:") } else { style.accent("assistant:") };
                    write!(out, "{at} {label} ")?;
                    self.open = streaming;
                }
                if thinking { write!(out, "{}", style.dim(&piece))? } else { write!(out, "{piece}")? }
            }
            Kind::Message(_) | Kind::Heartbeat(_) => {}
            Kind::Values(v) => writeln!(out, "{at} {}", style.dim(&format!("checkpoint (step {})", v.step)))?,
            Kind::ToolStarted(t) => {
                writeln!(out, "{at} tool {}({})", style.bold(&t.name), arguments(t.arguments.as_ref(), &t.raw_arguments))?
            }
            Kind::ToolFinished(t) => {
                let verdict = if t.outcome_unknown {
                    style.warn("outcome unknown (not re-run)")
                } else if t.is_error {
                    style.bad("failed")
                } else {
                    style.good("ok")
                };
                let ms = t.duration.map(|d| d.seconds as f64 * 1000.0 + f64::from(d.nanos) / 1e6).unwrap_or(0.0);
                writeln!(out, "{at}   → {} {verdict} in {ms:.0} ms: {}", t.name, one_line(&t.result_summary, 100))?
            }
            Kind::Clarification(c) => {
                writeln!(out, "{at} the agent asks: {}", style.bold(&c.question))?;
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
            Kind::Custom(c) => writeln!(out, "{at} {}", c.name)?,
            Kind::Delivery(d) => {
                // "Satisfied" with nothing produced and nothing declared would read as a success
                // before an END that may well say ERROR: say what the receipt holds instead.
                let verdict = if !d.satisfied {
                    style.bad(&format!("NOT satisfied, missing {}", d.missing.join(", ")))
                } else if d.produced.is_empty() && d.declared.is_empty() {
                    style.dim("no outputs (none produced, none declared)")
                } else {
                    style.good("satisfied")
                };
                writeln!(out, "{at} delivery receipt: {verdict}")?;
                for file in &d.produced {
                    let presented = if d.presented.contains(&file.path) { "presented" } else { "not presented" };
                    let sha = file.sha256.get(..12).unwrap_or(&file.sha256);
                    writeln!(out, "        {} ({} bytes, sha256 {sha}…, {presented})", file.path, file.size)?;
                }
            }
            Kind::Error(e) => writeln!(out, "{at} {}", style.bad(&format!("error: {}", e.error.map(|e| e.message).unwrap_or_default())))?,
            Kind::End(end) => {
                self.status = end.status();
                let usage = end.usage.unwrap_or_default();
                let reason = if end.stop_reason.is_empty() { String::new() } else { format!(" ({})", end.stop_reason) };
                let status = style.status(self.status.as_str_name().trim_start_matches("RUN_STATUS_"));
                writeln!(out, "{at} end: {status}{reason}")?;
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
                    writeln!(out, "        {}", style.bad(&format!("{}: {}", error.code, error.message)))?;
                }
            }
            other => writeln!(out, "{at} {other:?}")?,
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use antler_proto::runs::{EndEvent, MessageDelta, ToolCallDelta, ToolFinished};

    use super::*;

    fn printed(style: Style, events: Vec<Kind>) -> String {
        let mut printer = Printer::new(style);
        let mut out = Vec::new();
        for (seq, kind) in events.into_iter().enumerate() {
            printer.write(&mut out, seq as u64 + 1, kind).unwrap_or_else(|e| panic!("{e}"));
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    fn text(piece: &str) -> Kind {
        Kind::MessageDelta(MessageDelta { message_id: "m".into(), text: piece.into(), ..MessageDelta::default() })
    }

    fn arguments(piece: &str) -> Kind {
        let call = ToolCallDelta { name: "write_file".into(), arguments: piece.into(), ..ToolCallDelta::default() };
        Kind::MessageDelta(MessageDelta { message_id: "m".into(), tool_calls: vec![call], ..MessageDelta::default() })
    }

    #[test]
    fn tool_call_arguments_close_the_text_line_and_are_not_printed() {
        let plain = Style::new(ColorChoice::Never, true, None, None);
        let out = printed(plain, vec![text("Writing "), text("the note."), arguments("{\"path\": "), arguments("\"/a\"}")]);
        assert_eq!(out, "[  1] assistant: Writing the note.\n", "the line ends when the arguments start, so the spinner can draw");
        let mut printer = Printer::new(plain);
        let mut sink = Vec::new();
        printer.write(&mut sink, 1, text("Hi")).unwrap_or_else(|e| panic!("{e}"));
        printer.write(&mut sink, 2, arguments("{")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(printer.open, Open::None);
    }

    #[test]
    fn colours_mark_outcomes_and_are_absent_in_plain_text() {
        let events = || {
            vec![
                text("Done."),
                Kind::ToolFinished(ToolFinished { name: "bash".into(), is_error: true, ..ToolFinished::default() }),
                Kind::End(EndEvent { status: RunStatus::Success as i32, ..EndEvent::default() }),
            ]
        };
        let coloured = printed(Style::new(ColorChoice::Always, false, None, None), events());
        assert!(coloured.contains("\x1b[36massistant:\x1b[0m"), "{coloured:?}");
        assert!(coloured.contains("\x1b[31mfailed\x1b[0m"), "{coloured:?}");
        assert!(coloured.contains("end: \x1b[32mSUCCESS\x1b[0m"), "{coloured:?}");
        let plain = printed(Style::new(ColorChoice::Never, true, None, None), events());
        assert!(!plain.contains('\x1b'), "{plain:?}");
        assert!(plain.contains("[  3] end: SUCCESS\n"), "{plain:?}");
    }

    #[test]
    fn a_receipt_with_nothing_in_it_does_not_say_satisfied() {
        use antler_proto::runs::{DeliveryReceipt, OutputFile, RunError};
        let plain = Style::new(ColorChoice::Never, true, None, None);
        // A run that failed before it produced anything: an empty receipt, then END ERROR.
        let failed = printed(
            plain,
            vec![
                Kind::Delivery(DeliveryReceipt { satisfied: true, ..DeliveryReceipt::default() }),
                Kind::End(EndEvent {
                    status: RunStatus::Error as i32,
                    error: Some(RunError { code: "model_error".into(), ..RunError::default() }),
                    ..EndEvent::default()
                }),
            ],
        );
        assert!(failed.contains("[  1] delivery receipt: no outputs (none produced, none declared)\n"), "{failed}");
        assert!(!failed.contains("satisfied"), "{failed}");
        let file = OutputFile { path: "/mnt/user-data/outputs/a.md".into(), size: 3, sha256: "ab".repeat(32), ..OutputFile::default() };
        let delivered = printed(
            plain,
            vec![Kind::Delivery(DeliveryReceipt {
                satisfied: true,
                produced: vec![file.clone()],
                presented: vec![file.path.clone()],
                ..DeliveryReceipt::default()
            })],
        );
        assert!(delivered.contains("delivery receipt: satisfied\n"), "{delivered}");
    }

    #[test]
    fn an_address_is_a_url_or_host_and_port() {
        let url = |text: &str| parse_addr(text).map(|a| (a.url().to_owned(), a.is_tls()));
        assert_eq!(url("127.0.0.1:50051"), Ok(("http://127.0.0.1:50051".to_owned(), false)));
        assert_eq!(url("http://127.0.0.1:50051"), Ok(("http://127.0.0.1:50051".to_owned(), false)));
        assert_eq!(url("https://antler.example.com:443/"), Ok(("https://antler.example.com:443".to_owned(), true)));
        assert_eq!(url("localhost:50051"), Ok(("http://localhost:50051".to_owned(), false)));
        assert_eq!(url("[::1]:50051"), Ok(("http://[::1]:50051".to_owned(), false)));
        for bad in ["", "ftp://host:1", "http://[bad", "http://host:1/path", "host:port"] {
            let error = parse_addr(bad).err().unwrap_or_default();
            assert!(error.contains("host:port, http://host:port or https://host:port"), "{bad:?}: {error}");
        }
    }
}
