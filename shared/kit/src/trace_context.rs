//! W3C trace context (`traceparent`) in gRPC metadata, and one tracing span per request.
//!
//! Each request gets a span carrying the trace id it arrived with (or a new one) and a fresh span id;
//! the [`TraceContext`] in the request extensions lets outbound calls continue the same trace
//! (see [`crate::client`]). With OTLP export on (see [`crate::otel`]), the span continues the caller's
//! trace and the context names the exported span, so the ids in logs and in the collector agree.

use std::fmt;
use std::task::{Context, Poll};

use http::Request;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing::Instrument;
use tracing::instrument::Instrumented;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Metadata key of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The trace position of one request as seen by this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: u128,
    /// This server's span for the request; downstream calls name it as their parent.
    pub span_id: u64,
    /// The caller's span, when the request carried a `traceparent`.
    pub parent_span_id: Option<u64>,
    pub sampled: bool,
}

impl TraceContext {
    /// A new root context (no caller trace).
    pub fn new_root() -> Self {
        Self { trace_id: nonzero_u128(), span_id: nonzero_u64(), parent_span_id: None, sampled: true }
    }

    /// The current `tracing` span's place in its exported trace, for work that is not serving a
    /// request (a run's worker): calls made inside a run's span join the run's trace. A new root when
    /// spans are not exported or there is no current span.
    pub fn current() -> Self {
        of_span(&tracing::Span::current()).unwrap_or_else(Self::new_root)
    }

    /// Continues the trace of an incoming `traceparent` value, or starts a new one if it is absent or
    /// invalid (an invalid header must not fail the request).
    pub fn from_traceparent(header: Option<&str>) -> Self {
        match header.and_then(parse_traceparent) {
            Some((trace_id, parent, flags)) => {
                Self { trace_id, span_id: nonzero_u64(), parent_span_id: Some(parent), sampled: flags & 1 == 1 }
            }
            None => Self::new_root(),
        }
    }

    /// The `traceparent` value for a call made from within this request.
    pub fn to_traceparent(&self) -> String {
        format!("00-{:032x}-{:016x}-{:02x}", self.trace_id, self.span_id, u8::from(self.sampled))
    }

    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_traceparent())
    }
}

fn nonzero_u128() -> u128 {
    fastrand::u128(1..)
}

fn nonzero_u64() -> u64 {
    fastrand::u64(1..)
}

/// Parses `00-<32 hex>-<16 hex>-<2 hex>`; all-zero ids are invalid per the spec.
fn parse_traceparent(value: &str) -> Option<(u128, u64, u8)> {
    let mut parts = value.trim().split('-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let parent = parts.next()?;
    let flags = parts.next()?;
    if version.len() != 2 || version == "ff" || trace.len() != 32 || parent.len() != 16 || flags.len() != 2 {
        return None;
    }
    // Version 00 has exactly four fields; later versions may append more.
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let is_lower_hex = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ![version, trace, parent, flags].iter().all(|s| is_lower_hex(s)) {
        return None;
    }
    let trace_id = u128::from_str_radix(trace, 16).ok().filter(|v| *v != 0)?;
    let parent_id = u64::from_str_radix(parent, 16).ok().filter(|v| *v != 0)?;
    Some((trace_id, parent_id, u8::from_str_radix(flags, 16).ok()?))
}

/// Tower layer: a span per request, and the [`TraceContext`] in the request extensions.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceLayer;

impl<S> tower_layer::Layer<S> for TraceLayer {
    type Service = TraceService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        TraceService { inner }
    }
}

/// See [`TraceLayer`].
#[derive(Clone, Debug)]
pub struct TraceService<S> {
    inner: S,
}

impl<S, B> tower_service::Service<Request<B>> for TraceService<S>
where
    S: tower_service::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let header = request.headers().get(TRACEPARENT).and_then(|v| v.to_str().ok());
        let incoming = TraceContext::from_traceparent(header);
        let (service, method) = split_path(request.uri().path());
        // A root in this process: the caller's trace is its parent, not whatever span the
        // connection's task happens to be in.
        let span = tracing::info_span!(
            parent: None,
            "rpc",
            rpc.service = service,
            rpc.method = method,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
            parent_span_id = incoming.parent_span_id.map(|p| tracing::field::display(format!("{p:016x}"))),
        );
        let context = continue_in(&span, incoming);
        span.record("trace_id", tracing::field::display(format_args!("{:032x}", context.trace_id)));
        span.record("span_id", tracing::field::display(format_args!("{:016x}", context.span_id)));
        request.extensions_mut().insert(context);
        let future = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        future.instrument(span)
    }
}

fn split_path(path: &str) -> (&str, &str) {
    let path = path.trim_start_matches('/');
    path.split_once('/').unwrap_or((path, ""))
}

// The bridge to OpenTelemetry's span ids: with export on ([`crate::otel`]) a request's span continues
// the caller's trace and the context names the exported span; with export off no OpenTelemetry layer
// is installed and these keep the kit's own ids.

/// Makes `span` (not yet entered) continue `incoming`'s trace when it came from a caller, and returns
/// the context outbound calls should carry: `span`'s own ids when it is exported, `incoming` otherwise.
pub fn continue_in(span: &tracing::Span, incoming: TraceContext) -> TraceContext {
    if let Some(parent) = incoming.parent_span_id {
        let flags = if incoming.sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        let remote = SpanContext::new(
            TraceId::from_bytes(incoming.trace_id.to_be_bytes()),
            SpanId::from_bytes(parent.to_be_bytes()),
            flags,
            true,
            TraceState::default(),
        );
        // Fails only when no OpenTelemetry layer is installed, which is the export-off case.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
    match of_span(span) {
        Some(own) => TraceContext { parent_span_id: incoming.parent_span_id, ..own },
        None => incoming,
    }
}

/// The exported span's ids, when `span` is exported.
pub fn of_span(span: &tracing::Span) -> Option<TraceContext> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| TraceContext {
        trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
        span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
        parent_span_id: None,
        sampled: sc.is_sampled(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_is_continued() {
        let ctx = TraceContext::from_traceparent(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert_eq!(ctx.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.parent_span_id, Some(0x00f0_67aa_0ba9_02b7));
        assert!(ctx.sampled);
        assert_ne!(ctx.span_id, 0x00f0_67aa_0ba9_02b7, "the server opens its own span");
        let out = ctx.to_traceparent();
        assert!(out.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "{out}");
        assert!(out.ends_with("-01"));
    }

    #[test]
    fn invalid_traceparents_start_a_new_trace() {
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "garbage",
        ] {
            let ctx = TraceContext::from_traceparent(Some(bad));
            assert_eq!(ctx.parent_span_id, None, "accepted {bad:?}");
        }
    }

    #[test]
    fn a_rendered_traceparent_parses_back() {
        let ctx = TraceContext::new_root();
        let parsed = parse_traceparent(&ctx.to_traceparent());
        assert_eq!(parsed, Some((ctx.trace_id, ctx.span_id, 1)));
    }
}
