//! How `session/request_permission` is answered: no person watches an ACP call, so a policy does.
//! Deny by default; `runs.lead.acp.permissions` lists what is granted: an ACP tool kind, a title
//! prefix (`title:git `) or `*`. A denial picks the agent's reject option, so the agent hears "no"
//! rather than a cancelled turn.

use agent_client_protocol::{PermissionOption, PermissionOptionKind, RequestPermissionOutcome, SelectedPermissionOutcome, ToolKind};

/// The tool kinds ACP defines (schema `ToolKind`, as written on the wire).
pub const KINDS: [&str; 10] = ["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Any,
    Kind(String),
    TitlePrefix(String),
}

/// The parsed allowlist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PermissionPolicy {
    entries: Vec<Entry>,
}

impl PermissionPolicy {
    /// Err names the entry that is neither `*`, a kind nor `title:<prefix>`.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let entries = entries
            .iter()
            .map(|raw| match raw.as_str() {
                "*" => Ok(Entry::Any),
                kind if KINDS.contains(&kind) => Ok(Entry::Kind(kind.to_owned())),
                other => match other.strip_prefix("title:") {
                    Some(prefix) if !prefix.is_empty() => Ok(Entry::TitlePrefix(prefix.to_owned())),
                    _ => Err(format!("`{raw}` is not `*`, `title:<prefix>` or an ACP tool kind ({})", KINDS.join(", "))),
                },
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { entries })
    }

    /// Whether a request for a tool call of `kind` titled `title` is granted (no kind: `other`).
    pub fn allows(&self, kind: Option<&ToolKind>, title: &str) -> bool {
        let kind = kind_name(kind);
        self.entries.iter().any(|entry| match entry {
            Entry::Any => true,
            Entry::Kind(k) => *k == kind,
            Entry::TitlePrefix(prefix) => title.starts_with(prefix.as_str()),
        })
    }
}

/// A kind as ACP writes it (`other` when the agent sent none).
pub fn kind_name(kind: Option<&ToolKind>) -> String {
    kind.and_then(|k| serde_json::to_value(k).ok()).and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "other".to_owned())
}

/// The answer: an allow option when `granted` (once before always), else a reject option (once before
/// always); `Cancelled` only when the agent offered no option of the needed sort, the one way left
/// to say no.
pub fn choose(options: &[PermissionOption], granted: bool) -> RequestPermissionOutcome {
    let preferred: [PermissionOptionKind; 2] = if granted {
        [PermissionOptionKind::AllowOnce, PermissionOptionKind::AllowAlways]
    } else {
        [PermissionOptionKind::RejectOnce, PermissionOptionKind::RejectAlways]
    };
    preferred
        .iter()
        .find_map(|kind| options.iter().find(|o| o.kind == *kind))
        .map(|o| RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(o.option_id.clone())))
        .unwrap_or(RequestPermissionOutcome::Cancelled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(entries: &[&str]) -> PermissionPolicy {
        PermissionPolicy::parse(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>()).unwrap_or_default()
    }

    fn options() -> Vec<PermissionOption> {
        vec![
            PermissionOption::new("always", "Always allow", PermissionOptionKind::AllowAlways),
            PermissionOption::new("once", "Allow", PermissionOptionKind::AllowOnce),
            PermissionOption::new("no", "Reject", PermissionOptionKind::RejectOnce),
        ]
    }

    fn picked(outcome: RequestPermissionOutcome) -> String {
        match outcome {
            RequestPermissionOutcome::Selected(s) => s.option_id.to_string(),
            _ => "cancelled".to_owned(),
        }
    }

    #[test]
    fn everything_is_denied_by_default() {
        let none = policy(&[]);
        assert!(!none.allows(Some(&ToolKind::Read), "Read a.txt"));
        assert!(!none.allows(None, ""));
    }

    #[test]
    fn kinds_title_prefixes_and_star_grant() {
        let p = policy(&["read", "title:git status"]);
        assert!(p.allows(Some(&ToolKind::Read), "anything"));
        assert!(!p.allows(Some(&ToolKind::Edit), "Edit a.txt"));
        assert!(p.allows(Some(&ToolKind::Execute), "git status --short"));
        assert!(!p.allows(Some(&ToolKind::Execute), "rm -rf /"));
        assert!(policy(&["other"]).allows(None, "x"), "no kind is `other`");
        assert!(policy(&["switch_mode"]).allows(Some(&ToolKind::SwitchMode), "x"));
        assert!(policy(&["*"]).allows(Some(&ToolKind::Delete), "x"));
        assert!(PermissionPolicy::parse(&["write".to_owned()]).is_err());
        assert!(PermissionPolicy::parse(&["title:".to_owned()]).is_err());
    }

    #[test]
    fn a_denial_picks_the_reject_option_and_a_grant_allows_once() {
        assert_eq!(picked(choose(&options(), false)), "no");
        assert_eq!(picked(choose(&options(), true)), "once");
        let only_allow = vec![PermissionOption::new("yes", "Allow", PermissionOptionKind::AllowAlways)];
        assert_eq!(picked(choose(&only_allow, false)), "cancelled", "no reject option: the turn's cancellation says no");
        assert_eq!(picked(choose(&only_allow, true)), "yes");
    }
}
