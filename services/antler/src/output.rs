//! Printing to stdout without panicking when nobody reads it any more.
//!
//! `println!` panics when a write fails, and a reader that leaves early (`antler memory export | head
//! -2`) makes every later write fail with a broken pipe: the process died with exit code 101 and a panic
//! message. Every line the client commands print goes through [`outln!`] / [`out!`] instead, which return
//! the write's `io::Result`; commands pass it up with `?`, and `cli::exit` ends a command whose reader
//! left quietly, with exit code 0 (the reader got what it asked for; nothing is printed on stderr).

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
