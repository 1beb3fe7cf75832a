//! JSON bodies and responses, the one shape every route answers in.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// JSON text of a value (serde_json cannot fail on a `Value`).
pub fn json_text(value: &serde_json::Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// A JSON response body.
pub fn json_body(value: &serde_json::Value) -> axum::body::Body {
    axum::body::Body::from(json_text(value))
}

/// A 200 JSON response.
pub fn json_response(value: &serde_json::Value) -> Response {
    let mut response = json_body(value).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
