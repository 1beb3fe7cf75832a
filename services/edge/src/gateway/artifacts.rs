//! `/api/threads/{thread_id}/artifacts/{path}`: files of the thread's sandbox under `/mnt/user-data`
//! (outputs the agent presented, uploads), read with SandboxService.DownloadFile and, for DeerFlow's
//! artifact editor, replaced with WriteFile.
//!
//! GET answers as DeerFlow does: active content (HTML, XHTML, SVG) always as an attachment, so a
//! generated page never runs in the UI's origin; with `?download=true` everything as an attachment;
//! otherwise inline, typed by name, and a file of unknown type as `text/plain` when its first 8 KiB
//! hold no NUL byte. One byte range (`Range: bytes=a-b`, what the UI's preview asks for) is answered
//! 206, an unsatisfiable one 416 with `Content-Range: bytes */size`. The bytes are streamed through,
//! never held whole; the stream ends with an error (the connection is cut) if the sandbox's SHA-256
//! trailer disagrees with the length it announced. A member of a `.skill` archive
//! (`…/x.skill/SKILL.md`) is read from the archive, as DeerFlow's preview does.
//!
//! PUT replaces a UTF-8 text file under `/mnt/user-data/outputs` when its current SHA-256 is the
//! `expected_sha256` the editor opened it with (412 otherwise) and the thread has no active run (409).
//! The sandbox's WriteFile replaces the file atomically (a temporary file renamed over it), so a GET
//! during one save, or several, streams one version whole, never a truncated or half-written one.

use std::sync::Arc;

use antler_proto::runs::{GetThreadRequest, ThreadStatus};
use antler_proto::sandbox::download_file_response::Payload;
use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
use antler_proto::sandbox::write_file_request::Content;
use antler_proto::sandbox::{DownloadFileRequest, DownloadFileResponse, DownloadHeader, WriteFileRequest};
use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{Call, encode_segment, refused};
use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;
use crate::request::{Fields, Query, read_body};

/// Types a browser would run or render as a page: always downloaded (DeerFlow's ACTIVE_CONTENT_MIME_TYPES).
const ACTIVE_CONTENT: &[&str] = &["text/html", "application/xhtml+xml", "image/svg+xml"];
/// How much of a file of unknown type is looked at to call it text.
const SNIFF_BYTES: usize = 8192;
/// Largest text artifact the editor may replace (DeerFlow's MAX_EDITABLE_ARTIFACT_BYTES).
const MAX_EDITABLE_BYTES: usize = 2 * 1024 * 1024;
/// Largest `.skill` archive member previewed (DeerFlow's MAX_SKILL_ARCHIVE_MEMBER_BYTES).
const MAX_SKILL_MEMBER_BYTES: u64 = 16 * 1024 * 1024;
const EDITABLE_ROOT: &str = "/mnt/user-data/outputs/";

type Chunks = std::pin::Pin<Box<dyn Stream<Item = Result<DownloadFileResponse, tonic::Status>> + Send>>;

/// `Content-Disposition` with the RFC 5987 file name DeerFlow writes.
fn disposition(kind: &str, name: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("{kind}; filename*=UTF-8''{}", encode_segment(name)))
        .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

/// A `Range` this file cannot satisfy (416).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsatisfiable;

/// The one byte range of a `Range` header, as an inclusive `(start, end)` within `size`. Ok(None): no
/// range asked for (or a form this route answers whole: several ranges).
pub fn parse_range(value: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, Unsatisfiable> {
    let Some(value) = value else { return Ok(None) };
    let Some(spec) = value.trim().strip_prefix("bytes=") else { return Err(Unsatisfiable) };
    if spec.contains(',') {
        return Ok(None);
    }
    let (first, last) = spec.split_once('-').ok_or(Unsatisfiable)?;
    let (start, end) = if first.trim().is_empty() {
        let suffix: u64 = last.trim().parse().map_err(|_| Unsatisfiable)?;
        if suffix == 0 {
            return Err(Unsatisfiable);
        }
        (size.saturating_sub(suffix), size.saturating_sub(1))
    } else {
        let start: u64 = first.trim().parse().map_err(|_| Unsatisfiable)?;
        let end = if last.trim().is_empty() {
            size.saturating_sub(1)
        } else {
            last.trim().parse::<u64>().map_err(|_| Unsatisfiable)?.min(size.saturating_sub(1))
        };
        (start, end)
    };
    if size == 0 || start >= size || end < start {
        return Err(Unsatisfiable);
    }
    Ok(Some((start, end)))
}

fn unsatisfiable(size: u64) -> Response {
    let mut response = refused(StatusCode::RANGE_NOT_SATISFIABLE, "Range", "Requested range is not satisfiable").into_response();
    if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
        response.headers_mut().insert(header::CONTENT_RANGE, value);
    }
    response.headers_mut().insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    response
}

