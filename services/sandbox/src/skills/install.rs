//! Safe install of a `.skill` archive (a zip) into a user's custom skills directory.
//!
//! Every entry is checked before anything is written: at most `max_entries` entries and
//! `max_total_bytes` declared uncompressed bytes; no absolute path (POSIX or Windows), no `..`
//! component, no `:` (NTFS alternate streams, drive letters), no symlink, no `SKILL.md` below the skill
//! root. `__MACOSX/` and dot files are ignored. A single top directory becomes the skill root. The
//! files are then extracted into a staging directory next to the destination, counting the real
//! decompressed bytes against `max_file_bytes` and `max_total_bytes` (a zip bomb that lies about its
//! sizes is caught there), refusing native executables by their first bytes (ELF, PE, Mach-O 32/64/fat,
//! both byte orders). The staged skill is validated (`SKILL.md` frontmatter), scanned (see [`super::scan`]:
//! a CRITICAL finding refuses it) and renamed into place in one step. On any refusal the staging
//! directory is removed: nothing is left behind.

use super::limits::{InstallLimits, native_format};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::frontmatter::{self, SkillMeta};
use super::scan::{Decision, Finding, ScanConfig, Scanner};

/// Why an archive was refused. Each message names the entry and, for a limit, its value.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The archive breaks a rule; the client can fix it (INVALID_ARGUMENT).
    #[error("{0}")]
    Refused(String),
    /// A skill of that name exists and replace was not asked (ALREADY_EXISTS).
    #[error("skill {0:?} already exists\nhint: ask for replace to overwrite it")]
    AlreadyExists(String),
    /// The scan found something CRITICAL (INVALID_ARGUMENT); every finding is kept, the critical ones
    /// first.
    #[error("{}", blocked_message(.0))]
    Blocked(Vec<Finding>),
    /// A count limit was hit (RESOURCE_EXHAUSTED); the message names it.
    #[error("{0}")]
    Exhausted(String),
    /// The host failed while writing (INTERNAL / UNAVAILABLE).
    #[error("cannot install the skill: {0}")]
    Io(String),
}

/// Most findings a refusal message lists (the rest are counted).
const MAX_LISTED: usize = 10;

fn blocked_message(findings: &[Finding]) -> String {
    let mut sorted: Vec<&Finding> = findings.iter().collect();
    sorted.sort_by_key(|f| std::cmp::Reverse(f.rule.severity));
    let listed: Vec<String> = sorted.iter().take(MAX_LISTED).map(|f| f.to_string()).collect();
    let more = sorted.len().saturating_sub(MAX_LISTED);
    let tail = if more > 0 { format!("; and {more} more") } else { String::new() };
    format!(
        "refused by the skill scan (sandbox.skills.scan): {}{tail}\nhint: remove what the CRITICAL findings name and install again",
        listed.join("; ")
    )
}

/// A skill that was installed, with what the scan found (no CRITICAL finding: those refuse).
#[derive(Debug)]
pub struct Installed {
    pub meta: SkillMeta,
    pub findings: Vec<Finding>,
}

fn refused(message: impl Into<String>) -> InstallError {
    InstallError::Refused(message.into())
}

/// An entry's path, checked and split into components ("" components dropped).
fn components(raw: &str) -> Result<Vec<String>, InstallError> {
    let shown = crate::error::echo(raw);
    if raw.starts_with('/') || raw.starts_with('\\') {
        return Err(refused(format!("entry {shown:?}: absolute paths are not allowed")));
    }
    if raw.contains(':') {
        return Err(refused(format!("entry {shown:?}: ':' is not allowed in a path (drive letters, NTFS streams)")));
    }
    if raw.contains('\0') {
        return Err(refused(format!("entry {shown:?}: NUL in a path")));
    }
    let parts: Vec<String> = raw.split(['/', '\\']).filter(|p| !p.is_empty() && *p != ".").map(str::to_owned).collect();
    if parts.iter().any(|p| p == "..") {
        return Err(refused(format!("entry {shown:?}: '..' is not allowed in a path")));
    }
    Ok(parts)
}

struct Planned {
    index: usize,
    rel: Vec<String>,
    is_dir: bool,
    shown: String,
}

