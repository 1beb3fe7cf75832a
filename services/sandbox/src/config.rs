//! The `sandbox` section of `antler.yaml`.
//!
//! Every limit the service enforces is a setting here, checked at load time with its range in the error
//! (`sandbox.files.read_max_chars = 0 is out of range: must be between 100 and 10000000`). Defaults follow
//! DeerFlow where it has one (`reference/deerflow-subsystems.md` §1.5 and §9).

use std::path::PathBuf;
use std::time::Duration;

use antler_kit::Config;
use antler_kit::config::{ConfigError, check_range};
use serde::{Deserialize, Serialize};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Settings of the sandbox service.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// Which provider runs commands: `auto` (bwrap when it is installed and works here, else local),
    /// `bwrap`, or `local`.
    pub provider: ProviderChoice,
    /// Let the `local` provider run commands as plain host processes. Off by default: `local` is not a
    /// security boundary. Ignored by `bwrap`.
    pub allow_host_bash: bool,
    /// Skills: where they come from, their enabled state, archive install limits.
    pub skills: SkillsConfig,
    /// Sandboxes kept live in memory (least recently used beyond it are dropped; their files stay and
    /// they read as RELEASED until acquired again).
    pub max_live_sandboxes: u64,
    /// An ACTIVE sandbox with no call and no running command for this long becomes RELEASED, in seconds
    /// (0 = never).
    pub idle_release_secs: u64,
    /// How often the idle reaper runs, in seconds.
    pub reap_interval_secs: u64,
    /// How long the highest attempt of a run (the fencing token of `x-antler-run-attempt`) is
    /// remembered after the run's last call, in seconds.
    pub fence_retention_secs: u64,
    /// The most runs whose fencing token is remembered; past it the least recently used tenth is
    /// forgotten at once (one map entry each, holding the run's two ids).
    pub fence_max_runs: u64,
    /// Command execution.
    pub commands: CommandsConfig,
    /// File tools.
    pub files: FilesConfig,
    /// UploadFiles.
    pub uploads: UploadsConfig,
    /// The bubblewrap provider.
    pub bwrap: BwrapConfig,
    /// The seccomp filter of bwrap sandboxes (commands and the document converter): `strict` refuses
    /// the system calls listed in `src/seccomp/policy.rs` (EPERM), `off` installs no filter. Ignored by
    /// `local`.
    pub seccomp: SeccompMode,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            provider: ProviderChoice::Auto,
            allow_host_bash: false,
            skills: SkillsConfig::default(),
            max_live_sandboxes: 256,
            idle_release_secs: 1800,
            reap_interval_secs: 60,
            fence_retention_secs: 86_400,
            fence_max_runs: 100_000,
            commands: CommandsConfig::default(),
            files: FilesConfig::default(),
            uploads: UploadsConfig::default(),
            bwrap: BwrapConfig::default(),
            seccomp: SeccompMode::Strict,
        }
    }
}

/// `sandbox.seccomp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SeccompMode {
    Strict,
    Off,
}

impl SeccompMode {
    pub fn label(self) -> &'static str {
        match self {
            SeccompMode::Strict => "strict",
            SeccompMode::Off => "off",
        }
    }
}

/// `sandbox.provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderChoice {
    Auto,
    Bwrap,
    Local,
}

/// `sandbox.skills`.
///
/// Public skills are read from `public_dir`; each user's custom skills live under the data directory
/// (`{data_dir}/sandbox/users/{user}/skills/custom`). A user's sandboxes see the skills enabled for that
/// user, read-only, at `/mnt/skills/{public,custom}/<name>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SkillsConfig {
    /// Directory of the public skills (`<name>/SKILL.md`), shared by every user. Relative paths are taken
    /// from the working directory. The default `skills/public` is the repository's directory; when it
    /// does not exist there are no public skills. A directory set explicitly must exist.
    pub public_dir: Option<PathBuf>,
    /// DeerFlow's `extensions_config.json` (`{"skills": {"<name>": {"enabled": false}}}`): the operator's
    /// default enabled state of each skill. Relative paths are taken from the data directory. A user's
    /// own choice (SetSkillEnabled) overrides it for that user. A missing file enables every skill.
    pub extensions_config: PathBuf,
    /// Most custom skills one user may install.
    pub max_custom_per_user: u64,
    /// Largest `.skill` archive InstallSkill accepts, in bytes (checked while it streams in).
    pub max_archive_bytes: u64,
    /// Limits on the archive's content.
    pub install: crate::skills::limits::InstallLimits,
    /// The static scan every skill passes before it is installed (DeerFlow's `skill_scan`).
    pub scan: crate::skills::scan::ScanConfig,
    /// The LLM moderation pass after the scan (DeerFlow's `moderation_model_name`,
    /// `security_fail_closed`); off while `model_name` is empty.
    pub moderation: crate::skills::moderation::ModerationConfig,
}

