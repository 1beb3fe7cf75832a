//! Reading a request: the JSON body (bounded, an object, every field checked by name) and the query
//! string. Every refusal names the field.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Reads the whole body, at most `limit` bytes.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: u64) -> Result<axum::body::Bytes, ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(size) = declared
        && size > limit
    {
        return Err(ApiError::too_large(size as usize, limit));
    }
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    // A body sent without Content-Length (chunked) is cut at the limit as it arrives.
    axum::body::to_bytes(body, limit_usize).await.map_err(|_| ApiError::too_large(0, limit))
}

/// Reads and drops the whole body, at most `limit` bytes, holding none of it: what a route that
/// answers without looking at the body (a 501, a 404) does first. Left unread, the body makes the
/// server close the connection after the answer, so a client still sending sees a reset instead of
/// the answer, and its next request on the connection fails. A body declared (Content-Length) or found
/// (chunked) larger than `limit` is refused 413 as on every other route, without reading the rest.
pub async fn discard_body(headers: &HeaderMap, body: Body, limit: u64) -> Result<(), ApiError> {
    use futures::StreamExt;
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if let Some(size) = declared
        && size > limit
    {
        return Err(ApiError::too_large(size as usize, limit));
    }
    let mut stream = body.into_data_stream();
    let mut seen: u64 = 0;
    while let Some(chunk) = stream.next().await {
        // A client that stops sending midway gets no answer anyway: nothing to refuse.
        let Ok(chunk) = chunk else { return Ok(()) };
        seen = seen.saturating_add(chunk.len() as u64);
        if seen > limit {
            return Err(ApiError::too_large(0, limit));
        }
    }
    Ok(())
}

/// `answer` (a 501, a 404), given once the body is read and dropped by [`discard_body`]; a body past
/// `limit` gets the 413 instead.
pub async fn answer_after_body(headers: &HeaderMap, body: Body, limit: u64, answer: ApiError) -> ApiError {
    match discard_body(headers, body, limit).await {
        Ok(()) => answer,
        Err(too_large) => too_large,
    }
}

/// A JSON object whose fields are taken one by one; [`Fields::finish`] refuses any left over, so a
/// misspelt or unknown option is an error naming it instead of being silently ignored.
#[derive(Debug)]
pub struct Fields {
    map: Map<String, Value>,
    /// Prefix for field names in errors (`config.` for the fields of `config`).
    prefix: String,
}

impl Fields {
    /// The body as an object; an empty body is `{}`.
    pub fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self { map: Map::new(), prefix: String::new() });
        }
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(map)) => Ok(Self { map, prefix: String::new() }),
            Ok(_) => Err(ApiError::invalid("body", "must be a JSON object")),
            Err(e) => Err(ApiError::bad_request(format!("the body is not valid JSON: {e}"))),
        }
    }

    pub fn nested(prefix: &str, map: Map<String, Value>) -> Self {
        Self { map, prefix: format!("{prefix}.") }
    }

    pub fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The value of `key`; None when absent or null (LangGraph's SDKs send null for "not set").
    pub fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    pub fn string(&mut self, key: &str) -> Result<Option<String>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::invalid(&self.path(key), "must be a string")),
        }
    }

    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(ApiError::invalid(&self.path(key), "must be true or false")),
        }
    }

    /// A whole number within `min..=max`.
    pub fn integer(&mut self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
                _ => Err(ApiError::invalid(&self.path(key), format!("{n} is out of range: must be a whole number from {min} to {max}"))),
            },
            Some(_) => Err(ApiError::invalid(&self.path(key), format!("must be a whole number from {min} to {max}"))),
        }
    }

    pub fn object(&mut self, key: &str) -> Result<Option<Map<String, Value>>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(map)),
            Some(_) => Err(ApiError::invalid(&self.path(key), "must be an object")),
        }
    }

    /// One of `allowed` (a string).
    pub fn choice(&mut self, key: &str, allowed: &[&str]) -> Result<Option<String>, ApiError> {
        match self.string(key)? {
            None => Ok(None),
            Some(value) if allowed.contains(&value.as_str()) => Ok(Some(value)),
            Some(value) => Err(ApiError::invalid(&self.path(key), format!("`{value}` is not one of {}", allowed.join(", ")))),
        }
    }

    /// Refuses the fields nobody took.
    pub fn finish(self, what: &str) -> Result<(), ApiError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(key) => Err(ApiError::invalid(&self.path(key), format!("is not a field of {what} that Antler knows"))),
        }
    }
}

/// The query string's parameters, in order.
#[derive(Debug, Default)]
pub struct Query(Vec<(String, String)>);

