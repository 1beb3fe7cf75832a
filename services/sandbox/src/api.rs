//! Thin tonic handlers for `antler.sandbox.v1`: read the caller's identity, convert proto ⇄ domain, call
//! [`Sandboxes`]. Errors become statuses in one place (`impl From<SandboxError> for Status`).

use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use antler_kit::Identity;
use antler_proto::sandbox::*;
use futures::Stream;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use crate::error::SandboxError;
use crate::exec::ExecEvent;
use crate::exec::output::Stream as OutStream;
use crate::fence::Fence;
use crate::files;
use crate::paths::{self, Root, VirtualPath};
use crate::providers::ProviderKind;
use crate::registry::{KillReason, Sandbox, Status as LifeStatus};
use crate::service::Sandboxes;

/// `antler.sandbox.v1.SandboxService`.
#[derive(Debug, Clone)]
pub struct SandboxApi {
    sandboxes: Arc<Sandboxes>,
}

impl SandboxApi {
    pub fn new(sandboxes: Arc<Sandboxes>) -> Self {
        Self { sandboxes }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Bytes per DownloadFile chunk when the request gives none, and the most a request may ask for.
const DOWNLOAD_CHUNK_DEFAULT: usize = 64 * 1024;
const DOWNLOAD_CHUNK_MAX: usize = 1024 * 1024;

impl SandboxApi {
    /// The caller's user id, once the call's fencing token (if any) is admitted: a call of a fenced
    /// run attempt is refused here, and a new attempt's first call kills the old ones' commands.
    fn caller<T>(&self, request: &Request<T>) -> Result<(String, Option<Fence>), Status> {
        let user = Identity::of(request)?.user_id.clone();
        let fence = Fence::from_metadata(request.metadata())?;
        self.sandboxes.admit_fence(&user, fence.as_ref())?;
        Ok((user, fence))
    }

    fn user<T>(&self, request: &Request<T>) -> Result<String, Status> {
        Ok(self.caller(request)?.0)
    }
}

fn timestamp(time: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(time)
}

fn duration(d: std::time::Duration) -> Option<prost_types::Duration> {
    prost_types::Duration::try_from(d).ok()
}

fn path_or(raw: &str, field: &str, default: Option<VirtualPath>) -> Result<VirtualPath, Status> {
    Ok(paths::parse(raw, field, default)?)
}

impl SandboxApi {
    fn describe(&self, sandbox: &Sandbox) -> antler_proto::sandbox::Sandbox {
        let state = sandbox.state();
        let config = self.sandboxes.config();
        let provider = self.sandboxes.provider();
        let (c, f, u) = (&config.commands, &config.files, &config.uploads);
        let u32_of = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let mounts = Root::ALL
            .iter()
            .map(|root| Mount {
                virtual_path: root.virtual_path().to_owned(),
                read_only: root.read_only(),
                description: root.description().to_owned(),
            })
            .collect();
        antler_proto::sandbox::Sandbox {
            sandbox_id: sandbox.id.clone(),
            thread_id: sandbox.thread_id.clone(),
            provider: match provider.kind() {
                ProviderKind::Local => SandboxProviderKind::Local,
                ProviderKind::Bwrap => SandboxProviderKind::Bwrap,
            } as i32,
            status: match state.status {
                LifeStatus::Active => SandboxStatus::Active,
                LifeStatus::Released => SandboxStatus::Released,
            } as i32,
            mounts,
            exec_enabled: self.sandboxes.exec_enabled(),
            network_enabled: provider.network_enabled(),
            limits: Some(SandboxLimits {
                default_command_timeout: duration(c.default_timeout()),
                max_command_timeout: duration(c.max_timeout()),
                max_output_bytes_per_stream: c.max_output_bytes_per_stream,
                read_file_max_chars: f.read_max_chars,
                write_file_max_bytes: f.write_max_bytes,
                download_max_bytes: f.download_max_bytes,
                upload_max_files: u32_of(u.max_files),
                upload_max_file_bytes: u.max_file_bytes,
                upload_max_total_bytes: u.max_total_bytes,
                glob_max_results: u32_of(f.glob_max_results),
                grep_max_results: u32_of(f.grep_max_results),
                output_max_chars: c.output_max_chars,
            }),
            running_commands: u32::try_from(sandbox.running_commands()).unwrap_or(u32::MAX),
            created_at: Some(timestamp(state.created_at)),
            acquired_at: state.acquired_at.map(timestamp),
            last_used_at: Some(timestamp(state.last_used_at)),
            released_at: state.released_at.map(timestamp),
        }
    }
}

fn exit_message(info: &crate::exec::ExitInfo) -> CommandExit {
    let reason = match info.kill_reason {
        None => KillReason_::Unspecified,
        Some(KillReason::Timeout) => KillReason_::Timeout,
        Some(KillReason::Release) => KillReason_::Release,
        Some(KillReason::Reset) => KillReason_::Reset,
        // A cancelled call has nobody to read this; report it like a shutdown of that one call.
        Some(KillReason::Shutdown | KillReason::Cancelled) => KillReason_::Shutdown,
        Some(KillReason::Fenced) => KillReason_::Fenced,
    };
    CommandExit {
        exit_code: info.exit_code,
        signal: info.signal,
        timed_out: info.timed_out,
        killed: info.kill_reason.is_some(),
        kill_reason: reason as i32,
        truncated: info.totals.truncated,
        stdout_bytes: info.totals.stdout_bytes,
        stderr_bytes: info.totals.stderr_bytes,
        duration: duration(info.duration),
        output_chars_skipped: info.totals.middle_skipped,
    }
}

use antler_proto::sandbox::KillReason as KillReason_;

fn event_message(event: ExecEvent) -> ExecuteCommandResponse {
    let event = match event {
        ExecEvent::Started { pid, cwd, timeout } => {
            execute_command_response::Event::Started(CommandStarted { pid, cwd, timeout: duration(timeout) })
        }
        ExecEvent::Output { stream, text } => execute_command_response::Event::Output(CommandOutput {
            stream: match stream {
                OutStream::Stdout => OutputStream::Stdout,
                OutStream::Stderr => OutputStream::Stderr,
            } as i32,
            text,
        }),
        ExecEvent::Exit(info) => execute_command_response::Event::Exit(exit_message(&info)),
    };
    ExecuteCommandResponse { event: Some(event) }
}

fn entry_message(entry: files::list::Entry) -> DirEntry {
    DirEntry {
        path: entry.path,
        kind: match entry.kind {
            files::list::EntryKind::File => EntryKind::File,
            files::list::EntryKind::Directory => EntryKind::Directory,
            files::list::EntryKind::Symlink => EntryKind::Symlink,
            files::list::EntryKind::Other => EntryKind::Other,
        } as i32,
        size_bytes: entry.size_bytes,
        modified_at: Some(timestamp(entry.modified_at)),
        depth: entry.depth,
        read_only: entry.read_only,
    }
}

#[tonic::async_trait]
impl sandbox_service_server::SandboxService for SandboxApi {
    async fn acquire_sandbox(&self, request: Request<AcquireSandboxRequest>) -> Result<Response<AcquireSandboxResponse>, Status> {
        let user = self.user(&request)?;
        let (sandbox, created) = self.sandboxes.acquire(&user, &request.get_ref().thread_id).await?;
        Ok(Response::new(AcquireSandboxResponse { sandbox: Some(self.describe(&sandbox)), created }))
    }

    async fn get_sandbox(&self, request: Request<GetSandboxRequest>) -> Result<Response<GetSandboxResponse>, Status> {
        let user = self.user(&request)?;
        let sandbox = self.sandboxes.get(&user, &request.get_ref().thread_id)?;
        Ok(Response::new(GetSandboxResponse { sandbox: Some(self.describe(&sandbox)) }))
    }

    async fn release_sandbox(&self, request: Request<ReleaseSandboxRequest>) -> Result<Response<ReleaseSandboxResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.get_ref();
        let (sandbox, killed) = self.sandboxes.release(&user, &r.thread_id, r.terminate_processes, r.delete_workspace).await?;
        Ok(Response::new(ReleaseSandboxResponse { sandbox: Some(self.describe(&sandbox)), killed_processes: killed }))
    }

    async fn reset_sandbox(&self, request: Request<ResetSandboxRequest>) -> Result<Response<ResetSandboxResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.get_ref();
        let clear: Vec<Root> = [(r.clear_workspace, Root::Workspace), (r.clear_uploads, Root::Uploads), (r.clear_outputs, Root::Outputs)]
            .into_iter()
            .filter_map(|(wanted, root)| wanted.then_some(root))
            .collect();
        let (sandbox, killed, removed) = self.sandboxes.reset(&user, &r.thread_id, &clear).await?;
        Ok(Response::new(ResetSandboxResponse {
            sandbox: Some(self.describe(&sandbox)),
            killed_processes: killed,
            removed_entries: removed,
        }))
    }