impl Default for SkillsConfig {
    fn default() -> Self {
        Self {
            public_dir: None,
            extensions_config: PathBuf::from("extensions_config.json"),
            max_custom_per_user: 100,
            max_archive_bytes: 512 * MIB,
            install: crate::skills::limits::InstallLimits::default(),
            scan: crate::skills::scan::ScanConfig::default(),
            moderation: crate::skills::moderation::ModerationConfig::default(),
        }
    }
}

/// The public skills directory used when `sandbox.skills.public_dir` is unset (if it exists).
pub const DEFAULT_PUBLIC_SKILLS: &str = "skills/public";

/// `sandbox.commands`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommandsConfig {
    /// Timeout of a command whose request gives none, in seconds.
    pub default_timeout_secs: u64,
    /// Largest timeout a request may ask for, in seconds.
    pub max_timeout_secs: u64,
    /// Commands running at once in one sandbox; more get RESOURCE_EXHAUSTED.
    pub max_concurrent: u64,
    /// Bytes kept per stream (stdout, stderr) of one command; the rest is counted and discarded.
    pub max_output_bytes_per_stream: u64,
    /// Characters of output (both streams together) returned by one command before the middle is cut
    /// out with a marker (0 = no cut).
    pub output_max_chars: u64,
    /// Longest command line, in bytes.
    pub max_command_bytes: u64,
    /// Most variables one request may inject.
    pub max_env_vars: u64,
    /// Longest injected variable value, in bytes.
    pub max_env_value_bytes: u64,
    /// Host environment variables passed to commands (everything else is cleared).
    pub env_allowlist: Vec<String>,
    /// After the foreground command exits, how long to keep reading output that background processes
    /// may still hold open, in milliseconds. Then the call returns.
    pub drain_grace_ms: u64,
}

impl Default for CommandsConfig {
    fn default() -> Self {
        Self {
            default_timeout_secs: 600,
            max_timeout_secs: 3600,
            max_concurrent: 8,
            max_output_bytes_per_stream: 10 * MIB,
            output_max_chars: 20_000,
            max_command_bytes: 64 * KIB,
            max_env_vars: 64,
            max_env_value_bytes: 32 * KIB,
            env_allowlist: ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM"].map(str::to_owned).to_vec(),
            drain_grace_ms: 200,
        }
    }
}

/// `sandbox.files`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilesConfig {
    /// Characters one ReadFile returns before head truncation.
    pub read_max_chars: u64,
    /// Largest non-append WriteFile payload in bytes (0 = no cap).
    pub write_max_bytes: u64,
    /// Largest file EditFile will rewrite, in bytes.
    pub edit_max_bytes: u64,
    /// Characters of paths one ListDir returns before it stops and flags truncation.
    pub list_max_chars: u64,
    /// ListDir entries when the request gives no max_entries.
    pub list_default_entries: u64,
    /// Largest ListDir max_entries (larger requests are clamped).
    pub list_max_entries: u64,
    /// Glob results when the request gives no max_results.
    pub glob_default_results: u64,
    /// Largest Glob max_results (larger requests are clamped).
    pub glob_max_results: u64,
    /// Grep matches when the request gives no max_results.
    pub grep_default_results: u64,
    /// Largest Grep max_results (larger requests are clamped).
    pub grep_max_results: u64,
    /// Files above this size are skipped by Grep, in bytes.
    pub grep_max_file_bytes: u64,
    /// Lines longer than this are skipped by Grep, in characters.
    pub grep_max_line_chars: u64,
    /// A matched line is cut to this many characters (then ends in "...").
    pub grep_line_display_chars: u64,
    /// Largest file DownloadFile sends, in bytes.
    pub download_max_bytes: u64,
    /// Most files SnapshotOutputs reports.
    pub snapshot_max_files: u64,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            read_max_chars: 50_000,
            write_max_bytes: 80 * KIB,
            edit_max_bytes: 10 * MIB,
            list_max_chars: 20_000,
            list_default_entries: 1_000,
            list_max_entries: 10_000,
            glob_default_results: 200,
            glob_max_results: 1_000,
            grep_default_results: 100,
            grep_max_results: 500,
            grep_max_file_bytes: 1_000_000,
            grep_max_line_chars: 2_000,
            grep_line_display_chars: 200,
            download_max_bytes: 100 * MIB,
            snapshot_max_files: 10_000,
        }
    }
}

