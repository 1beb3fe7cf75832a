//! `antler-models`: serves the models service alone (for a multi-process or Kubernetes install).

use antler_kit::cli::ServeArgs;
use clap::Parser;

/// Serve the Antler models service (the model gateway: config-driven streaming chat against OpenAI-compatible, Anthropic and replay providers).
#[derive(Parser, Debug)]
#[command(name = "antler-models", version)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    antler_kit::cli::exit_code(antler_kit::cli::run("antler-models", &args.serve, &[antler_models::SERVICE]).await)
}
