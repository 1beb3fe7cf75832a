//! `antler mcp servers|tools`: McpService.ListServers / ListTools (the MCP pool).

use antler_proto::mcp::mcp_service_client::McpServiceClient;
use antler_proto::mcp::{ListServersRequest, ListToolsRequest};
use clap::Subcommand;

use super::{Conn, print_json, short};
use crate::output::Style;

/// The MCP servers of the pool and their tools.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the configured MCP servers with their status and tool count.
    Servers,
    /// List the tools the servers offer.
    Tools {
        /// Only this server's tools.
        #[arg(long, default_value = "")]
        server: String,
    },
}

/// Runs `antler mcp …`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let conn = args.conn;
    let mut client = McpServiceClient::new(conn.channel().await?);
    let style = Style::stdout(conn.color);
    match args.command {
        Command::Servers => {
            let reply = client.list_servers(conn.request(ListServersRequest {})?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.mcp.v1.ListServersResponse");
            }
            if reply.servers.is_empty() {
                outln!("no MCP servers configured")?;
            }
            for server in &reply.servers {
                let status = short(server.status().as_str_name(), "SERVER_STATUS_");
                let transport = short(server.transport().as_str_name(), "TRANSPORT_").to_ascii_lowercase();
                outln!("{}  {}  {transport}  {} tools", style.bold(&server.name), style.status(&status), server.tool_count)?;
                if !server.last_error.is_empty() {
                    outln!("    last error: {}", server.last_error)?;
                }
            }
            for error in &reply.errors {
                outln!("config error: {error:?}")?;
            }
        }
        Command::Tools { server } => {
            let reply = client.list_tools(conn.request(ListToolsRequest { server })?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.mcp.v1.ListToolsResponse");
            }
            if reply.tools.is_empty() {
                outln!("no tools")?;
            }
            for tool in &reply.tools {
                let description = tool.description.lines().next().unwrap_or_default();
                outln!("{}  {}  {description}", style.bold(&tool.name), style.dim(&format!("({})", tool.server)))?;
            }
            if !reply.unavailable_servers.is_empty() {
                outln!("unavailable servers: {}", reply.unavailable_servers.join(", "))?;
            }
        }
    }
    Ok(())
}
