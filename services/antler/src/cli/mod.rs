//! The inspection commands (`antler threads|runs|events|models|mcp|memory|skills …`): one file per command
//! group, each a thin layer over the generated gRPC client. This module holds what they share: the
//! connection flags, `--json` output, colour, and the exit codes.
//!
//! Exit codes (also in the README):
//!
//! | code | meaning |
//! |------|---------|
//! | 0  | success |
//! | 1  | any other failure (an INTERNAL error of the server, a file that cannot be read) |
//! | 2  | usage error: unknown command or flag, bad flag value, an --addr that is not an address (clap's code) |
//! | 3  | cannot reach the server (connection refused, TLS failure or mismatch, a lost connection, UNAVAILABLE, DEADLINE_EXCEEDED) |
//! | 4  | NOT_FOUND: no such thread, run, fact or skill (or it belongs to another user) |
//! | 5  | UNAUTHENTICATED or PERMISSION_DENIED: pass --token / ANTLER_TOKEN |
//! | 6  | the server refused the request: INVALID_ARGUMENT, FAILED_PRECONDITION, ABORTED, ALREADY_EXISTS, RESOURCE_EXHAUSTED, OUT_OF_RANGE |
//! | 7  | UNIMPLEMENTED: the server at --addr does not serve that service |
//! | 10 | the run ended ERROR (`antler run`, `antler events --follow`) |
//! | 11 | the run ended INTERRUPTED |
//! | 12 | the run ended TIMEOUT |
//!
//! A reader that leaves early (`antler memory export | head -2`) is not a failure: the command stops
//! quietly with 0 (see `output.rs`).

pub mod events;
pub mod hints;
pub mod mcp;
pub mod memory;
pub mod models;
pub mod runs;
pub mod skills;
pub mod threads;

use std::io::Write;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use antler_proto::runs::RunStatus;
use prost_reflect::{DescriptorPool, DynamicMessage};
use tonic::Code;
use tonic::transport::Channel;

use crate::client::{self, Addr, Failure, TlsArgs};
use crate::output::{ColorChoice, Style};

/// Where and how a command reaches the server, and how it prints. Flattened into every command group.
#[derive(clap::Args, Debug, Clone)]
pub struct Conn {
    /// Server address: http://host:port, https://host:port (TLS), or host:port (plaintext).
    #[arg(long, env = "ANTLER_ADDR", default_value = client::DEFAULT_ADDR, value_parser = client::parse_addr, global = true)]
    pub addr: Addr,
    /// Bearer token (API key or JWT) when the server requires one.
    #[arg(long, env = "ANTLER_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Print the server's reply as JSON (the proto3 JSON mapping, as grpcurl prints it) instead of text;
    /// streams print one JSON object per line.
    #[arg(long, global = true)]
    pub json: bool,
    /// Colours: auto (on a terminal, unless NO_COLOR is set or TERM=dumb), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, global = true)]
    pub color: ColorChoice,
}

impl Conn {
    /// A channel to the server (waiting at most 5 s for it to accept).
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        client::connect(&self.addr, Duration::from_secs(5), &self.tls).await
    }

    /// `message` with the bearer token attached.
    pub fn request<T>(&self, message: T) -> anyhow::Result<tonic::Request<T>> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| anyhow::anyhow!("--token holds characters that cannot be sent in a header"))?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

/// `antler run --multitask`: what to do when the thread already has an active run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Multitask {
    /// Refuse the new run (exit 6); the default.
    Reject,
    /// Interrupt the active run, then start this one.
    Interrupt,
    /// Interrupt the active run and discard its checkpoints, then start this one.
    Rollback,
    /// Queue this run behind the active one.
    Enqueue,
}

impl Multitask {
    /// The request's `multitask_strategy`.
    pub fn proto(self) -> antler_proto::runs::MultitaskStrategy {
        use antler_proto::runs::MultitaskStrategy as M;
        match self {
            Multitask::Reject => M::Reject,
            Multitask::Interrupt => M::Interrupt,
            Multitask::Rollback => M::Rollback,
            Multitask::Enqueue => M::Enqueue,
        }
    }
}

