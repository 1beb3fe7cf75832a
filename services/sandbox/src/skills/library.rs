//! One server's skills as its users see them: the public directory, each user's custom skills and
//! enabled state, and the read-only view a user's sandboxes mount at `/mnt/skills`.
//!
//! ```text
//! {data_dir}/sandbox/users/{user_dir}/skills/      0711
//!   custom/<name>/SKILL.md ...                     installed archives (InstallSkill)
//!   extensions_config.json                         the user's own enabled choices (SetSkillEnabled)
//!   view/{public,custom}/<name>/...                read-only copies of the skills enabled for the user
//!   view.manifest.json                             fingerprints of what `view/` holds
//!   .lock                                          flock: one writer of this user's skills at a time
//! ```
//!
//! The enabled state of a skill for a user is the user's own choice if there is one, else the
//! operator's `sandbox.skills.extensions_config`, else enabled (DeerFlow's default).
//!
//! The view is a copy, as DeerFlow's `skills_view` is, rather than bind mounts of the sources: the file
//! tools, the `local` provider's host commands and bwrap all need one plain directory holding exactly
//! the enabled skills, and a copy cannot change the source if something writes to it. Copies are made
//! read-only (files 0444 or 0555, directories 0555) and refreshed incrementally: a skill is copied again
//! only when its source or its copy changed since the last refresh (compared by a fingerprint of every
//! entry's path, size, mode and modification time), so a tampered copy is repaired at the next acquire.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::Category;
use super::catalog::{self, EnabledState, SkillEntry};
use super::install::{self, InstallError};
use super::limits::InstallLimits;
use super::scan::{Decision, Finding, ScanConfig};
use crate::config::SkillsConfig;
use crate::error::{Result, SandboxError};
use crate::ids;

/// See the module documentation.
#[derive(Debug)]
pub struct Library {
    base: PathBuf,
    public_dir: Option<PathBuf>,
    operator_state: PathBuf,
    limits: InstallLimits,
    scan: ScanConfig,
    /// The LLM moderation pass, once the service has its clients (see [`Self::set_moderator`]).
    moderator: std::sync::OnceLock<super::moderation::Moderator>,
    max_custom_per_user: u64,
}

/// A skill as ListSkills and GetSkill show it.
pub type Skill = SkillEntry;

