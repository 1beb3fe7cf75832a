//! `skill_manage`: creates, updates and deletes the run user's custom skills (DeerFlow's skill
//! evolution, `runs.lead.skill_evolution.enabled`, off by default).
//!
//! The tool writes nothing itself: it packs the skill into a `.skill` archive in memory and hands it to
//! the sandbox service's SkillService (InstallSkill; DeleteSkill), under the run user's identity. So a
//! skill the agent writes is held to exactly what a user's upload is: the archive limits, the frontmatter
//! rules and the static skill scan (a CRITICAL finding refuses it, WARNING findings come back in the
//! result), staged and moved into place in one step, per user. The tool is side-effecting, so the
//! journal makes a resumed run reuse its recorded result instead of writing twice.
//!
//! A skill written here is listed in the `<available_skills>` of the user's next runs (the list is read
//! at the start of every attempt) and readable at `/mnt/skills/custom/<name>/`.

use std::io::Write;

use antler_proto::sandbox::skill_service_client::SkillServiceClient;
use antler_proto::sandbox::{
    DeleteSkillRequest, GetSkillRequest, InstallSkillHeader, InstallSkillRequest, SkillCategory, SkillFinding, SkillFindingSeverity,
    install_skill_request,
};
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput, description_param, sandbox_failure};
use crate::lead::run_env::RunEnv;

#[derive(Debug)]
pub struct SkillManage;

/// Bytes per InstallSkill chunk.
const CHUNK: usize = 256 * 1024;

/// What a call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Create,
    Update,
    Delete,
}

impl Tool for SkillManage {
    fn name(&self) -> &'static str {
        "skill_manage"
    }

    fn description(&self) -> &'static str {
        "Create, update or delete one of the user's custom skills (a SKILL.md with optional resource files), so later \
         conversations can reuse a workflow that worked. `create` adds a new skill; `update` replaces an existing custom \
         skill as a whole (SKILL.md and exactly the files given; other files of the old version are dropped); `delete` \
         removes one. SKILL.md must start with a frontmatter block:\n---\nname: <the skill's name>\ndescription: <what it \
         does and when to use it>\n---\nEvery skill is scanned before it is saved: secrets, downloads piped into a shell, \
         nested archives and instructions to ignore guardrails are refused. The skill is listed in the next conversations, \
         not this one."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "description": description_param(),
                "action": {"type": "string", "enum": ["create", "update", "delete"], "description": "What to do."},
                "name": {"type": "string", "description": "The skill's name: hyphen-case (a-z, 0-9, '-'), at most 64 characters; must equal the frontmatter's name."},
                "content": {"type": "string", "description": "The full text of SKILL.md (create and update)."},
                "files": {
                    "type": "object",
                    "description": "Other files of the skill (create and update): relative path → text content, e.g. {\"scripts/report.py\": \"...\"}.",
                    "additionalProperties": {"type": "string"}
                }
            },
            "required": ["description", "action", "name"]
        })
    }

    fn side_effect(&self) -> bool {
        true
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let action = match args.required("action")?.as_str() {
                "create" => Action::Create,
                "update" => Action::Update,
                "delete" => Action::Delete,
                other => return Ok(ToolOutput::error(format!("action must be create, update or delete, not {other:?}"))),
            };
            let name = args.required("name")?;
            let client = env.ctx.clients().get("sandbox").ok_or(ToolError::NoSandboxClient)?;
            let mut grpc = SkillServiceClient::new(client.channel());
            let call = env.ctx.call_context();
            if action == Action::Delete {
                return match grpc.delete_skill(client.request(&call, DeleteSkillRequest { name: name.clone() })).await {
                    Ok(_) => Ok(ToolOutput::ok(format!("Skill `{name}` deleted."))),
                    Err(status) => sandbox_failure(status),
                };
            }
            let Some(content) = args.string("content") else {
                return Ok(ToolOutput::error(format!("`content` (the text of SKILL.md) is required to {}", action_word(action))));
            };
            if let Some(problem) = name_mismatch(&name, &content) {
                return Ok(ToolOutput::error(problem));
            }
            let files = match files(args) {
                Ok(files) => files,
                Err(problem) => return Ok(ToolOutput::error(problem)),
            };
            if action == Action::Update {
                // InstallSkill with replace creates a missing skill too; update promises an existing one.
                match grpc.get_skill(client.request(&call, GetSkillRequest { name: name.clone() })).await {
                    Ok(reply) if reply.get_ref().skill.as_ref().is_some_and(|s| s.category() == SkillCategory::Public) => {
                        return Ok(ToolOutput::error(format!(
                            "`{name}` is a built-in skill and cannot be changed; create a custom one under another name"
                        )));
                    }
                    Ok(_) => {}
                    Err(status) if status.code() == tonic::Code::NotFound => {
                        return Ok(ToolOutput::error(format!("there is no custom skill named `{name}`; use action `create`")));
                    }
                    Err(status) => return sandbox_failure(status),
                }
            }
            let archive = pack(&content, &files).map_err(|e| ToolError::InvalidArguments(format!("the skill cannot be packed: {e}")))?;
            let header = InstallSkillRequest {
                part: Some(install_skill_request::Part::Header(InstallSkillHeader {
                    replace: action == Action::Update,
                    file_name: format!("{name}.skill"),
                })),
            };
            let chunks: Vec<InstallSkillRequest> =
                archive.chunks(CHUNK).map(|c| InstallSkillRequest { part: Some(install_skill_request::Part::Chunk(c.to_vec())) }).collect();
            let stream = tokio_stream::iter(std::iter::once(header).chain(chunks));
            match grpc.install_skill(client.request(&call, stream)).await {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    let skill = reply.skill.unwrap_or_default();
                    let verb = if action == Action::Update { "updated" } else { "created" };
                    let state = if skill.enabled { "enabled" } else { "disabled by the user's settings" };
                    let mut text = format!(
                        "Skill `{}` {verb} ({state}); it is listed in the next conversations and its SKILL.md is at {}.",
                        skill.name, skill.container_path
                    );
                    text.push_str(&findings_text(&reply.findings));
                    Ok(ToolOutput::ok(text))
                }
                // A scan refusal is INVALID_ARGUMENT whose message lists the findings: the model reads them.
                Err(status) => sandbox_failure(status),
            }
        })
    }
}

