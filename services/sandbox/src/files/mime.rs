//! Media types guessed from file names, for DownloadFile headers and SnapshotOutputs. A short table of
//! what agents produce is enough; unknown names get None.

/// The IANA media type for `name`'s extension, if known.
pub fn guess(name: &str) -> Option<&'static str> {
    let ext = name.rsplit_once('.').map(|(_, ext)| ext.to_ascii_lowercase())?;
    Some(match ext.as_str() {
        "txt" | "text" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" | "mjs" => "text/javascript",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "py" => "text/x-python",
        "rs" => "text/x-rust",
        "sh" => "application/x-sh",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "doc" => "application/msword",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xls" => "application/vnd.ms-excel",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "ppt" => "application/vnd.ms-powerpoint",
        "pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        "mp4" => "video/mp4",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_and_unknown_extensions() {
        assert_eq!(super::guess("report.PDF"), Some("application/pdf"));
        assert_eq!(super::guess("notes.md"), Some("text/markdown"));
        assert_eq!(super::guess("Makefile"), None);
        assert_eq!(super::guess("x.unknownext"), None);
    }
}
