//! A fetched page as text the model reads: HTML becomes Markdown of its main content (not its menus),
//! plain text and JSON stay as they are, and anything long is cut with a marker.
//!
//! HTML goes through one parse (html5ever, through `dom_query`). A page that marks its main content
//! (`<main>`, `role="main"`, or a single `<article>`) gives that element, with navigation, asides,
//! forms, headers, footers and hidden parts left out; any other page goes through `dom_smoothie`, a
//! port of Mozilla's Readability, which scores the blocks of the page to find the article. The
//! landmark path costs about a third of the scoring one, and most pages have landmarks.

use dom_query::Document;
use reqwest::Url;

/// Elements never converted: scripts and styles, and the page furniture around the content.
const SKIP: &[&str] = &[
    "script", "style", "meta", "head", "noscript", "nav", "aside", "header", "footer", "form", "iframe", "svg", "template", "button",
    "select", "dialog", "canvas", "object", "embed",
];
/// Furniture marked by role or hidden from readers, removed inside a landmark before conversion.
const FURNITURE: &str =
    "[role=navigation], [role=banner], [role=contentinfo], [role=complementary], [role=search], [hidden], [aria-hidden=true]";
/// A landmark with less text than this is probably a shell (a client-rendered app's `<main id=root>`),
/// so the scoring path gets the page instead.
const MIN_LANDMARK_CHARS: usize = 80;

/// How the main content was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `<main>`, `role="main"` or the page's one `<article>`.
    Landmark,
    /// Readability's scoring.
    Readability,
    /// Neither found anything: the whole body, furniture left out.
    Body,
}

/// An HTML page as Markdown.
#[derive(Debug, Clone)]
pub struct Converted {
    pub title: String,
    pub markdown: String,
    pub method: Method,
}

/// Converts `html`, fetched from `url` (relative links become absolute against it).
pub fn html_to_markdown(html: &str, url: &Url) -> Converted {
    let doc = Document::from(html);
    let title = page_title(&doc);
    if let Some(markdown) = landmark_markdown(&doc, url) {
        return Converted { title, markdown, method: Method::Landmark };
    }
    match readability(doc, url, Some(dom_smoothie::ParsePolicy::Strict)).or_else(|| readability(Document::from(html), url, None)) {
        Some(article) => {
            let title = if title.is_empty() { article.title.trim().to_owned() } else { title };
            Converted { title, markdown: tidy(&article.text_content), method: Method::Readability }
        }
        None => {
            // Readability found no article: the body without its furniture is still better than nothing.
            let doc = Document::from(html);
            let markdown = doc.body().map(|body| tidy(&body.md(Some(SKIP)))).unwrap_or_default();
            Converted { title, markdown, method: Method::Body }
        }
    }
}

/// Readability's article of `doc` in Markdown. With a `policy`, one attempt that must give at least
/// the crate's 500-character threshold (what `parse` would take from its first, strict attempt, for
/// a fifth less CPU: no copy of the document is kept for later attempts); without, `parse`'s attempts
/// from strict to raw.
fn readability(doc: Document, url: &Url, policy: Option<dom_smoothie::ParsePolicy>) -> Option<dom_smoothie::Article> {
    let config = dom_smoothie::Config { text_mode: dom_smoothie::TextMode::Markdown, ..Default::default() };
    let threshold = config.char_threshold;
    let mut readability = dom_smoothie::Readability::with_document(doc, Some(url.as_str()), Some(config)).ok()?;
    let article = match policy {
        Some(policy) => readability.parse_with_policy(policy).ok().filter(|a| a.text_content.chars().count() >= threshold)?,
        None => readability.parse().ok()?,
    };
    (!article.text_content.trim().is_empty()).then_some(article)
}

fn page_title(doc: &Document) -> String {
    let title = doc.select_single("title").text();
    let title = title.split_whitespace().collect::<Vec<_>>().join(" ");
    if !title.is_empty() {
        return title;
    }
    doc.select_single("h1").text().split_whitespace().collect::<Vec<_>>().join(" ")
}

fn landmark_markdown(doc: &Document, url: &Url) -> Option<String> {
    let mut landmark = doc.select_single("main");
    if landmark.is_empty() {
        landmark = doc.select_single("[role=main]");
    }
    if landmark.is_empty() {
        let articles = doc.select("article");
        if articles.length() != 1 {
            return None;
        }
        landmark = articles;
    }
    landmark.select(FURNITURE).remove();
    absolutize(&landmark, url);
    let node = landmark.nodes().first()?;
    let markdown = tidy(&node.md(Some(SKIP)));
    (markdown.chars().filter(|c| c.is_alphanumeric()).count() >= MIN_LANDMARK_CHARS).then_some(markdown)
}

/// Relative links and image sources in `scope` made absolute, so the model can cite and fetch them.
fn absolutize(scope: &dom_query::Selection<'_>, base: &Url) {
    for (selector, attr) in [("a[href]", "href"), ("img[src]", "src")] {
        for node in scope.select(selector).nodes() {
            let Some(value) = node.attr(attr) else { continue };
            let value = value.trim();
            if value.starts_with('#') || value.contains("://") || value.starts_with("mailto:") || value.starts_with("data:") {
                continue;
            }
            if value.starts_with("javascript:") {
                node.remove_attr(attr);
                continue;
            }
            if let Ok(joined) = base.join(value) {
                node.set_attr(attr, joined.as_str());
            }
        }
    }
}