fn action_word(action: Action) -> &'static str {
    match action {
        Action::Create => "create a skill",
        Action::Update => "update a skill",
        Action::Delete => "delete a skill",
    }
}

/// The frontmatter's `name` when it differs from `name` (the sandbox installs under the frontmatter's
/// name, so a mismatch would create a skill the model did not ask for).
fn name_mismatch(name: &str, content: &str) -> Option<String> {
    let mut lines = content.lines();
    if lines.next().map(str::trim_end) != Some("---") {
        return Some("SKILL.md must start with a `---` frontmatter block holding `name:` and `description:`".to_owned());
    }
    let declared = lines
        .take_while(|l| l.trim_end() != "---")
        .find_map(|l| l.strip_prefix("name:"))
        .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned());
    match declared {
        Some(declared) if declared == name => None,
        Some(declared) => Some(format!("the frontmatter's name is `{declared}` but `name` is `{name}`; they must be equal")),
        None => Some("the frontmatter has no `name:`".to_owned()),
    }
}

/// The `files` argument: relative path → text, SKILL.md excluded (it is `content`).
fn files(args: &Args) -> Result<Vec<(String, String)>, String> {
    let Some(value) = args.0.get("files") else { return Ok(Vec::new()) };
    let map = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Object(map) => map.clone(),
        // Some models send an object as its JSON text.
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            _ => return Err("`files` must be an object: relative path → text content".to_owned()),
        },
        _ => return Err("`files` must be an object: relative path → text content".to_owned()),
    };
    let mut out = Vec::new();
    for (path, content) in map {
        let Value::String(content) = content else { return Err(format!("files[{path:?}] must be a string (the file's text)")) };
        if path.trim_start_matches("./") == "SKILL.md" {
            return Err("SKILL.md goes in `content`, not in `files`".to_owned());
        }
        out.push((path, content));
    }
    Ok(out)
}

