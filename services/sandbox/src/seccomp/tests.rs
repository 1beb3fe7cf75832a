//! The compiled program, run by a small classic-BPF interpreter for both architectures: the refusals
//! and the calls that must stay allowed, whatever host the tests run on. (The integration tests in
//! `tests/service/seccomp.rs` run it in a real kernel under bwrap.)

use super::*;

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;
const EPERM: u32 = SECCOMP_RET_ERRNO | 1;
const ENOSYS: u32 = SECCOMP_RET_ERRNO | 38;
const ALLOW: u32 = 0x7fff_0000;
const ARCHES: [(TargetArch, u32); 2] = [(TargetArch::x86_64, AUDIT_ARCH_X86_64), (TargetArch::aarch64, AUDIT_ARCH_AARCH64)];

/// What the kernel would do with this program for one call (`struct seccomp_data`, little-endian).
fn run(program: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    for (i, arg) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_le_bytes());
    }
    let (mut acc, mut pc) = (0u32, 0usize);
    loop {
        let ins = program.get(pc).unwrap_or_else(|| panic!("ran off the end of the program at {pc}"));
        pc += 1;
        let branch = |taken: bool| usize::from(if taken { ins.jt } else { ins.jf });
        match ins.code {
            0x20 => {
                let at = ins.k as usize;
                acc = u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
            }
            0x54 => acc &= ins.k,
            0x05 => pc += ins.k as usize,
            0x15 => pc += branch(acc == ins.k),
            0x25 => pc += branch(acc > ins.k),
            0x35 => pc += branch(acc >= ins.k),
            0x45 => pc += branch(acc & ins.k != 0),
            0x06 => return ins.k,
            other => panic!("opcode {other:#x} at {} is not interpreted here", pc - 1),
        }
    }
}

