//! PDF: the text of every page with lopdf, one `## Page N` section each. Text is decoded through each
//! font's encoding (ToUnicode maps, standard encodings); line breaks come from the text-positioning
//! operators (`Td`, `TD`, `Tm`, `T*`, `'`, `"`) and word gaps from large `TJ` offsets. Every stream is
//! inflated at most `max_inflated_part_bytes` (lopdf's own bound, applied while loading object
//! streams and while reading page content).
//!
//! A password-protected PDF whose content needs the password is an [`FormatError::Encrypted`] (one
//! with only an owner password opens, as in any reader); a PDF with pages but no text at all (scanned
//! images) is an error too, rather than an empty Markdown file: OCR is not done here.

use lopdf::content::Content;
use lopdf::{DecompressError, Document, Encoding, LoadOptions, Object};

use crate::convert::markdown::Out;
use crate::convert::{Format, FormatError, Limits};

/// A `TJ` adjustment (thousandths of an em) more negative than this is a word gap.
const GAP: f32 = -180.0;

pub fn write(bytes: &[u8], limits: &Limits, out: &mut Out) -> Result<(), FormatError> {
    if !bytes.windows(5).take(1024).any(|w| w == b"%PDF-") {
        return Err(FormatError::broken(Format::Pdf, "no %PDF- header in the first kilobyte"));
    }
    let inflate = usize::try_from(limits.max_inflated_part_bytes).unwrap_or(usize::MAX);
    let options = LoadOptions { max_decompressed_size: Some(inflate), ..LoadOptions::default() };
    let document = Document::load_mem_with_options(bytes, options).map_err(classify)?;
    // lopdf tries the empty user password itself; when that does not open the document it returns one
    // with no objects and no encryption state.
    if document.trailer.get(b"Encrypt").is_ok() && !document.was_encrypted() {
        return Err(FormatError::Encrypted(
            "the PDF is encrypted with a password (its content cannot be read without it); remove the password and upload it again"
                .to_owned(),
        ));
    }
    let pages = document.get_pages();
    if pages.is_empty() {
        return Err(FormatError::broken(Format::Pdf, "the document has no pages"));
    }
    let mut any_text = false;
    let mut any_content = false;
    for (number, page) in &pages {
        if out.is_full() {
            break;
        }
        let (text, has_content) = page_text(&document, *page, inflate).map_err(classify)?;
        any_content |= has_content;
        let text = text.trim();
        out.blank_line();
        out.push(&format!("## Page {number}\n\n"));
        if text.is_empty() {
            out.push("(no text on this page)\n");
        } else {
            any_text = true;
            out.push(text);
            out.push("\n");
        }
    }
    if !any_content && !out.is_full() {
        return Err(FormatError::broken(Format::Pdf, "its pages have no content (the file is truncated or damaged)"));
    }
    if !any_text && !out.is_full() {
        return Err(FormatError::Broken(format!(
            "the PDF has {} page(s) but no text layer (scanned images?); OCR is not available, so there is no Markdown",
            pages.len()
        )));
    }
    Ok(())
}

/// Maps lopdf's errors to what a person can act on.
fn classify(error: lopdf::Error) -> FormatError {
    match error {
        lopdf::Error::InvalidPassword | lopdf::Error::Decryption(_) | lopdf::Error::AlreadyEncrypted => {
            FormatError::Encrypted(format!("the PDF is encrypted with a password ({error}); remove the password and upload it again"))
        }
        lopdf::Error::Decompress(DecompressError::MemoryLimitExceeded { limit }) => FormatError::TooLarge(format!(
            "a stream of the PDF decompresses to more than {limit} bytes (sandbox.uploads.convert.max_inflated_part_bytes); \
             reading stopped there"
        )),
        lopdf::Error::Decompress(inner) => FormatError::broken(Format::Pdf, format!("a stream cannot be decompressed: {inner}")),
        lopdf::Error::Parse(inner) => FormatError::broken(Format::Pdf, format!("cannot parse it: {inner}")),
        other => FormatError::broken(Format::Pdf, other),
    }
}

