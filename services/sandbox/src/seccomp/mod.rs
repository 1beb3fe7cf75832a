//! The seccomp-bpf filter of bwrap sandboxes (`sandbox.seccomp: strict`, the default).
//!
//! bwrap separates namespaces and drops capabilities, but every system call still reaches the host
//! kernel. The filter refuses the calls in [`policy`] (EPERM; clone3 and x32 calls ENOSYS) and allows
//! the rest. It is compiled once at start-up with seccompiler for the host's architecture (x86_64 or
//! aarch64; anything else refuses to start while the mode is strict) and handed to bwrap with
//! `--seccomp FD` for every command: bwrap installs it, with no-new-privileges, right before it runs
//! the command, so bwrap's own set-up (mounts, namespaces) is not filtered and everything the command
//! starts is.
//!
//! The program reaches bwrap through a descriptor only that child inherits: a fresh in-memory file
//! per command (bwrap reads it to its end, so a shared one would race on the offset), close-on-exec in
//! this process and made inheritable in the child alone, after fork (command-fds), so no other child
//! started meanwhile sees it.

pub mod policy;

use std::ffi::OsString;
use std::io::{Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use command_fds::CommandFdExt;
use seccompiler::{BpfProgram, TargetArch, sock_filter};

use crate::config::SeccompMode;

/// Why the filter cannot be used; the message names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeccompError {
    #[error(
        "sandbox.seccomp is strict, but the filter is built for x86_64 and aarch64 only and this host is {arch}\nhint: set sandbox.seccomp: off to run commands under bwrap without a seccomp filter"
    )]
    UnsupportedArch { arch: &'static str },
    #[error(
        "sandbox.seccomp is strict, but the filter could not be built: {0}\nhint: set sandbox.seccomp: off to run commands under bwrap without a seccomp filter"
    )]
    Build(String),
}

/// A compiled filter, shared by every command (cheap to clone).
#[derive(Debug, Clone)]
pub struct Filter {
    /// The BPF program as bwrap reads it: `struct sock_filter` entries in the host's byte order.
    bytes: Arc<[u8]>,
    arch: &'static str,
    instructions: usize,
}

impl Filter {
    /// Builds the filter for `mode`: `None` when it is off.
    pub fn for_mode(mode: SeccompMode) -> Result<Option<Self>, SeccompError> {
        match mode {
            SeccompMode::Off => Ok(None),
            SeccompMode::Strict => Self::for_this_host().map(Some),
        }
    }

    /// Compiles the policy for the architecture this service runs on.
    pub fn for_this_host() -> Result<Self, SeccompError> {
        let arch = std::env::consts::ARCH;
        let target = match arch {
            "x86_64" => TargetArch::x86_64,
            "aarch64" => TargetArch::aarch64,
            _ => return Err(SeccompError::UnsupportedArch { arch }),
        };
        let program = compile(target)?;
        Ok(Self { bytes: to_bytes(&program).into(), arch, instructions: program.len() })
    }

    /// The architecture it was compiled for.
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    /// Length of the BPF program (for the start-up log).
    pub fn instructions(&self) -> usize {
        self.instructions
    }

    /// How many system calls it refuses on this architecture (for the start-up log).
    pub fn refused_calls(&self) -> usize {
        policy::DENIED.iter().filter(|r| !r.x86_64_only || self.arch == "x86_64").count() + 1
    }

    /// Gives `command` (a bwrap about to be spawned) its own copy of the program and returns the bwrap
    /// arguments naming it (`--seccomp FD`), to be placed before the command to run. The descriptor
    /// is closed here when `command` is dropped.
    pub fn attach<C: CommandFdExt>(&self, command: &mut C) -> std::io::Result<[OsString; 2]> {
        let fd = rustix::fs::memfd_create("antler-seccomp", rustix::fs::MemfdFlags::CLOEXEC)?;
        let mut file = std::fs::File::from(fd);
        file.write_all(&self.bytes)?;
        file.rewind()?;
        let fd = OwnedFd::from(file);
        let number = fd.as_raw_fd();
        // Clears close-on-exec on this descriptor in the child only, between fork and exec.
        command.preserved_fds(vec![fd]);
        Ok(["--seccomp".into(), number.to_string().into()])
    }
}

