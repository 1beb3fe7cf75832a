//! DeerFlow's own `config.yaml`, read as it is.
//!
//! A file is DeerFlow's when it has `config_version` or a top-level section only DeerFlow has (see
//! [`is_deerflow`]). It is then translated into the sections of `antler.yaml`, which go through the
//! same strict structures as a native file: every DeerFlow section that maps onto an Antler feature is
//! applied (`title` → `runs.lead.title`, `database` → `runs.database` and `memory.database`, …), and
//! everything else is accepted and listed once, with the reason, as `accepted, not applied: …`. The
//! list is what [`Translation::lines`] holds; `antler up` logs it at start-up and `antler config check`
//! prints it.
//!
//! Only the values that are applied are read, so their `$VAR`s are resolved exactly as in `antler.yaml`
//! (a missing variable names the DeerFlow path); a section that is not applied may reference variables
//! this process does not have (a Slack token under `channels`).
//!
//! Errors keep DeerFlow's names: a value of the wrong type is reported at its DeerFlow path, and a value
//! that an Antler service refuses later (a range) is explained with [`Translation::origin_of`].

mod sections;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_yaml_ng::{Mapping, Value};

use super::ConfigError;
use super::env;

/// The top-level sections of DeerFlow's `config.yaml` (its `AppConfig`, schema `config_version` 34),
/// plus `channels`, which DeerFlow reads beside it.
pub const SECTIONS: &[&str] = &[
    "config_version",
    "log_level",
    "logging",
    "extensions",
    "token_usage",
    "token_budget",
    "max_recursion_limit",
    "models",
    "tool_groups",
    "tools",
    "tool_search",
    "tool_output",
    "suggestions",
    "input_polish",
    "loop_detection",
    "tool_progress",
    "read_before_write",
    "safety_finish_reason",
    "uploads",
    "sandbox",
    "subagents",
    "acp_agents",
    "skills",
    "skill_scan",
    "title",
    "summarization",
    "memory",
    "agents_api",
    "skill_evolution",
    "checkpointer",
    "database",
    "dedupe_storage",
    "run_events",
    "agent_storage",
    "scheduler",
    "mcp_tasks",
    "run_ownership",
    "stream_bridge",
    "channel_connections",
    "channels",
    "guardrails",
    "authorization",
    "circuit_breaker",
    "llm_call",
    "auth",
    "plugins",
];

/// Antler sections a DeerFlow file may carry as well (DeerFlow ignores them): they are applied as
/// written, over what the translation produced. `models`, `sandbox` and `memory` are DeerFlow's own
/// sections in such a file.
pub const NATIVE_OVERLAYS: &[&str] = &["server", "clients", "runs", "mcp", "edge"];

/// True when `root` is a DeerFlow `config.yaml`: it has `config_version`, a section only DeerFlow has,
/// or DeerFlow's shape of a shared section (`sandbox.use`, `memory.manager_class` /
/// `memory.backend_config`). A native file with a misspelt section stays native, so the misspelling is
/// still an error.
pub fn is_deerflow(root: &Mapping) -> bool {
    let shared = ["models", "sandbox", "memory"];
    root.iter().any(|(key, value)| {
        let name = env::key_name(key);
        if name == "config_version" || (SECTIONS.contains(&name.as_str()) && !shared.contains(&name.as_str())) {
            return true;
        }
        match name.as_str() {
            "sandbox" => value.get("use").is_some(),
            "memory" => value.get("manager_class").is_some() || value.get("backend_config").is_some(),
            _ => false,
        }
    })
}

/// Whether a section (or a key of one) took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Mapped onto Antler settings.
    Applied,
    /// Read and accepted, with no effect; the line says why.
    NotApplied,
}

/// One line of the mapping: `applied: title → runs.lead.title` or `accepted, not applied: channels
/// (Antler has no messaging channels)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The DeerFlow section (or `section.key`) the line is about.
    pub section: String,
    pub outcome: Outcome,
    /// What it became (applied: `(detail) → targets`) or why it was not applied.
    pub detail: String,
}

impl Line {
    /// `applied: SECTION (note) → TARGETS`.
    pub fn applied(section: impl Into<String>, note: Option<String>, targets: &[String]) -> Self {
        let mut detail = note.map(|n| format!("({n})")).unwrap_or_default();
        if !targets.is_empty() {
            if !detail.is_empty() {
                detail.push(' ');
            }
            detail.push_str("→ ");
            detail.push_str(&targets.join(", "));
        }
        Self { section: section.into(), outcome: Outcome::Applied, detail }
    }

    /// `accepted, not applied: SECTION (why)`.
    pub fn not_applied(section: impl Into<String>, why: impl Into<String>) -> Self {
        Self { section: section.into(), outcome: Outcome::NotApplied, detail: format!("({})", why.into()) }
    }
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = match self.outcome {
            Outcome::Applied => "applied",
            Outcome::NotApplied => "accepted, not applied",
        };
        if self.detail.is_empty() { write!(f, "{word}: {}", self.section) } else { write!(f, "{word}: {} {}", self.section, self.detail) }
    }
}

