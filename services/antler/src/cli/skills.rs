//! `antler skills list|show|install|enable|disable|delete`: SkillService.

use std::io::Read;

use antler_proto::sandbox::skill_service_client::SkillServiceClient;
use antler_proto::sandbox::{
    DeleteSkillRequest, GetSkillRequest, InstallSkillHeader, InstallSkillRequest, ListSkillsRequest, SetSkillEnabledRequest, Skill,
    install_skill_request,
};
use clap::Subcommand;

use super::{Conn, print_json, short};
use crate::output::Style;

/// Bytes per InstallSkill message: well under the server's message limit.
const CHUNK: usize = 1024 * 1024;

/// The caller's skills (public ones shipped with the server, custom ones installed by you).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List your skills and whether each is enabled.
    List {
        /// Only the enabled ones (what the agent's prompt lists).
        #[arg(long)]
        enabled: bool,
    },
    /// Show one skill and its SKILL.md.
    Show { name: String },
    /// Install a `.skill` archive (a zip with SKILL.md at its root) as one of your custom skills.
    Install {
        /// The archive.
        file: std::path::PathBuf,
        /// Replace your custom skill of the same name.
        #[arg(long)]
        replace: bool,
    },
    /// Enable a skill for you.
    Enable { name: String },
    /// Disable a skill for you (it leaves the prompt and /mnt/skills).
    Disable { name: String },
    /// Delete one of your custom skills.
    Delete { name: String },
}

fn line(style: Style, skill: &Skill) -> String {
    let state = if !skill.error.is_empty() {
        style.status("INVALID")
    } else if skill.enabled {
        style.status("ENABLED")
    } else {
        style.dim("disabled")
    };
    let category = short(skill.category().as_str_name(), "SKILL_CATEGORY_").to_ascii_lowercase();
    let about = if skill.error.is_empty() { skill.description.clone() } else { skill.error.clone() };
    let about: String = about.lines().next().unwrap_or_default().chars().take(100).collect();
    format!("{:<8} {:<6} {}  {}", state, category, style.bold(&skill.name), style.dim(&about))
}

/// Runs `antler skills …`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let conn = args.conn;
    let mut client = SkillServiceClient::new(conn.channel().await?);
    let style = Style::stdout(conn.color);
    match args.command {
        Command::List { enabled } => {
            let reply = client.list_skills(conn.request(ListSkillsRequest { enabled_only: enabled })?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.sandbox.v1.ListSkillsResponse");
            }
            for skill in &reply.skills {
                outln!("{}", line(style, skill))?;
            }
            if reply.skills.is_empty() {
                outln!("no skills{}", if enabled { " enabled" } else { "" })?;
            }
        }
        Command::Show { name } => {
            let reply = client.get_skill(conn.request(GetSkillRequest { name })?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.sandbox.v1.GetSkillResponse");
            }
            let skill = reply.skill.unwrap_or_default();
            outln!("{}", line(style, &skill))?;
            outln!("{}", style.dim(&format!("path in a sandbox: {}", skill.container_path)))?;
            if let Some(policy) = &skill.allowed_tools {
                outln!(
                    "{}",
                    style.dim(&format!(
                        "allowed tools: {}",
                        if policy.tools.is_empty() { "none".to_owned() } else { policy.tools.join(", ") }
                    ))
                )?;
            }
            outln!()?;
            out!("{}", reply.skill_md)?;
            if reply.skill_md_truncated {
                outln!("\n{}", style.dim("... [SKILL.md cut at the server's read limit]"))?;
            }
        }
        Command::Install { file, replace } => {
            let mut bytes = Vec::new();
            std::fs::File::open(&file)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
            let header = InstallSkillRequest {
                part: Some(install_skill_request::Part::Header(InstallSkillHeader {
                    replace,
                    file_name: file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                })),
            };
            let chunks: Vec<InstallSkillRequest> =
                bytes.chunks(CHUNK).map(|c| InstallSkillRequest { part: Some(install_skill_request::Part::Chunk(c.to_vec())) }).collect();
            let stream = tokio_stream::iter(std::iter::once(header).chain(chunks));
            let reply = client.install_skill(conn.request(stream)?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.sandbox.v1.InstallSkillResponse");
            }
            let skill = reply.skill.unwrap_or_default();
            outln!("{} {}", if reply.replaced { "replaced" } else { "installed" }, style.bold(&skill.name))?;
            outln!("{}", line(style, &skill))?;
            // The skill scan's WARNING and INFO findings (CRITICAL ones refuse the install).
            for f in &reply.findings {
                let at = if f.line > 0 { format!("{}:{}", f.file, f.line) } else { f.file.clone() };
                let severity = f.severity().as_str_name().trim_start_matches("SKILL_FINDING_SEVERITY_").to_owned();
                outln!("  {} {} at {at}: {} ({:?})", style.bold(&severity), f.rule_id, f.reason, f.evidence)?;
            }
        }
        Command::Enable { name } => set(&mut client, &conn, style, name, true).await?,
        Command::Disable { name } => set(&mut client, &conn, style, name, false).await?,
        Command::Delete { name } => {
            let reply = client.delete_skill(conn.request(DeleteSkillRequest { name: name.clone() })?).await?.into_inner();
            if conn.json {
                return print_json(&reply, "antler.sandbox.v1.DeleteSkillResponse");
            }
            outln!("deleted {}", style.bold(&name))?;
        }
    }
    Ok(())
}

async fn set(
    client: &mut SkillServiceClient<tonic::transport::Channel>,
    conn: &Conn,
    style: Style,
    name: String,
    enabled: bool,
) -> anyhow::Result<()> {
    let reply = client.set_skill_enabled(conn.request(SetSkillEnabledRequest { name, enabled })?).await?.into_inner();
    if conn.json {
        return print_json(&reply, "antler.sandbox.v1.SetSkillEnabledResponse");
    }
    outln!("{}", line(style, &reply.skill.unwrap_or_default()))?;
    Ok(())
}