impl Library {
    /// `base` is `{data_dir}/sandbox`. A relative `extensions_config` is taken from `data_dir`; the public
    /// directory from the working directory (`skills/public` when unset and present).
    pub fn new(base: &Path, data_dir: &Path, config: &SkillsConfig) -> std::io::Result<Self> {
        let public_dir = match &config.public_dir {
            Some(dir) => Some(
                std::fs::canonicalize(dir)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("sandbox.skills.public_dir {}: {e}", dir.display())))?,
            ),
            None => std::fs::canonicalize(crate::config::DEFAULT_PUBLIC_SKILLS).ok().filter(|d| d.is_dir()),
        };
        let operator_state = if config.extensions_config.is_absolute() {
            config.extensions_config.clone()
        } else {
            data_dir.join(&config.extensions_config)
        };
        Ok(Self {
            base: base.to_path_buf(),
            public_dir,
            operator_state,
            limits: config.install,
            scan: config.scan.clone(),
            moderator: std::sync::OnceLock::new(),
            max_custom_per_user: config.max_custom_per_user,
        })
    }

    /// Turns the LLM moderation pass on (when its model is configured); the service calls this once it
    /// has its clients. Later calls change nothing.
    pub fn set_moderator(&self, moderator: super::moderation::Moderator) {
        if !moderator.config.model_name.is_empty() {
            let _ = self.moderator.set(moderator);
        }
    }

    /// Where the public skills come from (None: there are none).
    pub fn public_dir(&self) -> Option<&Path> {
        self.public_dir.as_deref()
    }

    fn root(&self, user_id: &str) -> PathBuf {
        self.base.join("users").join(ids::user_dir_name(user_id)).join("skills")
    }

    /// Where InstallSkill stages an upload (the user's skills directory, on the same disk).
    pub fn upload_dir(&self, user_id: &str) -> PathBuf {
        self.root(user_id)
    }

    fn custom_dir(&self, user_id: &str) -> PathBuf {
        self.root(user_id).join("custom")
    }

    /// The directory a user's sandboxes mount at `/mnt/skills` (it exists after [`Self::refresh_view`]).
    pub fn view_dir(&self, user_id: &str) -> PathBuf {
        self.root(user_id).join("view")
    }

    /// Takes the user's lock (creating the user's skills directory), for one mutation or refresh.
    fn lock(&self, user_id: &str) -> Result<UserLock> {
        let root = self.root(user_id);
        for dir in root.ancestors().take(3).collect::<Vec<_>>().into_iter().rev() {
            make_dir(dir, 0o711).map_err(|e| io_error("the skills directory", &e))?;
        }
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join(".lock"))
            .map_err(|e| io_error("the skills lock", &e))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| SandboxError::Internal(format!("cannot lock the user's skills ({e})")))?;
        Ok(UserLock { _file: file })
    }

    fn state(&self, user_id: &str) -> Result<EnabledState> {
        let operator = EnabledState::load(&self.operator_state).map_err(|e| {
            tracing::error!(error = %e, "sandbox.skills.extensions_config cannot be read");
            SandboxError::FailedPrecondition(
                "the operator's skills configuration (sandbox.skills.extensions_config) is not valid JSON\nhint: an operator can find the error in the server log".to_owned(),
            )
        })?;
        let own = EnabledState::load(&self.root(user_id).join("extensions_config.json"))
            .map_err(|e| SandboxError::Internal(format!("the user's skill state cannot be read: {}", e.message)))?;
        Ok(operator.overlaid_by(&own))
    }

    /// Every skill the user sees (public then custom, each sorted by name), with its enabled state.
    /// Invalid skills are listed with their error and never enabled.
    pub fn list(&self, user_id: &str) -> Result<Vec<Skill>> {
        let state = self.state(user_id)?;
        Ok(catalog::load(self.public_dir.as_deref(), Some(&self.custom_dir(user_id)), &state))
    }

    /// One skill by name (NOT_FOUND when the user has none of that name).
    pub fn get(&self, user_id: &str, name: &str) -> Result<Skill> {
        check_name(name)?;
        self.list(user_id)?.into_iter().find(|s| s.dir_name == name).ok_or_else(|| not_found(name))
    }

    /// Installs the archive in `archive` as one of the user's custom skills, then refreshes the view.
    /// Returns the skill, whether it replaced one, and the scan's findings (none CRITICAL).
    pub fn install(&self, user_id: &str, archive: File, replace: bool) -> Result<(Skill, bool, Vec<Finding>)> {
        let _lock = self.lock(user_id)?;
        let public: Vec<String> = self
            .public_dir
            .as_deref()
            .map(|d| catalog::scan(d, Category::Public, &EnabledState::default()))
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.dir_name)
            .collect();
        let custom_dir = self.custom_dir(user_id);
        let existing = catalog::scan(&custom_dir, Category::Custom, &EnabledState::default());
        let max = self.max_custom_per_user;
        let moderate = |root: &Path| self.moderator.get().map(|m| m.moderate_blocking(user_id, root)).unwrap_or_default();
        let moderate: Option<install::Moderate<'_>> = self.moderator.get().is_some().then_some(&moderate as install::Moderate<'_>);
        let installed =
            install::install_from(std::io::BufReader::new(archive), &custom_dir, &self.limits, &self.scan, moderate, replace, |meta| {
                if public.contains(&meta.name) {
                    return Err(InstallError::AlreadyExists(meta.name.clone()));
                }
                let replacing = existing.iter().any(|s| s.dir_name == meta.name);
                if !replacing && existing.len() as u64 >= max {
                    return Err(InstallError::Exhausted(format!(
                        "the user has {} custom skills; the limit is {max} (sandbox.skills.max_custom_per_user)\nhint: delete one first",
                        existing.len()
                    )));
                }
                Ok(())
            })
            .inspect(|installed| self.count_decision(Decision::of(&installed.findings)))
            .map_err(|e| match e {
                InstallError::Refused(message) => SandboxError::invalid("archive", message),
                InstallError::Blocked(findings) => {
                    self.count_decision(Decision::Block);
                    let rules: Vec<&str> = findings.iter().map(|f| f.rule.id).collect();
                    tracing::warn!(user_id, ?rules, "skill install blocked by the scan");
                    SandboxError::invalid("archive", InstallError::Blocked(findings))
                }
                InstallError::AlreadyExists(name) if public.contains(&name) => {
                    SandboxError::FailedPrecondition(format!("a public skill is named {name:?}; a custom skill cannot take its name"))
                }
                InstallError::AlreadyExists(name) => SandboxError::FailedPrecondition(format!(
                    "the custom skill {name:?} already exists\nhint: set replace to overwrite it (antler skills install --replace)"
                )),
                InstallError::Exhausted(message) => SandboxError::ResourceExhausted(message),
                InstallError::Io(message) => {
                    tracing::error!(error = %message, "skill install failed on the host");
                    SandboxError::Unavailable("the skill could not be written to the host's disk".to_owned())
                }
            })?;
        let meta = &installed.meta;
        let replaced = existing.iter().any(|s| s.dir_name == meta.name);
        tracing::info!(skill = %meta.name, replaced, findings = installed.findings.len(), "custom skill installed");
        self.refresh_locked(user_id)?;
        Ok((self.get(user_id, &meta.name)?, replaced, installed.findings))
    }

    /// Counts one scan decision (nothing when the scan and moderation are off: nothing was decided).
    fn count_decision(&self, decision: Decision) {
        if self.scan.enabled || self.moderator.get().is_some() {
            metrics::counter!("antler_sandbox_skill_scan_decisions_total", "decision" => decision.label()).increment(1);
        }
    }

    /// Enables or disables a skill for this user (public or custom), then refreshes the view.
    pub fn set_enabled(&self, user_id: &str, name: &str, enabled: bool) -> Result<Skill> {
        let skill = self.get(user_id, name)?;
        if let Err(why) = &skill.meta
            && enabled
        {
            return Err(SandboxError::FailedPrecondition(format!("skill {name:?} is invalid and cannot be enabled: {why}")));
        }
        let _lock = self.lock(user_id)?;
        EnabledState::store(&self.root(user_id).join("extensions_config.json"), name, enabled)
            .map_err(|e| SandboxError::Internal(format!("the user's skill state cannot be written: {}", e.message)))?;
        self.refresh_locked(user_id)?;
        self.get(user_id, name)
    }

    /// Deletes one of the user's custom skills (public skills can only be disabled).
    pub fn delete(&self, user_id: &str, name: &str) -> Result<()> {
        let skill = self.get(user_id, name)?;
        if skill.category == Category::Public {
            return Err(SandboxError::FailedPrecondition(format!(
                "{name:?} is a public skill: it ships with the server and cannot be deleted\nhint: disable it instead (antler skills disable {name})"
            )));
        }
        let _lock = self.lock(user_id)?;
        let dir = self.custom_dir(user_id).join(name);
        // Out of the way first, in one step, so no reader sees half a skill.
        let doomed = self.custom_dir(user_id).join(format!(".deleted-{:016x}", fastrand::u64(..)));
        std::fs::rename(&dir, &doomed).map_err(|e| io_error("the skill", &e))?;
        remove_tree(&doomed).map_err(|e| io_error("the skill", &e))?;
        tracing::info!(skill = %name, "custom skill deleted");
        self.refresh_locked(user_id)
    }

    /// Brings the user's view up to date (AcquireSandbox calls this, so every new sandbox sees the
    /// current skills and a tampered copy is repaired).
    pub fn refresh_view(&self, user_id: &str) -> Result<()> {
        let _lock = self.lock(user_id)?;
        self.refresh_locked(user_id)
    }

    fn refresh_locked(&self, user_id: &str) -> Result<()> {
        let enabled: Vec<Skill> = self.list(user_id)?.into_iter().filter(|s| s.enabled).collect();
        let root = self.root(user_id);
        refresh(&root, &enabled).map_err(|e| {
            tracing::error!(error = %e, "cannot refresh the skills view");
            io_error("the skills view", &e)
        })
    }
}