/// Installs the archive `bytes` into `custom_dir/<name>` under the default scan and returns the skill's
/// metadata.
pub fn install_archive(bytes: &[u8], custom_dir: &Path, limits: &InstallLimits, replace: bool) -> Result<SkillMeta, InstallError> {
    install_from(std::io::Cursor::new(bytes), custom_dir, limits, &ScanConfig::default(), None, replace, |_| Ok(())).map(|i| i.meta)
}

/// What the LLM moderation pass adds to the findings of a staged skill (given its root).
pub type Moderate<'a> = &'a dyn Fn(&Path) -> Vec<Finding>;

/// [`install_archive`] from any seekable reader (InstallSkill spools the upload to a file), under the
/// scan `scan` and, when the static scan passed, `moderate`. `check` sees the validated metadata before the skill is moved into place and may refuse
/// it (a name taken by a public skill, too many custom skills); the staging directory is then removed
/// like on any refusal.
pub fn install_from<R: Read + std::io::Seek>(
    reader: R,
    custom_dir: &Path,
    limits: &InstallLimits,
    scan: &ScanConfig,
    moderate: Option<Moderate<'_>>,
    replace: bool,
    check: impl FnOnce(&SkillMeta) -> Result<(), InstallError>,
) -> Result<Installed, InstallError> {
    let mut archive = zip::ZipArchive::new(reader).map_err(|e| refused(format!("not a valid .skill (zip) archive: {e}")))?;
    if archive.len() as u64 > limits.max_entries {
        return Err(refused(format!(
            "the archive has {} entries; the limit is {} (sandbox.skills.install.max_entries)",
            archive.len(),
            limits.max_entries
        )));
    }
    // Pass 1: names, kinds and declared sizes, before anything touches the disk.
    let mut planned = Vec::new();
    let mut declared: u64 = 0;
    for index in 0..archive.len() {
        let entry = archive.by_index_raw(index).map_err(|e| refused(format!("entry #{index}: unreadable: {e}")))?;
        let raw = String::from_utf8_lossy(entry.name_raw()).into_owned();
        let shown = crate::error::echo(&raw);
        let rel = components(&raw)?;
        if entry.unix_mode().is_some_and(|m| m & 0o170000 == 0o120000) {
            return Err(refused(format!("entry {shown:?}: symlinks are not allowed")));
        }
        if rel.is_empty() || rel.iter().any(|p| p.starts_with('.') || p == "__MACOSX") {
            continue;
        }
        if entry.size() > limits.max_file_bytes {
            return Err(refused(format!(
                "entry {shown:?}: {} bytes uncompressed; the per-file limit is {} (sandbox.skills.install.max_file_bytes)",
                entry.size(),
                limits.max_file_bytes
            )));
        }
        declared = declared.saturating_add(entry.size());
        if declared > limits.max_total_bytes {
            return Err(refused(format!(
                "the archive holds more than {} bytes uncompressed (sandbox.skills.install.max_total_bytes), at entry {shown:?}",
                limits.max_total_bytes
            )));
        }
        planned.push(Planned { index, rel, is_dir: entry.is_dir(), shown });
    }
    // A single top directory (holding SKILL.md) becomes the skill root.
    let top_skill_md = planned.iter().any(|p| !p.is_dir && p.rel.len() == 1 && p.rel[0] == "SKILL.md");
    if !top_skill_md {
        let first = planned.first().map(|p| p.rel[0].clone());
        let single = first.filter(|f| planned.iter().all(|p| &p.rel[0] == f));
        if single.is_some() {
            for p in &mut planned {
                p.rel.remove(0);
            }
            planned.retain(|p| !p.rel.is_empty());
        }
    }
    let mut root_md = 0;
    for p in &planned {
        if p.rel.last().is_some_and(|l| l == "SKILL.md") && !p.is_dir {
            if p.rel.len() > 1 {
                return Err(refused(format!("entry {:?}: a nested SKILL.md is not allowed", p.shown)));
            }
            root_md += 1;
        }
    }
    if root_md == 0 {
        return Err(refused("the archive has no SKILL.md at its root (or in its single top directory)"));
    }
    if root_md > 1 {
        return Err(refused("the archive has more than one SKILL.md at its root"));
    }
    std::fs::create_dir_all(custom_dir).map_err(|e| InstallError::Io(e.to_string()))?;
    let staging = custom_dir.join(format!(".staging-{:016x}", fastrand::u64(..)));
    std::fs::create_dir(&staging).map_err(|e| InstallError::Io(e.to_string()))?;
    let scanner = Scanner::new(scan.clone(), *limits);
    let result = extract(&mut archive, &planned, &staging, limits)
        .and_then(|()| validate(&staging))
        .and_then(|meta| {
            // Before `check` and the move: a refused skill never touches the user's skills.
            let mut findings = scanner.scan_dir(&staging).map_err(|e| InstallError::Io(format!("cannot scan the staged skill: {e}")))?;
            if Decision::of(&findings) == Decision::Block {
                return Err(InstallError::Blocked(findings));
            }
            // The model only sees skills the fixed rules let through: no tokens spent on the obvious.
            if let Some(moderate) = moderate {
                findings.extend(moderate(&staging));
                if Decision::of(&findings) == Decision::Block {
                    return Err(InstallError::Blocked(findings));
                }
            }
            Ok(Installed { meta, findings })
        })
        .and_then(|installed| check(&installed.meta).map(|()| installed))
        .and_then(|installed| place(&staging, custom_dir, &installed.meta, replace).map(|()| installed));
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result
}

