//! `antler models list`: ModelService.ListModels.

use antler_proto::models::ListModelsRequest;
use antler_proto::models::model_service_client::ModelServiceClient;
use clap::Subcommand;

use super::{Conn, print_json, short};
use crate::output::Style;

/// The configured models.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the configured models (the default one is marked).
    List,
}

/// Runs `antler models …`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let conn = args.conn;
    let mut client = ModelServiceClient::new(conn.channel().await?);
    let style = Style::stdout(conn.color);
    match args.command {
        Command::List => {
            let reply = client.list_models(conn.request(ListModelsRequest {})?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.models.v1.ListModelsResponse");
            }
            for model in &reply.models {
                let marker = if model.name == reply.default_model_name { "*" } else { " " };
                let caps = model.capabilities.unwrap_or_default();
                let flags: Vec<&str> = [
                    (caps.supports_tools, "tools"),
                    (caps.supports_thinking, "thinking"),
                    (caps.supports_vision, "vision"),
                    (caps.supports_reasoning_effort, "reasoning effort"),
                ]
                .into_iter()
                .filter_map(|(on, name)| on.then_some(name))
                .collect();
                outln!(
                    "{marker} {}  {}  {}  {}",
                    style.bold(&model.name),
                    short(model.provider().as_str_name(), "PROVIDER_KIND_").to_ascii_lowercase(),
                    model.upstream_model,
                    style.dim(&flags.join(", "))
                )?;
            }
            if reply.models.is_empty() {
                outln!("no models configured")?;
            } else {
                outln!("{}", style.dim("* the default model"))?;
            }
        }
    }
    Ok(())
}
