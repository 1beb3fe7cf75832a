//! HTML (.html, .htm): a small forgiving tokenizer (tags, attributes, comments, entities; never an
//! error — broken markup still gives its text) and a writer that maps the structure to Markdown:
//! `h1`-`h6` headings, paragraphs and other blocks, `ul`/`ol` items (nested by indentation), links
//! `[text](href)`, `strong`/`em`/`code`, `pre` as fenced code, `blockquote`, tables (a nested table is
//! flattened into its cell), image alt text. `head`, `script`, `style`, `noscript`, `template` and
//! `svg` are left out. The charset is UTF-8, else the one a `<meta>` names, else windows-1252.

use crate::convert::FormatError;
use crate::convert::markdown::{Out, collapse};

/// Elements whose content is never text of the document.
const SKIPPED: [&str; 7] = ["head", "script", "style", "noscript", "template", "svg", "iframe"];
/// Elements that start and end a block.
const BLOCKS: [&str; 27] = [
    "p",
    "div",
    "section",
    "article",
    "header",
    "footer",
    "main",
    "aside",
    "nav",
    "ul",
    "ol",
    "li",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "pre",
    "blockquote",
    "dl",
    "dt",
    "dd",
    "figure",
    "figcaption",
    "form",
    "address",
];

pub fn write(bytes: &[u8], out: &mut Out) -> Result<(), FormatError> {
    let text = decode(bytes);
    let mut writer = Writer::new(out);
    tokenize(&text, &mut |token| writer.token(token));
    writer.flush();
    Ok(())
}

/// The document as text: UTF-8 when it is, else the declared charset, else windows-1252.
fn decode(bytes: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return text.trim_start_matches('\u{feff}').to_owned();
    }
    let head = String::from_utf8_lossy(&bytes[..bytes.len().min(2048)]).to_ascii_lowercase();
    let label = head.find("charset=").map(|at| {
        head[at + 8..]
            .trim_start_matches(['"', '\''])
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect::<String>()
    });
    let encoding = label.and_then(|l| encoding_rs::Encoding::for_label(l.as_bytes())).unwrap_or(encoding_rs::WINDOWS_1252);
    encoding.decode(bytes).0.into_owned()
}

#[derive(Debug, PartialEq, Eq)]
enum Token<'a> {
    Open { name: String, attrs: Vec<(String, String)>, self_closing: bool },
    Close { name: String },
    Text(&'a str),
}

/// Calls `emit` for each token of `html`. The content of `script` and `style` is raw text up to its
/// end tag (never parsed as markup), and it is not emitted.
fn tokenize<'a>(html: &'a str, emit: &mut dyn FnMut(Token<'a>)) {
    let bytes = html.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'<' {
            let end = html[i..].find('<').map_or(bytes.len(), |n| i + n);
            emit(Token::Text(&html[i..end]));
            i = end;
            continue;
        }
        let rest = &html[i..];
        if let Some(comment) = rest.strip_prefix("<!--") {
            i = comment.find("-->").map_or(bytes.len(), |n| i + 4 + n + 3);
            continue;
        }
        if rest.starts_with("<!") || rest.starts_with("<?") {
            i = rest.find('>').map_or(bytes.len(), |n| i + n + 1);
            continue;
        }
        let closing = rest.starts_with("</");
        let name_start = if closing { 2 } else { 1 };
        let name_len =
            rest[name_start..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == ':')).unwrap_or(rest.len() - name_start);
        if name_len == 0 || !rest.as_bytes()[name_start].is_ascii_alphabetic() {
            emit(Token::Text("<"));
            i += 1;
            continue;
        }
        let name = rest[name_start..name_start + name_len].to_ascii_lowercase();
        let (attrs, self_closing, consumed) = attributes(&rest[name_start + name_len..]);
        i += name_start + name_len + consumed;
        if closing {
            emit(Token::Close { name });
            continue;
        }
        let raw = matches!(name.as_str(), "script" | "style" | "textarea" | "title");
        emit(Token::Open { name: name.clone(), attrs, self_closing });
        if raw && !self_closing {
            let end_tag = format!("</{name}");
            let lower = html[i..].to_ascii_lowercase();
            let end = lower.find(&end_tag).map_or(bytes.len(), |n| i + n);
            if name == "textarea" {
                emit(Token::Text(&html[i..end]));
            }
            i = end;
        }
    }
}

