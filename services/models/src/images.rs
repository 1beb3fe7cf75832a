//! Images given as sandbox virtual paths (`/mnt/user-data/...`): read from the thread's sandbox through
//! `SandboxService.DownloadFile`, as the caller (their identity and trace go along), and inlined as bytes
//! before the request reaches a provider. Providers only ever see bytes, data URLs or https URLs.

use antler_kit::CallContext;
use antler_kit::client::ServiceClient;
use antler_proto::common::{content_part, image_part};
use antler_proto::sandbox::DownloadFileRequest;
use antler_proto::sandbox::download_file_response::Payload;
use antler_proto::sandbox::sandbox_service_client::SandboxServiceClient;
use tonic::Code;

use crate::error::ModelError;
use crate::request::{ChatCall, is_virtual};

/// Largest image read from a sandbox (providers refuse far smaller ones; this only bounds our memory).
pub const MAX_IMAGE_BYTES: u64 = 20 * 1024 * 1024;

/// Where sandbox images come from.
#[derive(Debug, Clone)]
pub struct SandboxImages {
    client: ServiceClient,
}

impl SandboxImages {
    pub fn new(client: ServiceClient) -> Self {
        Self { client }
    }

    /// Replaces every virtual-path image of `call` with its bytes. Errors name the part
    /// (`messages[1].content[0].image.url`) and keep the sandbox's code (NOT_FOUND, PERMISSION_DENIED, …).
    pub async fn resolve(&self, call: &mut ChatCall, ctx: &CallContext) -> Result<(), ModelError> {
        let thread_id = call.thread_id.clone();
        for (i, message) in call.messages.iter_mut().enumerate() {
            for (j, part) in message.content.iter_mut().enumerate() {
                let Some(content_part::Part::Image(image)) = &mut part.part else { continue };
                let Some(image_part::Source::Url(url)) = &image.source else { continue };
                if !is_virtual(url) {
                    continue;
                }
                let field = format!("messages[{i}].content[{j}].image.url");
                let (bytes, mime) = self.download(&thread_id, url, ctx, &field).await?;
                if image.mime_type.is_empty() {
                    image.mime_type = mime;
                }
                if !image.mime_type.starts_with("image/") {
                    return Err(ModelError::invalid(field, format!("`{url}` is not an image ({})", image.mime_type)));
                }
                image.source = Some(image_part::Source::Data(bytes));
            }
        }
        Ok(())
    }

    async fn download(&self, thread_id: &str, path: &str, ctx: &CallContext, field: &str) -> Result<(Vec<u8>, String), ModelError> {
        let dependency = |status: tonic::Status| ModelError::Dependency {
            field: field.to_owned(),
            code: status.code(),
            message: format!("reading `{path}` from the sandbox of thread {thread_id}: {}", status.message()),
        };
        let request =
            self.client.request(ctx, DownloadFileRequest { thread_id: thread_id.to_owned(), path: path.to_owned(), chunk_size: 0 });
        let mut stream = SandboxServiceClient::new(self.client.channel()).download_file(request).await.map_err(dependency)?.into_inner();
        let mut bytes = Vec::new();
        let mut mime = String::new();
        while let Some(message) = stream.message().await.map_err(dependency)? {
            match message.payload {
                Some(Payload::Header(header)) => {
                    if header.size_bytes > MAX_IMAGE_BYTES {
                        return Err(ModelError::Dependency {
                            field: field.to_owned(),
                            code: Code::ResourceExhausted,
                            message: format!("`{path}` is {} bytes; images are limited to {MAX_IMAGE_BYTES}", header.size_bytes),
                        });
                    }
                    mime = header.mime_type;
                }
                Some(Payload::Chunk(chunk)) => {
                    if (bytes.len() + chunk.len()) as u64 > MAX_IMAGE_BYTES {
                        return Err(ModelError::Dependency {
                            field: field.to_owned(),
                            code: Code::ResourceExhausted,
                            message: format!("`{path}` is larger than {MAX_IMAGE_BYTES} bytes"),
                        });
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Some(Payload::Trailer(_)) | None => {}
            }
        }
        Ok((bytes, mime))
    }
}
