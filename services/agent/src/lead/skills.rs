//! Skills in the lead agent (DeerFlow's skill system, reference §7): the enabled skills of the run's
//! user are listed in the system prompt's `<available_skills>` section, and a skill becomes *active*
//! once the model has read its `SKILL.md` with `read_file` (a successful read of the exact container
//! path the prompt gives). Active skills that declare `allowed-tools` restrict the run's tools to the
//! union of their lists plus the framework's `read_file` and `tool_search` (see the SkillToolPolicy
//! layer). Merely being enabled restricts nothing.
//!
//! The list comes from the sandbox service's SkillService at the start of every attempt, so a resumed
//! run sees the user's skills as they are now.

use std::collections::BTreeSet;

use antler_proto::common::{Message, Role};
use antler_proto::sandbox::ListSkillsRequest;
use antler_proto::sandbox::skill_service_client::SkillServiceClient;

use crate::AgentContext;

/// Tools an active skill's policy never removes (DeerFlow's ALWAYS_AVAILABLE_BUILTIN_TOOL_NAMES minus
/// the tools Antler does not have): reading files (the skill's own resources) and finding tools.
pub const ALWAYS_AVAILABLE: [&str; 2] = ["read_file", "tool_search"];

/// The tool whose successful read of a SKILL.md activates the skill.
pub const ACTIVATING_TOOL: &str = "read_file";

/// One enabled skill, as the prompt lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillInfo {
    pub name: String,
    pub description: String,
    /// `public` or `custom`.
    pub category: &'static str,
    /// Where its SKILL.md is in the sandbox.
    pub container_path: String,
    /// `allowed-tools`: None = no policy.
    pub allowed_tools: Option<Vec<String>>,
}