/// The process exit code for the outcome of a command, printing a failure as `error: …` with a hint.
pub fn exit(result: anyhow::Result<()>) -> ExitCode {
    let Err(error) = result else { return ExitCode::SUCCESS };
    // `antler memory export | head`: the reader left; that is not a failure to report.
    if crate::output::is_broken_pipe(&error) {
        return ExitCode::SUCCESS;
    }
    let (code, text) = describe(&error);
    // Not eprintln!: with stderr closed too, a panic would replace the exit code.
    let _ = writeln!(std::io::stderr(), "error: {text}");
    ExitCode::from(code)
}

/// The exit code and the message (with its hint) of a failure.
fn describe(error: &anyhow::Error) -> (u8, String) {
    if let Some(status) = error.downcast_ref::<tonic::Status>()
        && let Some(lost) = client::transport_failure(status)
    {
        return (3, lost);
    }
    if let Some(status) = error.downcast_ref::<tonic::Status>() {
        let code = status.code();
        let hint = match code {
            Code::NotFound => {
                "\nhint: ids are per user (another user's look missing); list yours with `antler threads list` or `antler runs list`"
            }
            Code::Unauthenticated => "\nhint: pass an API key or JWT with --token or ANTLER_TOKEN",
            Code::PermissionDenied => "\nhint: the token is valid but not allowed to do this",
            Code::Unavailable => "\nhint: is the server running at --addr (ANTLER_ADDR)? start one with `antler up`",
            Code::Unimplemented => {
                "\nhint: the server at --addr does not serve this service; with separate services, point --addr at the one that does"
            }
            _ => "",
        };
        let exit = match code {
            Code::Unavailable | Code::DeadlineExceeded => 3,
            Code::NotFound => 4,
            Code::Unauthenticated | Code::PermissionDenied => 5,
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::Aborted
            | Code::AlreadyExists
            | Code::ResourceExhausted
            | Code::OutOfRange => 6,
            Code::Unimplemented => 7,
            _ => 1,
        };
        // The code goes on the first line, before any hint the server's message carries, which names
        // the request's fields: said here with the flags a command-line user types instead.
        let what = antler_models::error::code_name(code);
        let server = hints::for_the_cli(status.message());
        let message = match server.split_once('\n') {
            _ if server.is_empty() => what.to_owned(),
            Some((first, rest)) => format!("{first} ({what})\n{rest}"),
            None => format!("{server} ({what})"),
        };
        return (exit, format!("{message}{hint}"));
    }
    match error.downcast_ref::<Failure>() {
        Some(Failure::Connect(message)) => (3, message.clone()),
        Some(failure @ Failure::RunEnded(status)) => {
            let code = match status {
                RunStatus::Error => 10,
                RunStatus::Interrupted => 11,
                RunStatus::Timeout => 12,
                _ => 1,
            };
            (code, failure.to_string())
        }
        None => (1, format!("{error:#}")),
    }
}

/// The message descriptors of every Antler proto (and the well-known types they import).
fn pool() -> anyhow::Result<&'static DescriptorPool> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(antler_proto::FILE_DESCRIPTOR_SET).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("the embedded descriptor set does not decode: {e}"))
}

/// `message` (of the proto type `full_name`, e.g. `antler.runs.v1.Run`) in the proto3 JSON mapping.
pub fn to_json<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<serde_json::Value> {
    let descriptor =
        pool()?.get_message_by_name(full_name).ok_or_else(|| anyhow::anyhow!("{full_name} is not in the embedded descriptor set"))?;
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())?;
    Ok(serde_json::to_value(&dynamic)?)
}

/// Prints `message` as one line of JSON.
pub fn print_json<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let line = serde_json::to_string(&to_json(message, full_name)?)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// An enum value's name without its prefix: `RUN_STATUS_SUCCESS` → `SUCCESS`.
pub fn short(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_owned()
}

/// A timestamp as RFC 3339, or `-` when absent.
pub fn time(timestamp: Option<&prost_types::Timestamp>) -> String {
    timestamp.map_or_else(|| "-".to_owned(), ToString::to_string)
}

/// Page flags shared by the list commands.
#[derive(clap::Args, Debug, Clone)]
pub struct Page {
    /// At most this many items (0: the server's default page size).
    #[arg(long, default_value_t = 0)]
    pub limit: u32,
    /// Continue from the `next page:` token a previous listing printed.
    #[arg(long, default_value = "")]
    pub page_token: String,
}

