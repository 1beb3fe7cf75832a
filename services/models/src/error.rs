//! Everything a model call can fail with, and the one place where that becomes a `tonic::Status`.
//!
//! | failure | gRPC code |
//! |---|---|
//! | unknown model name | NOT_FOUND (lists the configured names) |
//! | bad request field, upstream HTTP 400/413/422 | INVALID_ARGUMENT (upstream message kept) |
//! | upstream HTTP 401/403 | FAILED_PRECONDITION (names the model and the key variable, never the key) |
//! | upstream HTTP 404 | NOT_FOUND |
//! | upstream 429 after every retry, local concurrency cap | RESOURCE_EXHAUSTED + `retry-after` |
//! | upstream 5xx/408/409/425, connect error, timeout, broken stream | UNAVAILABLE + `retry-after` |
//! | malformed upstream chunk | INTERNAL (offending line cut to 200 chars) |
//! | replay script cannot answer | FAILED_PRECONDITION |

use std::time::Duration;

use tonic::{Code, Status};

/// Longest provider message carried into a status.
const MAX_UPSTREAM_MESSAGE: usize = 500;
/// Longest malformed line quoted in an INTERNAL status.
pub const MAX_QUOTED_LINE: usize = 200;

/// What kind of upstream failure happened; decides retrying and the status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamKind {
    /// HTTP 400/413/422: the request itself is wrong (e.g. context overflow).
    BadRequest,
    /// HTTP 401/403: the configured credentials were refused.
    Auth,
    /// HTTP 404: unknown upstream model or endpoint.
    NotFound,
    /// HTTP 429.
    RateLimited,
    /// HTTP 5xx, 408, 409, 425, or an overload error event.
    Unavailable,
    /// Other 4xx answers: not retryable, not the caller's fault.
    Refused,
    /// The connection could not be established.
    Connect,
    /// No status line within the first-byte timeout.
    FirstByteTimeout,
    /// No stream event within the inter-chunk timeout.
    ChunkTimeout,
    /// The connection broke or the stream ended before the response was complete.
    Broken,
    /// The upstream sent bytes that are not its protocol.
    Malformed,
}

/// An upstream failure. `model` is filled in by the gateway, so providers need not know their name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct UpstreamError {
    pub kind: UpstreamKind,
    /// Configured model name.
    pub model: String,
    /// HTTP status, 0 when there was none.
    pub status: u16,
    /// What failed, with the provider's message when it gave one.
    pub message: String,
    /// How long the upstream asked us to wait (`Retry-After`).
    pub retry_after: Option<Duration>,
    /// Where the model's key comes from (`$OPENAI_API_KEY`), for credential errors.
    pub key_source: String,
}

impl UpstreamError {
    pub fn new(kind: UpstreamKind, message: impl Into<String>) -> Self {
        Self { kind, model: String::new(), status: 0, message: message.into(), retry_after: None, key_source: String::new() }
    }

    /// Classifies an HTTP error answer.
    pub fn from_status(status: u16, message: impl Into<String>, retry_after: Option<Duration>) -> Self {
        let kind = match status {
            400 | 413 | 422 => UpstreamKind::BadRequest,
            401 | 403 => UpstreamKind::Auth,
            404 => UpstreamKind::NotFound,
            429 => UpstreamKind::RateLimited,
            408 | 409 | 425 | 500..=599 => UpstreamKind::Unavailable,
            _ => UpstreamKind::Refused,
        };
        // Redacted before it is cut, so a cut cannot leave half a key that no longer matches.
        let mut message = antler_kit::redact::redact(&message.into()).into_owned();
        truncate(&mut message, MAX_UPSTREAM_MESSAGE);
        Self { kind, model: String::new(), status, message, retry_after, key_source: String::new() }
    }

    /// A chunk that is not the provider's protocol; the line is quoted, cut to 200 characters.
    pub fn malformed(what: &str, line: &str) -> Self {
        let mut quoted = antler_kit::redact::redact(line).into_owned();
        truncate(&mut quoted, MAX_QUOTED_LINE);
        Self::new(UpstreamKind::Malformed, format!("{what}: {quoted:?}"))
    }

