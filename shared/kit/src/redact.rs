//! Keeping credentials out of everything that leaves the process.
//!
//! One registry per process holds every secret value the process knows: configured ones (API keys,
//! JWT secrets, service tokens, provider keys — registered whenever a configuration is loaded, see
//! [`crate::config::Config::load`]) and ones that live for a while (a run's `secrets`, OAuth access
//! tokens — registered with a [`Secret`] guard that forgets them on drop). [`redact`] replaces every
//! occurrence of any of them, by value, with `[redacted]`.
//!
//! Redaction happens where text leaves the process, not in the code that produced it, so a new
//! provider or error path cannot forget it: the server's [`RedactLayer`] rewrites every gRPC status
//! message (unary and streaming), the log writer ([`crate::telemetry`]) every log line, and services
//! pass what they store or stream (run errors, events) through [`redact`] at their one write path.
//!
//! Values shorter than [`MIN_SECRET_CHARS`] are not registered: redacting "abc" everywhere would
//! mangle ordinary text and protects nothing (such a key is not a secret).

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::task::{Context, Poll};

use aho_corasick::AhoCorasick;
use http::{HeaderMap, HeaderValue};

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";
/// Shorter values are never treated as secrets.
pub const MIN_SECRET_CHARS: usize = 8;

#[derive(Default)]
struct Registry {
    /// Value → how many holders registered it (`usize::MAX`: for the life of the process).
    values: HashMap<String, usize>,
    /// Built lazily from `values` at the next redaction after a change.
    matcher: Option<Arc<AhoCorasick>>,
    dirty: bool,
}

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(Default::default);
/// True while at least one value is registered: lets [`redact`] skip the lock on the common path.
static ANY: AtomicBool = AtomicBool::new(false);

fn registry_write() -> std::sync::RwLockWriteGuard<'static, Registry> {
    REGISTRY.write().unwrap_or_else(|p| p.into_inner())
}

/// Registers `value` for the rest of the process's life (configured credentials). A rotated key's
/// old value stays registered, which is what one wants: it may still sit in an upstream's error text.
pub fn register_static(value: &str) {
    if value.chars().count() < MIN_SECRET_CHARS {
        return;
    }
    let mut registry = registry_write();
    let count = registry.values.entry(value.to_owned()).or_insert(0);
    let new = *count == 0;
    *count = usize::MAX;
    registry.dirty |= new;
    ANY.store(true, Ordering::Release);
}

/// Registers `value` until the returned guard is dropped (a run's secrets, an OAuth token).
#[must_use = "the value is forgotten as soon as the guard is dropped"]
pub fn register(value: &str) -> Secret {
    if value.chars().count() < MIN_SECRET_CHARS {
        return Secret { value: None };
    }
    let mut registry = registry_write();
    let count = registry.values.entry(value.to_owned()).or_insert(0);
    let new = *count == 0;
    // usize::MAX marks a value registered for good: a guard neither adds nor removes it.
    if *count != usize::MAX {
        *count += 1;
    }
    registry.dirty |= new;
    ANY.store(true, Ordering::Release);
    Secret { value: Some(value.to_owned()) }
}

/// Keeps a value registered while it lives; see [`register`].
#[derive(Debug)]
pub struct Secret {
    value: Option<String>,
}

impl Drop for Secret {
    fn drop(&mut self) {
        let Some(value) = self.value.take() else { return };
        let mut registry = registry_write();
        let Some(count) = registry.values.get_mut(&value) else { return };
        if *count == usize::MAX {
            return;
        }
        *count -= 1;
        if *count == 0 {
            registry.values.remove(&value);
            registry.dirty = true;
            if registry.values.is_empty() {
                ANY.store(false, Ordering::Release);
            }
        }
    }
}