/// How a file is answered: its content type and whether inline.
fn presentation(mime: &str, download: bool, head: &[u8]) -> (String, bool) {
    let mime = mime.trim();
    let known = !mime.is_empty() && mime != "application/octet-stream";
    if download || ACTIVE_CONTENT.contains(&mime) {
        return (if known { mime.to_owned() } else { "application/octet-stream".to_owned() }, false);
    }
    if known && mime.starts_with("text/") {
        return (format!("{mime}; charset=utf-8"), true);
    }
    if !known && !head.contains(&0) {
        return ("text/plain; charset=utf-8".to_owned(), true);
    }
    (if known { mime.to_owned() } else { "application/octet-stream".to_owned() }, true)
}

/// Opens a DownloadFile stream and reads its header.
async fn open(call: &Call, thread_id: &str, path: &str) -> Result<(DownloadHeader, Chunks), ApiError> {
    let request = DownloadFileRequest { thread_id: thread_id.to_owned(), path: path.to_owned(), chunk_size: 256 * 1024 };
    let mut stream: Chunks = Box::pin(SandboxServiceClient::new(call.channel()).download_file(call.transfer(request)).await?.into_inner());
    match stream.next().await {
        Some(Ok(DownloadFileResponse { payload: Some(Payload::Header(header)) })) => Ok((header, stream)),
        Some(Err(status)) => Err(status.into()),
        _ => Err(ApiError::internal("DownloadFile did not start with its header")),
    }
}

/// The rest of a download, whole, at most `limit` bytes (`too_big` answers past it).
async fn read_all(mut stream: Chunks, limit: u64, too_big: impl Fn() -> ApiError) -> Result<Vec<u8>, ApiError> {
    let mut bytes = Vec::new();
    while let Some(message) = stream.next().await {
        match message?.payload {
            Some(Payload::Chunk(chunk)) => {
                if (bytes.len() + chunk.len()) as u64 > limit {
                    return Err(too_big());
                }
                bytes.extend_from_slice(&chunk);
            }
            Some(Payload::Trailer(trailer)) => {
                if trailer.sha256 != hex::encode(Sha256::digest(&bytes)) {
                    return Err(ApiError::internal("the download's SHA-256 does not match its bytes"));
                }
                return Ok(bytes);
            }
            _ => return Err(ApiError::internal("DownloadFile sent a second header")),
        }
    }
    Err(ApiError::internal("DownloadFile ended without its trailer"))
}

/// The body: `prefix` (already read), then the rest of the stream, cut to the inclusive byte range
/// `[skip, skip + take)` of the file. The sandbox's trailer is checked against what came through; a
/// mismatch or a broken stream ends the body with an error, which aborts the response.
fn body(prefix: Vec<u8>, stream: Chunks, skip: u64, take: u64) -> Body {
    struct State {
        prefix: Option<Vec<u8>>,
        stream: Chunks,
        offset: u64,
        skip: u64,
        end: u64,
        hasher: Sha256,
        done: bool,
    }
    let state = State { prefix: Some(prefix), stream, offset: 0, skip, end: skip + take, hasher: Sha256::new(), done: false };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            if s.done {
                return None;
            }
            let chunk = match s.prefix.take() {
                Some(prefix) => prefix,
                None => match s.stream.next().await {
                    Some(Ok(DownloadFileResponse { payload: Some(Payload::Chunk(chunk)) })) => chunk,
                    Some(Ok(DownloadFileResponse { payload: Some(Payload::Trailer(trailer)) })) => {
                        s.done = true;
                        let sent = hex::encode(std::mem::take(&mut s.hasher).finalize());
                        if sent != trailer.sha256 || trailer.size_bytes != s.offset {
                            let error = std::io::Error::other("the artifact changed while it was read (SHA-256 mismatch)");
                            return Some((Err(error), s));
                        }
                        return None;
                    }
                    Some(Ok(_)) | None => {
                        s.done = true;
                        return Some((Err(std::io::Error::other("the sandbox's download stream ended early")), s));
                    }
                    Some(Err(status)) => {
                        s.done = true;
                        return Some((Err(std::io::Error::other(status.message().to_owned())), s));
                    }
                },
            };
            s.hasher.update(&chunk);
            let start = s.offset;
            s.offset += chunk.len() as u64;
            // The part of this chunk inside [skip, end).
            let from = s.skip.saturating_sub(start).min(chunk.len() as u64) as usize;
            let to = s.end.saturating_sub(start).min(chunk.len() as u64) as usize;
            if from < to {
                return Some((Ok(Bytes::copy_from_slice(&chunk[from..to])), s));
            }
        }
    });
    Body::from_stream(stream)
}

