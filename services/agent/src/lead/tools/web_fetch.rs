//! `web_fetch` (`runs.lead.web.fetch`): a page as text the model reads. The direct fetcher (the
//! default) checks every hop against the SSRF rules (`web/ssrf.rs`), keeps to the time, size and
//! content-type limits, and converts: HTML to Markdown of the main content, plain text and JSON as
//! they are. Images are saved into the workspace for `view_image`; a PDF is saved there too and
//! converted by the sandbox's document converter (ConvertDocument: a child process without network),
//! whose Markdown is the answer. Jina Reader and Firecrawl fetch and convert on their side instead.
//! Long text is cut with a marker.

use std::time::Instant;

use antler_proto::sandbox::{ConvertDocumentRequest, ReadFileRequest, WriteFileRequest, write_file_request};
use futures::future::BoxFuture;
use reqwest::Url;
use serde_json::{Value, json};
use sha2::Digest;

use super::web::convert::{cut, decode_text, html_to_markdown};
use super::web::direct::{FetchError, is_binary, url_text};
use super::web::fetcher::Fetcher;
use super::web::ssrf::ResolveError;
use super::web_search::unless_stopped;
use super::{Args, Tool, ToolError, ToolOutput, sandbox_failure};
use crate::lead::run_env::RunEnv;

/// Where fetched images and PDFs are saved.
pub const SAVE_DIR: &str = "/mnt/user-data/workspace/web";

#[derive(Debug)]
pub struct WebFetch {
    pub fetcher: Fetcher,
    pub cut_chars: usize,
    pub max_bytes: u64,
    /// `fetch.timeout_ms`.
    pub timeout: std::time::Duration,
}

/// What a fetch gave.
#[derive(Debug)]
pub enum Fetched {
    /// The tool's text answer.
    Text(String),
    /// An image or PDF to save into the workspace.
    File { url: String, media_type: String, bytes: Vec<u8> },
}

/// The workspace path a fetched file is saved under: a hash of its URL (the same URL always lands on
/// the same file, so a repeated call rewrites it instead of adding one), then the URL's own file name
/// (sanitised), with an extension that matches its media type so `view_image` takes it.
pub fn save_path(url: &str, media_type: &str) -> String {
    let hash = hex::encode(&sha2::Sha256::digest(url.as_bytes())[..6]);
    let extension = match media_type {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/webp" => "webp",
        "image/gif" => "gif",
        "application/pdf" => "pdf",
        _ => "bin",
    };
    let last = Url::parse(url).ok().and_then(|u| u.path_segments().and_then(|mut s| s.next_back().map(str::to_owned))).unwrap_or_default();
    let stem = last.rsplit_once('.').map_or(last.as_str(), |(stem, _)| stem);
    let stem: String = stem.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_')).take(48).collect();
    if stem.is_empty() { format!("{SAVE_DIR}/{hash}.{extension}") } else { format!("{SAVE_DIR}/{hash}-{stem}.{extension}") }
}

