"""Antler seen from Python: the published .proto contracts work for a client in another language.

What this module proves, against a real ``antler up`` process on loopback:

* every ``.proto`` file under ``proto/`` compiles with stock ``grpcio-tools`` (well-known types included)
  and the generated modules import;
* ``grpc.health.v1.Health/Check`` answers SERVING for the whole server ("") and for each of the seven services;
* one unary RPC per service, called through the generated stub, gives exactly the answer its contract
  documents on a fresh server: a reply whose content is checked (the built-in ``demo`` model, no MCP servers,
  an empty pool, no facts), or one error code whose details name the field or the missing id;
* a server-streaming RPC (``RunService.JoinRun``) of a missing run ends with NOT_FOUND naming it;
* ``examples/python/stream_run.py`` and ``examples/node/stream_run.js`` (``@grpc/grpc-js``) stream the demo
  run to SUCCESS, its file delivered.

Reflection is checked by ``scripts/grpcurl-smoke`` (grpcio-reflection is not a dependency here).

Environment: ``ANTLER_BIN`` (default ``<repo>/target/debug/antler``), ``ANTLER_TOOLS`` (the Node example's
packages are under ``$ANTLER_TOOLS/node-example``, default ``<repo>/.tools``; ``scripts/setup`` puts them there).
Run: ``python -m pytest -q integration-tests/python``.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import grpc_tools
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import antler_up

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
ANTLER_BIN = Path(os.environ.get("ANTLER_BIN", REPO / "target" / "debug" / "antler"))

LISTEN_PREFIX = "antler listening on "
STARTUP_TIMEOUT_S = 30.0
SHUTDOWN_GRACE_S = 10.0
RPC_TIMEOUT_S = 10.0

SERVICES = (
    "antler.runs.v1.RunService",
    "antler.runs.v1.ThreadService",
    "antler.sandbox.v1.SandboxService",
    "antler.sandbox.v1.SkillService",
    "antler.mcp.v1.McpService",
    "antler.models.v1.ModelService",
    "antler.memory.v1.MemoryService",
)


# --------------------------------------------------------------------------------------------------
# Fixtures: generated stubs, a running server, a channel.
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stubs_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Generates Python messages and stubs for every .proto file and puts them on sys.path."""
    out = tmp_path_factory.mktemp("stubs")
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    assert protos, f"no .proto files under {PROTO_ROOT}"
    well_known = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto ship here
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc",
        f"-I{PROTO_ROOT}", f"-I{well_known}",
        f"--python_out={out}", f"--grpc_python_out={out}",
        *protos,
    ]
    result = subprocess.run(cmd, cwd=PROTO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"protoc failed ({result.returncode}):\n{result.stderr}"
    sys.path.insert(0, str(out))
    importlib.invalidate_caches()
    yield out
    sys.path.remove(str(out))


@dataclass
class Server:
    """A running ``antler up`` process."""

    proc: subprocess.Popen
    address: str
    stdout_path: Path
    stderr_path: Path

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-4000:]}" for p in (self.stdout_path, self.stderr_path)
        )


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if the process is still there after the grace period."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=SHUTDOWN_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Server:
    """Starts ``antler up`` on a free loopback port; stopped by a finalizer whatever the tests do."""
    if not ANTLER_BIN.is_file():
        pytest.fail(f"antler binary not found at {ANTLER_BIN} (build it, or set ANTLER_BIN)")
    root = antler_up.searchable_root(request, "antler-clients-")
    stdout_path, stderr_path = root / "stdout.log", root / "stderr.log"
    with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [str(ANTLER_BIN), "up", "--listen", "127.0.0.1:0", "--data-dir", str(root / "data")],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            # A fresh working directory and no DEER_FLOW_EXTENSIONS_CONFIG_PATH: no MCP servers configured.
            cwd=root, env={k: v for k, v in os.environ.items() if k != "DEER_FLOW_EXTENSIONS_CONFIG_PATH"},
        )
    request.addfinalizer(lambda: _stop(proc))

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        for line in stdout_path.read_text(errors="replace").splitlines():
            if line.startswith(LISTEN_PREFIX):
                return Server(proc, line[len(LISTEN_PREFIX):].strip(), stdout_path, stderr_path)
        if proc.poll() is not None:
            pytest.fail(f"antler exited with {proc.returncode} before listening\n{stderr_path.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            pytest.fail(f"no '{LISTEN_PREFIX}...' line within {STARTUP_TIMEOUT_S:.0f} s\n{stderr_path.read_text(errors='replace')}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def channel(request: pytest.FixtureRequest, server: Server) -> grpc.Channel:
    ch = grpc.insecure_channel(server.address)
    request.addfinalizer(ch.close)
    grpc.channel_ready_future(ch).result(timeout=RPC_TIMEOUT_S)
    return ch


# --------------------------------------------------------------------------------------------------
# (a) Health
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ("", *SERVICES), ids=lambda s: s or "server")
def test_health_check_serving(channel: grpc.Channel, service: str) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


