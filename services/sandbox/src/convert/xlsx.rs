//! Excel (.xlsx, .xlsm): one `## name` section per worksheet in workbook order, each a Markdown table
//! whose first row is the sheet's first non-empty row. Cells show their stored value: shared and inline
//! strings, numbers as written (a date is its serial number), booleans as TRUE/FALSE, a formula's last
//! computed result. Cells are kept sparse while reading, so one cell at column XFD costs one entry; a
//! table is at most [`MAX_COLUMNS`] wide.

use crate::convert::markdown::Out;
use crate::convert::xml::{Node, Parser, attr, attr_exact, relationships};
use crate::convert::zipped::Archive;
use crate::convert::{Format, FormatError, Limits};

const WORKBOOK: &str = "xl/workbook.xml";
const WORKBOOK_RELS: &str = "xl/_rels/workbook.xml.rels";
const SHARED_STRINGS: &str = "xl/sharedStrings.xml";
/// Widest table written; columns beyond are dropped with a note.
pub const MAX_COLUMNS: usize = 256;

pub fn write(bytes: &[u8], limits: &Limits, out: &mut Out) -> Result<(), FormatError> {
    let mut archive = Archive::open(bytes, Format::Xlsx, limits)?;
    let workbook = archive.require(WORKBOOK)?;
    let rels = match archive.read(WORKBOOK_RELS)? {
        Some(rels) => relationships(&rels, Format::Xlsx, WORKBOOK_RELS, "xl")?,
        None => Vec::new(),
    };
    let mut sheets = Vec::new();
    let mut parser = Parser::new(&workbook, Format::Xlsx, WORKBOOK);
    while let Some(node) = parser.next()? {
        if let Node::Open { name, tag, .. } = node
            && name == b"sheet"
        {
            let title = attr(&tag, b"name").unwrap_or_else(|| format!("Sheet{}", sheets.len() + 1));
            let target = attr_exact(&tag, b"r:id")
                .and_then(|id| rels.iter().find(|r| r.id == id).map(|r| r.target.clone()))
                .unwrap_or_else(|| format!("xl/worksheets/sheet{}.xml", sheets.len() + 1));
            sheets.push((title, target));
        }
    }
    if sheets.is_empty() {
        return Err(FormatError::broken(Format::Xlsx, "the workbook lists no sheets"));
    }
    let strings = match archive.read(SHARED_STRINGS)? {
        Some(xml) => shared_strings(&xml)?,
        None => Vec::new(),
    };
    for (title, part) in sheets {
        if out.is_full() {
            break;
        }
        // Chart sheets and dialog sheets have no cells; a missing part is skipped like them.
        let Some(xml) = archive.read(&part)? else { continue };
        out.blank_line();
        out.push(&format!("## {}\n\n", title.replace('\n', " ")));
        let rows = cells(&xml, &part, &strings, limits.max_output_bytes)?;
        write_table(rows, out);
    }
    Ok(())
}

/// `xl/sharedStrings.xml`: the text of each `<si>` (rich-text runs joined, phonetic hints left out).
fn shared_strings(xml: &[u8]) -> Result<Vec<String>, FormatError> {
    let mut parser = Parser::new(xml, Format::Xlsx, SHARED_STRINGS);
    let mut strings = Vec::new();
    let mut current = String::new();
    let mut in_text = false;
    let mut in_phonetic = false;
    while let Some(node) = parser.next()? {
        match node {
            Node::Open { name, empty, .. } => match name.as_slice() {
                b"si" if !empty => current.clear(),
                b"si" => strings.push(String::new()),
                b"t" if !empty => in_text = true,
                b"rPh" if !empty => in_phonetic = true,
                _ => {}
            },
            Node::Text(text) if in_text && !in_phonetic => current.push_str(&text),
            Node::Text(_) => {}
            Node::Close { name } => match name.as_slice() {
                b"t" => in_text = false,
                b"rPh" => in_phonetic = false,
                b"si" => strings.push(std::mem::take(&mut current)),
                _ => {}
            },
        }
    }
    Ok(strings)
}

