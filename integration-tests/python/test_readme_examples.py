"""The README's first examples, run as written against ``antler up`` with no models configured (issue #28):
the built-in ``demo`` model must carry every one of them offline.

* ``antler run "…"`` with and without ``--plan`` (README, "What the first command shows"): SUCCESS, and without
  ``--plan`` no call of a tool the agent was not given (``write_todos is not a valid tool``).
* ``examples/python/stream_run.py`` and ``examples/node/stream_run.js`` (the command in each file's header, and
  the Node README's) end SUCCESS with the file delivered, with ``ANTLER_ADDR`` as ``host:port``, as
  ``http://host:port`` and, against a TLS server, as ``https://host:port`` with ``ANTLER_CA``.
* "A second thread that remembers the first": the README's commands, in order, save the fact with the demo
  model's extraction, and the second run's prompt carries it (the demo model echoes an injected ``<memory>``
  block: ``From memory: …``).

Commands are read from the files a user reads (README.md, the examples' headers), so a changed command is tested
as changed; the one liberty taken is the address: every command gets ``ANTLER_ADDR`` of the server under test
(and ``antler up`` a free port and its own data directory).

Environment: ``ANTLER_BIN`` (default ``<repo>/target/debug/antler``), ``ANTLER_TOOLS`` (the Node example's
packages under ``$ANTLER_TOOLS/node-example``, put there by ``scripts/setup``).
Run: ``python -m pytest -q integration-tests/python/test_readme_examples.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import antler_up
from pki import issue, new_ca

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
NODE_MODULES = Path(os.environ.get("ANTLER_TOOLS", REPO / ".tools")) / "node-example" / "node_modules"
RUN_TIMEOUT_S = 180
DEMO_OUTPUT = "/mnt/user-data/outputs/hello.md"


# --------------------------------------------------------------------------------------------------
# Reading the commands from the documents
# --------------------------------------------------------------------------------------------------


def readme_section(title: str) -> str:
    """The text of the README section headed ``title`` (any level), up to the next heading."""
    text = README.read_text()
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#+ )", text, re.S | re.M)
    assert match, f"README.md has no section {title!r}"
    return match[1]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def commands(block: str) -> list[list[str]]:
    """The commands of a shell block: comments dropped, ``\\`` continuations joined, a trailing ``&`` kept as a
    word of its own."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if shlex.split(line, comments=True)]


def header_command(path: Path, program: str) -> list[str]:
    """The command an example's header shows (its indented line starting with ``program``, continuations
    joined)."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.lstrip("/# ").strip()
        if stripped.startswith(program + " "):
            text = stripped
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].lstrip("/# ").strip()
            return shlex.split(text)
    raise AssertionError(f"{path} shows no `{program} …` command")


# --------------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------------


def _start(request: pytest.FixtureRequest, prefix: str, config: str) -> str:
    root = antler_up.searchable_root(request, prefix)
    return antler_up.start(request, root, config, antler_up.listen_address).ready


@pytest.fixture(scope="module")
def demo(request: pytest.FixtureRequest) -> str:
    """``antler up`` with no models configured: the built-in ``demo`` model. Returns ``host:port``."""
    return _start(request, "antler-readme-", "# no models: the built-in demo model\n")


@pytest.fixture(scope="module")
def tls_demo(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The same over TLS: (``host:port``, the CA's PEM file)."""
    pki = tmp_path_factory.mktemp("readme-pki")
    ca = new_ca("antler readme test CA")
    cert, key = issue(ca, "antler", ["localhost"], ["127.0.0.1"])
    (pki / "ca.pem").write_bytes(ca.pem)
    (pki / "server.pem").write_bytes(cert)
    (pki / "server-key.pem").write_bytes(key)
    config = f"server:\n  tls:\n    cert: {pki / 'server.pem'}\n    key: {pki / 'server-key.pem'}\n"
    return _start(request, "antler-readme-tls-", config), pki / "ca.pem"


