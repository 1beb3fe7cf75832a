//! Word (.docx): the paragraphs and tables of `word/document.xml`, in order. Heading styles
//! (`Title`, `Heading1`..`Heading6`, and localised ids ending in a digit such as `berschrift2`) become
//! `#` headings, numbered or bulleted paragraphs (their own numbering, or a `List…` style) `- ` items, tables Markdown tables (a nested table is
//! flattened into its cell). Deleted revisions, field codes, headers and footers are left out.

use crate::convert::markdown::{Out, collapse};
use crate::convert::xml::{Node, Parser, attr};
use crate::convert::zipped::Archive;
use crate::convert::{Format, FormatError, Limits};

const DOCUMENT: &str = "word/document.xml";

#[derive(Debug, Default)]
struct Table {
    rows: Vec<Vec<String>>,
    row: Vec<String>,
    cell: String,
}

#[derive(Debug, Default)]
struct Paragraph {
    text: String,
    heading: Option<usize>,
    list: bool,
}

pub fn write(bytes: &[u8], limits: &Limits, out: &mut Out) -> Result<(), FormatError> {
    let mut archive = Archive::open(bytes, Format::Docx, limits)?;
    let xml = archive.require(DOCUMENT)?;
    let mut parser = Parser::new(&xml, Format::Docx, DOCUMENT);
    let mut paragraph = Paragraph::default();
    let mut tables: Vec<Table> = Vec::new();
    // Inside <w:t>: the only text that is document content (whitespace between tags is not).
    let mut in_text = false;
    while let Some(node) = parser.next()? {
        if out.is_full() {
            break;
        }
        match node {
            Node::Open { name, tag, empty } => match name.as_slice() {
                b"p" if !empty => paragraph = Paragraph::default(),
                b"pStyle" => {
                    let style = attr(&tag, b"val").unwrap_or_default();
                    paragraph.heading = heading_level(&style);
                    // "ListBullet", "ListNumber", "ListParagraph": numbered through the style, not the paragraph.
                    paragraph.list |= style.to_ascii_lowercase().starts_with("list");
                }
                b"numPr" => paragraph.list = true,
                b"t" if !empty => in_text = true,
                b"tab" => paragraph.text.push('\t'),
                b"br" | b"cr" => paragraph.text.push('\n'),
                b"tbl" if !empty => tables.push(Table::default()),
                b"tr" if !empty => {
                    if let Some(table) = tables.last_mut() {
                        table.row = Vec::new();
                    }
                }
                b"tc" if !empty => {
                    if let Some(table) = tables.last_mut() {
                        table.cell = String::new();
                    }
                }
                _ => {}
            },
            Node::Text(text) if in_text => paragraph.text.push_str(&text),
            Node::Text(_) => {}
            Node::Close { name } => match name.as_slice() {
                b"t" => in_text = false,
                b"p" => {
                    let done = std::mem::take(&mut paragraph);
                    let text = done.text.lines().map(collapse).map(|l| l.trim().to_owned()).collect::<Vec<_>>().join("\n");
                    let text = text.trim();
                    if text.is_empty() {
                        continue;
                    }
                    if let Some(table) = tables.last_mut() {
                        if !table.cell.is_empty() {
                            table.cell.push('\n');
                        }
                        table.cell.push_str(text);
                    } else {
                        out.blank_line();
                        match (done.heading, done.list) {
                            (Some(level), _) => out.push(&format!("{} {}", "#".repeat(level), text.replace('\n', " "))),
                            (None, true) => out.push(&format!("- {}", text.replace('\n', "\n  "))),
                            (None, false) => out.push(text),
                        }
                        out.push("\n");
                        if !done.list {
                            out.blank_line();
                        }
                    }
                }
                b"tc" => {
                    if let Some(table) = tables.last_mut() {
                        let cell = std::mem::take(&mut table.cell);
                        table.row.push(cell);
                    }
                }
                b"tr" => {
                    if let Some(table) = tables.last_mut() {
                        let row = std::mem::take(&mut table.row);
                        table.rows.push(row);
                    }
                }
                b"tbl" => {
                    if let Some(table) = tables.pop() {
                        match tables.last_mut() {
                            Some(parent) => {
                                let flat: Vec<String> = table.rows.iter().map(|r| r.join(" | ")).collect();
                                if !parent.cell.is_empty() {
                                    parent.cell.push('\n');
                                }
                                parent.cell.push_str(&flat.join("\n"));
                            }
                            None => out.table(&table.rows),
                        }
                    }
                }
                _ => {}
            },
        }
    }
    Ok(())
}