/// Trims each line's end and collapses runs of blank lines to one.
fn tidy(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut blank = 0;
    for line in markdown.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            continue;
        }
        if !out.is_empty() {
            out.push_str(if blank > 0 { "\n\n" } else { "\n" });
        }
        blank = 0;
        out.push_str(line);
    }
    out
}

/// Bytes as text under the charset a Content-Type names: UTF-8 (the default, invalid sequences
/// replaced), or ISO-8859-1 / Windows-1252 / US-ASCII, whose bytes are taken as Latin-1 code points.
pub fn decode_text(bytes: &[u8], charset: Option<&str>) -> String {
    match charset.map(|c| c.trim().trim_matches('"').to_ascii_lowercase()) {
        Some(c) if ["iso-8859-1", "latin1", "latin-1", "windows-1252", "cp1252", "us-ascii", "ascii"].contains(&c.as_str()) => {
            bytes.iter().map(|b| char::from(*b)).collect()
        }
        _ => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// `text` cut to `cut_chars` characters (at a line break near the cut when there is one), with a
/// marker saying how much was left out and which setting cut it.
pub fn cut(text: String, cut_chars: usize) -> String {
    let total = text.chars().count();
    if total <= cut_chars {
        return text;
    }
    let end = text.char_indices().nth(cut_chars).map_or(text.len(), |(i, _)| i);
    let head = &text[..end];
    // Prefer the last line break in the final tenth, so a cut does not split a sentence mid-word.
    let head = match head.rfind('\n') {
        Some(at) if at >= end - end / 10 => &head[..at],
        _ => head,
    };
    let kept = head.chars().count();
    format!(
        "{head}\n\n[… cut: showing the first {kept} of {total} characters (runs.lead.web.fetch.cut_chars = {cut_chars}); \
         fetch a more specific page if you need the rest.]"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url() -> Url {
        Url::parse("https://news.example/2024/story.html").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_page_with_a_main_landmark_gives_its_content_without_menus() {
        let html = r#"<!doctype html><html><head><title> The  Story </title><script>var tracking = 1;</script></head><body>
            <header><nav><a href="/">Home</a> <a href="/sports">Sports menu</a></nav></header>
            <main><h1>Ferries return</h1><p>The harbour reopened on <b>Monday</b> after the <a href="../storm.html">storm</a>.</p>
              <aside>Related: celebrity gossip</aside><div role="navigation">Next page links</div>
              <p>Officials said the service would run every hour, weather permitting, until further notice from the port.</p></main>
            <footer>Copyright and cookie settings</footer></body></html>"#;
        let page = html_to_markdown(html, &url());
        assert_eq!(page.method, Method::Landmark);
        assert_eq!(page.title, "The Story");
        assert!(page.markdown.starts_with("# Ferries return"), "{}", page.markdown);
        assert!(page.markdown.contains("**Monday**"), "{}", page.markdown);
        assert!(page.markdown.contains("[storm](https://news.example/storm.html)"), "{}", page.markdown);
        for furniture in ["Sports menu", "celebrity gossip", "Next page links", "cookie", "tracking"] {
            assert!(!page.markdown.contains(furniture), "{furniture} in {}", page.markdown);
        }
    }

    #[test]
    fn a_page_without_landmarks_goes_through_readability() {
        let paragraph = "Readability scores blocks of prose, and this block has commas, sentences, and enough words to win. ";
        let html = format!(
            "<html><head><title>Essay</title></head><body><div class=menu><ul><li><a href=/a>Menu A</a></li><li><a href=/b>Menu B</a></li></ul></div>\
             <div class=content><h2>On prose</h2><p>{}</p><p>{}</p></div><div class=footer>Site footer links</div></body></html>",
            paragraph.repeat(4),
            paragraph.repeat(3)
        );
        let page = html_to_markdown(&html, &url());
        assert_eq!(page.method, Method::Readability);
        assert_eq!(page.title, "Essay");
        assert!(page.markdown.contains("Readability scores blocks of prose"), "{}", page.markdown);
        assert!(!page.markdown.contains("Menu A") && !page.markdown.contains("Site footer"), "{}", page.markdown);
    }

    #[test]
    fn a_short_page_without_landmarks_still_gives_its_text() {
        let html = "<html><head><title>Note</title></head><body><div><p>Ferries run hourly again, the harbour master said.</p></div>\
                    <div class=footer>Footer</div></body></html>";
        let page = html_to_markdown(html, &url());
        assert_ne!(page.method, Method::Landmark);
        assert!(page.markdown.contains("Ferries run hourly again, the harbour master said."), "{page:?}");
    }

    #[test]
    fn long_text_is_cut_with_a_marker_that_names_the_setting() {
        let text = "line one\nline two\n".repeat(100);
        let out = cut(text.clone(), 1000);
        assert!(out.len() < 1200 && out.contains("showing the first") && out.contains("of 1800 characters"), "{out}");
        assert!(out.contains("runs.lead.web.fetch.cut_chars = 1000"));
        assert_eq!(cut(text.clone(), 5000), text, "short text is untouched");
        let wide = "é".repeat(3000);
        assert!(cut(wide, 1000).starts_with(&"é".repeat(1000)), "cuts on character boundaries");
    }

    #[test]
    fn text_is_decoded_by_its_charset() {
        assert_eq!(decode_text(b"caf\xe9", Some("ISO-8859-1")), "café");
        assert_eq!(decode_text("café".as_bytes(), None), "café");
        assert_eq!(decode_text(b"caf\xe9", Some("utf-8")), "caf\u{fffd}");
    }
}
