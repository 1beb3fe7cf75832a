//! Virtual paths: what a client may name, parsed and normalised before anything touches the disk.
//!
//! This is the lexical half of the path policy (NUL bytes, length, `..`, which roots exist). The other
//! half — symbolic links, which only the filesystem can answer — is [`crate::resolve`], which opens the
//! remaining components beneath the root's directory with `openat2(RESOLVE_BENEATH)`.

use crate::error::{Result, SandboxError, echo};

/// The virtual directory holding the three read-write roots.
pub const USER_DATA: &str = "/mnt/user-data";
/// The read-only skills root.
pub const SKILLS: &str = "/mnt/skills";
/// The thread's ACP workspace: written by the external ACP agents the lead agent calls
/// (`invoke_acp_agent`, which runs them on the host), read-only to everything in the sandbox.
pub const ACP_WORKSPACE: &str = "/mnt/acp-workspace";
/// Longest path accepted, in bytes (Linux PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest single name accepted, in bytes (Linux NAME_MAX).
pub const MAX_NAME_BYTES: usize = 255;

/// A directory a virtual path can live under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Root {
    Workspace,
    Uploads,
    Outputs,
    Skills,
    AcpWorkspace,
}

impl Root {
    pub const ALL: [Root; 5] = [Root::Workspace, Root::Uploads, Root::Outputs, Root::Skills, Root::AcpWorkspace];
    pub const USER_DATA: [Root; 3] = [Root::Workspace, Root::Uploads, Root::Outputs];

    /// The root's virtual path.
    pub fn virtual_path(self) -> &'static str {
        match self {
            Root::Workspace => "/mnt/user-data/workspace",
            Root::Uploads => "/mnt/user-data/uploads",
            Root::Outputs => "/mnt/user-data/outputs",
            Root::Skills => SKILLS,
            Root::AcpWorkspace => ACP_WORKSPACE,
        }
    }

    /// Its directory name under the thread's `user-data` directory (None for skills and the ACP
    /// workspace, which live elsewhere).
    pub fn dir_name(self) -> Option<&'static str> {
        match self {
            Root::Workspace => Some("workspace"),
            Root::Uploads => Some("uploads"),
            Root::Outputs => Some("outputs"),
            Root::Skills | Root::AcpWorkspace => None,
        }
    }

    pub fn read_only(self) -> bool {
        matches!(self, Root::Skills | Root::AcpWorkspace)
    }

    pub fn description(self) -> &'static str {
        match self {
            Root::Workspace => "default working directory",
            Root::Uploads => "files sent with UploadFiles",
            Root::Outputs => "deliverables (see SnapshotOutputs)",
            Root::Skills => "enabled skills (read-only)",
            Root::AcpWorkspace => "what external ACP agents wrote (invoke_acp_agent; read-only)",
        }
    }
}

/// A parsed virtual path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VirtualPath {
    /// `/mnt/user-data` itself: a directory whose children are the three read-write roots.
    UserData,
    /// A path under one of the roots; `rel` is the normalised remainder (`""` for the root itself),
    /// components joined by `/`, none of them empty, `.` or `..`.
    In { root: Root, rel: String },
}

impl VirtualPath {
    pub fn root(root: Root) -> Self {
        Self::In { root, rel: String::new() }
    }

    /// The normalised virtual path, as responses show it.
    pub fn display(&self) -> String {
        match self {
            VirtualPath::UserData => USER_DATA.to_owned(),
            VirtualPath::In { root, rel } if rel.is_empty() => root.virtual_path().to_owned(),
            VirtualPath::In { root, rel } => format!("{}/{rel}", root.virtual_path()),
        }
    }

    /// The root and remainder, or PERMISSION_DENIED when the path is `/mnt/user-data` itself (which is no
    /// file and cannot be written).
    pub fn within_root(&self) -> Result<(Root, &str)> {
        match self {
            VirtualPath::In { root, rel } => Ok((*root, rel.as_str())),
            VirtualPath::UserData => {
                Err(SandboxError::denied(USER_DATA, "only its subdirectories workspace, uploads and outputs hold files"))
            }
        }
    }

    /// Like [`VirtualPath::within_root`], and also refuses the read-only root.
    pub fn writable(&self) -> Result<(Root, &str)> {
        let (root, rel) = self.within_root()?;
        if root.read_only() {
            return Err(SandboxError::denied(&self.display(), format!("{} is read-only", root.virtual_path())));
        }
        Ok((root, rel))
    }

    /// The parent directory and final name (None for a root or `/mnt/user-data`).
    pub fn split_last(&self) -> Option<(VirtualPath, &str)> {
        match self {
            VirtualPath::In { root, rel } if !rel.is_empty() => {
                let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
                Some((VirtualPath::In { root: *root, rel: parent.to_owned() }, name))
            }
            _ => None,
        }
    }

    /// The path of a child named `name` (one component, already checked by the caller).
    pub fn child(&self, name: &str) -> VirtualPath {
        match self {
            VirtualPath::UserData => match name {
                "workspace" => VirtualPath::root(Root::Workspace),
                "uploads" => VirtualPath::root(Root::Uploads),
                _ => VirtualPath::root(Root::Outputs),
            },
            VirtualPath::In { root, rel } if rel.is_empty() => VirtualPath::In { root: *root, rel: name.to_owned() },
            VirtualPath::In { root, rel } => VirtualPath::In { root: *root, rel: format!("{rel}/{name}") },
        }
    }
}

