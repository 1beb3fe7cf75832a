//! What one skill archive may hold: its size limits and the native executables it may not carry. A
//! leaf, read by the install (while unpacking) and by the scan (on the staged files).

/// Limits of one install (`sandbox.skills.install` in `antler.yaml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InstallLimits {
    /// Most entries (files and directories) an archive may have.
    pub max_entries: u64,
    /// Most uncompressed bytes of all files together.
    pub max_total_bytes: u64,
    /// Most uncompressed bytes of one file.
    pub max_file_bytes: u64,
}

impl Default for InstallLimits {
    fn default() -> Self {
        Self { max_entries: 4096, max_total_bytes: 512 * 1024 * 1024, max_file_bytes: 64 * 1024 * 1024 }
    }
}

/// The first bytes of native executables.
const MAGICS: [(&[u8], &str); 8] = [
    (b"\x7fELF", "ELF"),
    (b"MZ", "PE (Windows)"),
    (b"\xfe\xed\xfa\xce", "Mach-O"),
    (b"\xce\xfa\xed\xfe", "Mach-O"),
    (b"\xfe\xed\xfa\xcf", "Mach-O"),
    (b"\xcf\xfa\xed\xfe", "Mach-O"),
    (b"\xca\xfe\xba\xbe", "Mach-O (fat)"),
    (b"\xbe\xba\xfe\xca", "Mach-O (fat)"),
];

/// The native-executable format whose magic `head` starts with, if any.
pub fn native_format(head: &[u8]) -> Option<&'static str> {
    MAGICS.iter().find(|(magic, _)| head.starts_with(magic)).map(|(_, name)| *name)
}
