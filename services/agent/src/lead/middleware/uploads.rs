//! Uploads: tells the model about files uploaded with the current message. File parts of the run's
//! last user message that point into `/mnt/user-data/uploads` and still exist there are listed in a
//! `<current_uploads>` block put before the message's text (at most 10). A document the sandbox
//! converted on upload has its Markdown companion beside it (`report.pdf` → `report.md`, DeerFlow's
//! convention); when that file exists its path is listed under the document's.

use antler_proto::common::{ContentPart, Role, TextPart, content_part};
use antler_proto::sandbox::{EntryKind, ListDirRequest};
use futures::future::BoxFuture;

use crate::lead::pipeline::{LoopError, Middleware};
use crate::lead::run_env::RunEnv;
use crate::lead::state::ThreadState;

pub const UPLOADS: &str = "/mnt/user-data/uploads";
const MAX_LISTED: usize = 10;

#[derive(Debug)]
pub struct Uploads;

/// One uploaded file as the model is told about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub name: String,
    pub path: String,
    pub size_bytes: u64,
    /// The document's Markdown companion, when the sandbox converted it.
    pub markdown: Option<String>,
}

/// The block put before the message.
pub fn uploads_block(files: &[Upload]) -> String {
    let mut text = String::from("<current_uploads>\nThe following files were uploaded in this message:\n\n");
    for file in files.iter().take(MAX_LISTED) {
        text.push_str(&format!("- {} ({} bytes)\n  Path: {}\n", file.name.replace(['<', '>'], ""), file.size_bytes, file.path));
        if let Some(markdown) = &file.markdown {
            text.push_str(&format!("  Markdown: {markdown} (the document's text, converted on upload: read or grep this)\n"));
        }
    }
    if files.len() > MAX_LISTED {
        text.push_str(&format!("- … and {} more in {UPLOADS}\n", files.len() - MAX_LISTED));
    }
    text.push_str("\nYou can read these files with the `read_file` tool using the paths shown above.\n</current_uploads>");
    text
}

/// The names the sandbox converts (antler_sandbox::convert::detect).
const CONVERTED: [&str; 10] = ["pdf", "docx", "docm", "pptx", "pptm", "xlsx", "xlsm", "html", "htm", "xhtml"];

/// Where the sandbox writes a document's Markdown (`{stem}.md` beside it); None for other files.
fn companion(path: &str) -> Option<String> {
    let (base, extension) = path.rsplit_once('.')?;
    if !CONVERTED.iter().any(|e| extension.eq_ignore_ascii_case(e)) || base.ends_with('/') {
        return None;
    }
    Some(format!("{base}.md"))
}

impl Middleware for Uploads {
    fn name(&self) -> &'static str {
        "Uploads"
    }

    fn before_agent<'a>(&'a self, env: &'a RunEnv, state: &'a mut ThreadState) -> BoxFuture<'a, Result<(), LoopError>> {
        Box::pin(async move {
            let Some(message) = state.messages.iter_mut().rev().find(|m| m.role == Role::User as i32) else { return Ok(()) };
            let already = message
                .content
                .iter()
                .any(|p| matches!(&p.part, Some(content_part::Part::Text(t)) if t.text.starts_with("<current_uploads>")));
            let files: Vec<Upload> = message
                .content
                .iter()
                .filter_map(|p| match &p.part {
                    Some(content_part::Part::File(f)) if f.path.starts_with(&format!("{UPLOADS}/")) => Some(Upload {
                        name: if f.name.is_empty() { f.path.rsplit('/').next().unwrap_or_default().to_owned() } else { f.name.clone() },
                        path: f.path.clone(),
                        size_bytes: f.size_bytes,
                        markdown: None,
                    }),
                    _ => None,
                })
                .collect();
            if already || files.is_empty() {
                return Ok(());
            }
            // Only files that are still there are announced.
            let existing: Vec<String> = match env.sandbox().await {
                Ok((mut grpc, client)) => {
                    let request = ListDirRequest {
                        thread_id: env.thread_id().to_owned(),
                        path: UPLOADS.to_owned(),
                        max_depth: 1,
                        ..Default::default()
                    };
                    match grpc.list_dir(client.request(&env.ctx.call_context(), request)).await {
                        Ok(listing) => listing
                            .into_inner()
                            .entries
                            .into_iter()
                            .filter(|e| e.kind == EntryKind::File as i32)
                            .map(|e| if e.path.starts_with('/') { e.path } else { format!("{UPLOADS}/{}", e.path) })
                            .collect(),
                        Err(status) => {
                            tracing::info!(run_id = %env.ctx.spec.run_id, code = ?status.code(), "uploads not listable; not announced");
                            return Ok(());
                        }
                    }
                }
                Err(error) => {
                    tracing::info!(run_id = %env.ctx.spec.run_id, %error, "no sandbox; uploads not announced");
                    return Ok(());
                }
            };
            let files: Vec<Upload> = files
                .into_iter()
                .filter(|f| existing.contains(&f.path))
                .map(|mut f| {
                    f.markdown = companion(&f.path).filter(|md| existing.contains(md));
                    f
                })
                .collect();
            if files.is_empty() {
                return Ok(());
            }
            message.content.insert(0, ContentPart { part: Some(content_part::Part::Text(TextPart { text: uploads_block(&files) })) });
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_lists_files_with_paths_and_caps_the_list() {
        let file = |i: usize| Upload { name: format!("f{i}.txt"), path: format!("{UPLOADS}/f{i}.txt"), size_bytes: 3, markdown: None };
        let block = uploads_block(&[file(1)]);
        assert!(block.starts_with("<current_uploads>") && block.contains("Path: /mnt/user-data/uploads/f1.txt"));
        assert!(!block.contains("Markdown:"));
        let pdf = Upload { markdown: companion(&format!("{UPLOADS}/r.pdf")), ..file(2) };
        assert!(uploads_block(&[pdf]).contains("  Markdown: /mnt/user-data/uploads/r.md (the document's text"));
        assert_eq!(companion("/mnt/user-data/uploads/notes.md"), None);
        assert_eq!(companion("/mnt/user-data/uploads/notes.txt"), None);
        assert_eq!(companion("/mnt/user-data/uploads/Deck.PPTX").as_deref(), Some("/mnt/user-data/uploads/Deck.md"));
        let many: Vec<Upload> = (0..12).map(file).collect();
        assert!(uploads_block(&many).contains("and 2 more"));
    }
}