/// Parses attributes up to the tag's `>`: (attributes, self-closing, bytes consumed including `>`).
fn attributes(s: &str) -> (Vec<(String, String)>, bool, usize) {
    let bytes = s.as_bytes();
    let mut attrs = Vec::new();
    let mut i = 0;
    let mut self_closing = false;
    while i < bytes.len() {
        match bytes[i] {
            b'>' => return (attrs, self_closing, i + 1),
            b'/' => {
                self_closing = true;
                i += 1;
            }
            c if c.is_ascii_whitespace() => i += 1,
            _ => {
                self_closing = false;
                let start = i;
                while i < bytes.len() && !bytes[i].is_ascii_whitespace() && !matches!(bytes[i], b'=' | b'>' | b'/') {
                    i += 1;
                }
                let key = s[start..i].to_ascii_lowercase();
                while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                    i += 1;
                }
                let mut value = String::new();
                if i < bytes.len() && bytes[i] == b'=' {
                    i += 1;
                    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                        i += 1;
                    }
                    if i < bytes.len() && (bytes[i] == b'"' || bytes[i] == b'\'') {
                        let quote = bytes[i];
                        let end = bytes[i + 1..].iter().position(|&b| b == quote).map_or(bytes.len(), |n| i + 1 + n);
                        value = unescape(&s[i + 1..end]);
                        i = (end + 1).min(bytes.len());
                    } else {
                        let start = i;
                        while i < bytes.len() && !bytes[i].is_ascii_whitespace() && bytes[i] != b'>' {
                            i += 1;
                        }
                        value = unescape(&s[start..i]);
                    }
                }
                attrs.push((key, value));
            }
        }
    }
    (attrs, self_closing, bytes.len())
}

/// Resolves character references: the common named ones and every numeric one.
fn unescape(text: &str) -> String {
    if !text.contains('&') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let end = rest[1..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '#')).map(|n| n + 1);
        let (name, len) = match end {
            Some(end) if end > 1 => (&rest[1..end], end + usize::from(rest[end..].starts_with(';'))),
            _ => ("", 0),
        };
        let resolved = if let Some(number) = name.strip_prefix("#x").or_else(|| name.strip_prefix("#X")) {
            u32::from_str_radix(number, 16).ok().and_then(char::from_u32)
        } else if let Some(number) = name.strip_prefix('#') {
            number.parse().ok().and_then(char::from_u32)
        } else {
            named(name)
        };
        match resolved {
            Some(c) if len > 0 => {
                out.push(c);
                rest = &rest[len..];
            }
            _ => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn named(name: &str) -> Option<char> {
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => ' ',
        "ndash" => '–',
        "mdash" => '—',
        "hellip" => '…',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "laquo" => '«',
        "raquo" => '»',
        "bull" => '•',
        "middot" => '·',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "deg" => '°',
        "euro" => '€',
        "pound" => '£',
        "yen" => '¥',
        "cent" => '¢',
        "sect" => '§',
        "para" => '¶',
        "times" => '×',
        "divide" => '÷',
        "plusmn" => '±',
        "larr" => '←',
        "rarr" => '→',
        "uarr" => '↑',
        "darr" => '↓',
        "shy" => '\u{ad}',
        "zwj" => '\u{200d}',
        "zwnj" => '\u{200c}',
        _ => return None,
    })
}

#[derive(Debug, Default)]
struct Table {
    rows: Vec<Vec<String>>,
    row: Vec<String>,
    cell: Option<String>,
}

/// Turns tokens into Markdown blocks.
struct Writer<'o> {
    out: &'o mut Out,
    /// Inline text of the current block.
    line: String,
    /// Depth inside elements whose content is skipped.
    skip: usize,
    pre: usize,
    quote: usize,
    heading: Option<usize>,
    /// Open lists: ordered, next number.
    lists: Vec<(bool, usize)>,
    /// The prefix of the current block's first line (`- `, `1. `), taken by the next flush.
    item: Option<String>,
    tables: Vec<Table>,
    /// Open links: (href, where their text starts in `line`).
    links: Vec<(Option<String>, usize)>,
}

impl std::fmt::Debug for Writer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("line", &self.line).finish_non_exhaustive()
    }
}

impl<'o> Writer<'o> {
    fn new(out: &'o mut Out) -> Self {
        Self {
            out,
            line: String::new(),
            skip: 0,
            pre: 0,
            quote: 0,
            heading: None,
            lists: Vec::new(),
            item: None,
            tables: Vec::new(),
            links: Vec::new(),
        }
    }