    /// Worth another attempt (DeerFlow's retry set: 408/409/425/429/5xx, plus connection problems).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            UpstreamKind::RateLimited
                | UpstreamKind::Unavailable
                | UpstreamKind::Connect
                | UpstreamKind::FirstByteTimeout
                | UpstreamKind::ChunkTimeout
                | UpstreamKind::Broken
        )
    }

    /// Bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            UpstreamKind::BadRequest => "bad_request",
            UpstreamKind::Auth => "auth",
            UpstreamKind::NotFound => "not_found",
            UpstreamKind::RateLimited => "rate_limited",
            UpstreamKind::Unavailable => "unavailable",
            UpstreamKind::Refused => "refused",
            UpstreamKind::Connect => "connect",
            UpstreamKind::FirstByteTimeout => "first_byte_timeout",
            UpstreamKind::ChunkTimeout => "chunk_timeout",
            UpstreamKind::Broken => "broken",
            UpstreamKind::Malformed => "malformed",
        }
    }

    fn describe(&self) -> String {
        let model = &self.model;
        let http = if self.status > 0 { format!("HTTP {}: ", self.status) } else { String::new() };
        let message = &self.message;
        match self.kind {
            UpstreamKind::BadRequest => format!("model `{model}`: the upstream refused the request ({http}{message})"),
            UpstreamKind::Auth => {
                let source = if self.key_source.is_empty() { "its api_key".to_owned() } else { self.key_source.clone() };
                format!(
                    "model `{model}`: the upstream rejected the configured credentials ({http}{message})\nhint: check the API \
                     key in {source}"
                )
            }
            UpstreamKind::NotFound => format!(
                "model `{model}`: the upstream does not know the model or endpoint ({http}{message})\nhint: check the \
                 entry's `model` and `base_url`"
            ),
            UpstreamKind::RateLimited => format!("model `{model}` is rate limited by its upstream ({http}{message})"),
            UpstreamKind::Unavailable => format!("model `{model}`: the upstream failed ({http}{message})"),
            UpstreamKind::Refused => format!("model `{model}`: the upstream refused the request ({http}{message})"),
            UpstreamKind::Connect => format!("model `{model}`: cannot connect to the upstream: {message}"),
            UpstreamKind::FirstByteTimeout => format!("model `{model}`: the upstream did not answer in time: {message}"),
            UpstreamKind::ChunkTimeout => format!("model `{model}`: the upstream stream stalled: {message}"),
            UpstreamKind::Broken => format!("model `{model}`: the upstream stream broke: {message}"),
            UpstreamKind::Malformed => format!("model `{model}`: the upstream sent a malformed chunk: {message}"),
        }
    }
}

/// A failed model call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("model `{name}` is not configured\nhint: configured models are {}", list(known))]
    UnknownModel { name: String, known: Vec<String> },
    #[error("no model is configured\nhint: add entries under `models:` in antler.yaml")]
    NoModels,
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error(
        "model `{model}` already has {limit} requests in flight (its max_concurrency), and no fallback could take this one\nhint: retry after {}s",
        retry_after.as_secs().max(1)
    )]
    Busy { model: String, limit: u32, retry_after: Duration },
    #[error("replay model `{model}`: {message}")]
    Replay { model: String, message: String },
    #[error("the call was cancelled by the client")]
    Cancelled,
    /// Another Antler service refused or failed (e.g. the sandbox holding an image); its code is kept.
    #[error("{field}: {message}")]
    Dependency { field: String, code: Code, message: String },
    #[error("the models service is shutting down\nhint: retry; another replica or the restarted service will answer")]
    ShuttingDown,
}

fn list(names: &[String]) -> String {
    if names.is_empty() { "(none)".to_owned() } else { names.join(", ") }
}

