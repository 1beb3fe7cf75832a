//! The service's one error type and its mapping to gRPC status codes (the only place that mapping lives).
//!
//! Messages name the client's own virtual path or field and never a host path: filesystem errors are
//! mapped from their errno alone (see [`SandboxError::from_errno`]), never from an `io::Error`'s text.

use std::fmt::Display;

use rustix::io::Errno;
use tonic::Status;

/// Everything an RPC can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A request field is malformed.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// No sandbox was ever acquired for this thread by this caller.
    #[error("no sandbox for thread {thread_id}\nhint: call AcquireSandbox first")]
    SandboxNotFound { thread_id: String },
    /// The caller has no skill of that name (another user's custom skill included).
    #[error("no skill named {name:?}\nhint: `antler skills list` shows the skills you have")]
    SkillNotFound { name: String },
    /// The file or directory named by the request does not exist.
    #[error("{path}: no such file or directory")]
    PathNotFound { path: String },
    /// The sandbox was released; writes and commands need it ACTIVE.
    #[error("the sandbox of thread {thread_id} is RELEASED\nhint: call AcquireSandbox again (files are kept)")]
    Released { thread_id: String },
    /// The path exists but is the wrong kind (a directory where a file is needed, ...).
    #[error("{path}: {problem}")]
    WrongKind { path: String, problem: String },
    /// The path leaves the sandbox roots or writes to a read-only root.
    #[error("{path}: permission denied: {reason}")]
    PermissionDenied { path: String, reason: String },
    /// A size or count cap was hit; the message names the cap and its value.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A state conflict the caller can resolve (old_str not found, exec disabled, provider unusable).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The host cannot serve right now (disk full, process spawn failed); retrying later may work.
    #[error("{0}")]
    Unavailable(String),
    /// A bug or an unexpected host condition.
    #[error("{0}")]
    Internal(String),
}

/// Longest client-supplied path echoed back in a message (a 4 KiB path would drown the message).
const MAX_ECHO: usize = 256;

/// A client path made printable for an error message: control characters escaped, cut at [`MAX_ECHO`].
pub fn echo(path: &str) -> String {
    let escaped: String =
        path.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect();
    if escaped.chars().count() > MAX_ECHO {
        let cut: String = escaped.chars().take(MAX_ECHO).collect();
        format!("{cut}...")
    } else {
        escaped
    }
}

impl SandboxError {
    pub fn invalid(field: impl Into<String>, message: impl Display) -> Self {
        Self::InvalidArgument { field: field.into(), message: message.to_string() }
    }

    pub fn denied(path: &str, reason: impl Display) -> Self {
        Self::PermissionDenied { path: echo(path), reason: reason.to_string() }
    }

    pub fn not_found(path: &str) -> Self {
        Self::PathNotFound { path: echo(path) }
    }

    pub fn wrong_kind(path: &str, problem: impl Display) -> Self {
        Self::WrongKind { path: echo(path), problem: problem.to_string() }
    }

    /// Maps a filesystem errno met while working on the virtual path `path`. `openat2(RESOLVE_BENEATH)`
    /// reports an escape as EXDEV and a symlink loop (or a symlink where O_NOFOLLOW forbids one) as ELOOP.
    pub fn from_errno(path: &str, errno: Errno) -> Self {
        match errno {
            Errno::NOENT => Self::not_found(path),
            Errno::XDEV => Self::denied(path, "resolves outside the sandbox roots (a symbolic link or mount leaves them)"),
            Errno::LOOP => Self::denied(path, "too many levels of symbolic links, or a symbolic link where none is allowed"),
            Errno::ACCESS | Errno::PERM => Self::denied(path, "the host refused access"),
            Errno::ROFS => Self::denied(path, "read-only file system"),
            Errno::ISDIR => Self::wrong_kind(path, "is a directory"),
            Errno::NOTDIR => Self::wrong_kind(path, "a component of the path is not a directory"),
            Errno::NAMETOOLONG => Self::invalid("path", format!("{}: name too long", echo(path))),
            Errno::EXIST => Self::FailedPrecondition(format!("{}: already exists", echo(path))),
            Errno::NOTEMPTY => Self::FailedPrecondition(format!("{}: directory not empty", echo(path))),
            Errno::NXIO => Self::wrong_kind(path, "is not a regular file"),
            // Only reaches here from an open that kept being interrupted (see resolve::open_beneath).
            Errno::AGAIN => Self::Unavailable(format!(
                "{}: the file could not be opened because the host's filesystem kept changing during the lookup\nhint: retry",
                echo(path)
            )),
            Errno::NOSPC | Errno::DQUOT => Self::Unavailable(format!("{}: no space left on the sandbox's disk", echo(path))),
            Errno::FBIG => Self::ResourceExhausted(format!("{}: file too large for the host", echo(path))),
            Errno::MFILE | Errno::NFILE | Errno::NOMEM => Self::Unavailable(format!("the host is out of resources ({errno})")),
            other => Self::Internal(format!("{}: unexpected filesystem error ({other})", echo(path))),
        }
    }

