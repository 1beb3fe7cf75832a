//! The "waiting" spinner of `antler run` and `antler up --demo`: while nothing arrives (the run is
//! starting, the model is thinking, a tool runs), one line at the bottom says what is awaited and for
//! how long; the next event erases it and prints as usual.
//!
//! Only on a terminal: never when stdout is piped or redirected, with `NO_COLOR` set, or with
//! `TERM=dumb`, so scripts and logs see exactly the plain lines. A few lines instead of a crate
//! (indicatif) because it must interleave with text the printer streams mid-line: it draws only when
//! no line is open, and erases itself before every event, which a progress bar's own redraw thread
//! would fight with.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How long nothing must arrive before the spinner shows (a quick run never flickers).
pub const DELAY: Duration = Duration::from_millis(400);
/// Redraw interval.
pub const TICK: Duration = Duration::from_millis(100);

const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// Whether a spinner may be drawn: a terminal, and neither `NO_COLOR` nor `TERM=dumb`.
pub fn allowed(is_terminal: bool, no_color: Option<&str>, term: Option<&str>) -> bool {
    is_terminal && no_color.is_none_or(str::is_empty) && term != Some("dumb")
}

/// See the module documentation.
#[derive(Debug)]
pub struct Spinner {
    enabled: bool,
    /// What is awaited, e.g. "waiting for the model".
    label: String,
    since: Instant,
    frame: usize,
    drawn: bool,
}

impl Spinner {
    /// A spinner for stdout (disabled unless [`allowed`]).
    pub fn stdout() -> Self {
        let no_color = std::env::var("NO_COLOR").ok();
        let term = std::env::var("TERM").ok();
        Self::new(allowed(std::io::stdout().is_terminal(), no_color.as_deref(), term.as_deref()))
    }

    pub fn new(enabled: bool) -> Self {
        Self { enabled, label: "starting the run".to_owned(), since: Instant::now(), frame: 0, drawn: false }
    }

    /// Something arrived: the wait starts again, for `label`.
    pub fn reset(&mut self, label: impl Into<String>) {
        self.label = label.into();
        self.since = Instant::now();
    }

    /// The spinner line for now, if one should be shown (`line_open`: the printer is mid-line).
    pub fn frame(&mut self, line_open: bool) -> Option<String> {
        let waited = self.since.elapsed();
        if !self.enabled || line_open || waited < DELAY {
            return None;
        }
        self.frame = (self.frame + 1) % FRAMES.len();
        Some(format!("{} {}… {:.1}s", FRAMES[self.frame], self.label, waited.as_secs_f64()))
    }

    /// Draws the current frame over the previous one.
    pub fn tick(&mut self, line_open: bool) -> std::io::Result<()> {
        if let Some(text) = self.frame(line_open) {
            let mut out = std::io::stdout().lock();
            write!(out, "\r\x1b[2K\x1b[2m{text}\x1b[0m")?;
            out.flush()?;
            self.drawn = true;
        }
        Ok(())
    }

    /// Erases the spinner line, if drawn (before an event is printed).
    pub fn clear(&mut self) -> std::io::Result<()> {
        if self.drawn {
            let mut out = std::io::stdout().lock();
            write!(out, "\r\x1b[2K")?;
            out.flush()?;
            self.drawn = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_on_a_terminal_without_no_color_or_a_dumb_term() {
        assert!(allowed(true, None, Some("xterm-256color")));
        assert!(allowed(true, Some(""), None), "an empty NO_COLOR does not count (no-color.org)");
        assert!(!allowed(false, None, Some("xterm")), "piped");
        assert!(!allowed(true, Some("1"), Some("xterm")));
        assert!(!allowed(true, None, Some("dumb")));
    }

    #[test]
    fn a_frame_shows_after_the_delay_and_never_mid_line_or_disabled() {
        let mut spinner = Spinner::new(true);
        assert_eq!(spinner.frame(false), None, "not before the delay");
        spinner.since = Instant::now() - Duration::from_secs(2);
        let frame = spinner.frame(false).unwrap_or_default();
        assert!(frame.contains("starting the run… 2."), "{frame}");
        assert_eq!(spinner.frame(true), None, "a streamed line is open");
        spinner.reset("waiting for the model");
        assert_eq!(spinner.frame(false), None, "an event restarts the wait");
        let mut off = Spinner::new(false);
        off.since = Instant::now() - Duration::from_secs(2);
        assert_eq!(off.frame(false), None);
    }
}
