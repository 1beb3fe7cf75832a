//! The "waiting" spinner of `antler run` and `antler up --demo`: while nothing is printed (the run is
//! starting, the model is thinking, a tool runs), one line at the bottom says what is awaited and for
//! how long; the next printed event erases it and prints as usual. While the model streams a tool
//! call's arguments — which are not printed, the call is once it starts — the wait goes on and the line
//! says whose arguments are arriving and how many bytes so far ([`ToolArguments`]): a large
//! `write_file` takes seconds, which used to be a frozen screen.
//!
//! Only on a terminal: never when stdout is piped or redirected, with `NO_COLOR` set, with
//! `TERM=dumb`, or with `--color never`, so scripts and logs see exactly the plain lines (`--color
//! always` colours a pipe, but draws no spinner into it). A few lines instead of a crate
//! (indicatif) because it must interleave with text the printer streams mid-line: it draws only when
//! no line is open, and erases itself before every event, which a progress bar's own redraw thread
//! would fight with.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use antler_proto::runs::ToolCallDelta;

use crate::output::{ColorChoice, allowed};

/// How long nothing must arrive before the spinner shows (a quick run never flickers).
pub const DELAY: Duration = Duration::from_millis(400);
/// Redraw interval.
pub const TICK: Duration = Duration::from_millis(100);

const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

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
    /// A spinner for stdout (disabled unless [`allowed`], and with `--color never`).
    pub fn stdout(color: ColorChoice) -> Self {
        let no_color = std::env::var("NO_COLOR").ok();
        let term = std::env::var("TERM").ok();
        Self::new(color != ColorChoice::Never && allowed(std::io::stdout().is_terminal(), no_color.as_deref(), term.as_deref()))
    }

    pub fn new(enabled: bool) -> Self {
        Self { enabled, label: "starting the run".to_owned(), since: Instant::now(), frame: 0, drawn: false }
    }

    /// Something arrived: the wait starts again, for `label`.
    pub fn reset(&mut self, label: impl Into<String>) {
        self.label = label.into();
        self.since = Instant::now();
    }

    /// Progress within the same wait (tool-call arguments arriving): the label changes, the clock does not.
    pub fn progress(&mut self, label: impl Into<String>) {
        self.label = label.into();
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

/// The tool calls whose arguments the model is streaming, for the spinner's label.
#[derive(Debug, Default)]
pub struct ToolArguments {
    message_id: String,
    /// Per call index: its tool name (sent with the first fragment) and the argument bytes so far.
    calls: BTreeMap<u32, (String, u64)>,
}

impl ToolArguments {
    /// Counts the fragments of one `message_delta` (a new message starts the count again).
    pub fn add(&mut self, message_id: &str, deltas: &[ToolCallDelta]) {
        if message_id != self.message_id {
            self.message_id = message_id.to_owned();
            self.calls.clear();
        }
        for delta in deltas {
            let (name, bytes) = self.calls.entry(delta.index).or_default();
            if name.is_empty() {
                name.clone_from(&delta.name);
            }
            // The offset says where the fragment starts, so a fragment sent twice is not counted twice.
            *bytes = (*bytes).max(delta.arguments_offset + delta.arguments.len() as u64);
        }
    }

    /// "write_file: receiving its arguments, 1.2 kB"; several calls are named together.
    pub fn label(&self) -> String {
        let names: Vec<&str> = self.calls.values().map(|(name, _)| if name.is_empty() { "a tool call" } else { name.as_str() }).collect();
        let bytes: u64 = self.calls.values().map(|(_, bytes)| bytes).sum();
        let whose = if names.len() == 1 { "its" } else { "their" };
        format!("{}: receiving {whose} arguments, {}", names.join(", "), size(bytes))
    }
}

/// A byte count for people: 512 B, 1.2 kB, 3.4 MB.
fn size(bytes: u64) -> String {
    match bytes {
        0..1_000 => format!("{bytes} B"),
        1_000..1_000_000 => format!("{:.1} kB", bytes as f64 / 1e3),
        _ => format!("{:.1} MB", bytes as f64 / 1e6),
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

    #[test]
    fn streaming_arguments_keep_the_wait_and_say_how_much_has_arrived() {
        let mut spinner = Spinner::new(true);
        spinner.since = Instant::now() - Duration::from_secs(3);
        let mut arguments = ToolArguments::default();
        let delta = |index, name: &str, arguments: &str, offset| ToolCallDelta {
            index,
            name: name.to_owned(),
            arguments: arguments.to_owned(),
            arguments_offset: offset,
            ..ToolCallDelta::default()
        };
        arguments.add("m-1", &[delta(0, "write_file", "{\"path\": \"/mnt/a\", ", 0)]);
        arguments.add("m-1", &[delta(0, "", &"x".repeat(1200), 20)]);
        spinner.progress(arguments.label());
        let frame = spinner.frame(false).unwrap_or_default();
        assert!(frame.contains("write_file: receiving its arguments, 1.2 kB… 3."), "the clock runs on: {frame}");
        // The same fragment again (a replay) is not counted twice; a second call is named too.
        arguments.add("m-1", &[delta(0, "", &"x".repeat(1200), 20), delta(1, "present_files", "{}", 0)]);
        assert_eq!(arguments.label(), "write_file, present_files: receiving their arguments, 1.2 kB");
        // A new message counts afresh.
        arguments.add("m-2", &[delta(0, "bash", "{}", 0)]);
        assert_eq!(arguments.label(), "bash: receiving its arguments, 2 B");
    }
}