    type ExecuteCommandStream = BoxStream<ExecuteCommandResponse>;

    async fn execute_command(&self, request: Request<ExecuteCommandRequest>) -> Result<Response<Self::ExecuteCommandStream>, Status> {
        let (user, fence) = self.caller(&request)?;
        let r = request.into_inner();
        let timeout = r
            .timeout
            .map(std::time::Duration::try_from)
            .transpose()
            .map_err(|_| SandboxError::invalid("timeout", "must be a positive duration"))?;
        let mut spec = self.sandboxes.check_command(r.command, timeout, r.env, &r.cwd, r.max_output_bytes)?;
        spec.fence = fence;
        let events = self.sandboxes.execute(&user, &r.thread_id, spec).await?;
        let stream = UnboundedReceiverStream::new(events).map(|event| Ok(event_message(event)));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn read_file(&self, request: Request<ReadFileRequest>) -> Result<Response<ReadFileResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let read = files::read::ReadRequest {
            path: path_or(&r.path, "path", None)?,
            start_line: r.start_line,
            end_line: r.end_line,
            max_chars: r.max_chars,
        };
        let out = self.sandboxes.read_file(&user, &r.thread_id, read).await?;
        Ok(Response::new(ReadFileResponse {
            path: out.path,
            content: out.content,
            start_line: out.start_line,
            end_line: out.end_line,
            total_lines: out.total_lines,
            size_bytes: out.size_bytes,
            truncated: out.truncated,
            total_chars: out.total_chars,
            shown_chars: out.shown_chars,
            truncation_marker: out.truncation_marker,
            binary: out.binary,
            modified_at: out.modified_at.map(timestamp),
        }))
    }