/// `sandbox.uploads`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UploadsConfig {
    /// Most files in one UploadFiles call.
    pub max_files: u64,
    /// Largest single file, in bytes.
    pub max_file_bytes: u64,
    /// Largest total of one call, in bytes.
    pub max_total_bytes: u64,
    /// Honour UploadFiles' `convert_documents`: write a Markdown companion of each PDF, DOCX, PPTX,
    /// XLSX and HTML upload. On by default (DeerFlow's `uploads.auto_convert_documents` is off because
    /// it parses on the gateway host; here every conversion runs in an isolated, killable child).
    /// Off: the request field is ignored and ConvertDocument answers FAILED_PRECONDITION.
    pub auto_convert_documents: bool,
    /// How documents are converted.
    pub convert: ConvertConfig,
}

impl Default for UploadsConfig {
    fn default() -> Self {
        Self {
            max_files: 10,
            max_file_bytes: 50 * MIB,
            max_total_bytes: 100 * MIB,
            auto_convert_documents: true,
            convert: ConvertConfig::default(),
        }
    }
}

/// `sandbox.uploads.convert`: the isolation and the limits of one conversion (see `src/convert`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConvertConfig {
    /// Where the converter runs: `auto` (under bwrap when commands do and bwrap can start the converter
    /// here, else `process`), `bwrap` (always; an unusable bwrap makes every conversion fail with the
    /// reason), or `process` (a plain child process with the same rlimits and timeout, no namespaces).
    pub isolation: ConvertIsolation,
    /// The executable started as the converter (with a marker argument). Empty: this service's own
    /// executable, which is what `antler` and `antler-sandbox` are built for.
    pub program: PathBuf,
    /// Wall-clock limit of one conversion, in seconds; then the converter is killed.
    pub timeout_secs: u64,
    /// Conversions running at once in this process; more wait for a slot.
    pub max_concurrent: u64,
    /// Largest file converted, in bytes; a larger upload is stored without Markdown.
    pub max_input_bytes: u64,
    /// Markdown kept per document, in bytes; the rest is cut with a marker line.
    pub max_output_bytes: u64,
    /// Address space of the converter process, in bytes (RLIMIT_AS).
    pub max_memory_bytes: u64,
    /// Most entries in a DOCX/PPTX/XLSX zip container.
    pub max_zip_entries: u64,
    /// Largest decompressed size of one part read: a zip entry or a PDF stream, in bytes.
    pub max_inflated_part_bytes: u64,
    /// Largest decompressed total of a container (declared sizes, and bytes really inflated), in bytes.
    pub max_inflated_total_bytes: u64,
}

impl Default for ConvertConfig {
    fn default() -> Self {
        Self {
            isolation: ConvertIsolation::Auto,
            program: PathBuf::new(),
            timeout_secs: 60,
            max_concurrent: 2,
            max_input_bytes: 50 * MIB,
            max_output_bytes: 16 * MIB,
            max_memory_bytes: GIB,
            max_zip_entries: 10_000,
            max_inflated_part_bytes: 128 * MIB,
            max_inflated_total_bytes: 256 * MIB,
        }
    }
}

/// `sandbox.uploads.convert.isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConvertIsolation {
    Auto,
    Bwrap,
    Process,
}

impl ConvertConfig {
    /// The bounds one conversion runs under.
    pub fn limits(&self) -> crate::convert::Limits {
        crate::convert::Limits {
            max_input_bytes: self.max_input_bytes,
            max_output_bytes: self.max_output_bytes,
            max_zip_entries: self.max_zip_entries,
            max_inflated_part_bytes: self.max_inflated_part_bytes,
            max_inflated_total_bytes: self.max_inflated_total_bytes,
        }
    }
}