/// Parses a client path. Empty means `default`. A relative path is taken relative to
/// `/mnt/user-data/workspace`; `\` is treated as `/` (agents trained on Windows paths send it).
///
/// Refused: NUL bytes and over-long paths or names (INVALID_ARGUMENT, naming `field`); any `..` component
/// and anything outside `/mnt/user-data/{workspace,uploads,outputs}`, `/mnt/skills` and
/// `/mnt/acp-workspace` (PERMISSION_DENIED).
pub fn parse(raw: &str, field: &str, default: Option<VirtualPath>) -> Result<VirtualPath> {
    if raw.is_empty() {
        return default.ok_or_else(|| SandboxError::invalid(field, "is required"));
    }
    if raw.contains('\0') {
        return Err(SandboxError::invalid(field, format!("`{}` contains a NUL byte", echo(raw))));
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(SandboxError::invalid(field, format!("is {} bytes long; paths are limited to {MAX_PATH_BYTES} bytes", raw.len())));
    }
    let normalised = raw.replace('\\', "/");
    let absolute = if normalised.starts_with('/') { normalised } else { format!("{}/{normalised}", Root::Workspace.virtual_path()) };
    let mut parts = Vec::new();
    for part in absolute.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(SandboxError::denied(raw, "`..` is not allowed in sandbox paths")),
            name if name.len() > MAX_NAME_BYTES => {
                return Err(SandboxError::invalid(field, format!("a name in `{}` is longer than {MAX_NAME_BYTES} bytes", echo(raw))));
            }
            name => parts.push(name),
        }
    }
    let outside = || {
        SandboxError::denied(
            raw,
            "outside the sandbox roots (/mnt/user-data/workspace, uploads, outputs, /mnt/skills and /mnt/acp-workspace)",
        )
    };
    match parts.as_slice() {
        ["mnt", "user-data"] => Ok(VirtualPath::UserData),
        ["mnt", "user-data", root, rest @ ..] => {
            let root = match *root {
                "workspace" => Root::Workspace,
                "uploads" => Root::Uploads,
                "outputs" => Root::Outputs,
                _ => return Err(outside()),
            };
            Ok(VirtualPath::In { root, rel: rest.join("/") })
        }
        ["mnt", "skills", rest @ ..] => Ok(VirtualPath::In { root: Root::Skills, rel: rest.join("/") }),
        ["mnt", "acp-workspace", rest @ ..] => Ok(VirtualPath::In { root: Root::AcpWorkspace, rel: rest.join("/") }),
        _ => Err(outside()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(raw: &str) -> String {
        match parse(raw, "path", None) {
            Ok(p) => p.display(),
            Err(e) => format!("ERR {e}"),
        }
    }

    #[test]
    fn relative_paths_are_under_the_workspace() {
        assert_eq!(ok("a/b.txt"), "/mnt/user-data/workspace/a/b.txt");
        assert_eq!(ok("./a//b/"), "/mnt/user-data/workspace/a/b");
        assert_eq!(ok("/mnt/user-data/outputs/x"), "/mnt/user-data/outputs/x");
        assert_eq!(ok("/mnt/skills"), "/mnt/skills");
        assert_eq!(ok("/mnt/user-data/"), "/mnt/user-data");
        assert_eq!(ok("a\\b"), "/mnt/user-data/workspace/a/b");
    }

    #[test]
    fn escapes_are_refused_before_any_disk_access() {
        for raw in
            ["../x", "/mnt/user-data/workspace/../../etc", "/etc/passwd", "/mnt/user-data/other", "/mnt", "/", "..\\..\\x", "/mnt/skillsx"]
        {
            assert!(parse(raw, "path", None).is_err(), "{raw}");
        }
        assert!(matches!(parse("a\0b", "path", None), Err(SandboxError::InvalidArgument { .. })));
        let long_name = format!("/mnt/user-data/workspace/{}", "n".repeat(256));
        assert!(matches!(parse(&long_name, "path", None), Err(SandboxError::InvalidArgument { .. })));
        let long_path = format!("/mnt/user-data/workspace/{}", "d/".repeat(3000));
        assert!(matches!(parse(&long_path, "path", None), Err(SandboxError::InvalidArgument { .. })));
    }

    #[test]
    fn writes_to_skills_and_user_data_itself_are_refused() {
        let skills = parse("/mnt/skills/a", "path", None).ok();
        assert!(skills.is_some_and(|p| p.writable().is_err()));
        let acp = parse("/mnt/acp-workspace/result.txt", "path", None).ok();
        assert!(acp.as_ref().is_some_and(|p| p.within_root().is_ok()), "readable");
        let refused = acp.and_then(|p| p.writable().err()).map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("/mnt/acp-workspace is read-only"), "{refused}");
        assert!(VirtualPath::UserData.within_root().is_err());
    }

    #[test]
    fn split_and_child_round_trip() {
        let p = parse("a/b/c", "path", None).ok();
        let (parent, name) = p.as_ref().and_then(|p| p.split_last()).map(|(a, b)| (a.display(), b.to_owned())).unwrap_or_default();
        assert_eq!((parent.as_str(), name.as_str()), ("/mnt/user-data/workspace/a/b", "c"));
        assert_eq!(VirtualPath::root(Root::Outputs).child("x").display(), "/mnt/user-data/outputs/x");
    }
}