fn matcher() -> Option<Arc<AhoCorasick>> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    {
        let registry = REGISTRY.read().unwrap_or_else(|p| p.into_inner());
        if !registry.dirty {
            return registry.matcher.clone();
        }
    }
    let mut registry = registry_write();
    if registry.dirty {
        // Longest first, so a secret that contains another is replaced whole.
        let mut values: Vec<&String> = registry.values.keys().collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        registry.matcher = if values.is_empty() {
            None
        } else {
            AhoCorasick::builder().match_kind(aho_corasick::MatchKind::LeftmostLongest).build(values).ok().map(Arc::new)
        };
        registry.dirty = false;
    }
    registry.matcher.clone()
}

/// `text` with every registered secret replaced by `[redacted]` (borrowed when there was none).
pub fn redact(text: &str) -> Cow<'_, str> {
    let Some(matcher) = matcher() else { return Cow::Borrowed(text) };
    if !matcher.is_match(text) {
        return Cow::Borrowed(text);
    }
    let replacements = vec![REDACTED; matcher.patterns_len()];
    Cow::Owned(matcher.replace_all(text, &replacements))
}

/// Redacts `text` in place; returns whether anything was replaced.
pub fn redact_in_place(text: &mut String) -> bool {
    match redact(text) {
        Cow::Borrowed(_) => false,
        Cow::Owned(clean) => {
            *text = clean;
            true
        }
    }
}

/// Redacts raw bytes (a formatted log line); borrowed when there was nothing to replace.
pub fn redact_bytes(bytes: &[u8]) -> Cow<'_, [u8]> {
    let Some(matcher) = matcher() else { return Cow::Borrowed(bytes) };
    if !matcher.is_match(bytes) {
        return Cow::Borrowed(bytes);
    }
    let replacements = vec![REDACTED.as_bytes(); matcher.patterns_len()];
    Cow::Owned(matcher.replace_all_bytes(bytes, &replacements))
}

/// Whether `text` contains a registered secret.
pub fn contains_secret(text: &str) -> bool {
    matcher().is_some_and(|m| m.is_match(text))
}

/// `message` with every registered secret redacted from each of its strings, however deeply nested
/// (`Struct` values, repeated messages, oneofs), without knowing its schema: a secret inside a string
/// field appears verbatim in the encoding, so a scan of the encoded bytes finds it, and only then is
/// the wire format rewritten (see [`redact_wire`]). None when there was nothing to redact, which is
/// the common case and costs one scan.
pub fn redact_message<M: prost::Message + Default>(message: &M) -> Option<M> {
    let matcher = matcher()?;
    let bytes = message.encode_to_vec();
    if !matcher.is_match(&bytes) {
        return None;
    }
    M::decode(redact_wire(&matcher, &bytes).as_slice()).ok()
}

/// Redacts `message` in place; returns whether anything was replaced.
pub fn redact_message_in_place<M: prost::Message + Default>(message: &mut M) -> bool {
    match redact_message(message) {
        Some(clean) => {
            *message = clean;
            true
        }
        None => false,
    }
}

/// Rewrites an encoded protobuf message so that no length-delimited leaf contains a secret.
///
/// Written by hand because no protobuf crate rewrites unknown-schema messages: each length-delimited
/// field whose bytes contain a secret is first tried as a nested message (recursively); when that
/// parse fails, or leaves a secret behind (a string that merely looked like a message), it is treated
/// as text and the secrets in it are replaced. Lengths are re-encoded. A payload that is not valid
/// protobuf at all is redacted as text.
fn redact_wire(matcher: &AhoCorasick, bytes: &[u8]) -> Vec<u8> {
    redact_fields(matcher, bytes, 0).unwrap_or_else(|| redact_text_bytes(matcher, bytes))
}

/// Nested messages deeper than this are treated as text (protobuf's own default recursion limit).
const MAX_DEPTH: usize = 100;

fn redact_text_bytes(matcher: &AhoCorasick, bytes: &[u8]) -> Vec<u8> {
    let replacements = vec![REDACTED.as_bytes(); matcher.patterns_len()];
    matcher.replace_all_bytes(bytes, &replacements)
}

