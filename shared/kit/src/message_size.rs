//! tonic's own codec refusals, answered with the codes the gRPC spec and clients expect.
//!
//! - Oversized messages answer RESOURCE_EXHAUSTED, as the gRPC spec asks, with the limit named.
//!   tonic's codec reports a request over `max_decoding_message_size` as OUT_OF_RANGE; clients (and
//!   grpc-go / grpc-java servers) expect RESOURCE_EXHAUSTED.
//! - A request that is not a valid protobuf message of the method's type answers INVALID_ARGUMENT:
//!   tonic-prost maps every decode failure to INTERNAL, which tells a client the server is at fault
//!   and invites a retry that will fail the same way. On the server side a decode failure can only be
//!   the request's (a client's codec decoding a bad *response* is another matter, which is why this
//!   is a server layer and not a codec of our own, which both sides would share).
//!
//! For unary and server-streaming calls the refusal is a trailers-only response, so rewriting its
//! head is enough. A client stream whose later message is too large or malformed still sees tonic's
//! code in the trailers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};

const TONIC_PREFIX: &str = "Error, decoded message length too large";
/// How prost's `DecodeError` starts its text (tonic-prost puts it in the INTERNAL status as it is).
const DECODE_PREFIX: &str = "failed to decode Protobuf message";

/// Tower layer rewriting tonic's size refusal.
#[derive(Clone, Copy, Debug)]
pub struct MessageSizeLayer {
    limit: usize,
}

impl MessageSizeLayer {
    pub fn new(limit: usize) -> Self {
        Self { limit }
    }
}

impl<S> tower_layer::Layer<S> for MessageSizeLayer {
    type Service = MessageSizeService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        MessageSizeService { inner, limit: self.limit }
    }
}

/// See [`MessageSizeLayer`].
#[derive(Clone, Debug)]
pub struct MessageSizeService<S> {
    inner: S,
    limit: usize,
}

pin_project_lite::pin_project! {
    /// Rewrites the response head once the inner future resolves.
    pub struct RewriteFuture<F> {
        #[pin]
        inner: F,
        limit: usize,
    }
}

impl<F, B, E> Future for RewriteFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let limit = *this.limit;
        this.inner.poll(cx).map_ok(|mut response| {
            rewrite(response.headers_mut(), limit);
            rewrite_decode_failure(response.headers_mut());
            response
        })
    }
}

fn rewrite(headers: &mut http::HeaderMap, limit: usize) {
    if headers.get("grpc-status").map(HeaderValue::as_bytes) != Some(b"11") {
        return;
    }
    let Some(message) = headers.get("grpc-message").and_then(|v| v.to_str().ok()) else { return };
    // grpc-message is percent-encoded; the prefix has only spaces and commas to worry about.
    let decoded = message.replace("%20", " ").replace("%2C", ",");
    if !decoded.starts_with(TONIC_PREFIX) {
        return;
    }
    let size = decoded.split("found ").nth(1).and_then(|s| s.split(' ').next()).unwrap_or("?");
    let text = format!("request message is {size} bytes; the limit is {limit} bytes (server.max_message_bytes)");
    headers.insert("grpc-status", HeaderValue::from_static("8"));
    if let Ok(value) = HeaderValue::from_str(&text.replace(' ', "%20").replace(';', "%3B")) {
        headers.insert("grpc-message", value);
    }
    metrics::counter!("antler_requests_too_large_total").increment(1);
}

fn rewrite_decode_failure(headers: &mut http::HeaderMap) {
    if headers.get("grpc-status").map(HeaderValue::as_bytes) != Some(b"13") {
        return;
    }
    let Some(status) = tonic::Status::from_header_map(headers) else { return };
    let Some(detail) = status.message().strip_prefix(DECODE_PREFIX) else { return };
    let detail = detail.trim_start_matches(':').trim();
    let refusal = tonic::Status::invalid_argument(format!(
        "the request is not a valid protobuf message for this method ({detail})\nhint: the client's .proto files may not match \
         the server's: compare them with `grpcurl describe`, or regenerate the stubs from proto/"
    ));
    // Only fails for a message that cannot be a header value, which this one can always be.
    let _ = refusal.add_header(headers);
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for MessageSizeService<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = RewriteFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        RewriteFuture { inner: self.inner.call(request), limit: self.limit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonic_size_refusals_become_resource_exhausted() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("11"));
        headers.insert(
            "grpc-message",
            HeaderValue::from_static(
                "Error,%20decoded%20message%20length%20too%20large:%20found%208195%20bytes,%20the%20limit%20is:%202048%20bytes",
            ),
        );
        rewrite(&mut headers, 2048);
        assert_eq!(headers.get("grpc-status").map(HeaderValue::as_bytes), Some(&b"8"[..]));
        let message = headers.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(message.contains("8195") && message.contains("2048"), "{message}");
    }

    #[test]
    fn tonic_decode_failures_become_invalid_argument() {
        let mut headers = http::HeaderMap::new();
        // What tonic-prost answers for bytes that are no protobuf message: a field with wire type 7.
        let Err(decode) = <prost_types::Duration as prost::Message>::decode(&[0x0f_u8, 0x00][..]) else {
            panic!("0x0f is wire type 7, which does not exist")
        };
        let _ = tonic::Status::internal(decode.to_string()).add_header(&mut headers);
        rewrite_decode_failure(&mut headers);
        let status = tonic::Status::from_header_map(&headers).unwrap_or_else(|| tonic::Status::unknown("no status"));
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("wire type") && status.message().contains("hint:"), "{status:?}");

        // Any other INTERNAL stays what it is: the server's own fault.
        let mut headers = http::HeaderMap::new();
        let _ = tonic::Status::internal("database is corrupt").add_header(&mut headers);
        rewrite_decode_failure(&mut headers);
        assert_eq!(tonic::Status::from_header_map(&headers).map(|s| s.code()), Some(tonic::Code::Internal));
    }

    #[test]
    fn other_out_of_range_errors_are_left_alone() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("11"));
        headers.insert("grpc-message", HeaderValue::from_static("page_token%20out%20of%20range"));
        rewrite(&mut headers, 2048);
        assert_eq!(headers.get("grpc-status").map(HeaderValue::as_bytes), Some(&b"11"[..]));
    }
}
