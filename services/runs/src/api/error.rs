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
    use crate::store::StoreError;

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