/// `GET /api/threads/{thread_id}/artifacts/{path}` (`?download=true` for an attachment).
pub async fn get(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, path)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let query = Query::parse(raw.as_deref());
    let download = query.bool("download")?.unwrap_or(false);
    let path = format!("/{}", path.trim_start_matches('/'));
    // `If-Range` asks for the whole file unless it is unchanged; without validators, answer it whole.
    let range = if headers.contains_key(header::IF_RANGE) { None } else { headers.get(header::RANGE).and_then(|v| v.to_str().ok()) };
    let call = Call::new(&edge, "sandbox", &caller)?;
    if let Some(at) = path.find(".skill/") {
        let (archive, member) = (&path[..at + ".skill".len()], &path[at + ".skill/".len()..]);
        return skill_member(&edge, &call, &thread_id, archive, member, download, range).await;
    }
    let (header, mut stream) = open(&call, &thread_id, &path).await?;
    let size = header.size_bytes;
    // A file of unknown type is text when its head holds no NUL: read the head before answering.
    let mut head = Vec::new();
    let unknown = header.mime_type.is_empty() || header.mime_type == "application/octet-stream";
    let mut finished = None;
    while unknown && head.len() < SNIFF_BYTES && (head.len() as u64) < size {
        match stream.next().await {
            Some(Ok(DownloadFileResponse { payload: Some(Payload::Chunk(chunk)) })) => head.extend_from_slice(&chunk),
            Some(Ok(message)) => {
                finished = Some(message);
                break;
            }
            Some(Err(status)) => return Err(status.into()),
            None => break,
        }
    }
    if let Some(message) = finished {
        // The trailer came within the head: put it back in front of the (finished) stream.
        stream = Box::pin(futures::stream::iter([Ok(message)]).chain(stream));
    }
    let name = path.rsplit('/').next().unwrap_or_default();
    let (content_type, inline) = presentation(&header.mime_type, download, &head[..head.len().min(SNIFF_BYTES)]);
    let (status, skip, take) = match parse_range(range, size) {
        Ok(None) => (StatusCode::OK, 0, size),
        Ok(Some((start, end))) => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        Err(Unsatisfiable) => return Ok(unsatisfiable(size)),
    };
    let mut response = Response::new(body(head, stream, skip, take));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_str(&content_type).unwrap_or(HeaderValue::from_static("application/octet-stream")));
    headers.insert(header::CONTENT_DISPOSITION, disposition(if inline { "inline" } else { "attachment" }, name));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(take));
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if status == StatusCode::PARTIAL_CONTENT
        && let Ok(value) = HeaderValue::from_str(&format!("bytes {skip}-{}/{size}", skip + take - 1))
    {
        headers.insert(header::CONTENT_RANGE, value);
    }
    Ok(response)
}

/// The media type of an archive member, by name.
fn member_type(name: &str) -> Option<&'static str> {
    let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "md" | "markdown" => "text/markdown",
        "txt" => "text/plain",
        "py" => "text/x-python",
        "sh" => "application/x-sh",
        "json" => "application/json",
        "yaml" | "yml" => "application/yaml",
        "html" | "htm" => "text/html",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        _ => return None,
    })
}

