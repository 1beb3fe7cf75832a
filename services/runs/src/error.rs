//! The runs service's error type. Mapped to `tonic::Status` in one place: `api/error.rs`.

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
