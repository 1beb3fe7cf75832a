//! Document conversion: a PDF, DOCX, PPTX, XLSX or HTML file becomes Markdown (UploadFiles writes it
//! beside the original as a companion `.md`; ConvertDocument does the same for any file of a thread).
//!
//! A converter parses untrusted bytes, so the parsers never run in the service's own process. Each
//! conversion is one child process ([`worker`]: the service's own executable started with a marker
//! argument) that reads the document on stdin and writes Markdown on stdout, under:
//!
//! * rlimits it sets on itself before reading a byte: address space, CPU seconds, no file writes, no
//!   new processes or threads, no core dumps; and the parent's death signal;
//! * a wall-clock timeout in the parent ([`launch`]), which kills the child's whole process group;
//! * with `isolation: bwrap` (the default where commands run under bwrap), bubblewrap namespaces with no
//!   network and nothing of the host but the system libraries and the executable — the child never sees
//!   the data directory (its input is a file descriptor).
//!
//! The parsers are memory-safe Rust (lopdf for PDF, quick-xml over zip for the Office formats, a small
//! tokenizer for HTML), but memory safety does not stop a deeply nested document from overflowing the
//! stack, a decompression bomb from exhausting memory, or a pathological file from spinning for
//! minutes — and a thread cannot be killed. A child process can: whatever the input does, the service
//! gets a clean per-file error and stays up. Inside the child the zip containers are still bounded
//! before parsing ([`zipped`]: entry count, declared and real decompressed sizes), so a bomb fails fast
//! with a message that names the limit instead of running into the memory limit.
//!
//! One file per format: [`pdf`], [`docx`], [`pptx`], [`xlsx`], [`html`].

pub mod docx;
pub mod html;
pub mod launch;
pub mod pdf;
pub mod pptx;
pub mod worker;
pub mod xlsx;
pub mod zipped;

mod markdown;
mod xml;

use std::fmt;

/// A format the converter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Pdf,
    Docx,
    Pptx,
    Xlsx,
    Html,
}

impl Format {
    pub const ALL: [Format; 5] = [Format::Pdf, Format::Docx, Format::Pptx, Format::Xlsx, Format::Html];

    /// The word used on the worker's command line and in metrics labels.
    pub fn label(self) -> &'static str {
        match self {
            Format::Pdf => "pdf",
            Format::Docx => "docx",
            Format::Pptx => "pptx",
            Format::Xlsx => "xlsx",
            Format::Html => "html",
        }
    }

    pub fn from_label(label: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.label() == label)
    }

    /// What a person calls it, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Format::Pdf => "PDF",
            Format::Docx => "Word (.docx)",
            Format::Pptx => "PowerPoint (.pptx)",
            Format::Xlsx => "Excel (.xlsx)",
            Format::Html => "HTML",
        }
    }
}

/// What to do with a file, judged by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detected {
    /// A format the converter reads.
    Convert(Format),
    /// A document format that looks convertible but is not supported (the legacy binary Office formats);
    /// the reply says why there is no Markdown.
    Unsupported(&'static str),
    /// Not a document (text, images, archives, ...): no conversion is attempted.
    NotADocument,
}

/// The extensions converted, for documentation and messages.
pub const EXTENSIONS: &str = ".pdf, .docx, .pptx, .xlsx, .xlsm, .html, .htm";

/// Picks the format from the file name's extension (case-insensitive).
pub fn detect(filename: &str) -> Detected {
    let extension = match filename.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => ext.to_ascii_lowercase(),
        _ => return Detected::NotADocument,
    };
    match extension.as_str() {
        "pdf" => Detected::Convert(Format::Pdf),
        "docx" | "docm" => Detected::Convert(Format::Docx),
        "pptx" | "pptm" => Detected::Convert(Format::Pptx),
        "xlsx" | "xlsm" => Detected::Convert(Format::Xlsx),
        "html" | "htm" | "xhtml" => Detected::Convert(Format::Html),
        "doc" => Detected::Unsupported("legacy Word 97-2003 (.doc) files are not converted; save the document as .docx"),
        "ppt" => Detected::Unsupported("legacy PowerPoint 97-2003 (.ppt) files are not converted; save the presentation as .pptx"),
        "xls" => Detected::Unsupported("legacy Excel 97-2003 (.xls) files are not converted; save the workbook as .xlsx"),
        _ => Detected::NotADocument,
    }
}

/// Bounds on one conversion, passed to the worker on its command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest input, in bytes.
    pub max_input_bytes: u64,
    /// Markdown kept, in bytes; the rest is cut with a marker.
    pub max_output_bytes: u64,
    /// Most entries in a DOCX/PPTX/XLSX container.
    pub max_zip_entries: u64,
    /// Largest decompressed size of one part: a zip entry that is read, a PDF stream.
    pub max_inflated_part_bytes: u64,
    /// Largest decompressed total of a container's entries (declared, and really read).
    pub max_inflated_total_bytes: u64,
}

/// Why a parser gave up. Produced inside the worker; its text reaches the client as the conversion error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Password-protected: nothing can be read without the password.
    #[error("{0}")]
    Encrypted(String),
    /// Not a valid file of its format (truncated, corrupt, or another format under this name).
    #[error("{0}")]
    Broken(String),
    /// A bound of [`Limits`] was hit; the message names the setting.
    #[error("{0}")]
    TooLarge(String),
}

impl FormatError {
    pub fn broken(format: Format, detail: impl fmt::Display) -> Self {
        FormatError::Broken(format!("not a valid {} file: {detail}", format.describe()))
    }
}

/// Runs the parser of `format` over `bytes`. Only the worker calls this in production (see the module
/// comment); tests call it directly.
pub fn to_markdown(format: Format, bytes: &[u8], limits: &Limits) -> Result<String, FormatError> {
    let mut out = markdown::Out::new(limits.max_output_bytes);
    match format {
        Format::Pdf => pdf::write(bytes, limits, &mut out)?,
        Format::Docx => docx::write(bytes, limits, &mut out)?,
        Format::Pptx => pptx::write(bytes, limits, &mut out)?,
        Format::Xlsx => xlsx::write(bytes, limits, &mut out)?,
        Format::Html => html::write(bytes, &mut out)?,
    }
    Ok(out.finish())
}

/// Generous limits for the parsers' unit tests.
#[cfg(test)]
pub(crate) fn test_limits() -> Limits {
    Limits {
        max_input_bytes: 1 << 30,
        max_output_bytes: 1 << 20,
        max_zip_entries: 100,
        max_inflated_part_bytes: 1 << 20,
        max_inflated_total_bytes: 1 << 22,
    }
}