# --------------------------------------------------------------------------------------------------
# (b) One RPC per service through the generated stubs, (c) a server stream
# --------------------------------------------------------------------------------------------------


def _missing_id() -> str:
    """A well-formed id (UUID, also valid as a thread id) that no resource has."""
    return str(uuid.uuid4())


@dataclass(frozen=True)
class Call:
    """One RPC and the one answer its contract gives on a fresh ``antler up``: either a reply that
    ``check`` accepts, or exactly the error ``error_code`` whose details contain ``error_text``."""

    package: str  # e.g. "antler.runs.v1"
    proto_file: str  # module stem of the file that declares the service, e.g. "run_service"
    service: str  # e.g. "RunService"
    method: str  # e.g. "GetRun"
    request: Callable[[Any], Any]  # messages module -> request message
    check: Callable[[Any], None] | None = None  # asserts on the reply when the call must succeed
    error_code: grpc.StatusCode | None = None  # the error the call must fail with instead
    error_text: str = ""  # and a piece of its details

    @property
    def name(self) -> str:
        return f"{self.service}.{self.method}"

    def stub_method(self, channel: grpc.Channel) -> tuple[Callable[..., Any], Any]:
        module = f"{self.package}.{self.proto_file}"
        messages = importlib.import_module(module + "_pb2")
        services = importlib.import_module(module + "_pb2_grpc")
        stub = getattr(services, f"{self.service}Stub")(channel)
        return getattr(stub, self.method), self.request(messages)


def _demo_model_listed(reply: Any) -> None:
    # With no models configured, antler up serves its built-in replay model `demo`, the default.
    assert [m.name for m in reply.models] == ["demo"], reply
    assert reply.default_model_name == "demo", reply


def _no_mcp_servers(reply: Any) -> None:
    # No extensions_config.json in the working directory: no servers, no skipped entries, a config hash.
    assert list(reply.servers) == [] and list(reply.errors) == [], reply
    assert len(reply.config_hash) == 16, reply


def _empty_pool(reply: Any) -> None:
    assert reply.sessions_open == 0 and reply.capacity == 256 and list(reply.per_server) == [], reply


def _no_facts(reply: Any) -> None:
    assert list(reply.facts) == [] and not reply.page.next_page_token, reply


MISSING = _missing_id()

UNARY_CALLS = (
    Call("antler.runs.v1", "run_service", "RunService", "GetRun",
         lambda m: m.GetRunRequest(run_id=MISSING), error_code=grpc.StatusCode.NOT_FOUND, error_text=f"run {MISSING}"),
    Call("antler.runs.v1", "run_service", "RunService", "GetRun",
         lambda m: m.GetRunRequest(), error_code=grpc.StatusCode.INVALID_ARGUMENT, error_text="run_id: is required"),
    Call("antler.runs.v1", "thread_service", "ThreadService", "GetThread",
         lambda m: m.GetThreadRequest(thread_id=MISSING), error_code=grpc.StatusCode.NOT_FOUND, error_text=f"thread {MISSING}"),
    Call("antler.sandbox.v1", "sandbox", "SandboxService", "GetSandbox",
         lambda m: m.GetSandboxRequest(thread_id=MISSING), error_code=grpc.StatusCode.NOT_FOUND, error_text=MISSING),
    Call("antler.sandbox.v1", "skill", "SkillService", "GetSkill",
         lambda m: m.GetSkillRequest(name="no-such-skill"), error_code=grpc.StatusCode.NOT_FOUND, error_text='no skill named "no-such-skill"'),
    Call("antler.sandbox.v1", "skill", "SkillService", "GetSkill",
         lambda m: m.GetSkillRequest(name="Not_Hyphen"), error_code=grpc.StatusCode.INVALID_ARGUMENT, error_text="name: "),
    Call("antler.mcp.v1", "mcp", "McpService", "ListServers",
         lambda m: m.ListServersRequest(), check=_no_mcp_servers),
    Call("antler.mcp.v1", "mcp", "McpService", "GetPoolStats",
         lambda m: m.GetPoolStatsRequest(), check=_empty_pool),
    Call("antler.mcp.v1", "mcp", "McpService", "CallTool",
         lambda m: m.CallToolRequest(tool_name="nowhere_echo"), error_code=grpc.StatusCode.NOT_FOUND, error_text="nowhere_echo"),
    Call("antler.models.v1", "models", "ModelService", "ListModels",
         lambda m: m.ListModelsRequest(), check=_demo_model_listed),
    Call("antler.memory.v1", "memory", "MemoryService", "ListFacts",
         lambda m: m.ListFactsRequest(), check=_no_facts),
)


