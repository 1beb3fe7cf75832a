//! `view_image` (offered when the run's model supports vision): checks an image under
//! /mnt/user-data (jpg, jpeg, png, webp or gif, at most 20 MiB) and queues it for the next model call
//! only. The image travels as its sandbox path: the models service reads the bytes from the sandbox
//! when it builds that call, so no image data is ever stored in a checkpoint or an event.

use antler_proto::common::{ContentPart, ImagePart, Message, Role, content_part, image_part};
use antler_proto::sandbox::ListDirRequest;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{Args, Tool, ToolError, ToolOutput, description_param, sandbox_failure};
use crate::lead::run_env::RunEnv;
use crate::lead::state::text_message;

/// Largest image viewed (the models service reads at most this much from a sandbox).
pub const MAX_IMAGE_BYTES: u64 = 20 * 1024 * 1024;
const ROOTS: [&str; 3] = ["/mnt/user-data/workspace/", "/mnt/user-data/uploads/", "/mnt/user-data/outputs/"];

#[derive(Debug)]
pub struct ViewImage;

/// The message that shows the model the images `view_image` queued since the last model call (None:
/// none queued). Built for that one call and never put in the state: the images go as sandbox paths,
/// and the models service reads the bytes when it builds the provider request.
pub fn images_message(images: Vec<(String, String)>) -> Option<Message> {
    if images.is_empty() {
        return None;
    }
    let mut message = text_message(Role::User, "Here are the images you asked to view:");
    message.name = "view_image_context".to_owned();
    for (path, mime) in images {
        message.content.push(ContentPart {
            part: Some(content_part::Part::Image(ImagePart {
                source: Some(image_part::Source::Url(path)),
                mime_type: mime,
                ..Default::default()
            })),
        });
    }
    Some(message)
}

/// The media type of an image path by its extension (None: not an image `view_image` takes).
pub fn image_mime(path: &str) -> Option<&'static str> {
    let extension = path.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match extension.as_str() {
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "webp" => "image/webp",
        "gif" => "image/gif",
        _ => return None,
    })
}

impl Tool for ViewImage {
    fn name(&self) -> &'static str {
        "view_image"
    }

    fn description(&self) -> &'static str {
        "Read an image file. Use this tool to read an image file and make it available for display. Only image files \
         under /mnt/user-data (workspace, uploads, outputs) are supported: jpg, jpeg, png, webp, gif."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "description": description_param(),
                "image_path": {"type": "string", "description": "Absolute path to the image file."}
            },
            "required": ["image_path"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let path = args.required("image_path")?;
            if path.contains("/../") || !ROOTS.iter().any(|root| path.starts_with(root)) {
                return Ok(ToolOutput::error(format!(
                    "Error: {path} is not under /mnt/user-data/workspace, /mnt/user-data/uploads or /mnt/user-data/outputs"
                )));
            }
            let Some(mime) = image_mime(&path) else {
                return Ok(ToolOutput::error(format!("Error: {path} is not a supported image (jpg, jpeg, png, webp, gif)")));
            };
            let Some((parent, _)) = path.rsplit_once('/') else {
                return Ok(ToolOutput::error(format!("Error: {path} is not a file path")));
            };
            let (mut grpc, client) = env.sandbox().await?;
            let request = ListDirRequest {
                thread_id: env.thread_id().to_owned(),
                path: parent.to_owned(),
                max_depth: 1,
                include_ignored: true,
                ..Default::default()
            };
            let listing = match grpc.list_dir(client.request(&env.ctx.call_context(), request)).await {
                Ok(response) => response.into_inner(),
                Err(status) => return sandbox_failure(status),
            };
            let Some(entry) = listing.entries.iter().find(|e| e.path == path) else {
                return Ok(ToolOutput::error(format!("Error: image not found: {path}")));
            };
            if entry.size_bytes > MAX_IMAGE_BYTES {
                return Ok(ToolOutput::error(format!(
                    "Error: {path} is {} bytes; view_image takes images up to {MAX_IMAGE_BYTES} bytes (20 MiB)",
                    entry.size_bytes
                )));
            }
            env.view_image(&path, mime);
            Ok(ToolOutput::ok(format!(
                "Successfully read image {path} ({mime}, {} bytes); it is shown with your next turn.",
                entry.size_bytes
            )))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_known_by_their_extension() {
        assert_eq!(image_mime("/mnt/user-data/uploads/a.PNG"), Some("image/png"));
        assert_eq!(image_mime("/mnt/user-data/uploads/a.jpeg"), Some("image/jpeg"));
        assert_eq!(image_mime("/mnt/user-data/uploads/a.svg"), None);
        assert_eq!(image_mime("/mnt/user-data/uploads/noext"), None);
    }
}
