//! `antler-sandbox`: serves the sandbox service alone (for a multi-process or Kubernetes install).

use antler_kit::cli::ServeArgs;
use clap::Parser;

/// Serve the Antler sandbox service (per-thread workspaces, file tools, isolated command execution).
#[derive(Parser, Debug)]
#[command(
    name = "antler-sandbox",
    version,
    about = "Serve the Antler sandbox service (per-thread workspaces, file tools, isolated command execution)."
)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

fn main() -> std::process::ExitCode {
    // A document converter child (see antler_sandbox::convert::worker) never starts the server: it
    // converts its stdin and exits, before any runtime thread exists.
    antler_sandbox::convert::worker::run_if_requested();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    antler_kit::cli::exit_code(runtime.block_on(antler_kit::cli::run("antler-sandbox", &args.serve, &[antler_sandbox::SERVICE])))
}