/// What the translation of a DeerFlow file did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translation {
    /// The file's `config_version`, when it has one.
    pub config_version: Option<i64>,
    /// One line per section (and per key of a section that was applied only in part), in file order.
    pub lines: Vec<Line>,
    /// Antler path → the DeerFlow path its value came from.
    provenance: Vec<(String, String)>,
}

impl Translation {
    /// The DeerFlow path an Antler setting came from: `runs.lead.title.max_words` → `title.max_words`.
    /// A path below a translated value keeps its tail (`models.models[2].use` → `models[2].use`).
    pub fn origin_of(&self, antler_path: &str) -> Option<String> {
        self.provenance
            .iter()
            .filter(|(antler, _)| {
                antler_path == antler
                    || antler_path.strip_prefix(antler.as_str()).is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
            })
            .max_by_key(|(antler, _)| antler.len())
            .map(|(antler, deerflow)| format!("{deerflow}{}", &antler_path[antler.len()..]))
    }

    /// The heading of the mapping: which file, which schema, how many sections of each outcome.
    pub fn summary(&self) -> String {
        // Sections only: a line about a key (`title.prompt`) or an entry (`tools[2] …`) is not one.
        let section = |l: &&Line| l.section.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        let applied = self.lines.iter().filter(section).filter(|l| l.outcome == Outcome::Applied).count();
        let skipped = self.lines.iter().filter(section).filter(|l| l.outcome == Outcome::NotApplied).count();
        let version = self.config_version.map(|v| format!(" (config_version {v})")).unwrap_or_default();
        format!("DeerFlow config.yaml{version}: {applied} sections applied, {skipped} accepted but not applied")
    }
}

/// What a [`ToolsMapper`] made of DeerFlow `tools:` entries.
#[derive(Debug, Clone, Default)]
pub struct ToolsMapping {
    /// The `runs.lead.web` section to apply (None: no web tool was mapped).
    pub web: Option<Value>,
    /// Per entry (by its index in `tools:`): Ok(the Antler setting it became) or Err(why it was not
    /// applied).
    pub entries: Vec<(usize, Result<String, String>)>,
}

/// Maps DeerFlow `tools:` entries that are not sandbox built-ins (web search, fetch, image search, …)
/// onto Antler's web tools. The entries come with their index and their `$VAR`s resolved. The lead
/// agent's crate owns those settings, and it sits above this one, so the `antler` binary registers it
/// with [`set_tools_mapper`]; without one, such entries are listed as not applied.
pub type ToolsMapper = fn(entries: &[(usize, Value)]) -> Result<ToolsMapping, ConfigError>;

static TOOLS_MAPPER: OnceLock<ToolsMapper> = OnceLock::new();

/// Registers the mapper of web-tool entries for this process (the first registration wins).
pub fn set_tools_mapper(mapper: ToolsMapper) {
    let _ = TOOLS_MAPPER.set(mapper);
}

fn tools_mapper() -> Option<ToolsMapper> {
    TOOLS_MAPPER.get().copied()
}

/// Translates DeerFlow file `root` into the sections of `antler.yaml`. `base_dir` (the file's
/// directory) anchors DeerFlow's relative paths; `lookup` resolves `$VAR`s of the values applied.
pub fn translate(
    root: Mapping,
    base_dir: Option<&Path>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(Mapping, Translation), ConfigError> {
    let mut ctx = Ctx { tree: Mapping::new(), translation: Translation::default(), lookup, base_dir: base_dir.map(Path::to_path_buf) };
    let mut overlays = Vec::new();
    for (key, value) in root {
        let name = env::key_name(&key);
        if NATIVE_OVERLAYS.contains(&name.as_str()) {
            overlays.push((name, value));
            continue;
        }
        sections::translate_section(&mut ctx, &name, value)?;
    }
    for (name, mut value) in overlays {
        env::substitute(&mut value, &name, lookup)?;
        let mut into = Value::Mapping(std::mem::take(&mut ctx.tree));
        merge(&mut into, &name, value);
        ctx.tree = match into {
            Value::Mapping(map) => map,
            _ => Mapping::new(),
        };
        ctx.translation.lines.push(Line::applied(name.clone(), Some("an Antler section, as written".to_owned()), &[name]));
    }
    Ok((ctx.tree, ctx.translation))
}

/// Deep-merges `value` into `root[key]`: mappings key by key, anything else replaces.
fn merge(root: &mut Value, key: &str, value: Value) {
    let Value::Mapping(map) = root else { return };
    match (map.get_mut(key), value) {
        (Some(existing @ Value::Mapping(_)), Value::Mapping(incoming)) => {
            for (k, v) in incoming {
                merge(existing, &env::key_name(&k), v);
            }
        }
        (_, value) => {
            map.insert(Value::from(key), value);
        }
    }
}

/// State of one translation.
struct Ctx<'a> {
    tree: Mapping,
    translation: Translation,
    lookup: &'a dyn Fn(&str) -> Option<String>,
    base_dir: Option<PathBuf>,
}