impl ModelError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument { field: field.into(), message: message.into() }
    }

    /// The gRPC code this failure maps to.
    pub fn code(&self) -> Code {
        match self {
            Self::UnknownModel { .. } => Code::NotFound,
            Self::NoModels | Self::Replay { .. } => Code::FailedPrecondition,
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::Busy { .. } => Code::ResourceExhausted,
            Self::ShuttingDown => Code::Unavailable,
            Self::Cancelled => Code::Cancelled,
            Self::Dependency { code, .. } => *code,
            Self::Upstream(e) => match e.kind {
                UpstreamKind::BadRequest => Code::InvalidArgument,
                UpstreamKind::Auth | UpstreamKind::Refused => Code::FailedPrecondition,
                UpstreamKind::NotFound => Code::NotFound,
                UpstreamKind::RateLimited => Code::ResourceExhausted,
                UpstreamKind::Unavailable
                | UpstreamKind::Connect
                | UpstreamKind::FirstByteTimeout
                | UpstreamKind::ChunkTimeout
                | UpstreamKind::Broken => Code::Unavailable,
                UpstreamKind::Malformed => Code::Internal,
            },
        }
    }

    /// Seconds a client should wait before retrying, for the codes that carry `retry-after`.
    pub fn retry_after_secs(&self) -> Option<u64> {
        let ceil = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
        match self {
            Self::Busy { retry_after, .. } => Some(ceil(*retry_after).max(1)),
            Self::ShuttingDown => Some(1),
            Self::Dependency { code: Code::Unavailable | Code::ResourceExhausted, .. } => Some(1),
            Self::Upstream(e) => match self.code() {
                Code::ResourceExhausted | Code::Unavailable => Some(e.retry_after.map(ceil).unwrap_or(1).max(1)),
                _ => None,
            },
            _ => None,
        }
    }

    /// True when retrying the same request later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self.code(), Code::Unavailable | Code::ResourceExhausted)
    }

    /// The upstream's HTTP status, 0 when none.
    pub fn upstream_status(&self) -> u16 {
        match self {
            Self::Upstream(e) => e.status,
            _ => 0,
        }
    }
}

impl ModelError {
    /// The message a client may see (in a status or in `ChatError.message`): every registered secret
    /// redacted, whatever the upstream put in its error text.
    pub fn public_message(&self) -> String {
        antler_kit::redact::redact(&self.to_string()).into_owned()
    }
}

impl From<ModelError> for Status {
    fn from(error: ModelError) -> Self {
        let mut status = Status::new(error.code(), error.public_message());
        if let Some(secs) = error.retry_after_secs()
            && let Ok(value) = secs.to_string().parse()
        {
            status.metadata_mut().insert("retry-after", value);
        }
        status
    }
}

/// The canonical upper-case name of a code, as `ChatError.code` carries it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Cuts `text` to at most `max` characters (on a character boundary), marking the cut.
pub fn truncate(text: &mut String, max: usize) {
    if let Some((index, _)) = text.char_indices().nth(max) {
        text.truncate(index);
        text.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(status: u16, message: &str) -> ModelError {
        let mut e = UpstreamError::from_status(status, message, Some(Duration::from_millis(2500)));
        e.model = "gpt".into();
        e.key_source = "$OPENAI_API_KEY".into();
        ModelError::Upstream(e)
    }

    #[test]
    fn http_statuses_map_to_the_documented_codes() {
        let cases = [
            (400, Code::InvalidArgument),
            (401, Code::FailedPrecondition),
            (403, Code::FailedPrecondition),
            (404, Code::NotFound),
            (429, Code::ResourceExhausted),
            (500, Code::Unavailable),
            (503, Code::Unavailable),
            (408, Code::Unavailable),
        ];
        for (http, code) in cases {
            assert_eq!(Status::from(upstream(http, "x")).code(), code, "HTTP {http}");
        }
    }

    #[test]
    fn credential_errors_name_the_variable_not_the_key() {
        let status = Status::from(upstream(401, "Incorrect API key provided: sk-abc"));
        assert!(status.message().contains("$OPENAI_API_KEY") && status.message().contains("`gpt`"), "{}", status.message());
    }

    #[test]
    fn rate_limits_carry_retry_after_rounded_up() {
        let status = Status::from(upstream(429, "slow down"));
        assert_eq!(antler_kit::status::retry_after(&status), Some(3));
    }

    #[test]
    fn malformed_lines_are_cut_to_200_characters() {
        let line = "x".repeat(1000);
        let e = UpstreamError::malformed("not JSON", &line);
        assert!(e.message.len() < 260, "{}", e.message.len());
        assert_eq!(ModelError::Upstream(e).code(), Code::Internal);
    }

    #[test]
    fn unknown_models_list_the_valid_names() {
        let status = Status::from(ModelError::UnknownModel { name: "gpt5".into(), known: vec!["a".into(), "b".into()] });
        assert_eq!(status.code(), Code::NotFound);
        assert!(status.message().contains("a, b"), "{}", status.message());
    }
}
