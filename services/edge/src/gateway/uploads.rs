//! `/api/threads/{thread_id}/uploads`: files the user attaches to a thread, stored in its sandbox's
//! `/mnt/user-data/uploads` by SandboxService.UploadFiles, so the names are made safe and unique, the
//! limits are checked and documents converted exactly as for a gRPC upload. Listing is ListDir,
//! deleting DeleteFile, the limits are the sandbox's own (`Sandbox.limits`).
//!
//! The multipart body is read as a stream. UploadFiles declares every file's size (and here its
//! SHA-256) before the bytes, and browsers send no part sizes, so each file is spooled to a temporary
//! file (`edge.gateway.upload_spool_dir`) as it arrives, checked against the sandbox's limits on the
//! way (413 as soon as one is passed, nothing sent to the sandbox), then streamed to the sandbox in
//! 64 KiB chunks. The spool files are unlinked when the request ends, whatever happened.
//!
//! The UI asks for the limits as soon as it shows a new chat, under the thread id it will create, so
//! before that thread (or its sandbox) exists. The limits are the sandbox service's settings, the same
//! for every sandbox, so such a thread gets the limits of the last sandbox this router saw
//! ([`LastLimits`]) rather than a sandbox of its own for every new chat opened; only the first such
//! request of a process acquires one (as an upload to that thread would).

use std::io::SeekFrom;
use std::sync::{Arc, Mutex};

use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
use antler_proto::sandbox::upload_files_request::Payload;
use antler_proto::sandbox::{
    DeleteFileRequest, EntryKind, GetSandboxRequest, ListDirRequest, SandboxLimits, UploadChunk, UploadFileSpec, UploadFilesRequest,
    UploadFilesResponse, UploadHeader,
};
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use super::{Call, acquire_sandbox, artifact_url, refused, thread_exists};
use crate::edge::{Caller, Edge};
use crate::error::ApiError;
use crate::json::json_response;

/// The upload limits of the last sandbox seen by the upload and limits routes (the sandbox service's
/// `sandbox.uploads`, the same for every sandbox), answered for a thread that has no sandbox yet.
/// Refreshed by every upload and every limits request of a thread that has one, so a changed setting
/// shows there first; the upload itself is always checked against its own sandbox's limits.
#[derive(Debug, Clone, Default)]
pub struct LastLimits(Arc<Mutex<Option<SandboxLimits>>>);

impl LastLimits {
    fn get(&self) -> Option<SandboxLimits> {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn remember(&self, limits: SandboxLimits) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(limits);
    }
}

/// Where uploads live inside a sandbox.
pub const UPLOADS_DIR: &str = "/mnt/user-data/uploads";
/// The multipart field DeerFlow's UI sends each file in.
const FILES_FIELD: &str = "files";
/// Bytes per UploadChunk message (the size UploadFiles asks for).
const CHUNK: usize = 64 * 1024;

fn too_large(detail: String) -> ApiError {
    refused(StatusCode::PAYLOAD_TOO_LARGE, FILES_FIELD, detail)
}

/// RESOURCE_EXHAUSTED from UploadFiles is a size or count limit: 413, as DeerFlow answers it.
fn upload_error(status: tonic::Status) -> ApiError {
    if status.code() == tonic::Code::ResourceExhausted {
        return too_large(status.message().to_owned());
    }
    status.into()
}

/// One file as it arrived, spooled.
struct Spooled {
    filename: String,
    content_type: String,
    size: u64,
    sha256: String,
    file: tokio::fs::File,
}

/// Reads the multipart body into spool files, enforcing the sandbox's count, per-file and total limits.
async fn spool(edge: &Edge, headers: &HeaderMap, body: Body, limits: &SandboxLimits) -> Result<Vec<Spooled>, ApiError> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let Ok(boundary) = multer::parse_boundary(content_type) else {
        super::drain(body).await;
        return Err(ApiError::invalid(
            FILES_FIELD,
            "the body must be multipart/form-data with one `files` part per file (Content-Type: multipart/form-data; boundary=…)",
        ));
    };
    let mut raw = body.into_data_stream();
    let result = read_parts(edge, multer::Multipart::new(&mut raw, boundary), limits).await;
    if result.is_err() {
        // Answer a refusal only once the client has sent its body (up to the upload limit): a client
        // still sending when the connection closes sees a reset instead of the 413.
        let mut left = limits.upload_max_total_bytes.saturating_add(1024 * 1024);
        while let Some(Ok(chunk)) = raw.next().await {
            left = left.saturating_sub(chunk.len() as u64);
            if left == 0 {
                break;
            }
        }
    }
    result
}

