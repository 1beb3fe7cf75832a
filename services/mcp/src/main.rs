//! `antler-mcp`: serves the mcp service alone (for a multi-process or Kubernetes install).

use antler_kit::cli::ServeArgs;
use clap::Parser;

/// Serve the Antler mcp service (the MCP session pool: tools from MCP servers over stdio and HTTP).
#[derive(Parser, Debug)]
#[command(name = "antler-mcp", version)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    antler_kit::cli::exit_code(antler_kit::cli::run("antler-mcp", &args.serve, &[antler_mcp::SERVICE]).await)
}
