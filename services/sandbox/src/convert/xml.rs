//! A thin pull parser over quick-xml for the Office formats: element names and attributes by their
//! local name (so `w:p`, `a:p` and an unprefixed `p` in a default namespace all read as `p`), and text
//! with the five predefined entities and character references resolved. Custom entities are never
//! expanded (no billion-laughs), and end tags need not match (damaged files still give their text).

use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};

use crate::convert::{Format, FormatError};

/// One step of the document.
#[derive(Debug)]
pub enum Node<'a> {
    /// An opening tag; `empty` for `<x/>` (no End follows).
    Open {
        name: Vec<u8>,
        tag: BytesStart<'a>,
        empty: bool,
    },
    Close {
        name: Vec<u8>,
    },
    Text(String),
}

/// Pulls [`Node`]s from one XML part.
pub struct Parser<'a> {
    reader: Reader<&'a [u8]>,
    format: Format,
    part: &'a str,
}

impl std::fmt::Debug for Parser<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parser").field("part", &self.part).finish_non_exhaustive()
    }
}

impl<'a> Parser<'a> {
    pub fn new(bytes: &'a [u8], format: Format, part: &'a str) -> Self {
        let mut reader = Reader::from_reader(bytes);
        let config = reader.config_mut();
        config.trim_text(false);
        config.check_end_names = false;
        Self { reader, format, part }
    }

    /// The next node, or None at the end of the part.
    pub fn next(&mut self) -> Result<Option<Node<'a>>, FormatError> {
        loop {
            let event = self.reader.read_event().map_err(|e| {
                FormatError::broken(
                    self.format,
                    format!("{} is not well-formed XML at byte {}: {e}", self.part, self.reader.error_position()),
                )
            })?;
            return Ok(Some(match event {
                Event::Start(tag) => Node::Open { name: tag.local_name().as_ref().to_vec(), tag, empty: false },
                Event::Empty(tag) => Node::Open { name: tag.local_name().as_ref().to_vec(), tag, empty: true },
                Event::End(tag) => Node::Close { name: tag.local_name().as_ref().to_vec() },
                Event::Text(text) => Node::Text(text.decode().map(|t| t.into_owned()).unwrap_or_default()),
                Event::CData(text) => Node::Text(text.decode().map(|t| t.into_owned()).unwrap_or_default()),
                Event::GeneralRef(reference) => {
                    let resolved = match reference.resolve_char_ref() {
                        Ok(Some(c)) => Some(c),
                        Ok(None) => match &*reference {
                            b"amp" => Some('&'),
                            b"lt" => Some('<'),
                            b"gt" => Some('>'),
                            b"quot" => Some('"'),
                            b"apos" => Some('\''),
                            _ => None,
                        },
                        Err(_) => None,
                    };
                    match resolved {
                        Some(c) => Node::Text(c.to_string()),
                        None => continue,
                    }
                }
                Event::Eof => return Ok(None),
                Event::Decl(_) | Event::PI(_) | Event::DocType(_) | Event::Comment(_) => continue,
            }));
        }
    }
}

/// The value of the attribute whose local name is `local` (`w:val`, `r:id`, `val`...), unescaped.
pub fn attr(tag: &BytesStart<'_>, local: &[u8]) -> Option<String> {
    tag.attributes().flatten().find(|a| a.key.local_name().as_ref() == local).map(|a| match a.unescape_value() {
        Ok(value) => value.into_owned(),
        Err(_) => String::from_utf8_lossy(&a.value).into_owned(),
    })
}

/// The value of the attribute with exactly this qualified name (`r:id` where the local name `id`
/// would be ambiguous).
pub fn attr_exact(tag: &BytesStart<'_>, name: &[u8]) -> Option<String> {
    tag.attributes().flatten().find(|a| a.key.as_ref() == name).map(|a| String::from_utf8_lossy(&a.value).into_owned())
}

/// One relationship of a part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relationship {
    pub id: String,
    /// The target part's name in the container.
    pub target: String,
    /// The relationship type URI (its last segment says what it is: `slide`, `notesSlide`, `worksheet`).
    pub kind: String,
}

/// The relationships part (`_rels/x.rels`), targets resolved against `base` (the directory of the part
/// the relationships belong to).
pub fn relationships(bytes: &[u8], format: Format, part: &str, base: &str) -> Result<Vec<Relationship>, FormatError> {
    let mut parser = Parser::new(bytes, format, part);
    let mut out = Vec::new();
    while let Some(node) = parser.next()? {
        if let Node::Open { name, tag, .. } = node
            && name == b"Relationship"
            && let (Some(id), Some(target)) = (attr(&tag, b"Id"), attr(&tag, b"Target"))
        {
            let kind = attr(&tag, b"Type").unwrap_or_default();
            out.push(Relationship { id, target: resolve(base, &target), kind });
        }
    }
    Ok(out)
}

/// `target` relative to the directory `base` (`ppt` + `slides/slide1.xml` = `ppt/slides/slide1.xml`,
/// `xl` + `/xl/worksheets/sheet1.xml` = `xl/worksheets/sheet1.xml`), with `..` applied.
pub fn resolve(base: &str, target: &str) -> String {
    let mut parts: Vec<&str> = if target.starts_with('/') { Vec::new() } else { base.split('/').filter(|p| !p.is_empty()).collect() };
    for piece in target.split('/') {
        match piece {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_local_and_entities_resolved() -> Result<(), FormatError> {
        let xml = br#"<?xml version="1.0"?><w:p xmlns:w="x"><w:t xml:space="preserve">a &amp; b &#233;&unknown;</w:t><w:br/></w:p>"#;
        let mut parser = Parser::new(xml, Format::Docx, "test.xml");
        let mut names = Vec::new();
        let mut text = String::new();
        while let Some(node) = parser.next()? {
            match node {
                Node::Open { name, .. } => names.push(String::from_utf8_lossy(&name).into_owned()),
                Node::Text(t) => text.push_str(&t),
                Node::Close { .. } => {}
            }
        }
        assert_eq!(names, ["p", "t", "br"]);
        assert_eq!(text, "a & b é");
        Ok(())
    }

    #[test]
    fn targets_resolve_against_their_base() {
        assert_eq!(resolve("ppt", "slides/slide1.xml"), "ppt/slides/slide1.xml");
        assert_eq!(resolve("ppt/slides", "../notesSlides/n1.xml"), "ppt/notesSlides/n1.xml");
        assert_eq!(resolve("xl", "/xl/worksheets/sheet1.xml"), "xl/worksheets/sheet1.xml");
    }

    #[test]
    fn malformed_xml_is_a_broken_document() {
        let mut parser = Parser::new(b"<w:document><w:body><w:p", Format::Docx, "word/document.xml");
        let mut result = Ok(None);
        for _ in 0..10 {
            result = parser.next();
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(FormatError::Broken(ref m)) if m.contains("word/document.xml")), "{result:?}");
    }
}
