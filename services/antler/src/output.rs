//! Printing to stdout without panicking when nobody reads it any more.
//!
//! `println!` panics when a write fails, and a reader that leaves early (`antler memory export | head
//! -2`) makes every later write fail with a broken pipe: the process died with exit code 101 and a panic
//! message. Every line the client commands print goes through [`outln!`] / [`out!`] instead, which return
//! the write's `io::Result`; commands pass it up with `?`, and `cli::exit` ends a command whose reader
//! left quietly, with exit code 0 (the reader got what it asked for; nothing is printed on stderr).
//!
//! Also how text is styled: `--color` ([`ColorChoice`]) and the colours themselves ([`Style`]).

use std::io::IsTerminal;

/// `println!` to stdout, returning the write's `std::io::Result<()>`.
macro_rules! outln {
    () => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock())
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `print!` to stdout (flushed), returning the write's `std::io::Result<()>`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        write!(out, $($arg)*).and_then(|()| out.flush())
    }};
}

/// Whether `error` is stdout's reader having left: a write's own `io::Error`, passed up as it is. Only
/// the error itself, not its sources: a gRPC call whose connection broke carries a BrokenPipe among its
/// sources, and that is a failure to report (exit code 3), not a reader that left.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// When text output is coloured (`--color`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless `NO_COLOR` is set (https://no-color.org) or `TERM=dumb`.
    #[default]
    Auto,
    /// Always, also when piped.
    Always,
    /// Never.
    Never,
}

/// Colours on a terminal, plain text when piped or when NO_COLOR is set (https://no-color.org).
#[derive(Debug, Clone, Copy)]
pub struct Style {
    color: bool,
}

impl Style {
    /// The style for stdout under `choice`.
    pub fn stdout(choice: ColorChoice) -> Self {
        let no_color = std::env::var("NO_COLOR").ok();
        let term = std::env::var("TERM").ok();
        Self::new(choice, std::io::stdout().is_terminal(), no_color.as_deref(), term.as_deref())
    }

    /// `auto` colours a terminal whose environment does not say otherwise (`NO_COLOR`, `TERM=dumb`).
    pub fn new(choice: ColorChoice, is_terminal: bool, no_color: Option<&str>, term: Option<&str>) -> Self {
        let color = match choice {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => allowed(is_terminal, no_color, term),
        };
        Self { color }
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.color { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
    }

    /// A status word, coloured by what it means: green done, yellow paused or busy, red failed.
    pub fn status(self, word: &str) -> String {
        let code = match word {
            "SUCCESS" | "IDLE" | "READY" | "CONNECTED" | "ENABLED" => "32",
            "RUNNING" | "PENDING" | "FINALIZING" | "BUSY" | "INTERRUPTED" | "CONNECTING" => "33",
            "ERROR" | "TIMEOUT" | "FAILED" | "DISCONNECTED" | "INVALID" => "31",
            _ => "0",
        };
        self.paint(code, word)
    }

    /// Secondary text (ids, times).
    pub fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }

    /// A heading line, a name to find again (a tool's).
    pub fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }

    /// Something that went well (a tool call's `ok`, a satisfied receipt).
    pub fn good(self, text: &str) -> String {
        self.paint("32", text)
    }

    /// Something that failed.
    pub fn bad(self, text: &str) -> String {
        self.paint("31", text)
    }

    /// Something to look at (an outcome that is not known).
    pub fn warn(self, text: &str) -> String {
        self.paint("33", text)
    }

    /// Who speaks (the assistant's label).
    pub fn accent(self, text: &str) -> String {
        self.paint("36", text)
    }
}

/// Whether colours and a spinner may be drawn: a terminal, and neither `NO_COLOR` nor `TERM=dumb`.
pub fn allowed(is_terminal: bool, no_color: Option<&str>, term: Option<&str>) -> bool {
    is_terminal && no_color.is_none_or(str::is_empty) && term != Some("dumb")
}