/// The enabled skills of the run's user; empty (logged) when the sandbox service cannot say.
pub async fn discover(ctx: &AgentContext) -> Vec<SkillInfo> {
    let Some(client) = ctx.clients().get("sandbox") else { return Vec::new() };
    let request = client.request(&ctx.call_context(), ListSkillsRequest { enabled_only: true });
    match SkillServiceClient::new(client.channel()).list_skills(request).await {
        Ok(reply) => reply
            .into_inner()
            .skills
            .into_iter()
            .filter(|s| s.enabled && s.error.is_empty())
            .map(|s| SkillInfo {
                category: if s.category() == antler_proto::sandbox::SkillCategory::Custom { "custom" } else { "public" },
                name: s.name,
                description: s.description,
                container_path: s.container_path,
                allowed_tools: s.allowed_tools.map(|p| p.tools),
            })
            .collect(),
        Err(status) => {
            tracing::warn!(run_id = %ctx.spec.run_id, code = ?status.code(), "skills not listed: {}", status.message());
            Vec::new()
        }
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The `<skill_system>` section with `<available_skills>` (empty when there are no skills).
pub fn prompt_section(skills: &[SkillInfo]) -> String {
    if skills.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n\n<skill_system>\nSkills are ready-made workflows for specific kinds of task, with their best practices and the resources they need.\n\
         - When the task matches a skill's description, first call `read_file` on the SKILL.md at the skill's <location>, then follow it.\n\
         - A skill's other files are next to its SKILL.md; read them only when its instructions refer to them.\n\
         - Skills are read-only: copy a file to /mnt/user-data/workspace before changing it.\n\
         - Once you have read a skill, you may only use the tools it allows (when it names any).\n\n<available_skills>\n",
    );
    for skill in skills {
        let label = if skill.category == "custom" { "[custom]" } else { "[built-in]" };
        out.push_str(&format!(
            "    <skill>\n        <name>{}</name>\n        <description>{} {label}</description>\n        <location>{}</location>\n    </skill>\n",
            escape(&skill.name),
            escape(&skill.description),
            escape(&skill.container_path)
        ));
    }
    out.push_str("</available_skills>\n</skill_system>");
    out
}

/// Normalises a path the model passed (`.`/`..`/doubled slashes) the way the sandbox does, so
/// `/mnt/skills/public/x/../x/SKILL.md` activates `x` too. Relative paths never name a skill.
fn normalise(path: &str) -> Option<String> {
    let path = path.replace('\\', "/");
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// The SKILL.md paths of `skills` that `messages` show were read successfully with `read_file`: an
/// assistant tool call to `read_file` whose `path` is the skill's container path, answered by a tool
/// message that is not an error. In order of first activation.
pub fn activated(messages: &[Message], skills: &[SkillInfo]) -> Vec<String> {
    let mut reads: Vec<(String, String)> = Vec::new();
    for message in messages.iter().filter(|m| m.role == Role::Assistant as i32) {
        for call in message.tool_calls.iter().filter(|c| c.name == ACTIVATING_TOOL) {
            let args = match &call.arguments {
                Some(arguments) => antler_kit::json::struct_to_json(arguments),
                None => serde_json::from_str(&call.raw_arguments).unwrap_or_default(),
            };
            let Some(path) = args.get("path").and_then(|p| p.as_str()).and_then(normalise) else { continue };
            if skills.iter().any(|s| s.container_path == path) {
                reads.push((call.id.clone(), path));
            }
        }
    }
    let mut out = Vec::new();
    for message in messages.iter().filter(|m| m.role == Role::Tool as i32 && !m.is_error) {
        if let Some((_, path)) = reads.iter().find(|(id, _)| *id == message.tool_call_id)
            && !out.contains(path)
        {
            out.push(path.clone());
        }
    }
    out
}

/// The tools allowed while the skills at `active` (SKILL.md paths) are active: None when none of them
/// declares `allowed-tools` (no restriction); otherwise the union of the declared lists plus
/// [`ALWAYS_AVAILABLE`]. An active path that is no longer an enabled skill contributes nothing, and if
/// no active path resolves at all, only [`ALWAYS_AVAILABLE`] remains: a policy that cannot be checked
/// fails closed, as DeerFlow's does.
pub fn allowed_tools(active: &[String], skills: &[SkillInfo]) -> Option<BTreeSet<String>> {
    if active.is_empty() {
        return None;
    }
    let resolved: Vec<&SkillInfo> = active.iter().filter_map(|path| skills.iter().find(|s| &s.container_path == path)).collect();
    let mut allowed: BTreeSet<String> = ALWAYS_AVAILABLE.iter().map(|s| (*s).to_owned()).collect();
    if resolved.is_empty() {
        return Some(allowed);
    }
    let declared: Vec<&Vec<String>> = resolved.iter().filter_map(|s| s.allowed_tools.as_ref()).collect();
    if declared.is_empty() {
        return None;
    }
    allowed.extend(declared.into_iter().flatten().cloned());
    Some(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lead::state::{text_message, tool_message};
    use antler_proto::common::ToolCall;

    fn skill(name: &str, tools: Option<&[&str]>) -> SkillInfo {
        SkillInfo {
            name: name.to_owned(),
            description: format!("{name} <things> & more"),
            category: "public",
            container_path: format!("/mnt/skills/public/{name}/SKILL.md"),
            allowed_tools: tools.map(|t| t.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    fn read(id: &str, path: &str) -> Message {
        let mut m = text_message(Role::Assistant, "");
        m.tool_calls = vec![ToolCall {
            id: id.to_owned(),
            name: "read_file".to_owned(),
            raw_arguments: serde_json::json!({"path": path}).to_string(),
            ..ToolCall::default()
        }];
        m
    }

    fn result(id: &str, error: bool) -> Message {
        tool_message(&ToolCall { id: id.to_owned(), name: "read_file".to_owned(), ..ToolCall::default() }, "text", error)
    }

    #[test]
    fn the_section_lists_each_skill_escaped_with_its_location() {
        let section = prompt_section(&[skill("data-analysis", None)]);
        assert!(section.contains("<available_skills>"), "{section}");
        assert!(section.contains("<name>data-analysis</name>"));
        assert!(section.contains("<description>data-analysis &lt;things&gt; &amp; more [built-in]</description>"));
        assert!(section.contains("<location>/mnt/skills/public/data-analysis/SKILL.md</location>"));
        assert_eq!(prompt_section(&[]), "");
    }

    #[test]
    fn only_a_successful_read_of_the_exact_skill_md_activates() {
        let skills = [skill("a", Some(&["bash"])), skill("b", None)];
        let messages = vec![
            read("1", "/mnt/skills/public/a/../a/SKILL.md"),
            result("1", false),
            read("2", "/mnt/skills/public/b/SKILL.md"),
            result("2", true),
            read("3", "/mnt/skills/public/b/other.md"),
            result("3", false),
        ];
        assert_eq!(activated(&messages, &skills), vec!["/mnt/skills/public/a/SKILL.md".to_owned()]);
    }

    #[test]
    fn the_policy_is_the_union_of_declared_lists_and_fails_closed() {
        let skills = [skill("a", Some(&["bash"])), skill("b", None), skill("c", Some(&[]))];
        let path = |n: &str| format!("/mnt/skills/public/{n}/SKILL.md");
        assert_eq!(allowed_tools(&[], &skills), None);
        assert_eq!(allowed_tools(&[path("b")], &skills), None, "no declaration: no restriction");
        let set = |names: &[&str]| Some(names.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>());
        assert_eq!(allowed_tools(&[path("a"), path("b")], &skills), set(&["bash", "read_file", "tool_search"]));
        assert_eq!(allowed_tools(&[path("c")], &skills), set(&["read_file", "tool_search"]));
        assert_eq!(allowed_tools(&[path("gone")], &skills), set(&["read_file", "tool_search"]), "unresolvable: fail closed");
    }
}