def assert_answer(call: Call, reply: Any = None, error: grpc.RpcError | None = None) -> None:
    """The call gave exactly the answer its contract documents."""
    if call.check is not None:
        assert error is None, f"{call.name} failed with {error.code().name}: {error.details()!r}"
        call.check(reply)
        return
    assert error is not None, f"{call.name} succeeded ({reply!r}); expected {call.error_code.name}"
    assert error.code() == call.error_code, f"{call.name}: {error.code().name} {error.details()!r}; expected {call.error_code.name}"
    assert call.error_text in (error.details() or ""), f"{call.name}: {error.details()!r} lacks {call.error_text!r}"


@pytest.mark.parametrize("call", UNARY_CALLS, ids=lambda c: f"{c.name}-{c.error_code.name if c.error_code else 'OK'}")
def test_unary_rpc_through_stub(stubs_dir: Path, channel: grpc.Channel, call: Call) -> None:
    method, request = call.stub_method(channel)
    try:
        reply = method(request, timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as error:
        assert_answer(call, error=error)
    else:
        assert_answer(call, reply=reply)


def test_server_stream_through_stub(stubs_dir: Path, channel: grpc.Channel) -> None:
    join = Call("antler.runs.v1", "run_service", "RunService", "JoinRun",
                lambda m: m.JoinRunRequest(run_id=MISSING, after_seq=0),
                error_code=grpc.StatusCode.NOT_FOUND, error_text=f"run {MISSING}")
    method, request = join.stub_method(channel)
    # A run that does not exist: the stream ends at once with NOT_FOUND (bounded by the deadline).
    try:
        events = list(method(request, timeout=RPC_TIMEOUT_S))
    except grpc.RpcError as error:
        assert_answer(join, error=error)
    else:
        assert_answer(join, reply=events)


def test_the_sandbox_runs_commands_under_bwrap(stubs_dir: Path, channel: grpc.Channel, server: Server) -> None:
    """``antler up`` with the default ``sandbox.provider: auto`` runs commands in bwrap where bwrap works: the
    provider is BWRAP (not the ``local`` fallback) and a command runs in its own pid namespace."""
    antler_up.require_bwrap("the sandbox's bwrap provider")
    sandbox_pb2 = importlib.import_module("antler.sandbox.v1.sandbox_pb2")
    sandbox_grpc = importlib.import_module("antler.sandbox.v1.sandbox_pb2_grpc")
    stub = sandbox_grpc.SandboxServiceStub(channel)
    thread_id = _missing_id()
    acquired = stub.AcquireSandbox(sandbox_pb2.AcquireSandboxRequest(thread_id=thread_id), timeout=RPC_TIMEOUT_S)
    assert acquired.sandbox.provider == sandbox_pb2.SANDBOX_PROVIDER_KIND_BWRAP, f"{acquired.sandbox}\n{server.logs()}"
    assert acquired.sandbox.exec_enabled and not acquired.sandbox.network_enabled, acquired.sandbox
    assert "sandbox provider selected (fallback)" not in server.stderr_path.read_text(errors="replace")
    events = list(stub.ExecuteCommand(sandbox_pb2.ExecuteCommandRequest(thread_id=thread_id, command="echo pid=$$"),
                                      timeout=RPC_TIMEOUT_S))
    out = "".join(e.output.text for e in events if e.HasField("output"))
    exits = [e.exit for e in events if e.HasField("exit")]
    assert exits and exits[-1].exit_code == 0, events
    # In a fresh pid namespace the shell is one of its first processes; on the host it would be a large pid.
    pid = int(re.search(r"pid=(\d+)", out).group(1))
    assert pid < 10, out


# --------------------------------------------------------------------------------------------------
# (d) The Python example streams a whole lead-agent run
# --------------------------------------------------------------------------------------------------


EVENT_LINE = re.compile(r"^\[\s*(\d+)\] (.*)$")


def assert_demo_run_printed(stdout: str, output: str, shown: str) -> tuple[str, str]:
    """An example's printout of the demo run: events in stream order, opened by the run's metadata, the
    transcript's tool calls in order and finished, the delivered file listed, SUCCESS last. Returns the run
    and thread ids the metadata line names."""
    events = [(int(m[1]), m[2]) for m in map(EVENT_LINE.match, stdout.splitlines()) if m]
    seqs = [seq for seq, _ in events]
    assert seqs == sorted(set(seqs)) and seqs, f"event seqs not strictly increasing: {seqs}\n{shown}"
    first = re.fullmatch(r"run ([0-9a-f-]{36}) on thread ([0-9a-f-]{36}) \(attempt 1\)", events[0][1])
    assert first, f"the first event is not the run's metadata\n{shown}"
    assert events[-1][1] == "end: SUCCESS", shown

    # services/models/demo/transcript.yaml's tool calls in order (plan, write, check, tick the plan off,
    # present), every one finished, then the receipt just before the end.
    started = [text[len("tool "):text.index("(")] for _, text in events if text.startswith("tool ")]
    assert started == ["write_todos", "write_file", "bash", "write_todos", "present_files"], shown
    finished = sorted(text.split()[1] for _, text in events if text.startswith("  → "))
    assert finished == sorted(started), shown
    assert events[-2][1] == "delivery receipt: satisfied", shown
    assert re.search(rf"^        {re.escape(output)} \([1-9]\d* bytes, sha256 [0-9a-f]{{12}}…\)$", stdout, re.M), shown

    return first[1], first[2]


def test_the_python_example_streams_the_demo_run(stubs_dir: Path, server: Server) -> None:
    """``examples/python/stream_run.py`` against ``antler up`` with no models configured: the built-in
    ``demo`` model plays its transcript, and the run succeeds only because its file was delivered."""
    example = REPO / "examples" / "python" / "stream_run.py"
    output = "/mnt/user-data/outputs/hello.md"
    result = subprocess.run(
        [sys.executable, str(example), "Write a hello note and present it", "--addr", server.address,
         "--plan", "--expect", output, "--stubs", str(stubs_dir)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    shown = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\n{server.logs()}"
    assert result.returncode == 0, shown
    assert_demo_run_printed(result.stdout, output, shown)


# --------------------------------------------------------------------------------------------------
# (e) The Node example streams the same run over @grpc/grpc-js
# --------------------------------------------------------------------------------------------------

# scripts/setup installs examples/node/package.json's packages here; a user runs `npm ci` in examples/node.
NODE_MODULES = Path(os.environ.get("ANTLER_TOOLS", REPO / ".tools")) / "node-example" / "node_modules"


def test_the_node_example_streams_the_demo_run(stubs_dir: Path, server: Server, channel: grpc.Channel) -> None:
    """``examples/node/stream_run.js`` against ``antler up``: the demo transcript's events are printed in
    stream order, the run ends SUCCESS, and the run the example names is SUCCESS on the server too."""
    if not (NODE_MODULES / "@grpc" / "grpc-js").is_dir():
        pytest.fail(f"@grpc/grpc-js not found under {NODE_MODULES} (run scripts/setup)")
    example = REPO / "examples" / "node" / "stream_run.js"
    output = "/mnt/user-data/outputs/hello.md"
    result = subprocess.run(
        ["node", str(example), "Write a hello note and present it", "--addr", server.address,
         "--plan", "--expect", output],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "NODE_PATH": str(NODE_MODULES)},
    )
    shown = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}\n{server.logs()}"
    assert result.returncode == 0, shown

    run_id, thread_id = assert_demo_run_printed(result.stdout, output, shown)

    run_pb2 = importlib.import_module("antler.runs.v1.run_pb2")
    service_pb2 = importlib.import_module("antler.runs.v1.run_service_pb2")
    service_grpc = importlib.import_module("antler.runs.v1.run_service_pb2_grpc")
    run = service_grpc.RunServiceStub(channel).GetRun(service_pb2.GetRunRequest(run_id=run_id), timeout=RPC_TIMEOUT_S).run
    assert (run.thread_id, run.status) == (thread_id, run_pb2.RUN_STATUS_SUCCESS), run