/// The fields of `bytes` with secrets redacted, or None if `bytes` is not a well-formed message.
fn redact_fields(matcher: &AhoCorasick, mut bytes: &[u8], depth: usize) -> Option<Vec<u8>> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    while !bytes.is_empty() {
        let (key, used) = read_varint(bytes)?;
        let field_number = key >> 3;
        if field_number == 0 {
            return None;
        }
        out.extend_from_slice(&bytes[..used]);
        bytes = &bytes[used..];
        match key & 7 {
            0 => {
                let (_, used) = read_varint(bytes)?;
                out.extend_from_slice(&bytes[..used]);
                bytes = &bytes[used..];
            }
            1 | 5 => {
                let width = if key & 7 == 1 { 8 } else { 4 };
                out.extend_from_slice(bytes.get(..width)?);
                bytes = &bytes[width..];
            }
            2 => {
                let (len, used) = read_varint(bytes)?;
                let len = usize::try_from(len).ok()?;
                let payload = bytes.get(used..used.checked_add(len)?)?;
                bytes = &bytes[used + len..];
                let clean = if !matcher.is_match(payload) {
                    payload.to_vec()
                } else {
                    match redact_fields(matcher, payload, depth + 1) {
                        Some(nested) if !matcher.is_match(&nested) => nested,
                        _ => redact_text_bytes(matcher, payload),
                    }
                };
                write_varint(&mut out, clean.len() as u64);
                out.extend_from_slice(&clean);
            }
            // Groups (3, 4) are not used by proto3; 6 and 7 do not exist.
            _ => return None,
        }
    }
    Some(out)
}

fn read_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Tower layer: every gRPC status message this server sends — in a trailers-only response (unary
/// errors, streams refused before their first message) or in the trailers after a stream — is
/// redacted. Outermost in the server stack, so refusals by the other layers are covered too.
#[derive(Clone, Copy, Debug, Default)]
pub struct RedactLayer;

impl<S> tower_layer::Layer<S> for RedactLayer {
    type Service = RedactService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RedactService { inner }
    }
}

/// See [`RedactLayer`].
#[derive(Clone, Debug)]
pub struct RedactService<S> {
    inner: S,
}

