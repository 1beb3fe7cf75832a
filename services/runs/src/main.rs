//! `antler-runs`: serves the runs service alone (for a multi-process or Kubernetes install).

use antler_kit::cli::ServeArgs;
use clap::Parser;

/// Serve the Antler runs service (threads and runs: the run lifecycle, leases, cancellation and durable event streams).
#[derive(Parser, Debug)]
#[command(name = "antler-runs", version)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    antler_kit::cli::exit_code(antler_kit::cli::run("antler-runs", &args.serve, &[antler_runs::SERVICE]).await)
}