/// `sandbox.bwrap`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BwrapConfig {
    /// The bwrap binary. Empty: `bwrap` found on PATH.
    pub path: String,
    /// Let commands reach the network (they share the host's network namespace). Off by default: commands
    /// get a private namespace with only a loopback interface.
    pub network: bool,
    /// Host user and group bwrap runs as when the service runs as root. Root cannot be limited by
    /// `max_processes` (the kernel exempts it), so the service drops to this id; the thread's directories
    /// are owned by it.
    pub run_as_uid: u32,
    pub run_as_gid: u32,
    /// Host paths mounted read-only at the same place (the system view). Missing ones are skipped;
    /// symbolic links are recreated as links.
    pub system_paths: Vec<PathBuf>,
    /// `prlimit` inside the system view; it applies the limits below to the command.
    pub prlimit_path: PathBuf,
    /// Processes (and threads) one command may have at once (RLIMIT_NPROC, counted per command).
    pub max_processes: u64,
    /// CPU seconds per process (RLIMIT_CPU).
    pub cpu_secs: u64,
    /// Address space per process in bytes (RLIMIT_AS).
    pub max_memory_bytes: u64,
    /// Largest file a command may write, in bytes (RLIMIT_FSIZE).
    pub max_file_bytes: u64,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    pub max_open_files: u64,
}

impl Default for BwrapConfig {
    fn default() -> Self {
        let system = [
            "/usr",
            "/bin",
            "/sbin",
            "/lib",
            "/lib32",
            "/lib64",
            "/libx32",
            "/etc/alternatives",
            "/etc/ld.so.cache",
            "/etc/ld.so.conf",
            "/etc/ld.so.conf.d",
            "/etc/passwd",
            "/etc/group",
            "/etc/nsswitch.conf",
            "/etc/hosts",
            "/etc/resolv.conf",
            "/etc/ssl",
            "/etc/ca-certificates",
            "/etc/localtime",
            "/etc/mime.types",
            "/etc/protocols",
            "/etc/services",
        ];
        Self {
            path: String::new(),
            network: false,
            run_as_uid: 65534,
            run_as_gid: 65534,
            system_paths: system.iter().map(PathBuf::from).collect(),
            prlimit_path: PathBuf::from("/usr/bin/prlimit"),
            max_processes: 256,
            cpu_secs: 3600,
            max_memory_bytes: 16 * GIB,
            max_file_bytes: GIB,
            max_open_files: 1024,
        }
    }
}

impl CommandsConfig {
    pub fn default_timeout(&self) -> Duration {
        Duration::from_secs(self.default_timeout_secs)
    }

    pub fn max_timeout(&self) -> Duration {
        Duration::from_secs(self.max_timeout_secs)
    }
}

impl SandboxConfig {
    /// Checks every value against its range; errors name the YAML path and the range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_range("sandbox.max_live_sandboxes", self.max_live_sandboxes, 1, 1_000_000)?;
        check_range("sandbox.idle_release_secs", self.idle_release_secs, 0, 30 * 86_400)?;
        check_range("sandbox.reap_interval_secs", self.reap_interval_secs, 1, 86_400)?;
        check_range("sandbox.fence_retention_secs", self.fence_retention_secs, 60, 30 * 86_400)?;
        check_range("sandbox.fence_max_runs", self.fence_max_runs, 1_000, 100_000_000)?;
        let s = &self.skills;
        check_range("sandbox.skills.max_custom_per_user", s.max_custom_per_user, 0, 100_000)?;
        check_range("sandbox.skills.max_archive_bytes", s.max_archive_bytes, KIB, 64 * GIB)?;
        check_range("sandbox.skills.install.max_entries", s.install.max_entries, 1, 1_000_000)?;
        check_range("sandbox.skills.install.max_file_bytes", s.install.max_file_bytes, 1, 64 * GIB)?;
        check_range("sandbox.skills.install.max_total_bytes", s.install.max_total_bytes, s.install.max_file_bytes, 256 * GIB)?;
        check_range("sandbox.skills.moderation.timeout_secs", s.moderation.timeout_secs, 1, 3600)?;
        check_range("sandbox.skills.moderation.max_input_chars", s.moderation.max_input_chars, 1000, 10_000_000)?;
        if let Some(id) = s.scan.unknown_rule() {
            return Err(ConfigError::Invalid {
                path: "sandbox.skills.scan.disabled_rules".to_owned(),
                message: format!("`{id}` is not a rule of the skill scan (the rules are listed in the sandbox README)"),
            });
        }
        if s.extensions_config.as_os_str().is_empty() {
            return Err(ConfigError::Invalid {
                path: "sandbox.skills.extensions_config".to_owned(),
                message: "must name a file (it need not exist)".to_owned(),
            });
        }
        if let Some(dir) = &s.public_dir
            && !dir.is_dir()
        {
            return Err(ConfigError::Invalid {
                path: "sandbox.skills.public_dir".to_owned(),
                message: format!("`{}` is not a directory", dir.display()),
            });
        }

