//! Building `tonic::Status` values with messages a person can act on: a primary line naming what failed
//! and the offending value, then a hint.

use std::fmt::Display;

use tonic::{Code, Status};

/// An RPC whose capability has not landed yet; `capability` says what is missing and where it is
/// tracked ("the run lifecycle lands with issue #3").
pub fn unimplemented(rpc: &str, capability: &str) -> Status {
    Status::unimplemented(format!("{rpc} is not implemented yet: {capability}"))
}

/// Bad input in `field`.
pub fn invalid_argument(field: &str, problem: impl Display) -> Status {
    Status::invalid_argument(format!("{field}: {problem}"))
}

/// INVALID_ARGUMENT naming `field` when a required id is empty (an empty id is bad input, not a
/// resource that does not exist).
pub fn required(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() { Err(invalid_argument(field, "is required")) } else { Ok(()) }
}

/// A downstream service could not be reached; carries `retry-after` (seconds) for clients.
pub fn unavailable(what: impl Display, retry_after_secs: u64) -> Status {
    let mut status = Status::unavailable(format!("{what}\nhint: retry after {retry_after_secs}s"));
    if let Ok(value) = retry_after_secs.to_string().parse() {
        status.metadata_mut().insert("retry-after", value);
    }
    status
}

/// Whether a status from another service is worth retrying (the request was not processed).
pub fn is_retryable(status: &Status) -> bool {
    status.code() == Code::Unavailable
}

/// The `retry-after` a status carries, in seconds.
pub fn retry_after(status: &Status) -> Option<u64> {
    status.metadata().get("retry-after")?.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unimplemented_names_the_capability_and_issue() {
        let s = unimplemented("RunService.CreateRun", "the run lifecycle lands with issue #3");
        assert_eq!(s.code(), Code::Unimplemented);
        assert!(s.message().contains("RunService.CreateRun") && s.message().contains("#3"));
    }

    #[test]
    fn unavailable_carries_retry_after() {
        let s = unavailable("models service unreachable", 2);
        assert_eq!(retry_after(&s), Some(2));
        assert!(is_retryable(&s));
    }
}
