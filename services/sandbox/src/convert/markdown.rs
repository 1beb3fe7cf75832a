//! The Markdown being written: a string that stops growing at the output limit (parsers check
//! [`Out::is_full`] to stop early, so a million-row sheet costs no more than the limit), and the small
//! escaping rules the formats share.

/// Markdown under construction, bounded by `sandbox.uploads.convert.max_output_bytes`.
#[derive(Debug)]
pub struct Out {
    text: String,
    max: usize,
    truncated: bool,
}

impl Out {
    pub fn new(max_bytes: u64) -> Self {
        Self { text: String::new(), max: usize::try_from(max_bytes).unwrap_or(usize::MAX), truncated: false }
    }

    /// Appends `s`, cut at a character boundary when the limit is reached.
    pub fn push(&mut self, s: &str) {
        if self.truncated {
            return;
        }
        let room = self.max.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
            return;
        }
        let mut cut = room;
        while cut > 0 && !s.is_char_boundary(cut) {
            cut -= 1;
        }
        self.text.push_str(&s[..cut]);
        self.truncated = true;
    }

    /// Whether the limit was reached (nothing more will be kept).
    pub fn is_full(&self) -> bool {
        self.truncated
    }

    /// Ends the current block with a blank line (never more than one).
    pub fn blank_line(&mut self) {
        if self.text.is_empty() || self.text.ends_with("\n\n") {
            return;
        }
        if self.text.ends_with('\n') {
            self.push("\n");
        } else {
            self.push("\n\n");
        }
    }

    /// A table: the first row is the header. Rows are padded to the widest.
    pub fn table(&mut self, rows: &[Vec<String>]) {
        let width = rows.iter().map(Vec::len).max().unwrap_or(0);
        if width == 0 {
            return;
        }
        self.blank_line();
        for (i, row) in rows.iter().enumerate() {
            let mut line = String::from("|");
            for c in 0..width {
                line.push(' ');
                line.push_str(&cell(row.get(c).map(String::as_str).unwrap_or("")));
                line.push_str(" |");
            }
            line.push('\n');
            self.push(&line);
            if i == 0 {
                self.push(&format!("|{}\n", " --- |".repeat(width)));
            }
            if self.is_full() {
                return;
            }
        }
        self.push("\n");
    }

    /// The Markdown, with a marker line when it was cut.
    pub fn finish(mut self) -> String {
        if self.truncated {
            self.text.push_str(&format!(
                "\n\n[... truncated: the Markdown was cut at {} bytes (sandbox.uploads.convert.max_output_bytes) ...]\n",
                self.max
            ));
        } else {
            let trimmed = self.text.trim_end().len();
            self.text.truncate(trimmed);
            self.text.push('\n');
        }
        self.text
    }
}

/// Text made safe for one table cell: pipes escaped, line breaks as `<br>`, runs of blanks collapsed.
pub fn cell(text: &str) -> String {
    let lines: Vec<String> = text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).filter(|l| !l.is_empty()).collect();
    lines.join("<br>").replace('|', "\\|")
}

/// Collapses whitespace runs to one space (HTML and XML text that is not preformatted).
pub fn collapse(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            space = true;
        } else {
            if space && !out.is_empty() {
                out.push(' ');
            }
            space = false;
            out.push(c);
        }
    }
    if space && !out.is_empty() {
        out.push(' ');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_cuts_at_a_character_boundary_and_says_so() {
        let mut out = Out::new(5);
        out.push("ab");
        out.push("cdé€f");
        assert!(out.is_full());
        let text = out.finish();
        assert!(text.starts_with("abcd"), "{text}");
        assert!(text.contains("truncated") && text.contains("max_output_bytes"), "{text}");
    }

    #[test]
    fn tables_escape_pipes_and_pad_rows() {
        let mut out = Out::new(1000);
        out.table(&[vec!["a".into(), "b|c".into()], vec!["x\ny".into()]]);
        assert_eq!(out.finish(), "| a | b\\|c |\n| --- | --- |\n| x<br>y |  |\n");
    }
}