/// A `.skill` archive: SKILL.md and the files at its root (the sandbox checks every path).
fn pack(content: &str, files: &[(String, String)]) -> zip::result::ZipResult<Vec<u8>> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("SKILL.md", options)?;
    zip.write_all(content.as_bytes())?;
    for (path, text) in files {
        zip.start_file(path.as_str(), options)?;
        zip.write_all(text.as_bytes())?;
    }
    Ok(zip.finish()?.into_inner())
}

/// The scan's findings on an installed skill, for the model.
fn findings_text(findings: &[SkillFinding]) -> String {
    if findings.is_empty() {
        return " The skill scan found nothing.".to_owned();
    }
    let mut text = format!("\nThe skill scan reported {} finding(s) (saved anyway; fix them if they are mistakes):", findings.len());
    for f in findings {
        let severity = match f.severity() {
            SkillFindingSeverity::Critical => "CRITICAL",
            SkillFindingSeverity::Warning => "WARNING",
            _ => "INFO",
        };
        let at = if f.line > 0 { format!("{}:{}", f.file, f.line) } else { f.file.clone() };
        text.push_str(&format!("\n- {severity} {} at {at}: {} ({:?})", f.rule_id, f.reason, f.evidence));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_journalled_like_every_side_effect() {
        // ExecuteTool journals exactly the tools that say so: a resumed run must not write a skill twice.
        assert!(SkillManage.side_effect());
    }

    #[test]
    fn the_frontmatter_name_must_match() {
        let md = "---\nname: csv-report\ndescription: d\n---\n# x\n";
        assert_eq!(name_mismatch("csv-report", md), None);
        assert_eq!(name_mismatch("csv-report", "---\nname: \"csv-report\"\n---\n"), None);
        assert!(name_mismatch("other", md).is_some_and(|m| m.contains("`csv-report`")));
        assert!(name_mismatch("csv-report", "# no frontmatter").is_some());
        assert!(name_mismatch("csv-report", "---\ndescription: d\n---\nname: csv-report\n").is_some(), "name after the block");
    }

    #[test]
    fn files_are_read_leniently_and_skill_md_is_content() {
        let args = |v: Value| Args(v.as_object().cloned().unwrap_or_default());
        assert_eq!(files(&args(json!({}))), Ok(Vec::new()));
        assert_eq!(files(&args(json!({"files": {"a.sh": "echo"}}))), Ok(vec![("a.sh".to_owned(), "echo".to_owned())]));
        assert_eq!(files(&args(json!({"files": "{\"a.sh\": \"echo\"}"}))), Ok(vec![("a.sh".to_owned(), "echo".to_owned())]));
        assert!(files(&args(json!({"files": {"SKILL.md": "x"}}))).is_err());
        assert!(files(&args(json!({"files": {"a": 1}}))).is_err());
        assert!(files(&args(json!({"files": [1]}))).is_err());
    }

    #[test]
    fn the_archive_holds_skill_md_and_the_files() -> anyhow::Result<()> {
        let bytes = pack("---\nname: x\n---\n", &[("scripts/a.sh".to_owned(), "#!/bin/sh\necho\n".to_owned())])?;
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes))?;
        assert_eq!(zip.len(), 2);
        assert!(zip.by_name("scripts/a.sh").is_ok());
        let mut md = String::new();
        std::io::Read::read_to_string(&mut zip.by_name("SKILL.md")?, &mut md)?;
        assert_eq!(md, "---\nname: x\n---\n");
        Ok(())
    }

    #[test]
    fn findings_are_listed_for_the_model() {
        let finding = SkillFinding {
            rule_id: "injection.hidden_comment".to_owned(),
            severity: SkillFindingSeverity::Warning as i32,
            file: "SKILL.md".to_owned(),
            line: 6,
            evidence: "note".to_owned(),
            reason: "why".to_owned(),
        };
        assert_eq!(findings_text(&[]), " The skill scan found nothing.");
        assert!(findings_text(&[finding]).ends_with("\n- WARNING injection.hidden_comment at SKILL.md:6: why (\"note\")"));
    }
}