fn extract<R: Read + std::io::Seek>(
    archive: &mut zip::ZipArchive<R>,
    planned: &[Planned],
    staging: &Path,
    limits: &InstallLimits,
) -> Result<(), InstallError> {
    let io = |e: std::io::Error| InstallError::Io(e.to_string());
    let mut total: u64 = 0;
    for p in planned {
        let target: PathBuf = p.rel.iter().fold(staging.to_path_buf(), |acc, c| acc.join(c));
        if p.is_dir {
            std::fs::create_dir_all(&target).map_err(io)?;
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let mut entry = archive.by_index(p.index).map_err(|e| refused(format!("entry {:?}: cannot be read: {e}", p.shown)))?;
        let mut out = std::fs::OpenOptions::new().write(true).create_new(true).open(&target).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                refused(format!("entry {:?}: the path appears twice in the archive", p.shown))
            } else {
                io(e)
            }
        })?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut written: u64 = 0;
        loop {
            let n = entry.read(&mut buf).map_err(|e| refused(format!("entry {:?}: corrupt data: {e}", p.shown)))?;
            if n == 0 {
                break;
            }
            if written == 0
                && let Some(format) = native_format(&buf[..n])
            {
                return Err(refused(format!("entry {:?}: native executables ({format}) are not allowed", p.shown)));
            }
            written += n as u64;
            total += n as u64;
            if written > limits.max_file_bytes {
                return Err(refused(format!(
                    "entry {:?}: more than {} bytes uncompressed (sandbox.skills.install.max_file_bytes)",
                    p.shown, limits.max_file_bytes
                )));
            }
            if total > limits.max_total_bytes {
                return Err(refused(format!(
                    "the archive holds more than {} bytes uncompressed (sandbox.skills.install.max_total_bytes), at entry {:?}",
                    limits.max_total_bytes, p.shown
                )));
            }
            out.write_all(&buf[..n]).map_err(io)?;
        }
    }
    Ok(())
}

fn validate(staging: &Path) -> Result<SkillMeta, InstallError> {
    let text = std::fs::read(staging.join("SKILL.md")).map_err(|e| InstallError::Io(e.to_string()))?;
    let text = String::from_utf8(text).map_err(|_| refused("SKILL.md is not UTF-8"))?;
    frontmatter::parse(&text).map_err(|e| refused(e.to_string()))
}

fn place(staging: &Path, custom_dir: &Path, meta: &SkillMeta, replace: bool) -> Result<(), InstallError> {
    let io = |e: std::io::Error| InstallError::Io(e.to_string());
    let dest = custom_dir.join(&meta.name);
    if dest.symlink_metadata().is_ok() {
        if !replace {
            return Err(InstallError::AlreadyExists(meta.name.clone()));
        }
        let old = custom_dir.join(format!(".old-{:016x}", fastrand::u64(..)));
        std::fs::rename(&dest, &old).map_err(io)?;
        if let Err(e) = std::fs::rename(staging, &dest) {
            let _ = std::fs::rename(&old, &dest);
            return Err(io(e));
        }
        let _ = std::fs::remove_dir_all(&old);
        return Ok(());
    }
    std::fs::rename(staging, &dest).map_err(io)
}