        let c = &self.commands;
        check_range("sandbox.commands.default_timeout_secs", c.default_timeout_secs, 1, 86_400)?;
        check_range("sandbox.commands.max_timeout_secs", c.max_timeout_secs, c.default_timeout_secs, 86_400)?;
        check_range("sandbox.commands.max_concurrent", c.max_concurrent, 1, 1024)?;
        check_range("sandbox.commands.max_output_bytes_per_stream", c.max_output_bytes_per_stream, KIB, GIB)?;
        if c.output_max_chars != 0 {
            check_range("sandbox.commands.output_max_chars", c.output_max_chars, 100, 100_000_000)?;
        }
        check_range("sandbox.commands.max_command_bytes", c.max_command_bytes, 1, MIB)?;
        check_range("sandbox.commands.max_env_vars", c.max_env_vars, 0, 4096)?;
        check_range("sandbox.commands.max_env_value_bytes", c.max_env_value_bytes, 1, MIB)?;
        check_range("sandbox.commands.drain_grace_ms", c.drain_grace_ms, 0, 10_000)?;
        for (i, name) in c.env_allowlist.iter().enumerate() {
            if !crate::exec::env::valid_name(name) {
                return Err(ConfigError::Invalid {
                    path: format!("sandbox.commands.env_allowlist[{i}]"),
                    message: format!("`{name}` is not a variable name (must match ^[A-Za-z_][A-Za-z0-9_]*$)"),
                });
            }
        }

        let f = &self.files;
        check_range("sandbox.files.read_max_chars", f.read_max_chars, 100, 10_000_000)?;
        check_range("sandbox.files.write_max_bytes", f.write_max_bytes, 0, GIB)?;
        check_range("sandbox.files.edit_max_bytes", f.edit_max_bytes, KIB, GIB)?;
        check_range("sandbox.files.list_max_chars", f.list_max_chars, 100, 10_000_000)?;
        check_range("sandbox.files.list_max_entries", f.list_max_entries, 1, 1_000_000)?;
        check_range("sandbox.files.list_default_entries", f.list_default_entries, 1, f.list_max_entries)?;
        check_range("sandbox.files.glob_max_results", f.glob_max_results, 1, 1_000_000)?;
        check_range("sandbox.files.glob_default_results", f.glob_default_results, 1, f.glob_max_results)?;
        check_range("sandbox.files.grep_max_results", f.grep_max_results, 1, 1_000_000)?;
        check_range("sandbox.files.grep_default_results", f.grep_default_results, 1, f.grep_max_results)?;
        check_range("sandbox.files.grep_max_file_bytes", f.grep_max_file_bytes, KIB, GIB)?;
        check_range("sandbox.files.grep_max_line_chars", f.grep_max_line_chars, 10, 1_000_000)?;
        check_range("sandbox.files.grep_line_display_chars", f.grep_line_display_chars, 10, f.grep_max_line_chars)?;
        check_range("sandbox.files.download_max_bytes", f.download_max_bytes, 1, 64 * GIB)?;
        check_range("sandbox.files.snapshot_max_files", f.snapshot_max_files, 1, 10_000_000)?;

