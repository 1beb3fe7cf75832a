//! The child side of a conversion: the service's executable started as
//! `<exe> __antler-convert-document format=pdf max_input=… …`, reading the document on stdin and
//! writing Markdown on stdout. Every binary that serves the sandbox calls [`run_if_requested`] first
//! thing in `main` (`antler-sandbox`, `antler`).
//!
//! Before it reads a byte it limits itself — address space, CPU seconds, no file writes (RLIMIT_FSIZE
//! 0), no new processes or threads (RLIMIT_NPROC 0), few descriptors, no core dump (a crash must not
//! write the document to disk) — and asks for SIGKILL when its parent dies. The exit code says how it
//! went ([`Exit`]); on failure the first line of stderr is the message for the client.

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};

use rustix::process::{Resource, Rlimit};

use crate::convert::{Format, FormatError, Limits};

/// The first argument that turns a process into a worker.
pub const MARKER: &str = "__antler-convert-document";

/// Exit codes of the worker (anything else is a crash or a signal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    Usage = 2,
    Encrypted = 10,
    Broken = 11,
    TooLarge = 12,
}

impl Exit {
    pub fn from_code(code: i32) -> Option<Exit> {
        [Exit::Ok, Exit::Usage, Exit::Encrypted, Exit::Broken, Exit::TooLarge].into_iter().find(|e| *e as i32 == code)
    }
}

/// What the parent asks of one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub format: Format,
    pub limits: Limits,
    /// RLIMIT_AS, in bytes.
    pub max_memory_bytes: u64,
    /// RLIMIT_CPU, in seconds.
    pub cpu_secs: u64,
}

impl Job {
    /// The worker's arguments after the marker.
    pub fn args(&self) -> Vec<String> {
        let l = &self.limits;
        vec![
            format!("format={}", self.format.label()),
            format!("max_input={}", l.max_input_bytes),
            format!("max_output={}", l.max_output_bytes),
            format!("max_zip_entries={}", l.max_zip_entries),
            format!("max_part={}", l.max_inflated_part_bytes),
            format!("max_total={}", l.max_inflated_total_bytes),
            format!("memory={}", self.max_memory_bytes),
            format!("cpu={}", self.cpu_secs),
        ]
    }

    /// Parses [`Job::args`].
    pub fn parse(args: &[OsString]) -> Result<Job, String> {
        let mut format = None;
        let mut numbers = std::collections::HashMap::new();
        for arg in args {
            let arg = arg.to_str().ok_or("arguments must be UTF-8")?;
            let (key, value) = arg.split_once('=').ok_or_else(|| format!("`{arg}` is not key=value"))?;
            if key == "format" {
                format = Some(Format::from_label(value).ok_or_else(|| format!("unknown format `{value}`"))?);
            } else {
                numbers.insert(key.to_owned(), value.parse::<u64>().map_err(|_| format!("{key}: `{value}` is not a number"))?);
            }
        }
        let get = |key: &str| numbers.get(key).copied().ok_or_else(|| format!("missing {key}="));
        Ok(Job {
            format: format.ok_or("missing format=")?,
            limits: Limits {
                max_input_bytes: get("max_input")?,
                max_output_bytes: get("max_output")?,
                max_zip_entries: get("max_zip_entries")?,
                max_inflated_part_bytes: get("max_part")?,
                max_inflated_total_bytes: get("max_total")?,
            },
            max_memory_bytes: get("memory")?,
            cpu_secs: get("cpu")?,
        })
    }
}

/// Runs the worker and exits, when this process was started as one (its first argument is
/// [`MARKER`]); returns at once otherwise.
pub fn run_if_requested() {
    let mut args = std::env::args_os();
    let _program = args.next();
    if args.next().as_deref() != Some(OsStr::new(MARKER)) {
        return;
    }
    let rest: Vec<OsString> = args.collect();
    let code = run(&rest);
    std::process::exit(code as i32);
}

fn run(args: &[OsString]) -> Exit {
    let job = match Job::parse(args) {
        Ok(job) => job,
        Err(message) => return fail(Exit::Usage, &format!("{MARKER}: {message}")),
    };
    // Should the parent die, this process goes with it. (A parent that died before this line is
    // caught by the CPU limit below.)
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    for (resource, value) in [
        (Resource::As, job.max_memory_bytes),
        (Resource::Cpu, job.cpu_secs),
        (Resource::Fsize, 0),
        (Resource::Nproc, 0),
        (Resource::Nofile, 16),
        (Resource::Core, 0),
    ] {
        // Lowering a limit never needs a privilege; a failure means the limit is already lower.
        let _ = rustix::process::setrlimit(resource, Rlimit { current: Some(value), maximum: Some(value) });
    }
    let mut input = Vec::new();
    let max = job.limits.max_input_bytes;
    if let Err(e) = std::io::stdin().lock().take(max.saturating_add(1)).read_to_end(&mut input) {
        return fail(Exit::Broken, &format!("cannot read the document: {e}"));
    }
    if input.len() as u64 > max {
        return fail(Exit::TooLarge, &format!("the document is larger than {max} bytes (sandbox.uploads.convert.max_input_bytes)"));
    }
    match crate::convert::to_markdown(job.format, &input, &job.limits) {
        Ok(markdown) => {
            drop(input);
            let mut stdout = std::io::stdout().lock();
            if stdout.write_all(markdown.as_bytes()).and_then(|()| stdout.flush()).is_err() {
                // The parent stopped reading (it gave up on this conversion): nothing to report.
                return Exit::Broken;
            }
            Exit::Ok
        }
        Err(FormatError::Encrypted(m)) => fail(Exit::Encrypted, &m),
        Err(FormatError::Broken(m)) => fail(Exit::Broken, &m),
        Err(FormatError::TooLarge(m)) => fail(Exit::TooLarge, &m),
    }
}

fn fail(exit: Exit, message: &str) -> Exit {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{}", message.replace('\n', " "));
    exit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_arguments_round_trip() -> Result<(), String> {
        let job = Job { format: Format::Xlsx, limits: crate::convert::test_limits(), max_memory_bytes: 1 << 30, cpu_secs: 31 };
        let args: Vec<OsString> = job.args().into_iter().map(OsString::from).collect();
        assert_eq!(Job::parse(&args)?, job);
        assert!(Job::parse(&[OsString::from("format=exe")]).is_err());
        Ok(())
    }
}
