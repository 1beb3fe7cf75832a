"""Antler for scripts/real-model: grpcio stubs generated from proto/, and `antler up` on a free loopback port
with a config whose models point at llama-server."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
LISTEN_PREFIX = "antler listening on "
START_TIMEOUT_S = 60.0


def load_stubs(out: Path) -> SimpleNamespace:
    """Generates Python messages and stubs for every .proto file into `out` and imports the ones used."""
    import grpc_tools  # grpcio-tools, from scripts/setup's venv

    out.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}",
         f"--python_out={out}", f"--grpc_python_out={out}", *protos],
        cwd=PROTO_ROOT, check=True,
    )
    sys.path.insert(0, str(out))
    importlib.invalidate_caches()
    m = importlib.import_module
    return SimpleNamespace(
        common=m("antler.common.v1.common_pb2"),
        models=m("antler.models.v1.models_pb2"),
        models_grpc=m("antler.models.v1.models_pb2_grpc"),
        runs=m("antler.runs.v1.run_pb2"),
        run_service=m("antler.runs.v1.run_service_pb2"),
        run_service_grpc=m("antler.runs.v1.run_service_pb2_grpc"),
    )


def config(base_url: str) -> str:
    """antler.yaml: two entries for the same llama-server.

    `smollm2` is the model the comparisons use. `cache_prompt: false` (a llama-server request field, through
    `extra_body`) makes every request evaluate its whole prompt, so a request through Antler and the direct one
    run the same computation whatever the slot's cache held, and greedy decoding gives the same tokens.
    `smollm2-endless` adds `ignore_eos`, so a generation runs until max_tokens: the cancel and kill checks need
    one that is still going when they act. `smollm2-cached` keeps llama-server's prompt cache on (its default), for
    the cached-token count. These send the server's key from $REAL_MODEL_API_KEY; `smollm2-wrong-key`
    sends another one from $REAL_MODEL_WRONG_KEY. Retries are quick (0.2 s base) so a dead server's UNAVAILABLE comes
    after all three attempts in well under the bounds; the chunk timeout is 120 s, so a stream that ended because
    it waited that long would fail the bounds by far."""
    common = f"""
      provider: openai
      api_key: $REAL_MODEL_API_KEY
      model: smollm2-135m-instruct
      base_url: {base_url}/v1
      seed: 42
      max_retries: 2
      connect_timeout_ms: 2000
      chunk_timeout_ms: 120000
      context_window: 8192"""
    return f"""
server:
  shutdown_grace_secs: 2
models:
  retry: {{base_delay_ms: 200, cap_delay_ms: 1000}}
  models:
    - name: smollm2{common}
      max_tokens: 2048
      extra_body: {{cache_prompt: false}}
    - name: smollm2-endless{common}
      max_tokens: 4096
      extra_body: {{cache_prompt: false, ignore_eos: true}}
    - name: smollm2-cached{common}
      max_tokens: 2048
    - name: smollm2-wrong-key
      provider: openai
      api_key: $REAL_MODEL_WRONG_KEY
      model: smollm2-135m-instruct
      base_url: {base_url}/v1
      max_retries: 2
"""


class Antler:
    """`antler up` with its own config and data directory under `root`."""

    def __init__(self, binary: Path, root: Path, base_url: str, api_key: str, wrong_key: str) -> None:
        self.binary, self.root = binary, root
        self.env = {"REAL_MODEL_API_KEY": api_key, "REAL_MODEL_WRONG_KEY": wrong_key}
        (root / "antler.yaml").write_text(config(base_url))
        self.stdout, self.stderr = root / "antler.stdout.log", root / "antler.stderr.log"
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self) -> None:
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [str(self.binary), "up", "--config", str(self.root / "antler.yaml"), "--listen", "127.0.0.1:0",
                 "--data-dir", str(self.root / "data")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=self.root,
                env={**{k: v for k, v in os.environ.items() if k not in ("DEER_FLOW_EXTENSIONS_CONFIG_PATH", "ANTLER_CONFIG")}, **self.env},
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            for line in self.stdout.read_text(errors="replace").splitlines():
                if line.startswith(LISTEN_PREFIX):
                    self.address = line[len(LISTEN_PREFIX):].strip()
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"antler up exited with {self.proc.returncode}:\n{self.stderr.read_text(errors='replace')[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"antler up not listening within {START_TIMEOUT_S:.0f} s:\n{self.stderr.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
