//! The seccomp filter of bwrap commands, in a real kernel: each refused system call fails with EPERM
//! (clone3 with ENOSYS) from a small Python ctypes program run in the sandbox, while the everyday tools
//! still work; with `sandbox.seccomp: off` the same calls reach the kernel and get its own answers, so
//! the checks can fail.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{self, ALICE_KEY, bounded};

macro_rules! skip_unless_bwrap {
    ($name:literal) => {
        if !common::bwrap_usable($name) {
            return Ok(());
        }
    };
}

const T: &str = "seccomp";
const PROBE: &str = include_str!("seccomp_probe.py");

/// The system calls the probe makes, with their numbers on this architecture.
fn numbers() -> BTreeMap<&'static str, i64> {
    let mut calls = BTreeMap::from([
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("syslog", libc::SYS_syslog),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("clone", libc::SYS_clone),
        ("clone3", libc::SYS_clone3),
        ("personality", libc::SYS_personality),
        ("kexec_load", libc::SYS_kexec_load),
        ("init_module", libc::SYS_init_module),
        ("delete_module", libc::SYS_delete_module),
        ("reboot", libc::SYS_reboot),
        ("swapon", libc::SYS_swapon),
        ("acct", libc::SYS_acct),
        ("quotactl", libc::SYS_quotactl),
    ]);
    #[cfg(target_arch = "x86_64")]
    calls.extend([("iopl", libc::SYS_iopl), ("ioperm", libc::SYS_ioperm), ("modify_ldt", libc::SYS_modify_ldt)]);
    calls
}