async fn read_parts(edge: &Edge, mut multipart: multer::Multipart<'_>, limits: &SandboxLimits) -> Result<Vec<Spooled>, ApiError> {
    let dir = if edge.config.gateway.upload_spool_dir.is_empty() {
        std::env::temp_dir()
    } else {
        std::path::PathBuf::from(&edge.config.gateway.upload_spool_dir)
    };
    let malformed = |e: multer::Error| ApiError::invalid(FILES_FIELD, format!("the multipart body is malformed: {e}"));
    let mut files = Vec::new();
    let mut total = 0u64;
    while let Some(mut field) = multipart.next_field().await.map_err(malformed)? {
        let name = field.name().unwrap_or_default().to_owned();
        if name != FILES_FIELD {
            return Err(ApiError::invalid(&name, "is not a field of an upload: send each file as a `files` part"));
        }
        // DeerFlow skips a part without a file name.
        let Some(filename) = field.file_name().map(str::to_owned).filter(|n| !n.is_empty()) else { continue };
        if files.len() as u64 >= u64::from(limits.upload_max_files) {
            return Err(too_large(format!("Too many files: maximum is {} (sandbox.uploads.max_files)", limits.upload_max_files)));
        }
        let content_type = field.content_type().map(|m| m.essence_str().to_owned()).unwrap_or_default();
        let std_file = tempfile::tempfile_in(&dir)
            .map_err(|e| ApiError::internal(format!("cannot spool an upload in {} (edge.gateway.upload_spool_dir): {e}", dir.display())))?;
        let mut file = tokio::fs::File::from_std(std_file);
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        while let Some(chunk) = field.chunk().await.map_err(malformed)? {
            size += chunk.len() as u64;
            total += chunk.len() as u64;
            if size > limits.upload_max_file_bytes {
                return Err(too_large(format!(
                    "File too large: {filename} is over {} bytes (sandbox.uploads.max_file_bytes)",
                    limits.upload_max_file_bytes
                )));
            }
            if total > limits.upload_max_total_bytes {
                return Err(too_large(format!(
                    "Total upload size too large: over {} bytes (sandbox.uploads.max_total_bytes)",
                    limits.upload_max_total_bytes
                )));
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(|e| ApiError::internal(format!("cannot spool {filename}: {e}")))?;
        }
        file.flush().await.map_err(|e| ApiError::internal(format!("cannot spool {filename}: {e}")))?;
        file.seek(SeekFrom::Start(0)).await.map_err(|e| ApiError::internal(format!("cannot read back {filename}: {e}")))?;
        files.push(Spooled { filename, content_type, size, sha256: hex::encode(hasher.finalize()), file });
    }
    Ok(files)
}

/// The UploadFiles stream: the header, then each file's bytes from its spool file. A spool file that
/// cannot be read ends the stream early; the sandbox then sees a short file and removes the upload.
fn upload_stream(thread_id: String, files: Vec<Spooled>) -> impl futures::Stream<Item = UploadFilesRequest> + Send + 'static {
    let header = UploadHeader {
        thread_id,
        files: files
            .iter()
            .map(|f| UploadFileSpec {
                filename: f.filename.clone(),
                size_bytes: f.size,
                content_type: f.content_type.clone(),
                sha256: f.sha256.clone(),
            })
            .collect(),
        // Honoured only where the sandbox enables conversion (sandbox.uploads.auto_convert_documents).
        convert_documents: true,
    };
    let first = futures::stream::once(async move { UploadFilesRequest { payload: Some(Payload::Header(header)) } });
    let chunks = futures::stream::unfold((files, 0usize), |(mut files, mut index)| async move {
        loop {
            let spooled = files.get_mut(index)?;
            let mut buffer = vec![0u8; CHUNK];
            match spooled.file.read(&mut buffer).await {
                Ok(0) => index += 1,
                Ok(n) => {
                    buffer.truncate(n);
                    let chunk = UploadChunk { file_index: index as u32, data: buffer };
                    return Some((UploadFilesRequest { payload: Some(Payload::Chunk(chunk)) }, (files, index)));
                }
                Err(error) => {
                    tracing::warn!(%error, file = %spooled.filename, "a spooled upload could not be read back");
                    return None;
                }
            }
        }
    });
    first.chain(chunks)
}