/// The text of one page, lines separated by `\n`, and whether the page has any content at all.
fn page_text(document: &Document, page: lopdf::ObjectId, inflate: usize) -> lopdf::Result<(String, bool)> {
    let fonts = document.get_page_fonts(page).unwrap_or_default();
    let mut encodings: Vec<(Vec<u8>, Encoding<'_>)> = Vec::new();
    for (name, font) in &fonts {
        match font.get_font_encoding_with_limit(document, inflate) {
            Ok(encoding) => encodings.push((name.clone(), encoding)),
            Err(error @ lopdf::Error::Decompress(_)) => return Err(error),
            // An unreadable font loses its own text only.
            Err(_) => {}
        }
    }
    let content = document.get_page_content_with_limit(page, inflate)?;
    let mut text = String::new();
    let mut font: Option<usize> = None;
    let mut last_y: Option<f32> = None;
    for operation in Content::decode_iter(&content) {
        // A damaged content stream keeps the text before the damage.
        let Ok(operation) = operation else { break };
        let operands = &operation.operands;
        match operation.operator.as_str() {
            "Tf" => {
                font = operands.first().and_then(|o| o.as_name().ok()).and_then(|name| encodings.iter().position(|(n, _)| n == name));
            }
            "Td" | "TD" => {
                let dx = operands.first().and_then(number).unwrap_or(0.0);
                let dy = operands.get(1).and_then(number).unwrap_or(0.0);
                if dy.abs() > 0.01 {
                    newline(&mut text);
                } else if dx > 0.0 {
                    space(&mut text);
                }
            }
            "Tm" => {
                let y = operands.get(5).and_then(number);
                match (y, last_y) {
                    (Some(y), Some(last)) if (y - last).abs() > 0.01 => newline(&mut text),
                    (Some(_), Some(_)) => space(&mut text),
                    _ => {}
                }
                last_y = y;
            }
            "T*" => newline(&mut text),
            "ET" => space(&mut text),
            "Tj" | "'" | "\"" => {
                if operation.operator != "Tj" {
                    newline(&mut text);
                }
                if let (Some(Object::String(bytes, _)), Some(i)) = (operands.last(), font) {
                    push_decoded(&mut text, &encodings[i].1, bytes);
                }
            }
            "TJ" => {
                if let (Some(Object::Array(items)), Some(i)) = (operands.first(), font) {
                    for item in items {
                        match item {
                            Object::String(bytes, _) => push_decoded(&mut text, &encodings[i].1, bytes),
                            other if number(other).is_some_and(|n| n < GAP) => space(&mut text),
                            _ => {}
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok((text.lines().map(str::trim_end).collect::<Vec<_>>().join("\n"), !content.is_empty()))
}

fn number(object: &Object) -> Option<f32> {
    match object {
        Object::Integer(i) => Some(*i as f32),
        Object::Real(r) => Some(*r),
        _ => None,
    }
}

fn push_decoded(text: &mut String, encoding: &Encoding<'_>, bytes: &[u8]) {
    if let Ok(decoded) = Document::decode_text(encoding, bytes) {
        text.extend(decoded.chars().filter(|c| !c.is_control() || *c == '\t'));
    }
}

fn newline(text: &mut String) {
    if !text.is_empty() && !text.ends_with('\n') {
        let trimmed = text.trim_end_matches(' ').len();
        text.truncate(trimmed);
        text.push('\n');
    }
}

fn space(text: &mut String) {
    if !text.is_empty() && !text.ends_with([' ', '\n']) {
        text.push(' ');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::test_limits as limits;

    /// A one-page PDF with an uncompressed content stream, cross-reference table computed.
    pub(crate) fn pdf(content: &str) -> Vec<u8> {
        let objects = [
            "<< /Type /Catalog /Pages 2 0 R >>".to_owned(),
            "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_owned(),
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>".to_owned(),
            format!("<< /Length {} >>\nstream\n{content}\nendstream", content.len() + 1),
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>".to_owned(),
        ];
        let mut out = b"%PDF-1.4\n".to_vec();
        let mut offsets = Vec::new();
        for (i, body) in objects.iter().enumerate() {
            offsets.push(out.len());
            out.extend_from_slice(format!("{} 0 obj\n{body}\nendobj\n", i + 1).as_bytes());
        }
        let xref = out.len();
        out.extend_from_slice(format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes());
        for offset in offsets {
            out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
        }
        out.extend_from_slice(format!("trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n", objects.len() + 1).as_bytes());
        out
    }

    fn convert(bytes: &[u8]) -> Result<String, FormatError> {
        let mut out = Out::new(1 << 20);
        write(bytes, &limits(), &mut out)?;
        Ok(out.finish())
    }

    #[test]
    fn lines_and_word_gaps_come_from_the_positioning_operators() -> Result<(), FormatError> {
        let content = "BT /F1 12 Tf 72 720 Td (Quarterly) Tj ( report) Tj 0 -14 Td [(Revenue)-250(grew)] TJ T* (caf\\351 \\(ok\\)) Tj ET";
        assert_eq!(convert(&pdf(content))?, "## Page 1\n\nQuarterly report\nRevenue grew\ncafé (ok)\n");
        Ok(())
    }

    #[test]
    fn not_a_pdf_and_textless_pdfs_are_errors() {
        assert!(matches!(convert(b"hello"), Err(FormatError::Broken(ref m)) if m.contains("%PDF-")));
        let truncated = &pdf("BT ET")[..40];
        assert!(matches!(convert(truncated), Err(FormatError::Broken(_))), "{:?}", convert(truncated));
        let err = convert(&pdf("0 0 1 rg 0 0 10 10 re f")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("no text layer"), "{err}");
    }
}
