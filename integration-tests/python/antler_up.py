"""Starting ``antler up`` for the Python suites: its own config and data directory under ``root``, a free
loopback port, logs in ``root``; stopped with SIGTERM (SIGKILL after 10 s) when the requesting fixture ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Optional, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
ANTLER_BIN = Path(os.environ.get("ANTLER_BIN", REPO / "target" / "debug" / "antler"))
LISTEN_PREFIX = "antler listening on "
STARTUP_TIMEOUT_S = 30.0

T = TypeVar("T")


@dataclass
class Started(Generic[T]):
    proc: subprocess.Popen
    stdout: Path
    stderr: Path
    # What `ready` read from the server's output.
    ready: T


ALLOW_BWRAP_SKIP = "ANTLER_ALLOW_BWRAP_SKIP"


def searchable_root(request: pytest.FixtureRequest, prefix: str) -> Path:
    """A fresh directory for a server's config and data, removed when the requesting fixture ends.

    Not under pytest's temporary directory: that is mode 0700, and the sandbox runs bwrap (as uid 65534 when the
    tests run as root), which needs every directory above its data directory searchable; its start-up probe
    failed there and ``provider: auto`` fell back to ``local``, so the suites never exercised bwrap."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o711)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    return root


def bwrap_refused_by_kernel() -> Optional[str]:
    """Why bwrap cannot create its namespaces here, or None when it can. A missing binary fails the test."""
    if shutil.which("bwrap") is None:
        pytest.fail("bwrap must be installed for these tests (Debian package bubblewrap)")
    probe = subprocess.run(["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                           capture_output=True, text=True, check=False)
    return None if probe.returncode == 0 else f"bwrap --unshare-all failed here: {probe.stderr.strip()}"


def require_bwrap(what: str) -> None:
    """Fails where the kernel refuses bwrap's namespaces, unless ANTLER_ALLOW_BWRAP_SKIP=1 (then the test is
    reported as skipped; CI never sets it)."""
    reason = bwrap_refused_by_kernel()
    if reason is None:
        return
    if os.environ.get(ALLOW_BWRAP_SKIP) == "1":
        pytest.skip(f"{what}: {reason} ({ALLOW_BWRAP_SKIP}=1)")
    pytest.fail(f"{what}: {reason}\nhint: run where unprivileged user namespaces are allowed, or set {ALLOW_BWRAP_SKIP}=1 to skip knowingly")


def start(request: pytest.FixtureRequest, root: Path, config: str, ready: Callable[[str], Optional[T]]) -> Started[T]:
    """Starts the server and waits until ``ready(stdout so far)`` returns something other than None."""
    if not ANTLER_BIN.is_file():
        pytest.fail(f"antler binary not found at {ANTLER_BIN} (build it, or set ANTLER_BIN)")
    (root / "antler.yaml").write_text(config)
    stdout_path, stderr_path = root / "stdout.log", root / "stderr.log"
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        proc = subprocess.Popen(
            [str(ANTLER_BIN), "up", "--config", str(root / "antler.yaml"), "--listen", "127.0.0.1:0", "--data-dir", str(root / "data")],
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=root,
            env={k: v for k, v in os.environ.items() if k not in ("DEER_FLOW_EXTENSIONS_CONFIG_PATH", "ANTLER_CONFIG")},
        )

    def stop() -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    request.addfinalizer(stop)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        found = ready(stdout_path.read_text(errors="replace"))
        if found is not None:
            return Started(proc, stdout_path, stderr_path, found)
        if proc.poll() is not None:
            pytest.fail(f"antler exited with {proc.returncode} before it was ready\n{stderr_path.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            pytest.fail(f"antler not ready within {STARTUP_TIMEOUT_S:.0f} s\n{stderr_path.read_text(errors='replace')}")
        time.sleep(0.05)


def listen_address(stdout: str) -> Optional[str]:
    """The address of the ``antler listening on …`` line, once it is there."""
    for line in stdout.splitlines():
        if line.startswith(LISTEN_PREFIX):
            return line[len(LISTEN_PREFIX):].strip()
    return None
