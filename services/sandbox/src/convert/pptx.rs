//! PowerPoint (.pptx): one `## Slide N` section per slide in presentation order (`ppt/presentation.xml`
//! and its relationships; slides the list does not name are ignored, and when the list is unreadable
//! the slide parts are taken in number order). A title placeholder becomes `### title`, every other
//! text paragraph a line, tables Markdown tables, and the speaker notes a `Notes:` paragraph.

use crate::convert::markdown::{Out, collapse};
use crate::convert::xml::{Node, Parser, attr, attr_exact, relationships};
use crate::convert::zipped::Archive;
use crate::convert::{Format, FormatError, Limits};

const PRESENTATION: &str = "ppt/presentation.xml";
const PRESENTATION_RELS: &str = "ppt/_rels/presentation.xml.rels";

pub fn write(bytes: &[u8], limits: &Limits, out: &mut Out) -> Result<(), FormatError> {
    let mut archive = Archive::open(bytes, Format::Pptx, limits)?;
    let slides = slide_parts(&mut archive)?;
    if slides.is_empty() {
        return Err(FormatError::broken(Format::Pptx, "the presentation has no slides (no ppt/slides/slideN.xml)"));
    }
    for (n, part) in slides.iter().enumerate() {
        if out.is_full() {
            break;
        }
        let Some(xml) = archive.read(part)? else { continue };
        out.blank_line();
        out.push(&format!("## Slide {}\n\n", n + 1));
        write_shapes(&xml, part, out)?;
        if let Some(notes) = notes_part(&mut archive, part)?
            && let Some(xml) = archive.read(&notes)?
        {
            let mut lines = Out::new(u64::MAX);
            write_shapes(&xml, &notes, &mut lines)?;
            let text = lines.finish();
            // A notes page repeats the slide number in a placeholder: keep only real text.
            let text: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && l.parse::<u32>().is_err()).collect();
            if !text.is_empty() {
                out.blank_line();
                out.push(&format!("Notes: {}\n", text.join(" ")));
            }
        }
    }
    Ok(())
}

/// The slide parts in presentation order.
fn slide_parts(archive: &mut Archive<'_>) -> Result<Vec<String>, FormatError> {
    let listed = match (archive.read(PRESENTATION)?, archive.read(PRESENTATION_RELS)?) {
        (Some(presentation), Some(rels)) => {
            let rels = relationships(&rels, Format::Pptx, PRESENTATION_RELS, "ppt")?;
            let mut parser = Parser::new(&presentation, Format::Pptx, PRESENTATION);
            let mut order = Vec::new();
            while let Some(node) = parser.next()? {
                if let Node::Open { name, tag, .. } = node
                    && name == b"sldId"
                    && let Some(id) = attr_exact(&tag, b"r:id").or_else(|| attr(&tag, b"id").filter(|v| v.starts_with("rId")))
                    && let Some(rel) = rels.iter().find(|r| r.id == id)
                {
                    order.push(rel.target.clone());
                }
            }
            order
        }
        _ => Vec::new(),
    };
    if !listed.is_empty() {
        return Ok(listed);
    }
    let mut numbered: Vec<(u32, String)> = archive
        .names()
        .into_iter()
        .filter_map(|name| {
            let n = name.strip_prefix("ppt/slides/slide")?.strip_suffix(".xml")?.parse().ok()?;
            Some((n, name))
        })
        .collect();
    numbered.sort();
    Ok(numbered.into_iter().map(|(_, name)| name).collect())
}

/// The notes page of a slide, from the slide's relationships.
fn notes_part(archive: &mut Archive<'_>, slide: &str) -> Result<Option<String>, FormatError> {
    let (dir, file) = slide.rsplit_once('/').unwrap_or(("", slide));
    let rels_name = format!("{dir}/_rels/{file}.rels");
    let Some(rels) = archive.read(&rels_name)? else { return Ok(None) };
    let rels = relationships(&rels, Format::Pptx, &rels_name, dir)?;
    Ok(rels.into_iter().find(|r| r.kind.ends_with("/notesSlide")).map(|r| r.target))
}

