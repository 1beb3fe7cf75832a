//! `antler-memory`: serves the memory service alone (for a multi-process or Kubernetes install).

use antler_kit::cli::ServeArgs;
use clap::Parser;

/// Serve the Antler memory service (long-term memory: facts about a user, extraction queue, prompt injection).
#[derive(Parser, Debug)]
#[command(name = "antler-memory", version)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    antler_kit::cli::exit_code(antler_kit::cli::run("antler-memory", &args.serve, &[antler_memory::SERVICE]).await)
}