impl WebFetch {
    /// Fetches `url` and converts it; a failure is the `Error:` text the model reads.
    pub async fn fetch(&self, url: &str) -> Result<Fetched, String> {
        let started = Instant::now();
        let (provider, result) = match &self.fetcher {
            Fetcher::Direct(direct) => ("direct", self.direct(direct, url).await),
            Fetcher::Reader { provider, policy } => (provider.name(), self.reader(provider.as_ref(), policy, url).await),
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err((_, Some(rule))) => {
                metrics::counter!("antler_agent_web_fetch_refused_total", "rule" => *rule).increment(1);
                "refused"
            }
            Err(_) => "error",
        };
        metrics::histogram!("antler_agent_web_call_seconds", "tool" => "web_fetch", "provider" => provider, "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        result.map_err(|(text, rule)| {
            tracing::info!(provider, rule = rule.unwrap_or_default(), error = %text, "web_fetch failed");
            format!("Error: web_fetch {text}")
        })
    }

    async fn direct(&self, direct: &super::web::direct::DirectFetcher, url: &str) -> Result<Fetched, (String, Option<&'static str>)> {
        let body = direct.get(url).await.map_err(|e: FetchError| (e.to_string(), e.rule()))?;
        let source = url_text(&body.url);
        if is_binary(&body.media_type) {
            return Ok(Fetched::File { url: source, media_type: body.media_type, bytes: body.bytes });
        }
        let text = decode_text(&body.bytes, body.charset.as_deref());
        let mut out = if matches!(body.media_type.as_str(), "text/html" | "application/xhtml+xml") {
            let page = html_to_markdown(&text, &body.url);
            let mut out = String::with_capacity(page.markdown.len() + 256);
            if !page.title.is_empty() {
                out.push_str(&format!("# {}\n\n", page.title));
            }
            out.push_str(&format!("Source: {source}\n\n{}", page.markdown));
            out
        } else {
            format!("Source: {source}\n\n{text}")
        };
        if body.truncated {
            out.push_str(&format!(
                "\n\n[… the page is longer than {} bytes (runs.lead.web.fetch.max_bytes); only that much was read.]",
                self.max_bytes
            ));
        }
        Ok(Fetched::Text(cut(out, self.cut_chars)))
    }

    async fn reader(
        &self,
        provider: &dyn super::web::providers::FetchProvider,
        policy: &super::web::ssrf::Policy,
        url: &str,
    ) -> Result<Fetched, (String, Option<&'static str>)> {
        let parsed = Url::parse(url.trim()).map_err(|e| (format!("`{url}` is not a URL: {e}"), None))?;
        let refused = |r: super::web::ssrf::Refusal| (format!("refused {}: {r}", url_text(&parsed)), Some(r.rule.name()));
        policy.check_url(&parsed).map_err(refused)?;
        if let Some(url::Host::Domain(host)) = parsed.host() {
            // Bounded like the fetch: a resolver that hangs must not hold the call past its time.
            let resolve = policy.resolve(host, parsed.port_or_known_default().unwrap_or(443));
            match tokio::time::timeout(self.timeout, resolve).await {
                Ok(Ok(_)) => {}
                Ok(Err(ResolveError::Refused(r))) => return Err(refused(r)),
                // The reader resolves from its own network; a name we cannot resolve may still be one it can.
                Ok(Err(ResolveError::Lookup(_))) | Err(_) => {}
            }
        }
        let page = provider.fetch(&parsed).await.map_err(|e| (e.to_string(), None))?;
        let mut out = String::with_capacity(page.markdown.len() + 256);
        if !page.title.is_empty() {
            out.push_str(&format!("# {}\n\n", page.title));
        }
        out.push_str(&format!("Source: {}\n\n{}", page.url, page.markdown));
        Ok(Fetched::Text(cut(out, self.cut_chars)))
    }

    /// Saves a fetched image or PDF into the thread's workspace; a PDF is then converted there.
    async fn save(&self, env: &RunEnv, url: &str, media_type: &str, bytes: Vec<u8>) -> Result<ToolOutput, ToolError> {
        let path = save_path(url, media_type);
        let size = bytes.len();
        let (mut grpc, client) = env.sandbox().await?;
        let request = WriteFileRequest {
            thread_id: env.thread_id().to_owned(),
            path: path.clone(),
            content: Some(write_file_request::Content::Data(bytes)),
            append: false,
        };
        if let Err(status) = grpc.write_file(client.request(&env.ctx.call_context(), request)).await {
            return sandbox_failure(status);
        }
        if media_type == "application/pdf" {
            return self.convert_pdf(env, url, &path, size).await;
        }
        Ok(ToolOutput::ok(format!(
            "Saved the image {url} ({media_type}, {size} bytes) to {path}. Call view_image with that path to look at it."
        )))
    }

    /// Converts a saved PDF with the sandbox's document converter (ConvertDocument, which runs it in
    /// an isolated child process) and answers its Markdown.
    async fn convert_pdf(&self, env: &RunEnv, url: &str, path: &str, size: usize) -> Result<ToolOutput, ToolError> {
        use tonic::Code;
        let (mut grpc, client) = env.sandbox().await?;
        let request = ConvertDocumentRequest { thread_id: env.thread_id().to_owned(), path: path.to_owned() };
        let converted = match grpc.convert_document(client.request(&env.ctx.call_context(), request)).await {
            Ok(response) => response.into_inner(),
            Err(status) if status.code() == Code::Unimplemented => {
                return Ok(ToolOutput::error(format!(
                    "Error: {url} is a PDF ({size} bytes), saved to {path}; PDF conversion is not available (this sandbox \
                     service has no document converter)."
                )));
            }
            Err(status)
                if matches!(
                    status.code(),
                    Code::InvalidArgument | Code::FailedPrecondition | Code::ResourceExhausted | Code::Internal | Code::NotFound
                ) =>
            {
                return Ok(ToolOutput::error(format!(
                    "Error: {url} is a PDF ({size} bytes), saved to {path}, and it could not be converted: {}",
                    status.message()
                )));
            }
            Err(status) => return Err(ToolError::Sandbox(status)),
        };
        let markdown = converted.markdown.map(|m| m.virtual_path).unwrap_or_default();
        let request = ReadFileRequest { thread_id: env.thread_id().to_owned(), path: markdown.clone(), ..Default::default() };
        let content = match grpc.read_file(client.request(&env.ctx.call_context(), request)).await {
            Ok(response) => response.into_inner().content,
            Err(status) => return sandbox_failure(status),
        };
        let text = format!("Source: {url}\n(a PDF of {size} bytes, saved to {path}; its Markdown is {markdown})\n\n{content}");
        Ok(ToolOutput::ok(cut(text, self.cut_chars)))
    }
}