impl<S, ReqBody> tower_service::Service<http::Request<ReqBody>> for RedactService<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let future = self.inner.call(request);
        Box::pin(async move {
            let response = future.await?;
            let (mut parts, body) = response.into_parts();
            redact_status_headers(&mut parts.headers);
            Ok(http::Response::from_parts(parts, tonic::body::Body::new(RedactTrailers { inner: body })))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body whose trailers (where a stream's final status travels) are redacted.
    struct RedactTrailers {
        #[pin]
        inner: tonic::body::Body,
    }
}

impl http_body::Body for RedactTrailers {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame.map(|frame| match frame.into_trailers() {
                    Ok(mut trailers) => {
                        redact_status_headers(&mut trailers);
                        http_body::Frame::trailers(trailers)
                    }
                    Err(frame) => frame,
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Redacts `grpc-message` (percent-encoded, as the gRPC spec says) in a header map.
fn redact_status_headers(headers: &mut HeaderMap) {
    if matcher().is_none() {
        return;
    }
    let Some(message) = headers.get("grpc-message") else { return };
    let decoded = percent_decode(message.as_bytes());
    let text = String::from_utf8_lossy(&decoded);
    if let Cow::Owned(clean) = redact(&text)
        && let Ok(value) = HeaderValue::from_str(&percent_encode(&clean))
    {
        headers.insert("grpc-message", value);
    }
}

/// `%XX` → byte; anything else as it is (a malformed escape is kept literally).
fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex_value(bytes[i + 1]), hex_value(bytes[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

fn hex_value(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// The gRPC spec's encoding of grpc-message: printable ASCII except `%` as is, the rest `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // The registry is process-wide: each test uses values no other test registers.

    #[test]
    fn registered_values_are_replaced_wherever_they_appear() {
        register_static("sk-test-static-0123456789");
        let text = "Incorrect API key provided: sk-test-static-0123456789. Check it.";
        assert_eq!(redact(text), "Incorrect API key provided: [redacted]. Check it.");
        assert!(contains_secret(text));
        assert_eq!(redact("nothing here"), "nothing here");
    }

    #[test]
    fn a_guard_forgets_its_value_on_drop_but_not_while_another_holds_it() {
        let first = register("run-secret-guarded-1");
        let second = register("run-secret-guarded-1");
        drop(first);
        assert_eq!(redact("x run-secret-guarded-1 y"), "x [redacted] y");
        drop(second);
        assert_eq!(redact("x run-secret-guarded-1 y"), "x run-secret-guarded-1 y");
    }

    #[test]
    fn short_values_are_not_secrets() {
        let _guard = register("abc");
        register_static("1234567");
        assert_eq!(redact("abc 1234567"), "abc 1234567");
    }

    #[test]
    fn the_longest_overlapping_secret_wins() {
        register_static("overlap-secret-aaaa");
        register_static("overlap-secret-aaaa-bbbb");
        assert_eq!(redact("k=overlap-secret-aaaa-bbbb;"), "k=[redacted];");
    }

    #[test]
    fn status_headers_are_decoded_redacted_and_reencoded() {
        register_static("hdr-secret-value-42");
        let mut headers = HeaderMap::new();
        headers.insert("grpc-message", HeaderValue::from_static("key%20hdr-secret-value-42%0Ahint:%20%E2%9C%93"));
        redact_status_headers(&mut headers);
        let value = headers.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        assert_eq!(String::from_utf8_lossy(&percent_decode(value.as_bytes())), "key [redacted]\nhint: \u{2713}");
    }

    #[test]
    fn nested_strings_of_any_message_are_redacted_and_the_rest_kept() {
        use prost_types::value::Kind;
        register_static("wire-secret-value-99");
        let value = |kind| prost_types::Value { kind: Some(kind) };
        let inner = prost_types::Struct {
            fields: [
                ("token".to_owned(), value(Kind::StringValue("Bearer wire-secret-value-99 (expired)".to_owned()))),
                ("count".to_owned(), value(Kind::NumberValue(3.5))),
            ]
            .into(),
        };
        let outer = prost_types::Struct {
            fields: [
                ("nested".to_owned(), value(Kind::StructValue(inner))),
                (
                    "list".to_owned(),
                    value(Kind::ListValue(prost_types::ListValue {
                        values: vec![value(Kind::StringValue("wire-secret-value-99".to_owned()))],
                    })),
                ),
                ("plain".to_owned(), value(Kind::StringValue("nothing to see".to_owned()))),
            ]
            .into(),
        };
        let clean = redact_message(&outer).expect("something to redact");
        let text = format!("{clean:?}");
        assert!(!text.contains("wire-secret-value-99"), "{text}");
        assert!(text.contains("Bearer [redacted] (expired)") && text.contains("3.5") && text.contains("nothing to see"), "{text}");
        assert_eq!(redact_message(&clean), None, "nothing left to redact");
    }

    #[test]
    fn a_string_that_happens_to_parse_as_a_message_is_still_redacted() {
        register_static("zz-secret-in-parseable-string");
        // "\x08\x01" parses as a varint field; the secret follows as bytes that do not.
        let message =
            prost_types::Value { kind: Some(prost_types::value::Kind::StringValue("\u{8}\u{1}zz-secret-in-parseable-string".to_owned())) };
        let clean = redact_message(&message).expect("something to redact");
        assert!(!format!("{clean:?}").contains("zz-secret-in-parseable-string"));
    }

    #[test]
    fn bytes_are_redacted_like_text() {
        register_static("byte-secret-value-7");
        assert_eq!(&*redact_bytes(b"line byte-secret-value-7\n"), b"line [redacted]\n");
    }
}