    /// Same as [`SandboxError::from_errno`] for a std `io::Error` (only its errno is used).
    pub fn from_io(path: &str, error: &std::io::Error) -> Self {
        match error.raw_os_error() {
            Some(code) => Self::from_errno(path, Errno::from_raw_os_error(code)),
            None if error.kind() == std::io::ErrorKind::InvalidData => Self::wrong_kind(path, "is not valid UTF-8 text"),
            None => Self::Internal(format!("{}: unexpected I/O error ({})", echo(path), error.kind())),
        }
    }

    /// A short, bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidArgument { .. } => "invalid_argument",
            Self::SandboxNotFound { .. } | Self::PathNotFound { .. } | Self::SkillNotFound { .. } => "not_found",
            Self::Released { .. } | Self::WrongKind { .. } | Self::FailedPrecondition(_) => "failed_precondition",
            Self::PermissionDenied { .. } => "permission_denied",
            Self::ResourceExhausted(_) => "resource_exhausted",
            Self::Unavailable(_) => "unavailable",
            Self::Internal(_) => "internal",
        }
    }
}

impl From<SandboxError> for Status {
    fn from(error: SandboxError) -> Self {
        let message = error.to_string();
        match error {
            SandboxError::InvalidArgument { .. } => Status::invalid_argument(message),
            SandboxError::SandboxNotFound { .. } | SandboxError::PathNotFound { .. } | SandboxError::SkillNotFound { .. } => {
                Status::not_found(message)
            }
            SandboxError::Released { .. } | SandboxError::WrongKind { .. } | SandboxError::FailedPrecondition(_) => {
                Status::failed_precondition(message)
            }
            SandboxError::PermissionDenied { .. } => Status::permission_denied(message),
            SandboxError::ResourceExhausted(_) => Status::resource_exhausted(message),
            SandboxError::Unavailable(_) => antler_kit::status::unavailable(message, 5),
            SandboxError::Internal(_) => Status::internal(message),
        }
    }
}

/// Result alias for the service's domain code.
pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn each_variant_maps_to_its_documented_code() {
        let cases = [
            (SandboxError::invalid("path", "contains a NUL byte"), Code::InvalidArgument),
            (SandboxError::SandboxNotFound { thread_id: "t".into() }, Code::NotFound),
            (SandboxError::not_found("/mnt/user-data/workspace/x"), Code::NotFound),
            (SandboxError::Released { thread_id: "t".into() }, Code::FailedPrecondition),
            (SandboxError::wrong_kind("/x", "is a directory"), Code::FailedPrecondition),
            (SandboxError::denied("/etc/passwd", "outside"), Code::PermissionDenied),
            (SandboxError::ResourceExhausted("cap".into()), Code::ResourceExhausted),
            (SandboxError::Unavailable("disk".into()), Code::Unavailable),
        ];
        for (error, code) in cases {
            assert_eq!(Status::from(error).code(), code);
        }
    }

    #[test]
    fn errno_mapping_names_the_virtual_path_only() {
        let e = SandboxError::from_errno("/mnt/user-data/workspace/link", Errno::XDEV);
        assert!(matches!(e, SandboxError::PermissionDenied { .. }));
        assert!(e.to_string().starts_with("/mnt/user-data/workspace/link: permission denied"), "{e}");
        assert!(matches!(SandboxError::from_errno("/a", Errno::LOOP), SandboxError::PermissionDenied { .. }));
        assert!(matches!(SandboxError::from_errno("/a", Errno::NOSPC), SandboxError::Unavailable(_)));
    }

    #[test]
    fn echoed_paths_are_escaped_and_bounded() {
        assert_eq!(echo("a\0b\n"), "a\\u{0}b\\n");
        let long = "x".repeat(5000);
        assert!(echo(&long).len() < 300);
    }
}