/// One member of a `.skill` archive (a zip), as DeerFlow's preview serves it: the archive is read
/// (at most `edge.gateway.skill_preview_max_bytes`), the member found by its path or under the
/// archive's single top directory (at most 16 MiB inflated).
async fn skill_member(
    edge: &Edge,
    call: &Call,
    thread_id: &str,
    archive: &str,
    member: &str,
    download: bool,
    range: Option<&str>,
) -> Result<Response, ApiError> {
    let limit = edge.config.gateway.skill_preview_max_bytes;
    let (_, stream) = open(call, thread_id, archive).await?;
    let bytes = read_all(stream, limit, || {
        refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            "path",
            format!("the archive is larger than {limit} bytes (edge.gateway.skill_preview_max_bytes)"),
        )
    })
    .await?;
    let member_name = member.to_owned();
    let content = tokio::task::spawn_blocking(move || -> Result<Option<Vec<u8>>, ApiError> {
        use std::io::Read;
        let Ok(mut zip) = zip::ZipArchive::new(std::io::Cursor::new(bytes)) else { return Ok(None) };
        let names: Vec<String> = zip.file_names().map(str::to_owned).collect();
        let Some(found) =
            names.iter().find(|n| **n == member_name).or_else(|| names.iter().find(|n| n.ends_with(&format!("/{member_name}"))))
        else {
            return Ok(None);
        };
        let entry = zip.by_name(found).map_err(|e| ApiError::internal(format!("cannot read the archive member: {e}")))?;
        let mut content = Vec::new();
        entry
            .take(MAX_SKILL_MEMBER_BYTES + 1)
            .read_to_end(&mut content)
            .map_err(|e| ApiError::internal(format!("cannot inflate the archive member: {e}")))?;
        if content.len() as u64 > MAX_SKILL_MEMBER_BYTES {
            return Err(refused(StatusCode::PAYLOAD_TOO_LARGE, "path", "Skill archive member is too large to preview (16 MiB)"));
        }
        Ok(Some(content))
    })
    .await
    .map_err(|e| ApiError::internal(format!("the archive reader failed: {e}")))??;
    let Some(content) = content else {
        return Err(ApiError::not_found(format!("File '{member}' in the skill archive {archive}")));
    };
    let name = member.rsplit('/').next().unwrap_or(member);
    let mime = member_type(name).unwrap_or_default();
    let head_len = content.len().min(SNIFF_BYTES);
    let (mut content_type, inline) = presentation(mime, download, &content[..head_len]);
    if mime.is_empty() && inline && std::str::from_utf8(&content).is_err() {
        content_type = "application/octet-stream".to_owned();
    }
    let size = content.len() as u64;
    let (status, body) = match (inline, parse_range(range, size)) {
        (false, _) | (true, Ok(None)) => (StatusCode::OK, content),
        (true, Ok(Some((start, end)))) => (StatusCode::PARTIAL_CONTENT, content[start as usize..=end as usize].to_vec()),
        (true, Err(Unsatisfiable)) => return Ok(unsatisfiable(size)),
    };
    let length = body.len() as u64;
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_str(&content_type).unwrap_or(HeaderValue::from_static("application/octet-stream")));
    headers.insert(header::CONTENT_DISPOSITION, disposition(if inline { "inline" } else { "attachment" }, name));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=300"));
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if status == StatusCode::PARTIAL_CONTENT
        && let Some((start, _)) = parse_range(range, size).ok().flatten()
        && let Ok(value) = HeaderValue::from_str(&format!("bytes {start}-{}/{size}", start + length - 1))
    {
        headers.insert(header::CONTENT_RANGE, value);
    }
    Ok(response)
}