def run(argv: list[str], addr: str, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess:
    """Runs a documented command with ``ANTLER_ADDR=addr``: ``antler`` is the binary under test, ``python``
    this interpreter, ``node`` finds the example's packages."""
    program = {"antler": str(antler_up.ANTLER_BIN), "python": sys.executable, "python3": sys.executable}.get(argv[0], argv[0])
    environment = {k: v for k, v in os.environ.items() if k not in ("ANTLER_CA", "NO_COLOR", "ANTLER_CONFIG")}
    environment.update({"ANTLER_ADDR": addr, "NODE_PATH": str(NODE_MODULES), **env})
    return subprocess.run([program, *argv[1:]], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)


def shown(result: subprocess.CompletedProcess) -> str:
    return f"$ {shlex.join(result.args)}\nexit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def assert_delivered(result: subprocess.CompletedProcess) -> None:
    """The demo run printed by an example: SUCCESS, the receipt satisfied, hello.md listed."""
    assert result.returncode == 0, shown(result)
    lines = result.stdout.splitlines()
    assert any(line.endswith("] end: SUCCESS") for line in lines), shown(result)
    assert any(line.endswith("] delivery receipt: satisfied") for line in lines), shown(result)
    assert re.search(rf"^        {re.escape(DEMO_OUTPUT)} \(\d+ bytes", result.stdout, re.M), shown(result)


# --------------------------------------------------------------------------------------------------
# antler run, with and without --plan
# --------------------------------------------------------------------------------------------------


def test_antler_run_with_and_without_plan_succeeds_with_the_demo_model(demo: str) -> None:
    blocks = code_blocks(readme_section("What the first command shows"), "sh")
    runs = [argv for block in blocks for argv in commands(block) if argv[:2] == ["antler", "run"]]
    assert any("--plan" in argv for argv in runs) and any("--plan" not in argv for argv in runs), runs
    for argv in runs:
        result = run(argv, demo)
        assert result.returncode == 0, shown(result)
        assert "is not a valid tool" not in result.stdout, shown(result)
        assert re.search(r"^\[\s*\d+\] end: SUCCESS$", result.stdout, re.M), shown(result)
        tools = re.findall(r"^\[\s*\d+\] tool (\w+)\(", result.stdout, re.M)
        if "--plan" in argv:
            assert tools == ["write_todos", "write_file", "bash", "write_todos", "present_files"], shown(result)
        else:
            # No plan mode, no write_todos tool: the demo starts at the write step instead of calling it.
            assert tools == ["write_file", "bash", "present_files"], shown(result)


# --------------------------------------------------------------------------------------------------
# The Python and Node examples, as their headers say, with every form of ANTLER_ADDR
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fresh_python_stubs() -> None:
    """The Python example caches its generated stubs in ``examples/python/.stubs`` (ignored by git); a cache
    from an older ``proto/`` would test old stubs, so the first run generates them as a new user's does."""
    shutil.rmtree(REPO / "examples" / "python" / ".stubs", ignore_errors=True)


@pytest.mark.parametrize("form", ["host:port", "http://host:port"])
def test_the_python_example_runs_its_own_command(demo: str, form: str, fresh_python_stubs: None) -> None:
    argv = header_command(REPO / "examples" / "python" / "stream_run.py", "python")
    assert "--addr" not in argv, "the address comes from ANTLER_ADDR"
    assert_delivered(run(argv, form.replace("host:port", demo)))


def test_the_python_example_over_tls(tls_demo: tuple[str, Path], fresh_python_stubs: None) -> None:
    addr, ca = tls_demo
    argv = header_command(REPO / "examples" / "python" / "stream_run.py", "python")
    assert_delivered(run(argv, f"https://{addr}", ANTLER_CA=str(ca)))
    # The same with the flag, and a plaintext address to the TLS server fails (exit 2), not hangs.
    assert_delivered(run([*argv, "--ca", str(ca)], f"https://{addr}"))
    refused = run(argv, addr)
    assert refused.returncode == 2, shown(refused)


def test_the_python_example_refuses_an_address_that_is_not_one(demo: str) -> None:
    argv = header_command(REPO / "examples" / "python" / "stream_run.py", "python")
    result = run(argv, "ftp://" + demo)
    assert result.returncode == 2 and "is not an address" in result.stderr, shown(result)


def node_commands() -> list[tuple[list[str], Path]]:
    """The Node example's commands: its header's (from the repository root) and its README's (from
    ``examples/node``), each with the directory it runs in."""
    node_dir = REPO / "examples" / "node"
    readme = [argv for block in code_blocks((node_dir / "README.md").read_text(), "sh") for argv in commands(block)
              if argv[0] == "node"]
    assert readme, "examples/node/README.md shows no `node …` command"
    return [(header_command(node_dir / "stream_run.js", "node"), REPO)] + [(argv, node_dir) for argv in readme]


@pytest.fixture(scope="module")
def node_packages() -> None:
    if shutil.which("node") is None or not (NODE_MODULES / "@grpc" / "grpc-js").is_dir():
        pytest.fail(f"node and @grpc/grpc-js under {NODE_MODULES} are needed (run scripts/setup)")


@pytest.mark.parametrize("form", ["host:port", "http://host:port"])
def test_the_node_example_runs_its_documented_commands(demo: str, form: str, node_packages: None) -> None:
    for argv, cwd in node_commands():
        assert_delivered(run(argv, form.replace("host:port", demo), cwd=cwd))


def test_the_node_example_over_tls(tls_demo: tuple[str, Path], node_packages: None) -> None:
    addr, ca = tls_demo
    argv, cwd = node_commands()[0]
    assert_delivered(run(argv, f"https://{addr}", cwd=cwd, ANTLER_CA=str(ca)))
    assert_delivered(run([*argv, "--ca", str(ca)], f"https://{addr}", cwd=cwd))
    refused = run(argv, addr, cwd=cwd)
    assert refused.returncode == 2, shown(refused)
    bad = run(argv, "ftp://" + addr, cwd=cwd)
    assert bad.returncode == 2 and "is not an address" in bad.stderr, shown(bad)


# --------------------------------------------------------------------------------------------------
# A second thread that remembers the first
# --------------------------------------------------------------------------------------------------


def test_the_memory_walkthrough_saves_the_fact_and_the_second_run_gets_it(request: pytest.FixtureRequest) -> None:
    section = readme_section("A second thread that remembers the first")
    steps = commands(code_blocks(section, "sh")[0])
    up, rest = steps[0], steps[1:]
    # `antler up --config examples/memory-demo.yaml &`: started by the harness with that file's contents, on a
    # free port.
    assert up[:2] == ["antler", "up"] and up[-1] == "&", up
    config = (REPO / up[up.index("--config") + 1]).read_text()
    addr = _start(request, "antler-readme-memory-", config)

    outputs = []
    for argv in rest:
        result = run(argv, addr)
        assert result.returncode == 0, shown(result)
        outputs.append((argv, result))
    said = next(r for a, r in outputs if a[:2] == ["antler", "run"])
    flushed = next(r for a, r in outputs if a[:3] == ["antler", "memory", "flush"])
    listed = next(r for a, r in outputs if a[:3] == ["antler", "memory", "list"])
    second = [r for a, r in outputs if a[:2] == ["antler", "run"]][-1]
    assert said is not second, "two runs"

    fact = "The user said: I always write my services in Rust."
    assert re.search(r": 1 added, 0 invalidated, 0 confirmed again, 0 rejected", flushed.stdout), shown(flushed)
    assert re.search(rf"^fact_\w+  preference \(0\.90\)  {re.escape(fact)}$", listed.stdout, re.M), shown(listed)
    # The second run, on another thread, had the fact in its system prompt: the demo model starts its first
    # answer with the facts of the <memory> block it was given.
    assert re.search(rf"^\[\s*\d+\] assistant: From memory: {re.escape(fact)} ", second.stdout, re.M), shown(second)
    assert "From memory" not in said.stdout, shown(said)
    threads = {m for r in (said, second) for m in re.findall(r"on thread ([0-9a-f-]{36})", r.stdout)}
    assert len(threads) == 2, threads

    # What the README shows them printing is what they print.
    shown_text = code_blocks(section, "text")[0]
    assert f"preference (0.90)  {fact}" in shown_text and f"assistant: From memory: {fact}" in shown_text, shown_text
    assert "1 added, 0 invalidated, 0 confirmed again, 0 rejected, 0 summary sections" in shown_text, shown_text
