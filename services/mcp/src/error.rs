//! The service's one error type and its mapping to gRPC status codes (the only place that mapping lives).
//!
//! Messages name the server, the field or the limit, and never carry a credential: everything that can hold
//! one passes through [`crate::redact`] before it becomes an error.

use tonic::Status;

/// Everything an RPC can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum McpError {
    /// A request field is malformed; `field` is its name or a JSON path into the arguments.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// No such server or tool (also: one the caller may not see).
    #[error("{0}")]
    NotFound(String),
    /// The request is valid but the state forbids it (server disabled, config unreadable).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The caller may not do this (reload by a non-operator).
    #[error("{0}")]
    PermissionDenied(String),
    /// The server cannot be reached or its breaker is open; retrying after `retry_after_secs` may work.
    #[error("{message}")]
    Unavailable { message: String, retry_after_secs: u64 },
    /// The call's time ran out; it may still have taken effect on the server.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// A size or count cap was hit; the message names the cap.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The caller went away or the service is shutting down.
    #[error("{0}")]
    Cancelled(String),
    /// The server answered something that breaks the protocol, or a bug.
    #[error("{0}")]
    Internal(String),
}

impl McpError {
    pub fn invalid(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Self::InvalidArgument { field: field.into(), message: message.to_string() }
    }

    pub fn unavailable(message: impl Into<String>, retry_after_secs: u64) -> Self {
        Self::Unavailable { message: message.into(), retry_after_secs }
    }

    /// A short, bounded label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidArgument { .. } => "invalid_argument",
            Self::NotFound(_) => "not_found",
            Self::FailedPrecondition(_) => "failed_precondition",
            Self::PermissionDenied(_) => "permission_denied",
            Self::Unavailable { .. } => "unavailable",
            Self::DeadlineExceeded(_) => "deadline_exceeded",
            Self::ResourceExhausted(_) => "resource_exhausted",
            Self::Cancelled(_) => "cancelled",
            Self::Internal(_) => "internal",
        }
    }
}

impl From<McpError> for Status {
    fn from(error: McpError) -> Self {
        let message = error.to_string();
        match error {
            McpError::InvalidArgument { .. } => Status::invalid_argument(message),
            McpError::NotFound(_) => Status::not_found(message),
            McpError::FailedPrecondition(_) => Status::failed_precondition(message),
            McpError::PermissionDenied(_) => Status::permission_denied(message),
            McpError::Unavailable { retry_after_secs, message } => antler_kit::status::unavailable(message, retry_after_secs),
            McpError::DeadlineExceeded(_) => Status::deadline_exceeded(message),
            McpError::ResourceExhausted(_) => Status::resource_exhausted(message),
            McpError::Cancelled(_) => Status::cancelled(message),
            McpError::Internal(_) => Status::internal(message),
        }
    }
}

/// Result alias for the service's domain code.
pub type Result<T, E = McpError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn each_variant_maps_to_its_documented_code() {
        let cases = [
            (McpError::invalid("tool_name", "is required"), Code::InvalidArgument),
            (McpError::NotFound("x".into()), Code::NotFound),
            (McpError::FailedPrecondition("x".into()), Code::FailedPrecondition),
            (McpError::PermissionDenied("x".into()), Code::PermissionDenied),
            (McpError::unavailable("x", 3), Code::Unavailable),
            (McpError::DeadlineExceeded("x".into()), Code::DeadlineExceeded),
            (McpError::ResourceExhausted("x".into()), Code::ResourceExhausted),
            (McpError::Cancelled("x".into()), Code::Cancelled),
            (McpError::Internal("x".into()), Code::Internal),
        ];
        for (error, code) in cases {
            assert_eq!(Status::from(error).code(), code);
        }
    }

    #[test]
    fn unavailable_carries_retry_after() {
        let status = Status::from(McpError::unavailable("server github: circuit open", 42));
        assert_eq!(antler_kit::status::retry_after(&status), Some(42));
    }
}