/// A sheet's non-empty rows, each a sparse list of (column, text). Reading stops once the text kept
/// exceeds `budget` bytes (the output would be cut there anyway).
fn cells(xml: &[u8], part: &str, strings: &[String], budget: u64) -> Result<Vec<Vec<(usize, String)>>, FormatError> {
    let mut parser = Parser::new(xml, Format::Xlsx, part);
    let mut rows: Vec<Vec<(usize, String)>> = Vec::new();
    let mut row: Vec<(usize, String)> = Vec::new();
    let mut column = 0usize;
    let mut kind = String::new();
    let mut value = String::new();
    let mut in_value = false;
    let mut formula = String::new();
    let mut in_formula = false;
    let mut kept: u64 = 0;
    while let Some(node) = parser.next()? {
        match node {
            Node::Open { name, tag, empty } => match name.as_slice() {
                b"row" => {
                    row = Vec::new();
                    column = 0;
                }
                b"c" => {
                    column = attr(&tag, b"r").and_then(|r| column_of(&r)).unwrap_or(column);
                    kind = attr(&tag, b"t").unwrap_or_default();
                    value.clear();
                    formula.clear();
                    if empty {
                        column += 1;
                    }
                }
                // <v> holds the value; <t> inside <is> an inline string; <f> the formula, shown only when
                // the file has no computed value for it (a workbook written by a library, never opened).
                b"v" | b"t" if !empty => in_value = true,
                b"f" if !empty => in_formula = true,
                _ => {}
            },
            Node::Text(text) if in_value => value.push_str(&text),
            Node::Text(text) if in_formula => formula.push_str(&text),
            Node::Text(_) => {}
            Node::Close { name } => match name.as_slice() {
                b"v" | b"t" => in_value = false,
                b"f" => in_formula = false,
                b"c" => {
                    let formula_text = std::mem::take(&mut formula);
                    let text = match kind.as_str() {
                        "s" => value.trim().parse::<usize>().ok().and_then(|i| strings.get(i).cloned()).unwrap_or_default(),
                        "b" => if value.trim() == "1" { "TRUE" } else { "FALSE" }.to_owned(),
                        _ if value.trim().is_empty() && !formula_text.trim().is_empty() => format!("={}", formula_text.trim()),
                        _ => std::mem::take(&mut value),
                    };
                    if !text.trim().is_empty() {
                        kept += text.len() as u64;
                        row.push((column, text));
                    }
                    column += 1;
                }
                b"row" => {
                    if !row.is_empty() {
                        rows.push(std::mem::take(&mut row));
                    }
                    if kept > budget {
                        return Ok(rows);
                    }
                }
                _ => {}
            },
        }
    }
    Ok(rows)
}

/// The zero-based column of a cell reference (`B7` → 1, `AA1` → 26).
fn column_of(reference: &str) -> Option<usize> {
    let letters: String = reference.chars().take_while(char::is_ascii_alphabetic).collect();
    if letters.is_empty() || letters.len() > 3 {
        return None;
    }
    let number = letters.bytes().fold(0usize, |n, b| n * 26 + usize::from(b.to_ascii_uppercase() - b'A' + 1));
    Some(number - 1)
}

fn write_table(rows: Vec<Vec<(usize, String)>>, out: &mut Out) {
    if rows.is_empty() {
        out.push("(empty sheet)\n");
        return;
    }
    let first = rows.iter().flatten().map(|(c, _)| *c).min().unwrap_or(0);
    let last = rows.iter().flatten().map(|(c, _)| *c).max().unwrap_or(0);
    let width = (last - first + 1).min(MAX_COLUMNS);
    let dense: Vec<Vec<String>> = rows
        .into_iter()
        .map(|row| {
            let mut line = vec![String::new(); width];
            for (c, text) in row {
                if let Some(slot) = line.get_mut(c - first) {
                    *slot = text;
                }
            }
            line
        })
        .collect();
    out.table(&dense);
    if last - first + 1 > MAX_COLUMNS {
        out.push(&format!("(columns after the first {MAX_COLUMNS} are not shown)\n"));
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Write};

    use super::*;
    use crate::convert::test_limits as limits;

    fn xlsx(parts: &[(&str, &str)]) -> Vec<u8> {
        let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, body) in parts {
            writer.start_file(*name, zip::write::SimpleFileOptions::default()).expect("in-memory zip");
            writer.write_all(body.as_bytes()).expect("in-memory zip");
        }
        writer.finish().expect("in-memory zip").into_inner()
    }

    #[test]
    fn sheets_become_tables_with_shared_inline_and_typed_cells() -> Result<(), FormatError> {
        let bytes = xlsx(&[
            (WORKBOOK, r#"<workbook xmlns:r="r"><sheets><sheet name="Budget" sheetId="1" r:id="rId1"/></sheets></workbook>"#),
            (
                WORKBOOK_RELS,
                r#"<Relationships><Relationship Id="rId1" Type="x/worksheet" Target="worksheets/sheet1.xml"/></Relationships>"#,
            ),
            (
                SHARED_STRINGS,
                r#"<sst><si><t>Item</t></si><si><r><t>Co</t></r><r><t>st</t></r><rPh><t>ignored</t></rPh></si><si><t>Rent</t></si></sst>"#,
            ),
            (
                "xl/worksheets/sheet1.xml",
                r#"<worksheet><sheetData>
<row r="1"><c r="B1" t="s"><v>0</v></c><c r="C1" t="s"><v>1</v></c></row>
<row r="2"><c r="B2" t="s"><v>2</v></c><c r="C2"><f>SUM(1,2)</f><v>1200.5</v></c><c r="D2" t="b"><v>1</v></c></row>
<row r="3"><c r="B3" t="inlineStr"><is><t>Fuel | oil</t></is></c><c r="C3"><f>C2*2</f></c></row>
</sheetData></worksheet>"#,
            ),
        ]);
        let mut out = Out::new(1 << 20);
        write(&bytes, &limits(), &mut out)?;
        let text = out.finish();
        assert_eq!(
            text, "## Budget\n\n| Item | Cost |  |\n| --- | --- | --- |\n| Rent | 1200.5 | TRUE |\n| Fuel \\| oil | =C2*2 |  |\n",
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn cell_references_name_columns() {
        assert_eq!(column_of("A1"), Some(0));
        assert_eq!(column_of("Z9"), Some(25));
        assert_eq!(column_of("AA10"), Some(26));
        assert_eq!(column_of("XFD1048576"), Some(16383));
        assert_eq!(column_of("12"), None);
    }
}
