//! The service's one error type and its mapping to gRPC status codes (the only place that mapping lives).

use tonic::Status;

use crate::store::StoreError;

/// Everything an RPC can fail with.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// A request field is malformed; the message names the field and the limit.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// No such fact (also: another user's).
    #[error("{0}")]
    NotFound(String),
    /// The state forbids it (memory disabled, fact already invalidated).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A limit was hit; the message names it.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The database is unreachable.
    #[error("{0}")]
    Unavailable(String),
    /// A stored value is corrupt, or a bug.
    #[error("{0}")]
    Internal(String),
}

impl MemoryError {
    pub fn invalid(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Self::InvalidArgument { field: field.into(), message: message.to_string() }
    }

    pub fn not_found_fact(fact_id: &str) -> Self {
        Self::NotFound(format!("fact {fact_id} not found\nhint: ListFacts shows the facts of an agent scope"))
    }
}

impl From<StoreError> for MemoryError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Corrupt(message) => MemoryError::Internal(format!("stored memory is corrupt: {message}")),
            StoreError::Db(e) => {
                let text = e.to_string();
                // Connection-level failures are transient; anything else (a bad statement, a violated
                // constraint we did not expect) is a bug the client cannot fix by retrying.
                if matches!(e, sea_orm::DbErr::Conn(_) | sea_orm::DbErr::ConnectionAcquire(_)) || text.contains("database is locked") {
                    MemoryError::Unavailable(format!("the memory database is unavailable: {text}"))
                } else {
                    MemoryError::Internal(format!("memory database error: {text}"))
                }
            }
        }
    }
}

impl From<sea_orm::DbErr> for MemoryError {
    fn from(error: sea_orm::DbErr) -> Self {
        StoreError::Db(error).into()
    }
}

impl From<MemoryError> for Status {
    fn from(error: MemoryError) -> Self {
        match error {
            MemoryError::InvalidArgument { .. } => Status::invalid_argument(error.to_string()),
            MemoryError::NotFound(m) => Status::not_found(m),
            MemoryError::FailedPrecondition(m) => Status::failed_precondition(m),
            MemoryError::ResourceExhausted(m) => Status::resource_exhausted(m),
            MemoryError::Unavailable(m) => antler_kit::status::unavailable(m, 1),
            MemoryError::Internal(m) => Status::internal(m),
        }
    }
}
