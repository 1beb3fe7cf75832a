//! `antler`: every service in one process (`antler up`), one service (`antler serve <service>`),
//! a run from the command line (`antler run`), the inspection commands (`antler threads|runs|events|
//! models|mcp|memory`, in `cli/`), DeerFlow memory.json import/export (`antler memory import|export`),
//! and configuration checks (`antler config check`). Exit codes: see `cli/mod.rs` and the README.

#[macro_use]
mod output;
mod cli;
mod client;
mod deerflow_tools;
mod spinner;

use std::path::PathBuf;
use std::time::Duration;

use antler_kit::cli::{Registration, ServeArgs};
use clap::{Parser, Subcommand, ValueEnum};

/// Antler runs LLM agents as durable, observable work orders over gRPC.
#[derive(Parser, Debug)]
#[command(name = "antler", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start every service in one process on one port (default 127.0.0.1:50051, SQLite under the data dir).
    Up {
        #[command(flatten)]
        serve: ServeArgs,
        /// Once serving, stream a demo run and print its events (the server keeps running).
        #[arg(long)]
        demo: bool,
    },
    /// Start a run with TEXT as the user message and print its events as they arrive.
    Run {
        /// The user message.
        text: String,
        /// Server address: http://host:port, https://host:port (TLS), or host:port (plaintext).
        #[arg(long, env = "ANTLER_ADDR", default_value = client::DEFAULT_ADDR, value_parser = client::parse_addr)]
        addr: client::Addr,
        /// Thread to run on (empty: a new thread).
        #[arg(long, default_value = "")]
        thread: String,
        /// Bearer token (API key or JWT) when the server requires one.
        #[arg(long, env = "ANTLER_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[command(flatten)]
        tls: client::TlsArgs,
        /// Model name (empty: the server's default).
        #[arg(long, default_value = "")]
        model: String,
        /// Plan mode: the agent keeps a todo list (the `write_todos` tool).
        #[arg(long)]
        plan: bool,
        /// A file the run must deliver (repeatable), e.g. /mnt/user-data/outputs/report.md: the run
        /// succeeds only if it exists at the end.
        #[arg(long = "expect", value_name = "PATH")]
        expected_outputs: Vec<String>,
        /// What to do when the thread already has an active run: reject (the default), interrupt it,
        /// rollback (interrupt it and discard its checkpoints), or enqueue this run behind it.
        #[arg(long, value_enum, default_value_t = cli::Multitask::Reject)]
        multitask: cli::Multitask,
        /// Colours: auto (on a terminal, unless NO_COLOR is set or TERM=dumb), always, never.
        #[arg(long, value_enum, default_value_t = output::ColorChoice::Auto)]
        color: output::ColorChoice,
    },
    /// Start one service on its own (for a multi-process or Kubernetes install).
    Serve {
        /// Which service to serve.
        service: ServiceName,
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// List or search the caller's memory facts; bring a DeerFlow memory.json in or take one out.
    Memory {
        #[command(subcommand)]
        command: MemoryCommand,
        #[command(flatten)]
        conn: cli::Conn,
        /// Agent scope of the facts (empty: the default agent).
        #[arg(long, default_value = "", global = true)]
        agent: String,
    },
    /// List, show and delete threads.
    Threads(cli::threads::Args),
    /// List, show and cancel runs.
    Runs(cli::runs::Args),
    /// Print a run's events (--follow: until it ends).
    Events(cli::events::Args),
    /// The configured models.
    Models(cli::models::Args),
    /// The MCP servers and their tools.
    Mcp(cli::mcp::Args),
    /// Your skills: list, show, install a .skill archive, enable, disable, delete.
    Skills(cli::skills::Args),
    /// Inspect configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Validate antler.yaml (every section) and print it resolved, with secrets masked. A DeerFlow
    /// config.yaml is read as it is: what each of its sections became is printed first.
    Check {
        /// Path to antler.yaml (or DeerFlow's config.yaml); without it the built-in defaults are checked.
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum MemoryCommand {
    /// List the caller's facts, newest first.
    List {
        #[command(flatten)]
        page: cli::Page,
    },
    /// Search the caller's facts by relevance to QUERY.
    Search {
        /// What to look for.
        query: String,
        /// At most this many results (0: the server's default).
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
    /// Import a DeerFlow memory.json (version 1.0 or 2.0) into the caller's memory.
    Import {
        /// The memory.json file ("-" for stdin).
        file: PathBuf,
    },
    /// Print the caller's memory as a DeerFlow memory.json.
    // `--version` here names the document's version; the program's own `--version` (propagated to
    // every subcommand) would clash with it, which clap refuses (a panic in debug builds).
    #[command(disable_version_flag = true)]
    Export {
        /// Document version: 1.0 or 2.0.
        #[arg(long, default_value = "2.0")]
        version: String,
    },
    /// Extract facts from the queued conversations now instead of after the debounce, and wait for it.
    Flush {
        /// Only this thread's queued conversation (default: all of yours).
        #[arg(long, default_value = "")]
        thread: String,
        /// Wait at most this many seconds (1-300).
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=300))]
        timeout: u64,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ServiceName {
    Runs,
    Sandbox,
    Mcp,
    Models,
    Memory,
    Edge,
}

impl ServiceName {
    fn registration(self) -> Registration {
        match self {
            ServiceName::Runs => antler_runs::SERVICE,
            ServiceName::Sandbox => antler_sandbox::SERVICE,
            ServiceName::Mcp => antler_mcp::SERVICE,
            ServiceName::Models => antler_models::SERVICE,
            ServiceName::Memory => antler_memory::SERVICE,
            ServiceName::Edge => antler_edge::SERVICE,
        }
    }
}

const ALL: [Registration; 6] = [
    antler_runs::SERVICE,
    antler_sandbox::SERVICE,
    antler_mcp::SERVICE,
    antler_models::SERVICE,
    antler_memory::SERVICE,
    antler_edge::SERVICE,
];

/// Streams the demo run once the server accepts connections.
fn spawn_demo(serve: &ServeArgs) -> anyhow::Result<()> {
    let config = serve.load()?;
    let addr = config.server.listen;
    if addr.port() == 0 {
        eprintln!("note: no demo run with a random port (--listen …:0): the demo needs to know where to connect");
        return Ok(());
    }
    let host = if addr.ip().is_unspecified() { "127.0.0.1".to_owned() } else { addr.ip().to_string() };
    let host = if host.contains(':') { format!("[{host}]") } else { host };
    // Over TLS the demo is one more in-process client: it trusts exactly the certificate the server
    // presents, and presents the server's own when the server asks for one (as `antler up`'s clients do).
    let tls = match antler_kit::tls::ServerTls::load(&config.server.tls, Duration::ZERO, None)? {
        Some(server) => {
            let fields = antler_kit::tls::Fields::Yaml("server.tls".to_owned());
            let settings = antler_kit::tls::ClientTlsConfig::default();
            Some(antler_kit::tls::ClientTls::for_own_server(&settings, &fields, &server, Duration::ZERO, None)?)
        }
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = format!("{scheme}://{host}:{}", addr.port());
    let token = std::env::var("ANTLER_TOKEN").ok();
    tokio::spawn(async move {
        let result = async {
            let channel = client::connect_with(&endpoint, Duration::from_secs(30), tls.as_ref()).await?;
            outln!("\ndemo run: the lead agent, played by the built-in `demo` replay model unless antler.yaml configures models")?;
            client::stream_and_print(channel, token.as_deref(), client::demo_request(), output::ColorChoice::Auto).await
        }
        .await;
        match result {
            // Whoever reads the server's stdout may have left; the server keeps serving regardless.
            Ok(status) => drop(outln!("demo finished: {}\nthe server keeps running; Ctrl-C stops it\n", status.as_str_name())),
            Err(error) => eprintln!("demo run failed: {error:#}"),
        }
    });
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // The sandbox's document converter runs as a child of this executable: convert stdin and exit.
    antler_sandbox::convert::worker::run_if_requested();
    // Before any configuration is read: a DeerFlow file's web tools are mapped by the lead agent.
    deerflow_tools::register();
    cli::exit(run(Cli::parse()).await)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Up { mut serve, demo } => {
            if demo {
                // The demo's progress without INFO lines in between; RUST_LOG still wins.
                serve.log_filter = Some("warn".to_owned());
                eprintln!("note: logging at WARN while the demo shows its run (RUST_LOG=info for every log line)");
                spawn_demo(&serve)?;
            }
            antler_kit::cli::run("antler", &serve, &ALL).await?
        }
        Command::Run { text, addr, thread, token, tls, model, plan, expected_outputs, multitask, color } => {
            let channel = client::connect(&addr, Duration::from_secs(5), &tls).await?;
            let create = antler_proto::runs::CreateRunRequest {
                thread_id: thread,
                input: vec![client::user_message(&text)],
                expected_outputs,
                multitask_strategy: multitask.proto() as i32,
                config: Some(antler_proto::runs::RunConfig { model_name: model, plan_mode: plan, ..Default::default() }),
                ..Default::default()
            };
            let status = client::stream_and_print(channel, token.as_deref(), create, color).await?;
            if status != antler_proto::runs::RunStatus::Success {
                return Err(client::Failure::RunEnded(status).into());
            }
        }
        Command::Memory { command, conn, agent } => match command {
            MemoryCommand::List { page } => cli::memory::run(&conn, &agent, cli::memory::Action::List(page)).await?,
            MemoryCommand::Search { query, limit } => cli::memory::run(&conn, &agent, cli::memory::Action::Search { query, limit }).await?,
            MemoryCommand::Import { file } => cli::memory::transfer(&conn, &agent, cli::memory::Transfer::Import(file)).await?,
            MemoryCommand::Export { version } => cli::memory::transfer(&conn, &agent, cli::memory::Transfer::Export(version)).await?,
            MemoryCommand::Flush { thread, timeout } => {
                cli::memory::run(&conn, &agent, cli::memory::Action::Flush { thread, timeout: Duration::from_secs(timeout) }).await?
            }
        },
        Command::Threads(args) => cli::threads::run(args).await?,
        Command::Runs(args) => cli::runs::run(args).await?,
        Command::Events(args) => cli::events::run(args).await?,
        Command::Models(args) => cli::models::run(args).await?,
        Command::Mcp(args) => cli::mcp::run(args).await?,
        Command::Skills(args) => cli::skills::run(args).await?,
        Command::Serve { service, serve } => {
            let program = format!("antler serve {}", service.registration().name);
            antler_kit::cli::run(&program, &serve, &[service.registration()]).await?;
        }
        Command::Config { command: ConfigCommand::Check { config } } => {
            let loaded = antler_kit::Config::load(config.as_deref())?;
            antler_kit::cli::validate(&loaded, &ALL)?;
            antler_kit::client::check_tls(&loaded)?;
            // As comments, so that the output stays a YAML document.
            if let Some(translation) = &loaded.deerflow {
                outln!("# {}", translation.summary())?;
                for line in &translation.lines {
                    outln!("#   {line}")?;
                }
            }
            match &loaded.path {
                Some(path) => outln!("# {} is valid; resolved (secrets masked):", path.display())?,
                None => outln!("# no config file given; the built-in defaults (secrets masked):")?,
            }
            out!("{}", loaded.to_masked_yaml())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// clap checks a command's definition only when that command is parsed, and only in debug builds:
    /// `antler memory export` panicked on every call (its `--version` clashed with the program's own).
    #[test]
    fn every_command_is_well_defined() {
        Cli::command().debug_assert();
    }

    #[test]
    fn memory_export_takes_a_document_version() {
        let cli = Cli::try_parse_from(["antler", "memory", "export", "--version", "1.0"]).map_err(|e| e.to_string());
        assert!(
            matches!(cli, Ok(Cli { command: Command::Memory { command: MemoryCommand::Export { ref version }, .. } }) if version == "1.0"),
            "{cli:?}"
        );
    }
}
