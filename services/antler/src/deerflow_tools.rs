//! DeerFlow `tools:` entries that are not sandbox built-ins, mapped onto `runs.lead.web` with the lead
//! agent's own translation (`antler_agent::lead::tools::web::deerflow`). The kit's config loader,
//! which sits below the agent, calls it through [`antler_kit::config::deerflow::set_tools_mapper`].

use antler_agent::lead::tools::web::config::WebConfig;
use antler_agent::lead::tools::web::deerflow::{DeerflowToolError, ToolEntry, apply_tool_entry};
use antler_kit::config::ConfigError;
use antler_kit::config::deerflow::ToolsMapping;
use serde_yaml_ng::Value;

/// Registers [`map`] for this process.
pub fn register() {
    antler_kit::config::deerflow::set_tools_mapper(map);
}

/// Maps `entries` (index in `tools:`, entry with its variables resolved). A tool Antler does not have
/// is listed as not applied, with the agent's hint; an entry that is wrong for a tool Antler has (a bad
/// option, a second provider of one tool) is an error.
fn map(entries: &[(usize, Value)]) -> Result<ToolsMapping, ConfigError> {
    let mut web = WebConfig::default();
    let mut mapping = ToolsMapping::default();
    for (index, value) in entries {
        let path = format!("tools[{index}]");
        let entry: ToolEntry =
            serde_yaml_ng::from_value(value.clone()).map_err(|e| ConfigError::Invalid { path: path.clone(), message: e.to_string() })?;
        match apply_tool_entry(*index, &entry, &mut web) {
            Ok(mapped) => {
                let setting = match mapped.tool {
                    "web_search" => "runs.lead.web.search",
                    "web_fetch" => "runs.lead.web.fetch",
                    "image_search" => "runs.lead.web.image_search",
                    other => other,
                };
                let ignored =
                    if mapped.ignored.is_empty() { String::new() } else { format!(" (not applied: {})", mapped.ignored.join(", ")) };
                mapping.entries.push((*index, Ok(format!("{setting}{ignored}"))));
            }
            Err(DeerflowToolError::UnknownUse { use_path, hint, .. }) => {
                mapping.entries.push((*index, Err(format!("`use: {use_path}` is not a tool Antler has; {hint}"))));
            }
            Err(other) => return Err(ConfigError::Invalid { path, message: other.to_string() }),
        }
    }
    if web != WebConfig::default() {
        let value = serde_yaml_ng::to_value(&web).map_err(|e| ConfigError::Invalid { path: "tools".to_owned(), message: e.to_string() })?;
        mapping.web = Some(value);
    }
    Ok(mapping)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: usize, yaml: &str) -> (usize, Value) {
        (index, serde_yaml_ng::from_str(yaml).unwrap_or(Value::Null))
    }

    #[test]
    fn web_entries_become_runs_lead_web_and_unknown_tools_are_listed() -> Result<(), ConfigError> {
        let mapping = map(&[
            entry(0, "{name: web_search, group: web, use: 'deerflow.community.ddg_search.tools:web_search_tool', max_results: 5}"),
            entry(2, "{name: web_fetch, group: web, use: 'deerflow.community.jina_ai.tools:web_fetch_tool', timeout: 10}"),
        ])?;
        assert!(
            matches!(&mapping.entries[0], (0, Err(why)) if why.contains("ddg_search") && why.contains("searxng")),
            "{:?}",
            mapping.entries
        );
        assert_eq!(mapping.entries[1], (2, Ok("runs.lead.web.fetch".to_owned())));
        let web = mapping.web.unwrap_or(Value::Null);
        assert_eq!(web.get("fetch").and_then(|f| f.get("provider")).and_then(Value::as_str), Some("jina"));
        assert_eq!(web.get("fetch").and_then(|f| f.get("timeout_ms")).and_then(Value::as_u64), Some(10_000));
        let bad = map(&[entry(4, "{name: web_search, use: 'deerflow.community.tavily.tools:web_search_tool', max_results: many}")]);
        assert!(bad.err().is_some_and(|e| e.to_string().contains("tools[4]")));
        Ok(())
    }
}