/// DeerFlow's `UploadedFileInfo` of a stored upload. `path` is the virtual path too: Antler never
/// shows host paths.
fn upload_json(thread_id: &str, filename: &str, virtual_path: &str, size: u64) -> Map<String, Value> {
    let mut info = Map::new();
    info.insert("filename".to_owned(), json!(filename));
    info.insert("size".to_owned(), json!(size));
    info.insert("path".to_owned(), json!(virtual_path));
    info.insert("virtual_path".to_owned(), json!(virtual_path));
    info.insert("artifact_url".to_owned(), json!(artifact_url(thread_id, virtual_path)));
    info
}

fn reply_json(thread_id: &str, reply: &UploadFilesResponse) -> Value {
    let files: Vec<Value> = reply
        .files
        .iter()
        .map(|f| {
            let mut info = upload_json(thread_id, &f.filename, &f.virtual_path, f.size_bytes);
            let original = f.original_filename.rsplit('/').next().unwrap_or(&f.original_filename);
            if original != f.filename {
                info.insert("original_filename".to_owned(), json!(original));
            }
            info.insert("sha256".to_owned(), json!(f.sha256));
            if let Some(markdown) = &f.markdown {
                info.insert("markdown_file".to_owned(), json!(markdown.filename));
                info.insert("markdown_path".to_owned(), json!(markdown.virtual_path));
                info.insert("markdown_virtual_path".to_owned(), json!(markdown.virtual_path));
                info.insert("markdown_artifact_url".to_owned(), json!(artifact_url(thread_id, &markdown.virtual_path)));
            }
            if !f.conversion_error.is_empty() {
                info.insert("conversion_error".to_owned(), json!(f.conversion_error));
            }
            Value::Object(info)
        })
        .collect();
    let skipped: Vec<Value> = reply.skipped.iter().map(|s| json!(s.original_filename)).collect();
    let mut message = format!("Successfully uploaded {} file(s)", files.len());
    if !skipped.is_empty() {
        message.push_str(&format!("; skipped {} unsafe file(s)", skipped.len()));
    }
    let reasons: Vec<Value> = reply.skipped.iter().map(|s| json!({ "filename": s.original_filename, "reason": s.reason })).collect();
    json!({ "success": skipped.is_empty(), "files": files, "message": message, "skipped_files": skipped, "skipped": reasons })
}

/// `POST /api/threads/{thread_id}/uploads` (multipart, one `files` part per file): the thread's
/// sandbox is acquired (as the agent does before its first tool call; an upload may come before the
/// thread's first run, and the sandbox is the caller's own for that thread id), then UploadFiles.
pub async fn upload(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Extension(last): Extension<LastLimits>,
    Path(thread_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "sandbox", &caller)?;
    let sandbox = match acquire_sandbox(&call, &thread_id).await {
        Ok(sandbox) => sandbox,
        Err(error) => {
            super::drain(body).await;
            return Err(error);
        }
    };
    if let Some(limits) = sandbox.limits {
        last.remember(limits);
    }
    let limits = sandbox.limits.unwrap_or_default();
    let files = spool(&edge, &headers, body, &limits).await?;
    if files.is_empty() {
        return Err(refused(StatusCode::BAD_REQUEST, FILES_FIELD, "No files provided: send one `files` part per file"));
    }
    let stream = upload_stream(thread_id.clone(), files);
    let reply = SandboxServiceClient::new(call.channel()).upload_files(call.transfer(stream)).await.map_err(upload_error)?.into_inner();
    Ok(json_response(&reply_json(&thread_id, &reply)))
}

/// `GET /api/threads/{thread_id}/uploads/list`: the regular files in the uploads directory, by name
/// (ListDir, one level). A thread of the caller's with no sandbox yet has none; another user's thread
/// is 404 like a missing one.
pub async fn list(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "sandbox", &caller)?;
    let request = ListDirRequest {
        thread_id: thread_id.clone(),
        path: UPLOADS_DIR.to_owned(),
        max_depth: 1,
        include_ignored: false,
        max_entries: 10_000,
    };
    let entries = match SandboxServiceClient::new(call.channel()).list_dir(call.unary(request)).await {
        Ok(reply) => reply.into_inner().entries,
        Err(status) if status.code() == tonic::Code::NotFound && thread_exists(&edge, &caller, &thread_id).await? => Vec::new(),
        Err(status) => return Err(status.into()),
    };
    let files: Vec<Value> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::File as i32)
        .map(|e| {
            let filename = e.path.rsplit('/').next().unwrap_or(&e.path);
            let mut info = upload_json(&thread_id, filename, &e.path, e.size_bytes);
            let extension = filename.rfind('.').filter(|&i| i > 0).map(|i| &filename[i..]).unwrap_or_default();
            info.insert("extension".to_owned(), json!(extension));
            let modified = e.modified_at.as_ref().map(|t| t.seconds as f64 + f64::from(t.nanos) / 1e9);
            info.insert("modified".to_owned(), json!(modified));
            Value::Object(info)
        })
        .collect();
    Ok(json_response(&json!({ "count": files.len(), "files": files })))
}