/// Compiles the policy for `arch` into a BPF program: seccompiler's filter of [`policy::DENIED`]
/// (EPERM), with the ENOSYS guard of [`policy::ENOSYS_GUARD`] placed right after its architecture check.
pub fn compile(arch: TargetArch) -> Result<BpfProgram, SeccompError> {
    let rules: Vec<serde_json::Value> =
        policy::DENIED.iter().filter(|r| !r.x86_64_only || arch == TargetArch::x86_64).flat_map(json_rules).collect();
    // seccompiler's syscall name tables are reachable only through its JSON front end; the policy is
    // written as Rust (with a reason per line) and turned into that JSON here.
    let document = serde_json::json!({
        "denied": { "mismatch_action": "allow", "match_action": { "errno": errno(rustix::io::Errno::PERM) }, "filter": rules }
    });
    let mut programs =
        seccompiler::compile_from_json(document.to_string().as_bytes(), arch).map_err(|e| SeccompError::Build(e.to_string()))?;
    let program = programs.remove("denied").ok_or_else(|| SeccompError::Build("seccompiler returned no program".to_owned()))?;
    with_enosys_guard(program, arch)
}

/// The seccompiler JSON rules of one policy line: one entry per refused flag, as seccompiler ORs the
/// rules of a system call and ANDs the conditions of a rule.
fn json_rules(rule: &policy::Rule) -> Vec<serde_json::Value> {
    match rule.when {
        policy::When::Always => vec![serde_json::json!({ "syscall": rule.syscall })],
        policy::When::AnyBit { index, bits, unless } => bits
            .iter()
            .map(|bit| {
                let mut args = vec![serde_json::json!({ "index": index, "type": "dword", "op": { "masked_eq": bit }, "val": bit })];
                if let Some(value) = unless {
                    args.push(serde_json::json!({ "index": index, "type": "dword", "op": "ne", "val": value }));
                }
                serde_json::json!({ "syscall": rule.syscall, "args": args })
            })
            .collect(),
    }
}

fn errno(e: rustix::io::Errno) -> u32 {
    e.raw_os_error().unsigned_abs()
}

// Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// The kernel's limit on a filter's length.
const BPF_MAX_LEN: usize = 4096;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Inserts the ENOSYS guard after seccompiler's architecture check (load the arch, skip the next
/// instruction when it matches, kill the process otherwise). Its jumps are relative and all point
/// forward within its own part, so the insertion moves none of their targets; the guard loads the
/// system call number itself, and seccompiler's part loads it again.
fn with_enosys_guard(program: BpfProgram, arch: TargetArch) -> Result<BpfProgram, SeccompError> {
    let head = program.get(..4).unwrap_or_default();
    let expected = head.len() == 4
        && head[0] == stmt(BPF_LD_W_ABS, DATA_ARCH)
        && (head[1].code, head[1].jt, head[1].jf) == (BPF_JEQ_K, 1, 0)
        && head[2] == stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS)
        && head[3] == stmt(BPF_LD_W_ABS, DATA_NR);
    if !expected {
        return Err(SeccompError::Build(
            "seccompiler's program does not start with the architecture check the ENOSYS guard is placed after".to_owned(),
        ));
    }
    let enosys = SECCOMP_RET_ERRNO | errno(rustix::io::Errno::NOSYS);
    let mut guard = vec![stmt(BPF_LD_W_ABS, DATA_NR)];
    if arch == TargetArch::x86_64 {
        guard.extend([jump(BPF_JGE_K, policy::X32_SYSCALL_BIT, 0, 1), stmt(BPF_RET_K, enosys)]);
    }
    guard.extend([jump(BPF_JEQ_K, policy::CLONE3_NR, 0, 1), stmt(BPF_RET_K, enosys)]);
    let mut out = Vec::with_capacity(program.len() + guard.len());
    out.extend_from_slice(&program[..3]);
    out.extend(guard);
    out.extend_from_slice(&program[3..]);
    if out.len() >= BPF_MAX_LEN {
        return Err(SeccompError::Build(format!("the program has {} instructions, the kernel takes fewer than {BPF_MAX_LEN}", out.len())));
    }
    Ok(out)
}

/// `struct sock_filter { u16 code; u8 jt; u8 jf; u32 k; }` in the host's byte order, as bwrap reads it.
fn to_bytes(program: &[sock_filter]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for instruction in program {
        bytes.extend_from_slice(&instruction.code.to_ne_bytes());
        bytes.extend([instruction.jt, instruction.jf]);
        bytes.extend_from_slice(&instruction.k.to_ne_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests;