impl Ctx<'_> {
    /// Sets Antler setting `antler` (a dotted path) to `value`, which came from DeerFlow's `from`.
    fn set(&mut self, antler: &str, value: Value, from: &str) {
        let mut current = &mut self.tree;
        let mut parts = antler.split('.').peekable();
        while let Some(part) = parts.next() {
            if parts.peek().is_none() {
                current.insert(Value::from(part), value);
                break;
            }
            let entry = current.entry(Value::from(part)).or_insert_with(|| Value::Mapping(Mapping::new()));
            if !entry.is_mapping() {
                *entry = Value::Mapping(Mapping::new());
            }
            let Value::Mapping(next) = entry else { return };
            current = next;
        }
        if antler != from {
            self.translation.provenance.push((antler.to_owned(), from.to_owned()));
        }
    }

    /// The value at Antler path `antler`, if the translation set it.
    fn get(&self, antler: &str) -> Option<&Value> {
        let mut current = self.tree.get(antler.split('.').next()?)?;
        for part in antler.split('.').skip(1) {
            current = current.get(part)?;
        }
        Some(current)
    }

    fn line(&mut self, line: Line) {
        self.translation.lines.push(line);
    }

    /// A DeerFlow path made absolute against the file's directory (as DeerFlow takes it against its
    /// project root, where `config.yaml` lives).
    fn path(&self, raw: &str) -> PathBuf {
        let path = PathBuf::from(raw);
        match &self.base_dir {
            Some(dir) if path.is_relative() && !dir.as_os_str().is_empty() => dir.join(path),
            _ => path,
        }
    }
}

/// The keys of one DeerFlow mapping, taken one by one; whatever is left was not applied.
struct Reader<'a> {
    /// DeerFlow path of the mapping (`title`, `memory.backend_config`).
    path: String,
    map: Mapping,
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

fn describe(value: &Value) -> String {
    let text = serde_yaml_ng::to_string(value).map(|s| s.trim().to_owned()).unwrap_or_else(|_| "?".to_owned());
    if text.len() > 60 { format!("{}…", &text[..text.char_indices().nth(57).map_or(text.len(), |(i, _)| i)]) } else { text }
}

fn wrong_type(path: &str, wanted: &str, value: &Value) -> ConfigError {
    ConfigError::Invalid { path: path.to_owned(), message: format!("must be {wanted}, not `{}`", describe(value)) }
}

impl<'a> Reader<'a> {
    /// A reader of `value` at DeerFlow path `path`; null is an empty mapping (DeerFlow drops null
    /// sections and uses its defaults), anything else that is not a mapping is an error.
    fn new(path: &str, value: Value, lookup: &'a dyn Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let map = match value {
            Value::Null => Mapping::new(),
            Value::Mapping(map) => map,
            other => return Err(wrong_type(path, "a mapping", &other)),
        };
        Ok(Self { path: path.to_owned(), map, lookup })
    }

    fn key_path(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    /// Whether `key` is present (with any value, null included).
    fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Takes `key` out, with its variables resolved; null and absent are None.
    fn take(&mut self, key: &str) -> Result<Option<Value>, ConfigError> {
        match self.map.shift_remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(mut value) => {
                env::substitute(&mut value, &self.key_path(key), self.lookup)?;
                Ok(Some(value))
            }
        }
    }

    /// Takes `key` out without reading it (a setting that is not applied).
    fn drop_key(&mut self, key: &str) -> bool {
        self.map.shift_remove(key).is_some()
    }

    fn bool(&mut self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.take(key)? {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(Value::String(s)) if ["true", "false"].contains(&s.trim().to_ascii_lowercase().as_str()) => {
                Ok(Some(s.trim().eq_ignore_ascii_case("true")))
            }
            Some(other) => Err(wrong_type(&self.key_path(key), "true or false", &other)),
        }
    }

    /// A whole number ≥ 0; as pydantic does, `30.0` and `"30"` are accepted.
    fn u64(&mut self, key: &str) -> Result<Option<u64>, ConfigError> {
        let path = self.key_path(key);
        match self.take(key)? {
            None => Ok(None),
            Some(value) => {
                let number = match &value {
                    Value::Number(n) => n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64)),
                    Value::String(s) => s.trim().parse().ok(),
                    _ => None,
                };
                number.map(Some).ok_or_else(|| wrong_type(&path, "a whole number (0 or more)", &value))
            }
        }
    }

    fn f64(&mut self, key: &str) -> Result<Option<f64>, ConfigError> {
        let path = self.key_path(key);
        match self.take(key)? {
            None => Ok(None),
            Some(value) => {
                let number = match &value {
                    Value::Number(n) => n.as_f64(),
                    Value::String(s) => s.trim().parse().ok(),
                    _ => None,
                };
                number.filter(|f| f.is_finite()).map(Some).ok_or_else(|| wrong_type(&path, "a number", &value))
            }
        }
    }

    fn string(&mut self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.take(key)? {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(other) => Err(wrong_type(&self.key_path(key), "a string", &other)),
        }
    }

    /// The keys nobody took, in file order.
    fn rest(&self) -> Vec<String> {
        self.map.keys().map(env::key_name).collect()
    }
}

#[cfg(test)]
mod tests;