/// `PUT /api/threads/{thread_id}/artifacts/{path}` with `{content, expected_sha256}`: DeerFlow's
/// artifact editor saving a UTF-8 text file under `/mnt/user-data/outputs`. Answers `{path, sha256,
/// size}`. 400 outside outputs, 415 for a `.skill` archive or content that is not UTF-8 text, 413 past
/// 2 MiB (or the sandbox's single-write cap, `sandbox.files.write_max_bytes`), 412 when the file
/// changed since it was opened, 409 while a run of the thread is active, 404 for a missing file or
/// another user's thread.
pub async fn put(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, path)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut fields = Fields::parse(&read_body(&headers, body, edge.config.max_body_bytes).await?)?;
    let content = fields.string("content")?.ok_or_else(|| ApiError::invalid("content", "is required: the new text of the file"))?;
    let expected = fields
        .string("expected_sha256")?
        .ok_or_else(|| ApiError::invalid("expected_sha256", "is required: the SHA-256 of the text the editor opened"))?;
    fields.finish("an artifact update")?;
    if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(ApiError::invalid("expected_sha256", "must be 64 lower-case hex digits"));
    }
    let path = format!("/{}", path.trim_start_matches('/'));
    if !path.starts_with(EDITABLE_ROOT) {
        return Err(refused(StatusCode::BAD_REQUEST, "path", "Only files in /mnt/user-data/outputs can be edited"));
    }
    if path.ends_with(".skill") || path.contains(".skill/") {
        return Err(refused(StatusCode::UNSUPPORTED_MEDIA_TYPE, "path", "Skill archives cannot be edited in the artifacts panel"));
    }
    if content.len() > MAX_EDITABLE_BYTES {
        return Err(refused(StatusCode::PAYLOAD_TOO_LARGE, "content", "Artifact is too large to edit (2 MiB)"));
    }
    if content.contains('\0') {
        return Err(refused(StatusCode::UNSUPPORTED_MEDIA_TYPE, "content", "Binary content cannot be saved as an artifact"));
    }
    // The thread must be the caller's, with no run writing to its outputs now.
    let reply = edge.threads().get_thread(edge.grpc(&caller, GetThreadRequest { thread_id: thread_id.clone() })).await?.into_inner();
    if reply.thread.is_some_and(|t| t.status == ThreadStatus::Busy as i32) {
        return Err(ApiError::conflict("Thread has a run in flight. Save after the run finishes."));
    }
    let call = Call::new(&edge, "sandbox", &caller)?;
    let (_, stream) = open(&call, &thread_id, &path).await?;
    let current = read_all(stream, MAX_EDITABLE_BYTES as u64, || {
        refused(StatusCode::PAYLOAD_TOO_LARGE, "path", "Artifact is too large to edit (2 MiB)")
    })
    .await?;
    if current.contains(&0) || std::str::from_utf8(&current).is_err() {
        return Err(refused(StatusCode::UNSUPPORTED_MEDIA_TYPE, "path", "Only UTF-8 text artifacts can be edited"));
    }
    if hex::encode(Sha256::digest(&current)) != expected {
        return Err(refused(StatusCode::PRECONDITION_FAILED, "expected_sha256", "Artifact changed since it was opened"));
    }
    super::writable_sandbox(&call, &thread_id).await?;
    let sha256 = hex::encode(Sha256::digest(content.as_bytes()));
    let size = content.len();
    let request = WriteFileRequest { thread_id, path: path.clone(), content: Some(Content::Text(content)), append: false };
    SandboxServiceClient::new(call.channel()).write_file(call.unary(request)).await.map_err(|status| {
        if status.code() == tonic::Code::ResourceExhausted {
            refused(StatusCode::PAYLOAD_TOO_LARGE, "content", status.message())
        } else {
            status.into()
        }
    })?;
    Ok(json_response(&json!({ "path": path, "sha256": sha256, "size": size })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_as_rfc_9110_reads_them() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-4"), 10), Ok(Some((0, 4))));
        assert_eq!(parse_range(Some("bytes=0-1048575"), 10), Ok(Some((0, 9))));
        assert_eq!(parse_range(Some("bytes=7-"), 10), Ok(Some((7, 9))));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Ok(Some((7, 9))));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("bytes=0-0"), 0), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("bytes=5-2"), 10), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("items=0-1"), 10), Err(Unsatisfiable));
        assert_eq!(parse_range(Some("bytes=0-1,3-4"), 10), Ok(None));
    }

    #[test]
    fn active_content_is_never_inline() {
        assert_eq!(presentation("text/html", false, b"<p>"), ("text/html".to_owned(), false));
        assert_eq!(presentation("image/svg+xml", false, b"<svg"), ("image/svg+xml".to_owned(), false));
        assert_eq!(presentation("text/markdown", false, b"# hi"), ("text/markdown; charset=utf-8".to_owned(), true));
        assert_eq!(presentation("text/markdown", true, b"# hi"), ("text/markdown".to_owned(), false));
        assert_eq!(presentation("application/octet-stream", false, b"plain words"), ("text/plain; charset=utf-8".to_owned(), true));
        assert_eq!(presentation("", false, b"bin\0ary"), ("application/octet-stream".to_owned(), true));
        assert_eq!(presentation("image/png", false, b"\x89PNG\0"), ("image/png".to_owned(), true));
    }
}
