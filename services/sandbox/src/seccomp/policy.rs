//! What the seccomp filter refuses inside a bwrap sandbox (`sandbox.seccomp: strict`), one line per
//! system call with the reason. Everything not listed is allowed: the filter takes away what an
//! agent's tools (shells, compilers, interpreters, git, pip, archivers) never need and what kernel
//! exploits are built from, not what ordinary programs use.
//!
//! A refused call fails with EPERM (the program sees "Operation not permitted" and can fall back or
//! report it) rather than killing the process, so a tool that probes for a feature keeps working.
//! Two refusals answer ENOSYS instead, as the kernel would for a call it does not have, because that
//! is what the C library falls back on (see [`ENOSYS_GUARD`]).

/// Which values of an argument a rule refuses.
#[derive(Debug, Clone, Copy)]
pub enum When {
    /// Every call.
    Always,
    /// Calls whose argument `index` (its low 32 bits) has any of `bits` set, except the exact value
    /// `unless` (a query value that sets every bit).
    AnyBit { index: u8, bits: &'static [u64], unless: Option<u64> },
}

/// One refused system call.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Its name in the kernel's (and seccompiler's) syscall table.
    pub syscall: &'static str,
    pub when: When,
    /// Only on x86_64 (the call does not exist on aarch64).
    pub x86_64_only: bool,
    /// Why a sandboxed tool does not get it.
    pub why: &'static str,
}

const fn always(syscall: &'static str, why: &'static str) -> Rule {
    Rule { syscall, when: When::Always, x86_64_only: false, why }
}

const fn x86_64(syscall: &'static str, why: &'static str) -> Rule {
    Rule { syscall, when: When::Always, x86_64_only: true, why }
}

/// The namespace flags of clone(2) (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET).
/// CLONE_NEWTIME (0x80) is left out: clone(2) reads those bits as the exit signal.
pub const CLONE_NAMESPACE_FLAGS: &[u64] = &[0x0002_0000, 0x0200_0000, 0x0400_0000, 0x0800_0000, 0x1000_0000, 0x2000_0000, 0x4000_0000];

/// personality(2) flags that exist to weaken memory protections: ADDR_NO_RANDOMIZE (no ASLR),
/// MMAP_PAGE_ZERO, ADDR_COMPAT_LAYOUT and READ_IMPLIES_EXEC.
pub const UNSAFE_PERSONALITY_FLAGS: &[u64] = &[0x0004_0000, 0x0010_0000, 0x0020_0000, 0x0040_0000];

/// personality(0xffffffff) only reads the current persona; it sets every bit, so it is let through by value.
pub const PERSONALITY_QUERY: u64 = 0xffff_ffff;

/// The refused calls, answered with EPERM.
pub const DENIED: &[Rule] = &[
    // Reaching into other processes.
    always(
        "ptrace",
        "reads and writes another process's memory and registers: no debugging in the sandbox, and the classic escalation path",
    ),
    always("process_vm_readv", "reads another process's memory directly"),
    always("process_vm_writev", "writes another process's memory directly"),
    always("pidfd_getfd", "copies a file descriptor out of another process"),
    // Kernel attack surface that tools do not use.
    always("bpf", "loads programs into the kernel; the BPF verifier is a steady source of kernel exploits"),
    always("perf_event_open", "kernel performance counters: a large, often exploited interface and a side channel"),
    always("userfaultfd", "lets a process stall the kernel's page faults at will, the usual way to win a kernel race"),
    always(
        "io_uring_setup",
        "io_uring is a large, fast-moving kernel surface behind many recent exploits; programs fall back to ordinary I/O",
    ),
    always("io_uring_enter", "see io_uring_setup"),
    always("io_uring_register", "see io_uring_setup"),
    always("keyctl", "the kernel keyring is not a namespace bwrap separates, and its code has had use-after-free bugs"),
    always("add_key", "see keyctl"),
    always("request_key", "see keyctl"),
    always("open_by_handle_at", "opens files by handle, around path lookup and the mount view (the \"shocker\" container escape)"),
    always("lookup_dcookie", "profiling interface that hands out kernel path cookies"),
    always("syslog", "reads the kernel log, which carries kernel addresses"),
    // The machine itself.
    always("kexec_load", "boots another kernel"),
    always("kexec_file_load", "boots another kernel"),
    always("init_module", "loads kernel code"),
    always("finit_module", "loads kernel code"),
    always("delete_module", "unloads kernel code"),
    always("reboot", "restarts or halts the machine"),
    always("swapon", "changes the machine's swap"),
    always("swapoff", "changes the machine's swap"),
    always("acct", "turns on process accounting to a file"),
    always("quotactl", "changes disk quotas"),
    always("quotactl_fd", "changes disk quotas"),
    x86_64("iopl", "raw access to I/O ports"),
    x86_64("ioperm", "raw access to I/O ports"),
    x86_64("modify_ldt", "16-bit segment descriptors: old, rarely used, and a history of kernel bugs"),
    x86_64("uselib", "the obsolete a.out library loader"),
    // The filesystem view bwrap built stays as it is.
    always("mount", "bwrap built the filesystem view; changing it from inside is never needed and the mount code is exploit surface"),
    always("umount2", "see mount"),
    always("pivot_root", "see mount"),
    always("move_mount", "see mount (the new mount API)"),
    always("open_tree", "see mount (the new mount API)"),
    always("fsopen", "see mount (the new mount API)"),
    always("fsconfig", "see mount (the new mount API)"),
    always("fsmount", "see mount (the new mount API)"),
    always("fspick", "see mount (the new mount API)"),
    always("mount_setattr", "see mount (the new mount API)"),
    // No new namespaces: bwrap already refuses nested user namespaces (--disable-userns); this is the second lock.
    always("unshare", "creates new namespaces, the entry to kernel code that unprivileged users otherwise cannot reach"),
    always("setns", "joins other namespaces"),
    Rule {
        syscall: "clone",
        when: When::AnyBit { index: 0, bits: CLONE_NAMESPACE_FLAGS, unless: None },
        x86_64_only: false,
        why: "only with a CLONE_NEW* flag: new namespaces, as unshare (threads and fork are untouched)",
    },
    Rule {
        syscall: "personality",
        when: When::AnyBit { index: 0, bits: UNSAFE_PERSONALITY_FLAGS, unless: Some(PERSONALITY_QUERY) },
        x86_64_only: false,
        why: "only with a flag that turns off address randomisation or makes data executable: exploits use them for reliability",
    },
];

/// Refused with ENOSYS, checked before [`DENIED`]:
///
/// * `clone3`: its flags sit in memory a filter cannot read, so it cannot be refused only for new
///   namespaces as `clone` is. The C library (glibc 2.34 and later) tries clone3 first and, on ENOSYS
///   only, falls back to clone, whose flags the filter does see; EPERM here would break every thread.
/// * on x86_64, every x32 system call (numbers with bit 30 set): the same architecture tag as x86_64
///   but other numbers, so without this a kernel built with x32 support would let the listed calls
///   through under their x32 numbers.
pub const ENOSYS_GUARD: &[&str] = &["clone3", "x32 system calls (x86_64)"];

/// clone3's number: 435 on every architecture (it came after the syscall tables were unified).
pub const CLONE3_NR: u32 = 435;

/// Bit 30 marks the x32 ABI's system calls on x86_64.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;
