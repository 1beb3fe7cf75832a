//! Oversized messages answer RESOURCE_EXHAUSTED, as the gRPC spec asks, with the limit named.
//!
//! tonic's codec reports a request over `max_decoding_message_size` as OUT_OF_RANGE; clients (and
//! grpc-go / grpc-java servers) expect RESOURCE_EXHAUSTED. For unary and server-streaming calls the
//! refusal is a trailers-only response, so rewriting its head is enough. A client stream whose later
//! message is too large still sees tonic's OUT_OF_RANGE in the trailers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};

const TONIC_PREFIX: &str = "Error, decoded message length too large";

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
    fn other_out_of_range_errors_are_left_alone() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("11"));
        headers.insert("grpc-message", HeaderValue::from_static("page_token%20out%20of%20range"));
        rewrite(&mut headers, 2048);
        assert_eq!(headers.get("grpc-status").map(HeaderValue::as_bytes), Some(&b"11"[..]));
    }
}