impl Page {
    /// The request's page.
    pub fn request(&self) -> antler_proto::common::PageRequest {
        antler_proto::common::PageRequest { page_size: self.limit, page_token: self.page_token.clone() }
    }
}

/// Prints the continuation hint of a page in text mode.
pub fn next_page(style: Style, page: Option<&antler_proto::common::PageResponse>) -> std::io::Result<()> {
    if let Some(page) = page.filter(|p| !p.next_page_token.is_empty()) {
        outln!("{}", style.dim(&format!("next page: --page-token {}", page.next_page_token)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_their_documented_exit_codes() {
        let cases = [
            (anyhow::Error::new(tonic::Status::not_found("run r-1 not found")), 4),
            (anyhow::Error::new(tonic::Status::unauthenticated("no token")), 5),
            (anyhow::Error::new(tonic::Status::failed_precondition("not cancellable")), 6),
            (anyhow::Error::new(tonic::Status::unavailable("down")), 3),
            (anyhow::Error::new(tonic::Status::unimplemented("")), 7),
            (anyhow::Error::new(tonic::Status::internal("bug")), 1),
            (anyhow::Error::new(Failure::Connect("cannot connect".into())), 3),
            (anyhow::Error::new(Failure::RunEnded(RunStatus::Error)), 10),
            (anyhow::Error::new(Failure::RunEnded(RunStatus::Interrupted)), 11),
            (anyhow::Error::new(Failure::RunEnded(RunStatus::Timeout)), 12),
        ];
        for (error, want) in cases {
            assert_eq!(describe(&error).0, want, "{error:#}");
        }
    }

    #[test]
    fn a_status_prints_its_message_code_and_hint_not_tonics_debug_form() {
        let (_, text) = describe(&anyhow::Error::new(tonic::Status::not_found("run r-1 not found")));
        assert!(text.starts_with("run r-1 not found (NOT_FOUND)\nhint: "), "{text}");
        assert!(!text.contains("metadata"), "{text}");
        let (_, text) = describe(&anyhow::Error::new(tonic::Status::failed_precondition("run r is not cancellable\nhint: read it")));
        assert_eq!(text, "run r is not cancellable (FAILED_PRECONDITION)\nhint: read it");
    }

    #[test]
    fn server_hints_name_the_flags_not_the_request_fields() {
        let status = tonic::Status::aborted(
            "thread t-1 has an active run r-9\nhint: retry with multitask_strategy=MULTITASK_STRATEGY_ENQUEUE (or INTERRUPT) or cancel r-9",
        );
        let (code, text) = describe(&anyhow::Error::new(status));
        assert_eq!(code, 6);
        assert_eq!(
            text,
            "thread t-1 has an active run r-9 (ABORTED)\nhint: retry with --multitask enqueue (or --multitask interrupt), or cancel r-9 with `antler runs cancel r-9`"
        );
    }

    #[test]
    fn colour_follows_the_choice_then_the_terminal_and_environment() {
        let coloured = |style: Style| style.good("ok") != "ok";
        assert!(coloured(Style::new(ColorChoice::Always, false, Some("1"), Some("dumb"))), "always wins");
        assert!(!coloured(Style::new(ColorChoice::Never, true, None, Some("xterm"))));
        assert!(coloured(Style::new(ColorChoice::Auto, true, None, Some("xterm"))));
        assert!(!coloured(Style::new(ColorChoice::Auto, false, None, Some("xterm"))), "piped");
        assert!(!coloured(Style::new(ColorChoice::Auto, true, Some("1"), Some("xterm"))), "NO_COLOR");
        assert!(!coloured(Style::new(ColorChoice::Auto, true, None, Some("dumb"))), "TERM=dumb");
    }

    #[test]
    fn json_uses_the_proto3_mapping() -> anyhow::Result<()> {
        let run =
            antler_proto::runs::Run { run_id: "r-1".into(), status: RunStatus::Interrupted as i32, last_seq: 7, ..Default::default() };
        let json = to_json(&run, "antler.runs.v1.Run")?;
        assert_eq!(json["runId"], "r-1");
        assert_eq!(json["status"], "RUN_STATUS_INTERRUPTED");
        // 64-bit integers are strings in the proto3 JSON mapping.
        assert_eq!(json["lastSeq"], "7");
        Ok(())
    }
}
