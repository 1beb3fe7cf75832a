//! `antler`: every service in one process (`antler up`), one service (`antler serve <service>`), and
//! configuration checks (`antler config check`).

use std::path::PathBuf;

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
    },
    /// Start one service on its own (for a multi-process or Kubernetes install).
    Serve {
        /// Which service to serve.
        service: ServiceName,
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// Inspect configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Validate antler.yaml (every section) and print it resolved, with secrets masked.
    Check {
        /// Path to antler.yaml; without it the built-in defaults are checked.
        #[arg(long, env = "ANTLER_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ServiceName {
    Runs,
    Sandbox,
    Mcp,
    Models,
    Memory,
}

impl ServiceName {
    fn registration(self) -> Registration {
        match self {
            ServiceName::Runs => antler_runs::SERVICE,
            ServiceName::Sandbox => antler_sandbox::SERVICE,
            ServiceName::Mcp => antler_mcp::SERVICE,
            ServiceName::Models => antler_models::SERVICE,
            ServiceName::Memory => antler_memory::SERVICE,
        }
    }
}

const ALL: [Registration; 5] =
    [antler_runs::SERVICE, antler_sandbox::SERVICE, antler_mcp::SERVICE, antler_models::SERVICE, antler_memory::SERVICE];

#[tokio::main]
async fn main() -> std::process::ExitCode {
    antler_kit::cli::exit_code(run(Cli::parse()).await.map_err(|e| e.to_string()))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Up { serve } => antler_kit::cli::run("antler", &serve, &ALL).await?,
        Command::Serve { service, serve } => {
            let program = format!("antler serve {}", service.registration().name);
            antler_kit::cli::run(&program, &serve, &[service.registration()]).await?;
        }
        Command::Config { command: ConfigCommand::Check { config } } => {
            let loaded = antler_kit::Config::load(config.as_deref())?;
            antler_kit::cli::validate(&loaded, &ALL)?;
            match &loaded.path {
                Some(path) => println!("# {} is valid; resolved (secrets masked):", path.display()),
                None => println!("# no config file given; the built-in defaults (secrets masked):"),
            }
            print!("{}", loaded.to_masked_yaml());
        }
    }
    Ok(())
}
