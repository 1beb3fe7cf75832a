//! The edge's errors, in LangGraph's shape: `{"detail": "<message>"}` with the HTTP status LangGraph
//! uses, plus `code` (a stable word) and `param` (the offending field) that the SDKs read when present.
//! gRPC statuses from the services become HTTP statuses here, in one table.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tonic::Code;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub detail: String,
    pub code: &'static str,
    pub param: Option<String>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self { status, detail: detail.into(), code, param: None, retry_after: None }
    }

    /// 422: `field` has a value the edge cannot accept.
    pub fn invalid(field: &str, problem: impl std::fmt::Display) -> Self {
        Self {
            param: Some(field.to_owned()),
            ..Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_argument", format!("{field}: {problem}"))
        }
    }

    /// The same refusal, naming the setting that sets its bound (`limit` past `edge.max_page`): a
    /// person reading it learns which key to raise, not only that a number was too large.
    pub fn naming_setting(mut self, setting: &str) -> Self {
        self.detail = format!("{} ({setting})", self.detail);
        self
    }

    /// 422: `field` asks for a LangGraph capability Antler does not have; `why` says what instead.
    pub fn unsupported_option(field: &str, why: impl std::fmt::Display) -> Self {
        Self {
            param: Some(field.to_owned()),
            ..Self::new(StatusCode::UNPROCESSABLE_ENTITY, "unsupported", format!("{field} is not supported by Antler: {why}"))
        }
    }

    /// 501: a LangGraph endpoint Antler does not serve; `capability` names what is missing.
    pub fn unsupported_endpoint(capability: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, "unsupported", format!("not supported by Antler: {capability}"))
    }

    /// 400: the body is not JSON at all.
    pub fn bad_request(problem: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", problem)
    }

    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", format!("{what} not found"))
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", detail)
    }

    pub fn too_large(size: usize, limit: u64) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the request body is larger than {limit} bytes (edge.max_body_bytes){}",
                if size > 0 { format!(": {size} bytes") } else { String::new() }
            ),
        )
    }

    pub fn busy(limit: u32) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "resource_exhausted",
                format!("{limit} requests are in progress on the HTTP edge (edge.max_concurrent_requests)\nhint: retry after 1 s"),
            )
        }
    }

    pub fn unauthenticated(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", detail)
    }

    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", detail)
    }
}

/// The HTTP status LangGraph uses for what a gRPC code means.
pub fn http_status(code: Code) -> (StatusCode, &'static str) {
    match code {
        Code::InvalidArgument | Code::OutOfRange => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_argument"),
        Code::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        // An active run under multitask_strategy=reject, a run that is no longer cancellable, a
        // reused idempotency key: LangGraph answers these 409.
        Code::Aborted | Code::FailedPrecondition | Code::AlreadyExists => (StatusCode::CONFLICT, "conflict"),
        Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "resource_exhausted"),
        Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
        Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "deadline_exceeded"),
        Code::Unimplemented => (StatusCode::NOT_IMPLEMENTED, "unsupported"),
        Code::Ok | Code::Cancelled | Code::Unknown | Code::Internal | Code::DataLoss => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        let (http, code) = http_status(status.code());
        let retry_after = antler_kit::status::retry_after(&status)
            .or_else(|| matches!(status.code(), Code::ResourceExhausted | Code::Unavailable).then_some(1));
        Self { status: http, detail: status.message().to_owned(), code, param: None, retry_after }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // No refusal may carry a registered secret out (the gRPC stack's RedactLayer does the same).
        let detail = antler_kit::redact::redact(&self.detail).into_owned();
        let mut body = serde_json::json!({ "detail": detail, "code": self.code });
        if let Some(param) = &self.param {
            body["param"] = serde_json::Value::String(param.clone());
        }
        let mut response = (self.status, crate::json::json_body(&body)).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secs) = self.retry_after
            && let Ok(value) = HeaderValue::from_str(&secs.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_map_to_the_statuses_langgraph_uses() {
        let cases = [
            (tonic::Status::invalid_argument("input[0].role: bad"), StatusCode::UNPROCESSABLE_ENTITY),
            (tonic::Status::not_found("thread t not found"), StatusCode::NOT_FOUND),
            (tonic::Status::aborted("thread t has an active run r"), StatusCode::CONFLICT),
            (tonic::Status::failed_precondition("run r is not cancellable"), StatusCode::CONFLICT),
            (tonic::Status::resource_exhausted("queue full"), StatusCode::TOO_MANY_REQUESTS),
            (tonic::Status::unavailable("db"), StatusCode::SERVICE_UNAVAILABLE),
            (tonic::Status::unauthenticated("no key"), StatusCode::UNAUTHORIZED),
            (tonic::Status::internal("bug"), StatusCode::INTERNAL_SERVER_ERROR),
        ];
        for (status, http) in cases {
            let message = status.message().to_owned();
            let error = ApiError::from(status);
            assert_eq!(error.status, http, "{message}");
            assert_eq!(error.detail, message);
        }
        assert_eq!(ApiError::from(tonic::Status::resource_exhausted("full")).retry_after, Some(1));
    }

    #[test]
    fn field_errors_name_the_field_in_detail_and_param() {
        let error = ApiError::invalid("stream_mode[1]", "`debug` is not a stream mode Antler serves");
        assert_eq!(error.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(error.param.as_deref(), Some("stream_mode[1]"));
        assert!(error.detail.starts_with("stream_mode[1]: "), "{}", error.detail);
    }
}
