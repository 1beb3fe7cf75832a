//! `antler-sandbox`: serves the sandbox service alone (for a multi-process or Kubernetes install).

use antler_kit::cli::ServeArgs;
use clap::Parser;

/// Serve the Antler sandbox service (per-thread workspaces, file tools and isolated command execution).
#[derive(Parser, Debug)]
#[command(name = "antler-sandbox", version)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    antler_kit::cli::exit_code(antler_kit::cli::run("antler-sandbox", &args.serve, &[antler_sandbox::SERVICE]).await)
}