        let u = &self.uploads;
        check_range("sandbox.uploads.max_files", u.max_files, 1, 10_000)?;
        check_range("sandbox.uploads.max_file_bytes", u.max_file_bytes, 1, 64 * GIB)?;
        check_range("sandbox.uploads.max_total_bytes", u.max_total_bytes, u.max_file_bytes, 256 * GIB)?;
        let v = &u.convert;
        if !v.program.as_os_str().is_empty() && !v.program.is_absolute() {
            return Err(ConfigError::Invalid {
                path: "sandbox.uploads.convert.program".to_owned(),
                message: format!("`{}` must be an absolute path (or empty for this service's own executable)", v.program.display()),
            });
        }
        check_range("sandbox.uploads.convert.timeout_secs", v.timeout_secs, 1, 3600)?;
        check_range("sandbox.uploads.convert.max_concurrent", v.max_concurrent, 1, 256)?;
        check_range("sandbox.uploads.convert.max_input_bytes", v.max_input_bytes, KIB, 16 * GIB)?;
        check_range("sandbox.uploads.convert.max_output_bytes", v.max_output_bytes, KIB, GIB)?;
        check_range("sandbox.uploads.convert.max_memory_bytes", v.max_memory_bytes, 256 * MIB, 1 << 50)?;
        check_range("sandbox.uploads.convert.max_zip_entries", v.max_zip_entries, 1, 1_000_000)?;
        check_range("sandbox.uploads.convert.max_inflated_part_bytes", v.max_inflated_part_bytes, KIB, 64 * GIB)?;
        check_range("sandbox.uploads.convert.max_inflated_total_bytes", v.max_inflated_total_bytes, v.max_inflated_part_bytes, 256 * GIB)?;

        let b = &self.bwrap;
        if !b.path.is_empty() && !b.path.starts_with('/') {
            return Err(ConfigError::Invalid {
                path: "sandbox.bwrap.path".to_owned(),
                message: format!("`{}` must be an absolute path (or empty to search PATH)", b.path),
            });
        }
        check_range("sandbox.bwrap.run_as_uid", b.run_as_uid.into(), 1, u64::from(u32::MAX - 1))?;
        check_range("sandbox.bwrap.run_as_gid", b.run_as_gid.into(), 1, u64::from(u32::MAX - 1))?;
        for (i, path) in b.system_paths.iter().enumerate() {
            let reserved = ["/mnt", "/tmp", "/proc", "/dev"].iter().any(|r| path.starts_with(r));
            if !path.is_absolute() || reserved || path.as_os_str() == "/" {
                return Err(ConfigError::Invalid {
                    path: format!("sandbox.bwrap.system_paths[{i}]"),
                    message: format!(
                        "`{}` must be an absolute path other than /, and not under /mnt, /tmp, /proc or /dev (the sandbox provides those)",
                        path.display()
                    ),
                });
            }
        }
        if !b.prlimit_path.is_absolute() {
            return Err(ConfigError::Invalid {
                path: "sandbox.bwrap.prlimit_path".to_owned(),
                message: format!("`{}` must be an absolute path", b.prlimit_path.display()),
            });
        }
        check_range("sandbox.bwrap.max_processes", b.max_processes, 1, 1_000_000)?;
        check_range("sandbox.bwrap.cpu_secs", b.cpu_secs, 1, 30 * 86_400)?;
        check_range("sandbox.bwrap.max_memory_bytes", b.max_memory_bytes, 16 * MIB, 1 << 50)?;
        check_range("sandbox.bwrap.max_file_bytes", b.max_file_bytes, KIB, 1 << 50)?;
        check_range("sandbox.bwrap.max_open_files", b.max_open_files, 16, 1 << 20)?;
        Ok(())
    }
}

/// Parses and checks the `sandbox` section.
pub fn load(config: &Config) -> Result<SandboxConfig, ConfigError> {
    let sandbox: SandboxConfig = config.section("sandbox")?;
    sandbox.validate()?;
    Ok(sandbox)
}