impl Query {
    /// A parameter with an empty value counts as absent: httpx writes a Python `None` as `key=`
    /// (langgraph-sdk's join_stream sends `stream_mode=` when no mode is given).
    pub fn parse(raw: Option<&str>) -> Self {
        Self(raw.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().filter(|(_, v)| !v.is_empty()).collect()).unwrap_or_default())
    }

    pub fn last(&self, key: &str) -> Option<&str> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn all(&self, key: &str) -> Vec<&str> {
        self.0.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
    }

    /// `true`/`false`/`1`/`0` (what httpx writes for Python booleans and the SDKs' `wait=1`).
    pub fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.last(key) {
            None => Ok(None),
            Some("true" | "True" | "1") => Ok(Some(true)),
            Some("false" | "False" | "0") => Ok(Some(false)),
            Some(other) => Err(ApiError::invalid(key, format!("`{other}` is not true or false"))),
        }
    }

    pub fn integer(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        match self.last(key) {
            None => Ok(None),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(ApiError::invalid(key, format!("`{v}` must be a whole number from {min} to {max}"))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_mistyped_fields_are_named() {
        let mut fields = Fields::parse(br#"{"limit": 5000, "offest": 1, "status": 3}"#).expect("an object");
        let limit = fields.integer("limit", 1, 1000);
        assert!(matches!(limit, Err(ref e) if e.param.as_deref() == Some("limit") && e.detail.contains("5000")), "{limit:?}");
        assert!(matches!(fields.string("status"), Err(ref e) if e.param.as_deref() == Some("status")));
        let left = fields.finish("a thread search");
        assert!(matches!(left, Err(ref e) if e.param.as_deref() == Some("offest")), "{left:?}");
    }

    #[test]
    fn bodies_that_are_not_objects_are_refused() {
        assert_eq!(Fields::parse(b"[1]").map(|_| ()).map_err(|e| e.status), Err(axum::http::StatusCode::UNPROCESSABLE_ENTITY));
        assert_eq!(Fields::parse(b"{nope").map(|_| ()).map_err(|e| e.status), Err(axum::http::StatusCode::BAD_REQUEST));
        assert!(Fields::parse(b"").is_ok());
        let mut nested = Fields::nested("config", Map::new());
        nested.map.insert("recursion_limit".to_owned(), Value::String("x".to_owned()));
        let err = nested.integer("recursion_limit", 1, 10);
        assert!(matches!(err, Err(ref e) if e.param.as_deref() == Some("config.recursion_limit")));
    }

    fn chunked(chunks: Vec<usize>) -> Body {
        let stream = futures::stream::iter(chunks.into_iter().map(|n| Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b'x'; n]))));
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn a_discarded_body_is_read_to_its_end_and_bounded_by_the_limit() {
        let none = HeaderMap::new();
        assert_eq!(discard_body(&none, chunked(vec![1000, 24]), 1024).await, Ok(()));
        // Chunked past the limit: 413 naming the setting.
        let over = discard_body(&none, chunked(vec![1000, 25]), 1024).await.expect_err("past the limit");
        assert_eq!(over.status, axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(over.detail.contains("1024 bytes (edge.max_body_bytes)"), "{}", over.detail);
        // A declared length past the limit is refused before a byte is read: this body never ends.
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, axum::http::HeaderValue::from_static("5000"));
        let endless = Body::from_stream(futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>());
        let refused = tokio::time::timeout(std::time::Duration::from_secs(5), discard_body(&declared, endless, 1024))
            .await
            .expect("answered without reading the body");
        assert!(matches!(refused, Err(ref e) if e.detail.contains("5000 bytes")), "{refused:?}");
        // The answer is given only once the body has been read.
        let answer = answer_after_body(&none, chunked(vec![10; 10]), 1024, ApiError::unsupported_endpoint("x")).await;
        assert_eq!(answer.status, axum::http::StatusCode::NOT_IMPLEMENTED);
        let refused = answer_after_body(&none, chunked(vec![2048]), 1024, ApiError::unsupported_endpoint("x")).await;
        assert_eq!(refused.status, axum::http::StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[test]
    fn query_booleans_read_httpx_and_sdk_spellings() {
        let query = Query::parse(Some("wait=1&cancel_on_disconnect=false&stream_mode=values&stream_mode=updates"));
        assert_eq!(query.bool("wait").ok().flatten(), Some(true));
        assert_eq!(query.bool("cancel_on_disconnect").ok().flatten(), Some(false));
        assert_eq!(query.all("stream_mode"), vec!["values", "updates"]);
        assert!(Query::parse(Some("wait=maybe")).bool("wait").is_err());
        assert!(Query::parse(Some("stream_mode=&wait=1")).all("stream_mode").is_empty());
    }
}