/// The text of a slide (or notes page): paragraphs as lines, the title as a heading, tables as tables.
fn write_shapes(xml: &[u8], part: &str, out: &mut Out) -> Result<(), FormatError> {
    let mut parser = Parser::new(xml, Format::Pptx, part);
    let mut in_text = false;
    let mut paragraph = String::new();
    // The shape being read is a title placeholder.
    let mut title = false;
    let mut table: Option<Vec<Vec<String>>> = None;
    let mut cell: Option<String> = None;
    while let Some(node) = parser.next()? {
        match node {
            Node::Open { name, tag, empty } => match name.as_slice() {
                b"sp" if !empty => title = false,
                b"ph" => title = matches!(attr(&tag, b"type").as_deref(), Some("title" | "ctrTitle")),
                b"t" if !empty => in_text = true,
                b"br" => paragraph.push('\n'),
                b"tbl" if !empty => table = Some(Vec::new()),
                b"tr" if !empty => {
                    if let Some(rows) = table.as_mut() {
                        rows.push(Vec::new());
                    }
                }
                b"tc" if !empty => cell = Some(String::new()),
                _ => {}
            },
            Node::Text(text) if in_text => paragraph.push_str(&text),
            Node::Text(_) => {}
            Node::Close { name } => match name.as_slice() {
                b"t" => in_text = false,
                b"p" => {
                    let text = std::mem::take(&mut paragraph);
                    let text = text.lines().map(|l| collapse(l).trim().to_owned()).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("\n");
                    if text.is_empty() {
                        continue;
                    }
                    match cell.as_mut() {
                        Some(cell) => {
                            if !cell.is_empty() {
                                cell.push('\n');
                            }
                            cell.push_str(&text);
                        }
                        None if title => out.push(&format!("### {}\n\n", text.replace('\n', " "))),
                        None => out.push(&format!("{text}\n")),
                    }
                }
                b"tc" => {
                    if let (Some(text), Some(rows)) = (cell.take(), table.as_mut())
                        && let Some(row) = rows.last_mut()
                    {
                        row.push(text);
                    }
                }
                b"tbl" => {
                    if let Some(rows) = table.take() {
                        out.table(&rows);
                    }
                }
                b"sp" => title = false,
                _ => {}
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Write};

    use super::*;
    use crate::convert::test_limits as limits;

    fn pptx(slides: &[&str], order: &[usize]) -> Vec<u8> {
        let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default();
        let mut add = |name: &str, body: &str| {
            writer.start_file(name, options).expect("in-memory zip");
            writer.write_all(body.as_bytes()).expect("in-memory zip");
        };
        let ids: String = order.iter().map(|i| format!(r#"<p:sldId id="{}" r:id="rId{i}"/>"#, 256 + i)).collect();
        add(PRESENTATION, &format!(r#"<p:presentation xmlns:p="p" xmlns:r="r"><p:sldIdLst>{ids}</p:sldIdLst></p:presentation>"#));
        let rels: String = (1..=slides.len())
            .map(|i| format!(r#"<Relationship Id="rId{i}" Type="http://x/slide" Target="slides/slide{i}.xml"/>"#))
            .collect();
        add(PRESENTATION_RELS, &format!("<Relationships>{rels}</Relationships>"));
        for (i, body) in slides.iter().enumerate() {
            add(
                &format!("ppt/slides/slide{}.xml", i + 1),
                &format!(r#"<p:sld xmlns:p="p" xmlns:a="a"><p:cSld><p:spTree>{body}</p:spTree></p:cSld></p:sld>"#),
            );
        }
        writer.finish().expect("in-memory zip").into_inner()
    }

    fn shape(placeholder: &str, lines: &[&str]) -> String {
        let paragraphs: String = lines.iter().map(|l| format!("<a:p><a:r><a:t>{l}</a:t></a:r></a:p>")).collect();
        format!(r#"<p:sp><p:nvSpPr><p:nvPr>{placeholder}</p:nvPr></p:nvSpPr><p:txBody>{paragraphs}</p:txBody></p:sp>"#)
    }

    #[test]
    fn slides_follow_the_presentation_order_with_titles() -> Result<(), FormatError> {
        let first = format!("{}{}", shape(r#"<p:ph type="title"/>"#, &["Roadmap"]), shape("", &["Ship it", "Then rest"]));
        let second = shape(r#"<p:ph type="ctrTitle"/>"#, &["Welcome"]);
        let mut out = Out::new(1 << 20);
        write(&pptx(&[&first, &second], &[2, 1]), &limits(), &mut out)?;
        let text = out.finish();
        assert_eq!(text, "## Slide 1\n\n### Welcome\n\n## Slide 2\n\n### Roadmap\n\nShip it\nThen rest\n", "{text}");
        Ok(())
    }
}