/// Runs the probe in a fresh bwrap server with `sandbox_yaml`; returns name -> "ok" or the errno name.
async fn probe(sandbox_yaml: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let server = common::start(sandbox_yaml).await?;
    let mut c = server.client().await?;
    common::acquire(&mut c, ALICE_KEY, T).await?;
    common::write(&mut c, ALICE_KEY, T, "/mnt/user-data/workspace/probe.py", PROBE).await?;
    let table = serde_json::to_string(&numbers())?;
    let command = format!("python3 /mnt/user-data/workspace/probe.py '{table}'");
    let ran = common::exec(&mut c, ALICE_KEY, T, &command, Duration::from_secs(60)).await?;
    anyhow::ensure!(ran.exit.exit_code == 0, "the probe failed under {sandbox_yaml:?}: {ran:?}");
    let results: BTreeMap<String, String> =
        serde_json::from_str(ran.stdout.trim()).map_err(|e| anyhow::anyhow!("probe output is not JSON ({e}): {ran:?}"))?;
    for name in numbers().keys() {
        anyhow::ensure!(results.contains_key(*name), "the probe did not call {name}: {results:?}");
    }
    Ok(results)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_seccomp_refuses_the_listed_calls_with_eperm_and_off_lets_them_through() -> anyhow::Result<()> {
    skip_unless_bwrap!("bwrap_seccomp_refuses_the_listed_calls_with_eperm_and_off_lets_them_through");
    bounded(async {
        let strict = probe("provider: bwrap").await?;
        let off = probe("provider: bwrap\nseccomp: off").await?;
        let mut wrong = Vec::new();
        for name in numbers().keys() {
            let expected = if *name == "clone3" { "ENOSYS" } else { "EPERM" };
            if strict[*name] != expected {
                wrong.push(format!("{name}: {} (expected {expected})", strict[*name]));
            }
        }
        assert!(wrong.is_empty(), "under sandbox.seccomp: strict:\n{}\nall: {strict:?}", wrong.join("\n"));
        assert_ne!(strict["seccomp_filters"], "0", "strict: a filter is installed on the command: {strict:?}");
        assert_eq!(off["seccomp_filters"], "0", "off: no filter: {off:?}");

        // Without the filter these calls reach the kernel, which answers them otherwise (no privilege
        // is needed to get that far): the EPERMs above came from the filter. `unshare` with no flags and
        // `personality` succeed; the rest fail on their deliberately bad arguments.
        let reach_the_kernel = [
            "ptrace",
            "process_vm_readv",
            "unshare",
            "setns",
            "mount",
            "umount2",
            "open_tree",
            "keyctl",
            "add_key",
            "userfaultfd",
            "io_uring_enter",
            "clone",
            "clone3",
            "personality",
        ];
        for name in reach_the_kernel {
            assert!(
                off[name] != "EPERM" && off[name] != strict[name],
                "{name} answered {} without the filter, as with it ({}): the check cannot tell them apart\noff: {off:?}",
                off[name],
                strict[name]
            );
        }
        assert_eq!((off["unshare"].as_str(), off["personality"].as_str()), ("ok", "ok"), "{off:?}");
        println!("without the filter: {off:?}");
        Ok(())
    })
    .await
}

/// Python (threads, subprocess), git, a C compile and run (threads: glibc tries clone3 and falls back
/// to clone on ENOSYS), pip installing a local wheel, tar and grep.
const EVERYDAY: &str = r#"set -e
cd /mnt/user-data/workspace
python3 -c 'import threading, subprocess; t = threading.Thread(target=print, args=("thread-ok",)); t.start(); t.join(); print(subprocess.run(["echo", "subprocess-ok"], capture_output=True, text=True).stdout.strip())'
git init -q repo && cd repo && echo hello-git > a.txt && git add a.txt && git -c user.name=t -c user.email=t@example.com commit -qm first && echo "git-commits=$(git rev-list --count HEAD)" && cd ..
cat > hello.c <<'C'
#include <pthread.h>
#include <stdio.h>
static void *run(void *arg) { (void)arg; return NULL; }
int main(void) { pthread_t t; if (pthread_create(&t, NULL, run, NULL) != 0) return 2; pthread_join(t, NULL); puts("c-ok"); return 0; }
C
cc -o hello hello.c -lpthread && ./hello
python3 - <<'PY'
import base64, hashlib, zipfile
files = {"antlerdemo/__init__.py": "VALUE = 'wheel-ok'\n",
         "antlerdemo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: antlerdemo\nVersion: 1.0\n",
         "antlerdemo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: antler-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
record = "".join(f"{name},{digest(text.encode())},{len(text.encode())}\n" for name, text in files.items())
with zipfile.ZipFile("antlerdemo-1.0-py3-none-any.whl", "w") as wheel:
    for name, text in files.items():
        wheel.writestr(name, text)
    wheel.writestr("antlerdemo-1.0.dist-info/RECORD", record + "antlerdemo-1.0.dist-info/RECORD,,\n")
PY
python3 -m pip install -q --no-index --no-deps --no-cache-dir --disable-pip-version-check --target site ./antlerdemo-1.0-py3-none-any.whl
PYTHONPATH=site python3 -c 'import antlerdemo; print(antlerdemo.VALUE)'
tar czf repo.tgz repo/a.txt && mkdir unpacked && tar xzf repo.tgz -C unpacked && cat unpacked/repo/a.txt
grep -rl hello-git unpacked
unshare -U true 2>&1 || echo "unshare-refused"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_seccomp_keeps_everyday_tools_working() -> anyhow::Result<()> {
    skip_unless_bwrap!("bwrap_seccomp_keeps_everyday_tools_working");
    bounded(async {
        let server = common::start("provider: bwrap").await?;
        let mut c = server.client().await?;
        common::acquire(&mut c, ALICE_KEY, T).await?;
        let ran = common::exec(&mut c, ALICE_KEY, T, EVERYDAY, Duration::from_secs(90)).await?;
        assert_eq!(ran.exit.exit_code, 0, "{ran:?}");
        for line in
            ["thread-ok", "subprocess-ok", "git-commits=1", "c-ok", "wheel-ok", "hello-git", "unpacked/repo/a.txt", "unshare-refused"]
        {
            assert!(ran.stdout.lines().any(|l| l == line), "missing {line:?}: {ran:?}");
        }
        assert!(ran.stdout.contains("Operation not permitted"), "unshare(1) reports the filter's EPERM: {ran:?}");
        Ok(())
    })
    .await
}
