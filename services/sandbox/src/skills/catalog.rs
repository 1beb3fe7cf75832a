//! Listing the skills of the public directory and one user's custom directory, with their enabled state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Category;
use super::frontmatter::{self, SkillMeta};

/// One skill directory found on disk.
#[derive(Debug, Clone)]
pub struct SkillEntry {
    /// The directory name (for a valid skill, equal to its `name`).
    pub dir_name: String,
    /// Public or custom.
    pub category: Category,
    /// The host directory holding `SKILL.md`.
    pub dir: PathBuf,
    /// The metadata, or why the skill is invalid (an invalid skill is never enabled).
    pub meta: Result<SkillMeta, String>,
    /// Enabled by `extensions_config.json` (default true); always false for an invalid skill.
    pub enabled: bool,
}

impl SkillEntry {
    /// Where its `SKILL.md` is inside a sandbox.
    pub fn container_path(&self) -> String {
        format!("/mnt/skills/{}/{}/SKILL.md", self.category.as_str(), self.dir_name)
    }
}

/// The enabled state: `extensions_config.json` `skills.<name>.enabled` (a missing name is enabled).
#[derive(Debug, Clone, Default)]
pub struct EnabledState {
    disabled: BTreeMap<String, bool>,
}

#[derive(serde::Deserialize, serde::Serialize, Default)]
struct ExtensionsFile {
    #[serde(default)]
    skills: BTreeMap<String, SkillState>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

#[derive(serde::Deserialize, serde::Serialize)]
struct SkillState {
    #[serde(default = "yes")]
    enabled: bool,
}

fn yes() -> bool {
    true
}

/// `extensions_config.json` could not be read or parsed.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct StateError {
    pub path: String,
    pub message: String,
}

impl EnabledState {
    /// Reads `path`; a missing file means every skill is enabled.
    pub fn load(path: &Path) -> Result<Self, StateError> {
        let err = |message: String| StateError { path: path.display().to_string(), message };
        let file = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice::<ExtensionsFile>(&bytes).map_err(|e| err(e.to_string()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ExtensionsFile::default(),
            Err(e) => return Err(err(e.to_string())),
        };
        Ok(Self { disabled: file.skills.into_iter().map(|(k, v)| (k, v.enabled)).collect() })
    }

    /// This state with `other`'s choices taking precedence (a user's own over the operator's).
    pub fn overlaid_by(&self, other: &EnabledState) -> EnabledState {
        let mut disabled = self.disabled.clone();
        disabled.extend(other.disabled.iter().map(|(k, v)| (k.clone(), *v)));
        EnabledState { disabled }
    }

    /// Whether `name` is enabled.
    pub fn is_enabled(&self, name: &str) -> bool {
        self.disabled.get(name).copied().unwrap_or(true)
    }

    /// Sets `skills.<name>.enabled` in `path`, keeping the file's other keys; written to a temporary file
    /// and renamed, so a reader never sees half a file.
    pub fn store(path: &Path, name: &str, enabled: bool) -> Result<(), StateError> {
        let err = |message: String| StateError { path: path.display().to_string(), message };
        let mut file = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice::<ExtensionsFile>(&bytes).map_err(|e| err(e.to_string()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ExtensionsFile::default(),
            Err(e) => return Err(err(e.to_string())),
        };
        file.skills.insert(name.to_owned(), SkillState { enabled });
        let text = serde_json::to_vec_pretty(&file).map_err(|e| err(e.to_string()))?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| err(e.to_string()))?;
        }
        let tmp = path.with_extension(format!("json.tmp-{:016x}", fastrand::u64(..)));
        std::fs::write(&tmp, text).map_err(|e| err(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e.to_string())
        })
    }
}

/// Lists the skills under `dir` (each subdirectory with a `SKILL.md`), sorted by name. A missing
/// directory has none. Invalid skills are logged and returned with their error.
pub fn scan(dir: &Path, category: Category, state: &EnabledState) -> Vec<SkillEntry> {
    let Ok(read) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in read.flatten() {
        let Ok(kind) = entry.file_type() else { continue };
        let dir_name = entry.file_name().to_string_lossy().into_owned();
        if !kind.is_dir() || dir_name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let meta = match std::fs::read_to_string(path.join("SKILL.md")) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => Err(format!("SKILL.md: cannot read: {e}")),
            Ok(text) => frontmatter::parse(&text).map_err(|e| e.to_string()).and_then(|meta| {
                if meta.name == dir_name {
                    Ok(meta)
                } else {
                    Err(format!("SKILL.md: name {:?} differs from its directory {dir_name:?}", meta.name))
                }
            }),
        };
        if let Err(e) = &meta {
            tracing::warn!(skill = %dir_name, category = category.as_str(), error = %e, "invalid skill not loaded");
        }
        let enabled = meta.is_ok() && state.is_enabled(&dir_name);
        out.push(SkillEntry { dir_name, category, dir: path, meta, enabled });
    }
    out.sort_by(|a, b| a.dir_name.cmp(&b.dir_name));
    out
}

/// The public skills then the user's custom ones.
pub fn load(public_dir: Option<&Path>, custom_dir: Option<&Path>, state: &EnabledState) -> Vec<SkillEntry> {
    let mut all = public_dir.map(|d| scan(d, Category::Public, state)).unwrap_or_default();
    all.extend(custom_dir.map(|d| scan(d, Category::Custom, state)).unwrap_or_default());
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(root: &Path, dir: &str, body: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(root.join(dir))?;
        std::fs::write(root.join(dir).join("SKILL.md"), body)?;
        Ok(())
    }

    #[test]
    fn lists_valid_and_invalid_skills_with_the_enabled_state() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let public = tmp.path().join("public");
        let custom = tmp.path().join("custom");
        skill(&public, "good", "---\nname: good\ndescription: fine\n---\n")?;
        skill(&public, "off", "---\nname: off\ndescription: fine\n---\n")?;
        skill(&public, "bad", "---\nname: bad\ndescription: <x>\n---\n")?;
        skill(&custom, "mine", "---\nname: other\ndescription: fine\n---\n")?;
        std::fs::create_dir_all(public.join("no-skill-md"))?;
        let state_path = tmp.path().join("extensions_config.json");
        EnabledState::store(&state_path, "off", false)?;
        let state = EnabledState::load(&state_path)?;
        let all = load(Some(&public), Some(&custom), &state);
        let names: Vec<_> = all.iter().map(|s| (s.dir_name.as_str(), s.enabled, s.meta.is_ok())).collect();
        assert_eq!(names, [("bad", false, false), ("good", true, true), ("off", false, true), ("mine", false, false)]);
        assert!(all[0].meta.as_ref().err().is_some_and(|e| e.contains("'<' or '>'")));
        assert!(all[3].meta.as_ref().err().is_some_and(|e| e.contains("differs from its directory")));
        assert_eq!(all[1].container_path(), "/mnt/skills/public/good/SKILL.md");
        EnabledState::store(&state_path, "off", true)?;
        assert!(EnabledState::load(&state_path)?.is_enabled("off"));
        Ok(())
    }
}