    fn token(&mut self, token: Token<'_>) {
        if self.out.is_full() {
            return;
        }
        match token {
            Token::Text(text) => {
                if self.skip == 0 {
                    self.line.push_str(&unescape(text));
                }
            }
            Token::Open { name, attrs, self_closing } => {
                // A <head> that is never closed ends where the body starts.
                if name == "body" {
                    self.skip = 0;
                }
                if SKIPPED.contains(&name.as_str()) {
                    if !self_closing {
                        self.skip += 1;
                    }
                    return;
                }
                if self.skip > 0 {
                    return;
                }
                self.open(&name, &attrs, self_closing);
            }
            Token::Close { name } => {
                if SKIPPED.contains(&name.as_str()) {
                    self.skip = self.skip.saturating_sub(1);
                    return;
                }
                if self.skip > 0 {
                    return;
                }
                self.close(&name);
            }
        }
    }

    fn open(&mut self, name: &str, attrs: &[(String, String)], self_closing: bool) {
        let attr = |key: &str| attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        match name {
            "br" => self.line.push('\n'),
            "hr" => {
                self.flush();
                self.out.blank_line();
                self.out.push("---\n\n");
            }
            "img" => {
                if let Some(alt) = attr("alt").filter(|a| !a.trim().is_empty()) {
                    self.line.push_str(&format!("[image: {}]", collapse(&alt).trim()));
                }
            }
            "a" if !self_closing => {
                let href =
                    attr("href").filter(|h| !h.is_empty() && !h.starts_with('#') && !h.to_ascii_lowercase().starts_with("javascript:"));
                self.links.push((href, self.line.len()));
            }
            "strong" | "b" if self.pre == 0 => self.line.push_str("**"),
            "em" | "i" if self.pre == 0 => self.line.push('*'),
            "code" if self.pre == 0 => self.line.push('`'),
            "table" => {
                self.flush();
                self.tables.push(Table::default());
            }
            "tr" => {
                if let Some(table) = self.tables.last_mut() {
                    table.row = Vec::new();
                }
            }
            "td" | "th" => {
                self.flush();
                if let Some(table) = self.tables.last_mut() {
                    table.cell = Some(String::new());
                }
            }
            _ if BLOCKS.contains(&name) => {
                self.flush();
                match name {
                    "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => self.heading = name[1..].parse().ok(),
                    "pre" => {
                        self.pre += 1;
                        if self.pre == 1 && self.tables.is_empty() {
                            self.out.blank_line();
                            self.out.push("```\n");
                        }
                    }
                    "blockquote" => self.quote += 1,
                    "ul" => self.lists.push((false, 1)),
                    "ol" => self.lists.push((true, attr("start").and_then(|s| s.parse().ok()).unwrap_or(1))),
                    "li" => {
                        let depth = self.lists.len().saturating_sub(1);
                        let marker = match self.lists.last_mut() {
                            Some((true, n)) => {
                                let marker = format!("{n}. ");
                                *n += 1;
                                marker
                            }
                            _ => "- ".to_owned(),
                        };
                        self.item = Some(format!("{}{marker}", "  ".repeat(depth)));
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn close(&mut self, name: &str) {
        match name {
            "a" => {
                if let Some((href, start)) = self.links.pop()
                    && let Some(href) = href
                    && start <= self.line.len()
                {
                    let text = collapse(&self.line[start..]).trim().to_owned();
                    self.line.truncate(start);
                    if text.is_empty() {
                        return;
                    }
                    self.line.push_str(&format!("[{text}]({href})"));
                }
            }
            "strong" | "b" if self.pre == 0 => self.line.push_str("**"),
            "em" | "i" if self.pre == 0 => self.line.push('*'),
            "code" if self.pre == 0 => self.line.push('`'),
            "td" | "th" => {
                self.flush();
                if let Some(table) = self.tables.last_mut()
                    && let Some(cell) = table.cell.take()
                {
                    table.row.push(cell);
                }
            }
            "tr" => {
                self.flush();
                if let Some(table) = self.tables.last_mut() {
                    if let Some(cell) = table.cell.take() {
                        table.row.push(cell);
                    }
                    let row = std::mem::take(&mut table.row);
                    if !row.is_empty() {
                        table.rows.push(row);
                    }
                }
            }
            "table" => {
                self.flush();
                if let Some(mut table) = self.tables.pop() {
                    if !table.row.is_empty() {
                        let row = std::mem::take(&mut table.row);
                        table.rows.push(row);
                    }
                    match self.tables.last_mut() {
                        Some(parent) => {
                            let flat: Vec<String> = table.rows.iter().map(|r| r.join(" | ")).collect();
                            parent.cell.get_or_insert_with(String::new).push_str(&flat.join("\n"));
                        }
                        None => self.out.table(&table.rows),
                    }
                }
            }
            _ if BLOCKS.contains(&name) => {
                self.flush();
                match name {
                    "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => self.heading = None,
                    "pre" => {
                        self.pre = self.pre.saturating_sub(1);
                        if self.pre == 0 && self.tables.is_empty() {
                            self.out.push("```\n\n");
                        }
                    }
                    "blockquote" => self.quote = self.quote.saturating_sub(1),
                    "ul" | "ol" => {
                        self.lists.pop();
                        if self.lists.is_empty() {
                            self.out.blank_line();
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// Ends the current block: writes the text gathered since the last one.
    fn flush(&mut self) {
        let raw = std::mem::take(&mut self.line);
        if let Some(table) = self.tables.last_mut() {
            let text = collapse(&raw.replace('\n', " "));
            let text = text.trim();
            if let Some(cell) = table.cell.as_mut()
                && !text.is_empty()
            {
                if !cell.is_empty() {
                    cell.push(' ');
                }
                cell.push_str(text);
            }
            return;
        }
        if self.pre > 0 {
            if !raw.is_empty() {
                self.out.push(&raw);
                if !raw.ends_with('\n') {
                    self.out.push("\n");
                }
            }
            return;
        }
        let lines: Vec<String> = raw.split('\n').map(|l| collapse(l).trim().to_owned()).filter(|l| !l.is_empty()).collect();
        let item = self.item.take();
        if lines.is_empty() {
            if let Some(item) = item {
                // An item whose text is in a nested block: keep its marker for that block.
                self.item = Some(item);
            }
            return;
        }
        let quote = "> ".repeat(self.quote);
        if let Some(level) = self.heading {
            self.out.blank_line();
            self.out.push(&format!("{quote}{} {}\n\n", "#".repeat(level.clamp(1, 6)), lines.join(" ")));
            return;
        }
        match item {
            Some(marker) => {
                let indent = " ".repeat(marker.len());
                self.out.push(&format!("{quote}{marker}{}\n", lines.join(&format!("\n{quote}{indent}"))));
            }
            None if !self.lists.is_empty() => {
                let indent = "  ".repeat(self.lists.len());
                self.out.push(&format!("{quote}{indent}{}\n", lines.join(&format!("\n{quote}{indent}"))));
            }
            None => {
                self.out.blank_line();
                self.out.push(&format!("{quote}{}\n\n", lines.join(&format!("  \n{quote}"))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert(html: &str) -> String {
        let mut out = Out::new(1 << 20);
        let _ = write(html.as_bytes(), &mut out);
        out.finish()
    }

    #[test]
    fn structure_becomes_markdown() {
        let html = r#"<!DOCTYPE html><html><head><title>T</title><style>p{color:red}</style><script>if (a<b) alert("x")</script></head>
<body><h1>Annual   report</h1><p>Profit rose <b>12%</b> &amp; see <a href="https://example.com/x">the&nbsp;notes</a>.</p>
<ul><li>one</li><li>two<ol><li>nested</li></ol></li></ul>
<table><tr><th>Region</th><th>Sales</th></tr><tr><td>North</td><td>4|2</td></tr></table>
<pre>let x = 1;
  indented</pre><!-- a comment --><blockquote>Quoted</blockquote></body></html>"#;
        let text = convert(html);
        assert_eq!(
            text,
            "# Annual report\n\nProfit rose **12%** & see [the notes](https://example.com/x).\n\n- one\n- two\n  1. nested\n\n| Region | Sales |\n| --- | --- |\n| North | 4\\|2 |\n\n```\nlet x = 1;\n  indented\n```\n\n> Quoted\n",
            "{text}"
        );
    }

    #[test]
    fn broken_markup_and_entities_still_give_text() {
        let text = convert("<div><p>a < b &lt; c &#x263A; &#9731; &bogus; <unclosed");
        assert!(text.starts_with("a < b < c ☺ ☃ &bogus;"), "{text}");
    }

    #[test]
    fn an_unclosed_head_ends_at_the_body() {
        assert_eq!(convert("<html><head><meta charset=utf-8><title>T</title><body><p>Text</p>"), "Text\n");
    }

    #[test]
    fn a_declared_charset_is_honoured() {
        let mut bytes = b"<meta charset=\"iso-8859-1\"><p>caf".to_vec();
        bytes.push(0xE9);
        bytes.extend_from_slice(b"</p>");
        let mut out = Out::new(1000);
        let _ = write(&bytes, &mut out);
        assert_eq!(out.finish(), "café\n");
    }
}