/// The heading level of a paragraph style id, if it is a heading style.
fn heading_level(style: &str) -> Option<usize> {
    let lower = style.to_ascii_lowercase();
    if lower == "title" {
        return Some(1);
    }
    if lower == "subtitle" {
        return Some(2);
    }
    let digits = lower.trim_start_matches(|c: char| !c.is_ascii_digit());
    let word = &lower[..lower.len() - digits.len()];
    let level: usize = digits.parse().ok()?;
    // "heading1", and localised ids ("berschrift1", "titre1", "kop1") that end in the level.
    let is_heading = word.ends_with("heading") || word.contains("berschrift") || word == "titre" || word == "kop" || word == "titolo";
    (is_heading && (1..=9).contains(&level)).then_some(level.min(6))
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Write};

    use super::*;

    use crate::convert::test_limits as limits;

    fn docx(body: &str) -> Vec<u8> {
        let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default();
        let document = format!(
            r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>{body}</w:body></w:document>"#
        );
        writer.start_file(DOCUMENT, options).expect("in-memory zip");
        writer.write_all(document.as_bytes()).expect("in-memory zip");
        writer.finish().expect("in-memory zip").into_inner()
    }

    fn run(text: &str) -> String {
        format!(r#"<w:r><w:t xml:space="preserve">{text}</w:t></w:r>"#)
    }

    #[test]
    fn headings_lists_paragraphs_and_tables() -> Result<(), FormatError> {
        let body = format!(
            r#"<w:p><w:pPr><w:pStyle w:val="Heading1"/></w:pPr>{}</w:p>
<w:p>{}{}</w:p>
<w:p><w:pPr><w:numPr><w:ilvl w:val="0"/></w:numPr></w:pPr>{}</w:p>
<w:tbl><w:tr><w:tc><w:p>{}</w:p></w:tc><w:tc><w:p>{}</w:p></w:tc></w:tr><w:tr><w:tc><w:p>{}</w:p></w:tc><w:tc><w:p>{}</w:p></w:tc></w:tr></w:tbl>"#,
            run("Quarterly report"),
            run("Revenue grew "),
            run("by 12% &amp; costs fell."),
            run("first item"),
            run("Region"),
            run("Sales"),
            run("North"),
            run("42"),
        );
        let mut out = Out::new(1 << 20);
        write(&docx(&body), &limits(), &mut out)?;
        let text = out.finish();
        assert_eq!(
            text,
            "# Quarterly report\n\nRevenue grew by 12% & costs fell.\n\n- first item\n\n| Region | Sales |\n| --- | --- |\n| North | 42 |\n",
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn list_styles_make_items() -> Result<(), FormatError> {
        let body = format!(r#"<w:p><w:pPr><w:pStyle w:val="ListBullet"/></w:pPr>{}</w:p><w:p>{}</w:p>"#, run("styled item"), run("after"));
        let mut out = Out::new(1 << 20);
        write(&docx(&body), &limits(), &mut out)?;
        assert_eq!(out.finish(), "- styled item\n\nafter\n");
        Ok(())
    }

    #[test]
    fn heading_styles_are_recognised() {
        assert_eq!(heading_level("Heading2"), Some(2));
        assert_eq!(heading_level("berschrift3"), Some(3));
        assert_eq!(heading_level("Title"), Some(1));
        assert_eq!(heading_level("Normal"), None);
        assert_eq!(heading_level("ListParagraph"), None);
    }

    #[test]
    fn a_container_without_the_document_part_is_broken() {
        let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
        writer.start_file("other.xml", zip::write::SimpleFileOptions::default()).expect("in-memory zip");
        let bytes = writer.finish().expect("in-memory zip").into_inner();
        let err = write(&bytes, &limits(), &mut Out::new(100)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("word/document.xml"), "{err}");
    }
}