impl Tool for WebFetch {
    fn name(&self) -> &'static str {
        "web_fetch"
    }

    fn description(&self) -> &'static str {
        "Fetch a web page and read it. Pages come back as Markdown of their main content, text and JSON as they are, \
         a PDF as Markdown of its text; an image is saved into the workspace for view_image.\n\
         - Fetch only URLs the user gave you or that web_search, image_search or an earlier web_fetch returned, exactly \
         as they were given: do not invent URLs or add www.\n\
         - A URL must include its scheme: https://example.com, not example.com.\n\
         - Pages behind a login (private documents, accounts) cannot be fetched."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "The URL to fetch, with its scheme (https://…)."}
            },
            "required": ["url"]
        })
    }

    fn call<'a>(&'a self, env: &'a RunEnv, args: &'a Args) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let url = args.string("url").unwrap_or_default();
            if url.trim().is_empty() {
                return Ok(ToolOutput::error("Error: `url` is empty; give the full URL to fetch (https://…)"));
            }
            match unless_stopped(env, self.fetch(&url)).await? {
                Ok(Fetched::Text(text)) => Ok(ToolOutput::ok(text)),
                Ok(Fetched::File { url, media_type, bytes }) => self.save(env, &url, &media_type, bytes).await,
                Err(text) => Ok(ToolOutput::error(text)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_files_are_named_by_their_url_with_the_right_extension() {
        let a = save_path("https://img.example/photos/Red%20Fox.jpeg?w=800", "image/jpeg");
        assert!(a.starts_with("/mnt/user-data/workspace/web/") && a.ends_with("-Red20Fox.jpg"), "{a}");
        assert_eq!(a, save_path("https://img.example/photos/Red%20Fox.jpeg?w=800", "image/jpeg"), "stable");
        assert_ne!(a, save_path("https://img.example/photos/Red%20Fox.jpeg?w=400", "image/jpeg"));
        let b = save_path("https://img.example/", "image/png");
        assert!(b.ends_with(".png") && !b.contains("-."), "{b}");
        assert!(crate::lead::tools::view_image::image_mime(&a).is_some());
    }
}