/// The number of `name` on `arch`, from seccompiler's own table (a one-rule program's comparison).
fn nr(name: &str, arch: TargetArch) -> u32 {
    let document = format!(r#"{{"x": {{"mismatch_action": "allow", "match_action": "trap", "filter": [{{"syscall": "{name}"}}]}}}}"#);
    let program =
        seccompiler::compile_from_json(document.as_bytes(), arch).expect("a one-rule program compiles").remove("x").expect("it is named x");
    assert_eq!(program[4].code, BPF_JEQ_K, "seccompiler's layout: arch check, load nr, compare");
    program[4].k
}

fn programs() -> Vec<(TargetArch, u32, BpfProgram)> {
    ARCHES.iter().map(|&(arch, audit)| (arch, audit, compile(arch).expect("the policy compiles"))).collect()
}

#[test]
fn every_listed_call_is_refused_with_eperm_on_both_architectures() {
    for (arch, audit, program) in programs() {
        for rule in policy::DENIED.iter().filter(|r| matches!(r.when, policy::When::Always)) {
            if rule.x86_64_only && arch != TargetArch::x86_64 {
                continue;
            }
            let number = nr(rule.syscall, arch);
            for args in [[0; 6], [u64::MAX; 6], [1, 2, 3, 4, 5, 6]] {
                assert_eq!(run(&program, audit, number, args), EPERM, "{} on {arch:?}", rule.syscall);
            }
        }
    }
}

#[test]
fn ordinary_calls_stay_allowed() {
    // fork (SIGCHLD), glibc's pthread_create flags, vfork+VM (posix_spawn).
    let clone_flags = [17u64, 0x003d_0f00, 0x4111];
    for (arch, audit, program) in programs() {
        for name in ["read", "write", "openat", "execve", "mmap", "futex", "wait4", "prlimit64", "seccomp", "prctl", "chroot"] {
            assert_eq!(run(&program, audit, nr(name, arch), [0; 6]), ALLOW, "{name} on {arch:?}");
        }
        for flags in clone_flags {
            assert_eq!(run(&program, audit, nr("clone", arch), [flags, 0, 0, 0, 0, 0]), ALLOW, "clone({flags:#x}) on {arch:?}");
        }
        // PER_LINUX, PER_LINUX32, UNAME26, and the query value that sets every bit.
        for persona in [0u64, 0x8, 0x0002_0000, policy::PERSONALITY_QUERY, u64::MAX] {
            assert_eq!(run(&program, audit, nr("personality", arch), [persona, 0, 0, 0, 0, 0]), ALLOW, "personality({persona:#x})");
        }
    }
}

#[test]
fn namespaces_through_clone_and_unsafe_personas_are_refused() {
    for (arch, audit, program) in programs() {
        for &flag in policy::CLONE_NAMESPACE_FLAGS {
            let args = [flag | 17, 0, 0, 0, 0, 0];
            assert_eq!(run(&program, audit, nr("clone", arch), args), EPERM, "clone({flag:#x}|SIGCHLD) on {arch:?}");
        }
        for &flag in policy::UNSAFE_PERSONALITY_FLAGS {
            assert_eq!(run(&program, audit, nr("personality", arch), [flag, 0, 0, 0, 0, 0]), EPERM, "personality({flag:#x})");
        }
    }
}

#[test]
fn clone3_and_x32_calls_get_enosys_so_the_c_library_falls_back() {
    for (arch, audit, program) in programs() {
        assert_eq!(nr("clone3", arch), policy::CLONE3_NR);
        assert_eq!(run(&program, audit, policy::CLONE3_NR, [0; 6]), ENOSYS, "{arch:?}");
    }
    let program = compile(TargetArch::x86_64).expect("compiles");
    let x32_ptrace = policy::X32_SYSCALL_BIT | 521;
    assert_eq!(run(&program, AUDIT_ARCH_X86_64, x32_ptrace, [0; 6]), ENOSYS);
    assert_eq!(run(&program, AUDIT_ARCH_X86_64, policy::X32_SYSCALL_BIT | nr("read", TargetArch::x86_64), [0; 6]), ENOSYS);
}

#[test]
fn another_architecture_is_killed_not_waved_through() {
    // A 32-bit x86 system call (int 0x80) carries AUDIT_ARCH_I386: its numbers mean other calls.
    let program = compile(TargetArch::x86_64).expect("compiles");
    assert_eq!(run(&program, 0x4000_0003, 26, [0; 6]), SECCOMP_RET_KILL_PROCESS);
    let program = compile(TargetArch::aarch64).expect("compiles");
    assert_eq!(run(&program, AUDIT_ARCH_X86_64, 0, [0; 6]), SECCOMP_RET_KILL_PROCESS);
}

#[test]
fn x86_64_only_calls_are_left_out_on_aarch64_and_the_program_fits_the_kernel() {
    assert!(policy::DENIED.iter().any(|r| r.x86_64_only));
    for (_, _, program) in programs() {
        assert!(program.len() < BPF_MAX_LEN);
        assert_eq!(to_bytes(&program).len(), program.len() * 8);
    }
}

#[test]
fn the_host_filter_builds_and_serialises_as_bwrap_reads_it() {
    match std::env::consts::ARCH {
        "x86_64" | "aarch64" => {
            let filter = Filter::for_this_host().expect("builds on a supported host");
            assert_eq!(filter.bytes.len(), filter.instructions() * 8);
            // The first instruction, in host byte order: BPF_LD|BPF_W|BPF_ABS of the arch (offset 4).
            assert_eq!(&filter.bytes[..8], &[&0x20u16.to_ne_bytes()[..], &[0, 0], &4u32.to_ne_bytes()[..]].concat()[..]);
        }
        other => assert_eq!(Filter::for_this_host().err(), Some(SeccompError::UnsupportedArch { arch: other })),
    }
    assert!(matches!(Filter::for_mode(SeccompMode::Off), Ok(None)));
}

#[test]
fn errors_name_the_setting() {
    let text = SeccompError::UnsupportedArch { arch: "riscv64" }.to_string();
    assert!(text.contains("sandbox.seccomp") && text.contains("riscv64") && text.contains("off"), "{text}");
}
