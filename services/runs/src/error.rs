//! The runs service's error type, and the one place where it becomes a gRPC status (for the
//! handlers and for the event streams they hand out).

use tonic::Status;

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum RunsError {
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// Also for other users' resources: they look exactly like missing ones.
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl RunsError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        RunsError::InvalidArgument { field: field.into(), message: message.into() }
    }
}

impl From<sea_orm::DbErr> for RunsError {
    fn from(e: sea_orm::DbErr) -> Self {
        RunsError::Store(StoreError::Db(e))
    }
}

impl crate::store::Busy for RunsError {
    fn is_busy(&self) -> bool {
        matches!(self, RunsError::Store(e) if e.is_busy())
    }
}

impl From<antler_kit::input_keys::KeyError> for RunsError {
    fn from(e: antler_kit::input_keys::KeyError) -> Self {
        RunsError::InvalidArgument { field: e.field, message: e.message }
    }
}

impl From<prost::DecodeError> for RunsError {
    fn from(e: prost::DecodeError) -> Self {
        RunsError::Store(e.into())
    }
}

fn to_status(error: RunsError) -> Status {
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
        // The database's own text stays in the log: it names tables and values, and means nothing to
        // a client. Only what a retry can fix is UNAVAILABLE (retryable by gRPC clients).
        RunsError::Store(error) if error.is_transient() => {
            tracing::warn!(%error, "runs database unavailable");
            antler_kit::status::unavailable("the runs database is unavailable right now", 1)
        }
        RunsError::Store(error) => {
            tracing::error!(%error, "runs database error");
            Status::internal(
                "the runs database failed (the server log has the detail)\nhint: this is not fixed by retrying; report it with the time of the call",
            )
        }
    }
}

impl From<RunsError> for Status {
    fn from(error: RunsError) -> Self {
        to_status(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_errors_keep_their_text_in_the_log() {
        let lost = to_status(RunsError::Store(StoreError::Db(sea_orm::DbErr::ConnectionAcquire(sea_orm::ConnAcquireErr::Timeout))));
        assert_eq!(lost.code(), tonic::Code::Unavailable);
        assert!(lost.metadata().get("retry-after").is_some());
        let broken = to_status(RunsError::Store(StoreError::Db(sea_orm::DbErr::Custom("relation \"runs\" does not exist".to_owned()))));
        assert_eq!(broken.code(), tonic::Code::Internal);
        assert!(!broken.message().contains("relation"), "{}", broken.message());
        let corrupt = to_status(RunsError::Store(StoreError::Corrupt("invalid wire type".to_owned())));
        assert_eq!(corrupt.code(), tonic::Code::Internal);
    }
}
