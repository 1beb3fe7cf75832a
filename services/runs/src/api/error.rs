//! The one place where the runs service's errors become gRPC statuses.

use tonic::Status;

use crate::error::RunsError;

pub fn to_status(error: RunsError) -> Status {
    match error {
        RunsError::InvalidArgument { field, message } => antler_kit::status::invalid_argument(&field, message),
        RunsError::NotFound(what) => Status::not_found(format!("{what} not found")),
        RunsError::FailedPrecondition(message) => Status::failed_precondition(message),
        RunsError::Aborted(message) => Status::aborted(message),
        RunsError::ResourceExhausted(message) => {
            // Every limit here frees up as runs finish: say when to try again.
            let mut status = Status::resource_exhausted(message);
            status.metadata_mut().insert("retry-after", tonic::metadata::MetadataValue::from_static("1"));
            status
        }
        RunsError::Unavailable(message) => antler_kit::status::unavailable(message, 1),
        RunsError::Store(error) => {
            tracing::error!(%error, "runs database error");
            antler_kit::status::unavailable(format!("the runs database failed: {error}"), 1)
        }
    }
}

impl From<RunsError> for Status {
    fn from(error: RunsError) -> Self {
        to_status(error)
    }
}
