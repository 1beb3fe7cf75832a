//! The zip container of DOCX, PPTX and XLSX, opened with bounds checked before anything is inflated:
//! the entry count (from the end-of-central-directory record, before the directory is even parsed),
//! every entry's declared size and their sum, and — because a declared size can lie — the real number
//! of bytes inflated, counted while reading. A document whose `word/document.xml` would inflate to
//! gigabytes fails here with a message naming the setting, after reading at most the limit.

use std::io::{Cursor, Read};

use zip::ZipArchive;
use zip::result::ZipError;

use crate::convert::{Format, FormatError, Limits};

/// The "D0 CF 11 E0" signature of an OLE compound file: a legacy Office file, or an encrypted OOXML one
/// (Office wraps a password-protected .docx/.xlsx/.pptx in an OLE container).
const OLE_MAGIC: [u8; 8] = [0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1];

/// An opened container.
pub struct Archive<'a> {
    zip: ZipArchive<Cursor<&'a [u8]>>,
    format: Format,
    limits: Limits,
    /// Bytes inflated so far by [`Archive::read`].
    inflated: u64,
}

impl std::fmt::Debug for Archive<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive").field("entries", &self.zip.len()).field("inflated", &self.inflated).finish()
    }
}

impl<'a> Archive<'a> {
    /// Opens `bytes` as the container of a `format` document.
    pub fn open(bytes: &'a [u8], format: Format, limits: &Limits) -> Result<Self, FormatError> {
        if bytes.starts_with(&OLE_MAGIC) {
            return Err(FormatError::Encrypted(format!(
                "not a {} file: it is an OLE compound file — a password-protected Office document (or a legacy \
                 97-2003 file under a new name); remove the password (or save it in the current format) and upload it again",
                format.describe()
            )));
        }
        if !bytes.starts_with(b"PK") {
            return Err(FormatError::broken(format, "it is not a zip container (no PK signature at the start)"));
        }
        if let Some(count) = declared_entry_count(bytes)
            && count > limits.max_zip_entries
        {
            return Err(too_many(count, limits));
        }
        let zip = ZipArchive::new(Cursor::new(bytes)).map_err(|e| FormatError::broken(format, format!("unreadable zip container: {e}")))?;
        let count = zip.len() as u64;
        if count > limits.max_zip_entries {
            return Err(too_many(count, limits));
        }
        let mut archive = Self { zip, format, limits: *limits, inflated: 0 };
        let mut declared: u64 = 0;
        for i in 0..archive.zip.len() {
            let entry = archive.zip.by_index_raw(i).map_err(|e| FormatError::broken(format, format!("unreadable zip entry {i}: {e}")))?;
            if entry.encrypted() {
                return Err(FormatError::Encrypted(format!(
                    "the {} container is password-protected (entry {} is encrypted)",
                    format.describe(),
                    entry.name()
                )));
            }
            declared = declared.saturating_add(entry.size());
        }
        if declared > limits.max_inflated_total_bytes {
            return Err(FormatError::TooLarge(format!(
                "the {} container declares {declared} bytes once decompressed, above the limit of {} bytes \
                 (sandbox.uploads.convert.max_inflated_total_bytes); a zip bomb is refused before it is inflated",
                format.describe(),
                limits.max_inflated_total_bytes
            )));
        }
        archive.inflated = 0;
        Ok(archive)
    }

    /// The entry names, in container order.
    pub fn names(&self) -> Vec<String> {
        self.zip.file_names().map(str::to_owned).collect()
    }

    /// Reads entry `name` (None when there is none), inflating at most the per-entry limit and counting
    /// toward the total.
    pub fn read(&mut self, name: &str) -> Result<Option<Vec<u8>>, FormatError> {
        let format = self.format;
        let limits = self.limits;
        let entry = match self.zip.by_name(name) {
            Ok(entry) => entry,
            Err(ZipError::FileNotFound) => return Ok(None),
            Err(e) => return Err(FormatError::broken(format, format!("entry {name}: {e}"))),
        };
        let cap = limits.max_inflated_part_bytes.min(limits.max_inflated_total_bytes.saturating_sub(self.inflated));
        let mut data = Vec::new();
        // One byte past the cap tells "exactly at the cap" from "above it".
        entry.take(cap.saturating_add(1)).read_to_end(&mut data).map_err(|e| FormatError::broken(format, format!("entry {name}: {e}")))?;
        self.inflated = self.inflated.saturating_add(data.len() as u64);
        if data.len() as u64 > cap {
            let (limit, setting) = if cap == limits.max_inflated_part_bytes {
                (limits.max_inflated_part_bytes, "max_inflated_part_bytes")
            } else {
                (limits.max_inflated_total_bytes, "max_inflated_total_bytes")
            };
            return Err(FormatError::TooLarge(format!(
                "entry {name} of the {} container decompresses to more than {limit} bytes (sandbox.uploads.convert.{setting}); \
                 reading stopped there (a zip bomb, or a document too large to convert)",
                format.describe()
            )));
        }
        Ok(Some(data))
    }