    async fn write_file(&self, request: Request<WriteFileRequest>) -> Result<Response<WriteFileResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let path = path_or(&r.path, "path", None)?;
        let content = match r.content {
            Some(write_file_request::Content::Text(text)) => text.into_bytes(),
            Some(write_file_request::Content::Data(data)) => data,
            None => return Err(SandboxError::invalid("content", "set text or data (an empty text writes an empty file)").into()),
        };
        let out = self.sandboxes.write_file(&user, &r.thread_id, path, content, r.append).await?;
        Ok(Response::new(WriteFileResponse {
            path: out.path,
            bytes_written: out.bytes_written,
            size_bytes: out.size_bytes,
            created: out.created,
        }))
    }

    async fn delete_file(&self, request: Request<DeleteFileRequest>) -> Result<Response<DeleteFileResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let path = path_or(&r.path, "path", None)?;
        let out = self.sandboxes.delete_file(&user, &r.thread_id, path).await?;
        Ok(Response::new(DeleteFileResponse { path: out.path, size_bytes: out.size_bytes }))
    }

    async fn edit_file(&self, request: Request<EditFileRequest>) -> Result<Response<EditFileResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let path = path_or(&r.path, "path", None)?;
        let out = self.sandboxes.edit_file(&user, &r.thread_id, path, r.old_str, r.new_str, r.replace_all).await?;
        Ok(Response::new(EditFileResponse { path: out.path, replacements: out.replacements, size_bytes: out.size_bytes }))
    }

    async fn list_dir(&self, request: Request<ListDirRequest>) -> Result<Response<ListDirResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let path = path_or(&r.path, "path", Some(VirtualPath::root(Root::Workspace)))?;
        let out = self.sandboxes.list_dir(&user, &r.thread_id, path, r.max_depth, r.include_ignored, r.max_entries).await?;
        Ok(Response::new(ListDirResponse { entries: out.entries.into_iter().map(entry_message).collect(), truncated: out.truncated }))
    }

    async fn glob(&self, request: Request<GlobRequest>) -> Result<Response<GlobResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let path = path_or(&r.path, "path", Some(VirtualPath::root(Root::Workspace)))?;
        let out = self.sandboxes.glob(&user, &r.thread_id, path, r.pattern, r.include_dirs, r.max_results).await?;
        Ok(Response::new(GlobResponse { paths: out.paths, truncated: out.truncated }))
    }

    async fn grep(&self, request: Request<GrepRequest>) -> Result<Response<GrepResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let grep = files::grep::GrepRequest {
            path: path_or(&r.path, "path", Some(VirtualPath::root(Root::Workspace)))?,
            pattern: r.pattern,
            literal: r.literal,
            case_insensitive: r.case_insensitive,
            glob: r.glob,
            max_results: 0,
            max_file_bytes: 0,
            max_line_chars: 0,
            display_chars: 0,
        };
        let out = self.sandboxes.grep(&user, &r.thread_id, grep, r.max_results).await?;
        Ok(Response::new(GrepResponse {
            matches: out
                .matches
                .into_iter()
                .map(|m| GrepMatch { path: m.path, line_number: m.line_number, line: m.line, line_truncated: m.line_truncated })
                .collect(),
            truncated: out.truncated,
            files_searched: out.files_searched,
            files_skipped: out.files_skipped,
        }))
    }

    type DownloadFileStream = BoxStream<DownloadFileResponse>;

    async fn download_file(&self, request: Request<DownloadFileRequest>) -> Result<Response<Self::DownloadFileStream>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let path = path_or(&r.path, "path", None)?;
        let chunk = match r.chunk_size {
            0 => DOWNLOAD_CHUNK_DEFAULT,
            n => usize::try_from(n).unwrap_or(DOWNLOAD_CHUNK_MAX).min(DOWNLOAD_CHUNK_MAX),
        };
        let download = self.sandboxes.download(&user, &r.thread_id, path).await?;
        // A small bounded channel: when the client reads slowly the reader task waits; when the client
        // goes away the send fails and the task ends.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let header = DownloadHeader {
            path: download.path.clone(),
            size_bytes: download.size_bytes,
            mime_type: download.mime_type.to_owned(),
            modified_at: Some(timestamp(download.modified_at)),
        };
        let path = download.path.clone();
        let size = download.size_bytes;
        let mut file = tokio::fs::File::from_std(download.file);
        tokio::spawn(async move {
            let send = |payload| DownloadFileResponse { payload: Some(payload) };
            if tx.send(Ok(send(download_file_response::Payload::Header(header)))).await.is_err() {
                return;
            }
            let mut hasher = Sha256::new();
            let mut sent = 0u64;
            let mut buffer = vec![0u8; chunk];
            // Never more than the size announced in the header, even if the file grows meanwhile.
            while sent < size {
                let want = usize::try_from(size - sent).unwrap_or(chunk).min(chunk);
                let n = match file.read(&mut buffer[..want]).await {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.send(Err(SandboxError::from_io(&path, &e).into())).await;
                        return;
                    }
                };
                hasher.update(&buffer[..n]);
                sent += n as u64;
                if tx.send(Ok(send(download_file_response::Payload::Chunk(buffer[..n].to_vec())))).await.is_err() {
                    return;
                }
            }
            let trailer = DownloadTrailer { sha256: hex::encode(hasher.finalize()), size_bytes: sent };
            let _ = tx.send(Ok(send(download_file_response::Payload::Trailer(trailer)))).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn upload_files(&self, request: Request<Streaming<UploadFilesRequest>>) -> Result<Response<UploadFilesResponse>, Status> {
        let user = self.user(&request)?;
        let mut stream = request.into_inner();
        let header = match stream.message().await? {
            Some(UploadFilesRequest { payload: Some(upload_files_request::Payload::Header(header)) }) => header,
            _ => return Err(SandboxError::invalid("header", "the first message must be the header").into()),
        };
        let convert_documents = header.convert_documents;
        let specs = header
            .files
            .into_iter()
            .map(|f| files::upload::FileSpec { filename: f.filename, size_bytes: f.size_bytes, sha256: f.sha256 })
            .collect();
        let (sandbox, mut upload) = self.sandboxes.begin_upload(&user, &header.thread_id, specs).await?;
        // Dropping `upload` on any early return (bad chunk, client gone) removes what it wrote.
        while let Some(message) = stream.message().await? {
            match message.payload {
                Some(upload_files_request::Payload::Chunk(chunk)) => upload.write(chunk.file_index, &chunk.data)?,
                Some(upload_files_request::Payload::Header(_)) => return Err(SandboxError::invalid("header", "sent twice").into()),
                None => return Err(SandboxError::invalid("payload", "empty message").into()),
            }
        }
        let outcome = tokio::task::spawn_blocking(move || upload.finish()).await.map_err(|e| Status::internal(e.to_string()))??;
        tracing::info!(sandbox_id = %sandbox.id, stored = outcome.files.len(), skipped = outcome.skipped.len(), "upload stored");
        metrics::counter!("antler_sandbox_uploaded_files_total").increment(outcome.files.len() as u64);
        // The files are in place: a conversion that fails only leaves its own file without Markdown.
        let conversions = if convert_documents {
            self.sandboxes.convert_uploads(&sandbox, &outcome.files).await
        } else {
            vec![None; outcome.files.len()]
        };
        Ok(Response::new(UploadFilesResponse {
            files: outcome
                .files
                .into_iter()
                .zip(conversions)
                .map(|(f, conversion)| {
                    let (markdown, conversion_error) = match conversion {
                        None => (None, String::new()),
                        Some(Ok(c)) => (
                            Some(MarkdownCompanion { filename: c.filename, virtual_path: c.virtual_path, size_bytes: c.size_bytes }),
                            String::new(),
                        ),
                        Some(Err(why)) => (None, why),
                    };
                    UploadedFile {
                        index: f.index,
                        original_filename: f.original_filename,
                        filename: f.filename,
                        virtual_path: f.virtual_path,
                        size_bytes: f.size_bytes,
                        sha256: f.sha256,
                        markdown,
                        conversion_error,
                    }
                })
                .collect(),
            skipped: outcome
                .skipped
                .into_iter()
                .map(|s| SkippedUpload { index: s.index, original_filename: s.original_filename, reason: s.reason })
                .collect(),
        }))
    }

    async fn convert_document(&self, request: Request<ConvertDocumentRequest>) -> Result<Response<ConvertDocumentResponse>, Status> {
        let user = self.user(&request)?;
        let r = request.into_inner();
        let path = path_or(&r.path, "path", None)?;
        let (companion, format) = self.sandboxes.convert_document(&user, &r.thread_id, path).await?;
        Ok(Response::new(ConvertDocumentResponse {
            markdown: Some(MarkdownCompanion {
                filename: companion.filename,
                virtual_path: companion.virtual_path,
                size_bytes: companion.size_bytes,
            }),
            format: format.label().to_owned(),
        }))
    }

    async fn snapshot_outputs(&self, request: Request<SnapshotOutputsRequest>) -> Result<Response<SnapshotOutputsResponse>, Status> {
        let user = self.user(&request)?;
        let snapshot = self.sandboxes.snapshot(&user, &request.get_ref().thread_id).await?;
        Ok(Response::new(SnapshotOutputsResponse {
            files: snapshot
                .files
                .into_iter()
                .map(|f| OutputFile {
                    path: f.path,
                    size_bytes: f.size_bytes,
                    sha256: f.sha256,
                    modified_at: Some(timestamp(f.modified_at)),
                    mime_type: f.mime_type.unwrap_or_default().to_owned(),
                })
                .collect(),
            total_bytes: snapshot.total_bytes,
            taken_at: Some(timestamp(snapshot.taken_at)),
        }))
    }
}