/// Parses and checks the `sandbox` section (the [`antler_kit::cli::Registration`] hook).
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    let sandbox = load(config)?;
    if sandbox.skills.moderation.model_name.is_empty() {
        return Ok(());
    }
    // Moderation runs on the sandbox's own account: no caller token to forward.
    config.require_service_token("sandbox", "models", "to moderate skills (sandbox.skills.moderation.model_name)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<SandboxConfig, ConfigError> {
        let config = Config::parse(yaml, "antler.yaml", &|_| None)?;
        load(&config)
    }

    #[test]
    fn an_absent_section_gives_the_documented_defaults() -> Result<(), ConfigError> {
        let c = parse("")?;
        assert_eq!(c.provider, ProviderChoice::Auto);
        assert!(!c.allow_host_bash);
        assert_eq!(c.max_live_sandboxes, 256);
        assert_eq!(c.commands.default_timeout_secs, 600);
        assert_eq!(c.commands.output_max_chars, 20_000);
        assert_eq!(c.commands.max_output_bytes_per_stream, 10 * MIB);
        assert_eq!(c.files.read_max_chars, 50_000);
        assert_eq!(c.files.write_max_bytes, 81_920);
        assert_eq!((c.files.glob_default_results, c.files.glob_max_results), (200, 1000));
        assert_eq!((c.files.grep_default_results, c.files.grep_max_results), (100, 500));
        assert_eq!(c.files.download_max_bytes, 100 * MIB);
        assert_eq!((c.uploads.max_files, c.uploads.max_file_bytes, c.uploads.max_total_bytes), (10, 50 * MIB, 100 * MIB));
        assert!(c.uploads.auto_convert_documents);
        assert_eq!(c.uploads.convert.isolation, ConvertIsolation::Auto);
        assert_eq!((c.uploads.convert.timeout_secs, c.uploads.convert.max_input_bytes), (60, 50 * MIB));
        assert!(!c.bwrap.network);
        assert_eq!(c.seccomp, SeccompMode::Strict);
        Ok(())
    }

    #[test]
    fn the_skill_scan_is_on_by_default_and_an_unknown_disabled_rule_is_refused() -> Result<(), ConfigError> {
        let c = parse("")?;
        assert!(c.skills.scan.enabled && c.skills.scan.disabled_rules.is_empty());
        let m = &c.skills.moderation;
        assert!(m.model_name.is_empty() && m.fail_closed && m.timeout_secs == 20 && m.max_input_chars == 200_000);
        let text = parse("sandbox:\n  skills:\n    moderation:\n      timeout_secs: 0\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("sandbox.skills.moderation.timeout_secs"), "{text}");
        let c = parse("sandbox:\n  skills:\n    scan:\n      enabled: false\n      disabled_rules: [secret.api_key]\n")?;
        assert!(!c.skills.scan.enabled);
        let text = parse("sandbox:\n  skills:\n    scan:\n      disabled_rules: [secret.apikey]\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains("sandbox.skills.scan.disabled_rules") && text.contains("secret.apikey"), "{text}");
        Ok(())
    }

    #[test]
    fn unknown_keys_are_refused_with_their_path() {
        let text = parse("sandbox:\n  files:\n    read_max_char: 10\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("sandbox.files"), "{text}");
        assert!(text.contains("read_max_char"), "{text}");
    }

    #[test]
    fn out_of_range_values_name_the_range() {
        let text = parse("sandbox:\n  commands:\n    max_concurrent: 0\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("sandbox.commands.max_concurrent") && text.contains("between 1 and 1024"), "{text}");
        let text = parse("sandbox:\n  commands:\n    default_timeout_secs: 100\n    max_timeout_secs: 50\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains("max_timeout_secs") && text.contains("between 100 and"), "{text}");
    }

    #[test]
    fn bad_env_allowlist_names_are_refused() {
        let text = parse("sandbox:\n  commands:\n    env_allowlist: [PATH, 'BAD-NAME']\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("env_allowlist[1]") && text.contains("BAD-NAME"), "{text}");
    }

    #[test]
    fn system_paths_may_not_shadow_the_sandbox_mounts() {
        let text = parse("sandbox:\n  bwrap:\n    system_paths: [/usr, /mnt/user-data]\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("system_paths[1]"), "{text}");
    }

    #[test]
    fn the_example_file_lists_exactly_the_defaults() -> Result<(), ConfigError> {
        let text = include_str!("../../../examples/antler.yaml");
        let config = Config::parse(text, "examples/antler.yaml", &|_| None)?;
        let example = load(&config)?;
        assert_eq!(format!("{example:?}"), format!("{:?}", SandboxConfig::default()));
        Ok(())
    }

    #[test]
    fn seccomp_modes_are_checked() {
        assert!(matches!(parse("sandbox:\n  seccomp: off\n").map(|c| c.seccomp), Ok(SeccompMode::Off)));
        let text = parse("sandbox:\n  seccomp: permissive\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("seccomp") && text.contains("permissive"), "{text}");
    }

    #[test]
    fn provider_names_are_checked() {
        assert!(parse("sandbox:\n  provider: docker\n").is_err());
        assert!(matches!(parse("sandbox:\n  provider: local\n").map(|c| c.provider), Ok(ProviderChoice::Local)));
    }
}