/// `GET /api/threads/{thread_id}/uploads/limits`: the sandbox's upload limits (`max_files`,
/// `max_file_size`, `max_total_size`), as configured in `sandbox.uploads`. A thread of the caller's
/// without a sandbox gets one (as its first run would); a thread id the caller has no thread for yet —
/// the UI's new chat — gets the last limits seen ([`LastLimits`]), as DeerFlow answers its configured
/// limits for any thread id (another user's thread reads as not existing: the limits are no secret).
pub async fn limits(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Extension(last): Extension<LastLimits>,
    Path(thread_id): Path<String>,
) -> Result<Response, ApiError> {
    let call = Call::new(&edge, "sandbox", &caller)?;
    let request = GetSandboxRequest { thread_id: thread_id.clone() };
    let limits = match SandboxServiceClient::new(call.channel()).get_sandbox(call.unary(request)).await {
        Ok(reply) => reply.into_inner().sandbox.and_then(|s| s.limits),
        Err(status) if status.code() == tonic::Code::NotFound => {
            if thread_exists(&edge, &caller, &thread_id).await? {
                acquire_sandbox(&call, &thread_id).await?.limits
            } else if let Some(limits) = last.get() {
                Some(limits)
            } else {
                acquire_sandbox(&call, &thread_id).await?.limits
            }
        }
        Err(status) => return Err(status.into()),
    };
    if let Some(limits) = limits {
        last.remember(limits);
    }
    let limits = limits.unwrap_or_default();
    Ok(json_response(&json!({
        "max_files": limits.upload_max_files,
        "max_file_size": limits.upload_max_file_bytes,
        "max_total_size": limits.upload_max_total_bytes,
    })))
}

/// Extensions whose uploads may have a Markdown companion `{stem}.md` (DeerFlow's
/// CONVERTIBLE_EXTENSIONS, and what the sandbox also converts: .xlsm, .html, .htm); deleting the upload
/// deletes the companion too, as DeerFlow does.
const CONVERTIBLE: &[&str] = &["pdf", "ppt", "pptx", "xls", "xlsx", "xlsm", "doc", "docx", "html", "htm"];

async fn delete_named(edge: &Edge, caller: &Caller, thread_id: &str, filename: &str) -> Result<Response, ApiError> {
    if filename.is_empty() || filename.contains('/') || filename.contains('\\') || filename == "." || filename == ".." {
        return Err(refused(StatusCode::BAD_REQUEST, "filename", format!("`{filename}` is not a file name in the uploads directory")));
    }
    let call = Call::new(edge, "sandbox", caller)?;
    super::writable_sandbox(&call, thread_id).await?;
    let mut sandbox = SandboxServiceClient::new(call.channel());
    let path = format!("{UPLOADS_DIR}/{filename}");
    sandbox.delete_file(call.unary(DeleteFileRequest { thread_id: thread_id.to_owned(), path })).await?;
    if let Some((stem, extension)) = filename.rsplit_once('.')
        && CONVERTIBLE.contains(&extension.to_ascii_lowercase().as_str())
        && !stem.is_empty()
    {
        let companion = DeleteFileRequest { thread_id: thread_id.to_owned(), path: format!("{UPLOADS_DIR}/{stem}.md") };
        match sandbox.delete_file(call.unary(companion)).await {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => return Err(status.into()),
        }
    }
    Ok(json_response(&json!({ "success": true, "message": format!("Deleted {filename}") })))
}

/// `DELETE /api/threads/{thread_id}/uploads/{filename}` (SandboxService.DeleteFile).
pub async fn delete(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path((thread_id, filename)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    delete_named(&edge, &caller, &thread_id, &filename).await
}

/// `DELETE …/uploads/list`: an upload named `list`.
pub async fn delete_list(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
) -> Result<Response, ApiError> {
    delete_named(&edge, &caller, &thread_id, "list").await
}

/// `DELETE …/uploads/limits`: an upload named `limits`.
pub async fn delete_limits(
    State(edge): State<Arc<Edge>>,
    Extension(caller): Extension<Caller>,
    Path(thread_id): Path<String>,
) -> Result<Response, ApiError> {
    delete_named(&edge, &caller, &thread_id, "limits").await
}