    /// Reads entry `name`, which the format requires.
    pub fn require(&mut self, name: &str) -> Result<Vec<u8>, FormatError> {
        self.read(name)?.ok_or_else(|| FormatError::broken(self.format, format!("the container has no {name}")))
    }
}

fn too_many(count: u64, limits: &Limits) -> FormatError {
    FormatError::TooLarge(format!(
        "the container has {count} entries, above the limit of {} (sandbox.uploads.convert.max_zip_entries)",
        limits.max_zip_entries
    ))
}

/// The entry count of the end-of-central-directory record, read before the zip library parses the
/// directory (whose size follows the count). None when there is no plain record (zip64 or damaged):
/// then the count is checked after parsing.
fn declared_entry_count(bytes: &[u8]) -> Option<u64> {
    const EOCD: [u8; 4] = [0x50, 0x4b, 0x05, 0x06];
    // The record is 22 bytes plus a comment of at most 65,535.
    let tail_start = bytes.len().saturating_sub(22 + 65_535);
    let tail = &bytes[tail_start..];
    let at = tail.windows(4).rposition(|w| w == EOCD)?;
    let record = tail.get(at..at + 22)?;
    let total = u16::from_le_bytes([record[10], record[11]]);
    (total != u16::MAX).then_some(u64::from(total))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn limits() -> Limits {
        Limits {
            max_input_bytes: 1 << 30,
            max_output_bytes: 1 << 20,
            max_zip_entries: 10,
            max_inflated_part_bytes: 1000,
            max_inflated_total_bytes: 1500,
        }
    }

    fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in entries {
            writer.start_file(*name, options).expect("a fresh in-memory zip accepts entries");
            writer.write_all(data).expect("writing to memory cannot fail");
        }
        writer.finish().expect("finishing an in-memory zip cannot fail").into_inner()
    }

    #[test]
    fn entries_within_the_limits_are_read() -> Result<(), FormatError> {
        let bytes = zip_of(&[("a.xml", b"<a/>"), ("b.xml", b"<b/>")]);
        let mut archive = Archive::open(&bytes, Format::Docx, &limits())?;
        assert_eq!(archive.read("a.xml")?, Some(b"<a/>".to_vec()));
        assert_eq!(archive.read("missing.xml")?, None);
        Ok(())
    }

    #[test]
    fn bombs_and_crowds_are_refused_naming_the_setting() {
        let big = vec![b'a'; 5000];
        let bytes = zip_of(&[("word/document.xml", &big)]);
        let err = Archive::open(&bytes, Format::Docx, &limits()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("max_inflated_total_bytes"), "{err}");

        // Declared sizes within the total, but one entry above the per-entry cap.
        let bytes = zip_of(&[("word/document.xml", &big[..1200])]);
        let mut archive = match Archive::open(&bytes, Format::Docx, &limits()) {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        };
        let err = archive.read("word/document.xml").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("max_inflated_part_bytes"), "{err}");

        let many: Vec<(String, Vec<u8>)> = (0..11).map(|i| (format!("f{i}"), vec![])).collect();
        let refs: Vec<(&str, &[u8])> = many.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
        let err = Archive::open(&zip_of(&refs), Format::Xlsx, &limits()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("max_zip_entries"), "{err}");
    }

    #[test]
    fn other_containers_get_a_clear_error() {
        let err = Archive::open(&OLE_MAGIC, Format::Docx, &limits()).err();
        assert!(matches!(err, Some(FormatError::Encrypted(ref m)) if m.contains("password-protected")), "{err:?}");
        let err = Archive::open(b"%PDF-1.4", Format::Pptx, &limits()).err();
        assert!(matches!(err, Some(FormatError::Broken(ref m)) if m.contains("not a zip")), "{err:?}");
    }
}