struct UserLock {
    _file: File,
}

fn check_name(name: &str) -> Result<()> {
    super::frontmatter::check_name(name).map_err(|e| SandboxError::invalid("name", e.0))
}

fn not_found(name: &str) -> SandboxError {
    SandboxError::SkillNotFound { name: crate::error::echo(name) }
}

fn io_error(what: &str, e: &std::io::Error) -> SandboxError {
    match e.raw_os_error() {
        Some(code) if code == rustix::io::Errno::NOSPC.raw_os_error() => SandboxError::Unavailable(format!("no space left for {what}")),
        _ => SandboxError::Unavailable(format!("{what} could not be updated on the host ({})", e.kind())),
    }
}

fn make_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Removes a tree whose directories may be read-only (a view copy): write permission is given back
/// first, since a non-root service could not empty them otherwise.
fn remove_tree(path: &Path) -> std::io::Result<()> {
    for entry in walkdir(path)? {
        if entry.1 {
            let _ = std::fs::set_permissions(&entry.0, std::fs::Permissions::from_mode(0o755));
        }
    }
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Every directory and file under `root` (itself included), without following symlinks: (path, is_dir).
fn walkdir(root: &Path) -> std::io::Result<Vec<(PathBuf, bool)>> {
    let mut out = Vec::new();
    let Ok(meta) = std::fs::symlink_metadata(root) else { return Ok(out) };
    out.push((root.to_path_buf(), meta.is_dir()));
    let mut index = 0;
    while index < out.len() {
        let (dir, is_dir) = out[index].clone();
        index += 1;
        if !is_dir {
            continue;
        }
        let mut children: Vec<_> = std::fs::read_dir(&dir)?.collect::<std::io::Result<_>>()?;
        children.sort_by_key(|e| e.file_name());
        for child in children {
            let kind = child.file_type()?;
            if kind.is_dir() || kind.is_file() {
                out.push((child.path(), kind.is_dir()));
            }
        }
    }
    Ok(out)
}

/// A fingerprint of a tree: every directory's and regular file's relative path, size, mode and
/// modification time (symlinks are skipped: they are never copied).
fn fingerprint(root: &Path) -> std::io::Result<String> {
    let mut hash = Sha256::new();
    for (path, is_dir) in walkdir(root)? {
        let meta = std::fs::symlink_metadata(&path)?;
        let rel = path.strip_prefix(root).unwrap_or(&path);
        let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
        hash.update(format!("{}\0{is_dir}\0{}\0{:o}\0{mtime}\n", rel.display(), meta.len(), meta.permissions().mode()).as_bytes());
    }
    Ok(hex::encode(hash.finalize()))
}

/// Copies the skill `source` into `dest` (which must not exist), read-only.
fn copy_read_only(source: &Path, dest: &Path) -> std::io::Result<()> {
    let entries = walkdir(source)?;
    for (path, is_dir) in &entries {
        let rel = path.strip_prefix(source).unwrap_or(path);
        let target = dest.join(rel);
        if *is_dir {
            std::fs::DirBuilder::new().mode(0o755).create(&target)?;
        } else {
            let mut from = File::open(path)?;
            let executable = from.metadata()?.permissions().mode() & 0o111 != 0;
            let mut to = File::options().write(true).create_new(true).open(&target)?;
            std::io::copy(&mut from, &mut to)?;
            to.set_permissions(std::fs::Permissions::from_mode(if executable { 0o555 } else { 0o444 }))?;
        }
    }
    // Directories last (deepest first), once nothing more is written into them. The top one stays
    // writable until it is renamed into place: moving a directory to another parent needs that.
    for (path, _) in entries.iter().rev().filter(|(p, d)| *d && p != source) {
        let rel = path.strip_prefix(source).unwrap_or(path);
        std::fs::set_permissions(dest.join(rel), std::fs::Permissions::from_mode(0o555))?;
    }
    Ok(())
}

#[derive(serde::Serialize, serde::Deserialize, Default, PartialEq, Eq, Clone)]
struct Prints {
    source: String,
    copy: String,
}

/// Makes `{root}/view` hold exactly `enabled`, copying only what changed.
fn refresh(root: &Path, enabled: &[Skill]) -> std::io::Result<()> {
    let view = root.join("view");
    make_dir(&view, 0o755)?;
    for category in [Category::Public, Category::Custom] {
        make_dir(&view.join(category.as_str()), 0o755)?;
    }
    let manifest_path = root.join("view.manifest.json");
    let mut manifest: BTreeMap<String, Prints> =
        std::fs::read(&manifest_path).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default();
    let wanted: BTreeMap<String, &Skill> = enabled.iter().map(|s| (format!("{}/{}", s.category.as_str(), s.dir_name), s)).collect();
    // Whatever is in the view and no longer wanted (disabled, deleted, or put there by someone else).
    for category in [Category::Public, Category::Custom] {
        for entry in std::fs::read_dir(view.join(category.as_str()))? {
            let entry = entry?;
            let key = format!("{}/{}", category.as_str(), entry.file_name().to_string_lossy());
            if !wanted.contains_key(&key) {
                remove_tree(&entry.path())?;
                manifest.remove(&key);
            }
        }
    }
    for (key, skill) in &wanted {
        let copy = view.join(key);
        let source = fingerprint(&skill.dir)?;
        let current = Prints { source: source.clone(), copy: if copy.exists() { fingerprint(&copy)? } else { String::new() } };
        if manifest.get(key) == Some(&current) && !current.copy.is_empty() {
            continue;
        }
        let staging = root.join(format!(".staging-{:016x}", fastrand::u64(..)));
        if let Err(e) = copy_read_only(&skill.dir, &staging) {
            let _ = remove_tree(&staging);
            return Err(e);
        }
        if copy.symlink_metadata().is_ok() {
            let old = root.join(format!(".old-{:016x}", fastrand::u64(..)));
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755))?;
            std::fs::rename(&copy, &old)?;
            std::fs::rename(&staging, &copy)?;
            remove_tree(&old)?;
        } else {
            std::fs::rename(&staging, &copy)?;
        }
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o555))?;
        manifest.insert(key.clone(), Prints { source, copy: fingerprint(&copy)? });
    }
    let tmp = root.join(format!(".manifest-{:016x}", fastrand::u64(..)));
    std::fs::write(&tmp, serde_json::to_vec(&manifest).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, &manifest_path)
}

