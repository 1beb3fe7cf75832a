//! Skills: `SKILL.md` directories, their frontmatter rules, the enabled state, and archive install.
//!
//! * Public skills ship in the repo under `skills/public/<name>/SKILL.md`; custom skills live per user
//!   under `{data_dir}/sandbox/users/<user>/skills/custom/<name>/SKILL.md` (see [`library`]).
//! * [`frontmatter::parse`] applies DeerFlow's rules to the YAML between the leading `---` lines.
//! * [`catalog::load`] lists both directories; a skill whose `SKILL.md` is invalid is listed with its
//!   error (and logged), never treated as loadable.
//! * The enabled state comes from `extensions_config.json` (`{"skills": {"<name>": {"enabled": false}}}`),
//!   default enabled, as in DeerFlow.
//! * [`install::install_archive`] extracts a `.skill` zip safely into a user's custom directory, after
//!   [`scan`] found nothing CRITICAL in the staged files.
//! * [`library::Library`] is what the SkillService and AcquireSandbox use: per-user listing, enabled
//!   state, install / delete, and the read-only view mounted at `/mnt/skills`.

pub mod api;
pub mod catalog;
pub mod frontmatter;
pub mod install;
pub mod library;
pub mod limits;
pub mod moderation;
pub mod scan;

/// Where a skill comes from; also its directory under `/mnt/skills`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Shipped with Antler (`skills/public`).
    Public,
    /// Installed by a user (`users/<user>/skills/custom`).
    Custom,
}

impl Category {
    /// The directory name under `/mnt/skills`.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Public => "public",
            Category::Custom => "custom",
        }
    }
}