/// Reads SKILL.md of a skill, at most `max_chars` characters (then `truncated`).
pub fn read_skill_md(skill: &Skill, max_chars: usize) -> Result<(String, bool)> {
    let mut bytes = Vec::new();
    // At most 4 bytes per character: enough for `max_chars`, without reading a huge file whole.
    File::open(skill.dir.join("SKILL.md"))
        .and_then(|f| f.take(max_chars as u64 * 4 + 4).read_to_end(&mut bytes))
        .map_err(|e| SandboxError::Unavailable(format!("SKILL.md of {:?} cannot be read ({})", skill.dir_name, e.kind())))?;
    let text = String::from_utf8_lossy(&bytes);
    if text.chars().count() > max_chars { Ok((text.chars().take(max_chars).collect(), true)) } else { Ok((text.into_owned(), false)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(root: &Path, name: &str, description: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(root.join(name).join("scripts"))?;
        std::fs::write(root.join(name).join("SKILL.md"), format!("---\nname: {name}\ndescription: {description}\n---\n# {name}\n"))?;
        std::fs::write(root.join(name).join("scripts/run.sh"), "echo hi\n")?;
        Ok(())
    }

    fn library(tmp: &Path) -> anyhow::Result<Library> {
        let public = tmp.join("public");
        skill(&public, "alpha", "first")?;
        skill(&public, "beta", "second")?;
        let base = tmp.join("data/sandbox");
        std::fs::create_dir_all(&base)?;
        let config = SkillsConfig { public_dir: Some(public), ..SkillsConfig::default() };
        Ok(Library::new(&base, &tmp.join("data"), &config)?)
    }

    fn view_names(library: &Library, user: &str) -> Vec<String> {
        let view = library.view_dir(user);
        let mut names = Vec::new();
        for category in ["public", "custom"] {
            for entry in std::fs::read_dir(view.join(category)).into_iter().flatten().flatten() {
                names.push(format!("{category}/{}", entry.file_name().to_string_lossy()));
            }
        }
        names.sort();
        names
    }

    #[test]
    fn the_view_holds_exactly_the_enabled_skills_read_only_and_repairs_itself() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let library = library(tmp.path())?;
        library.refresh_view("u")?;
        assert_eq!(view_names(&library, "u"), ["public/alpha", "public/beta"]);
        let copy = library.view_dir("u").join("public/alpha/SKILL.md");
        assert_eq!(std::fs::metadata(&copy)?.permissions().mode() & 0o777, 0o444);
        assert_eq!(std::fs::metadata(copy.parent().unwrap_or(&copy))?.permissions().mode() & 0o777, 0o555);

        library.set_enabled("u", "beta", false)?;
        assert_eq!(view_names(&library, "u"), ["public/alpha"]);
        assert!(library.list("u")?.iter().any(|s| s.dir_name == "beta" && !s.enabled));
        // Another user's choice is their own.
        library.refresh_view("v")?;
        assert_eq!(view_names(&library, "v"), ["public/alpha", "public/beta"]);

        // A tampered copy is put back at the next refresh.
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o644))?;
        std::fs::write(&copy, "tampered")?;
        library.refresh_view("u")?;
        assert!(std::fs::read_to_string(&copy)?.contains("name: alpha"));
        Ok(())
    }

    #[test]
    fn unknown_and_public_skills_cannot_be_deleted() -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let library = library(tmp.path())?;
        assert!(matches!(library.delete("u", "alpha"), Err(SandboxError::FailedPrecondition(_))));
        assert!(matches!(library.delete("u", "nope"), Err(SandboxError::SkillNotFound { .. })));
        assert!(matches!(library.get("u", "../x"), Err(SandboxError::InvalidArgument { .. })));
        Ok(())
    }
}
