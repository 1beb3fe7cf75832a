"""llama-server for scripts/real-model: start, kill, restart on the same port; its slot state; and direct
streamed Chat Completions requests that read the wire exactly as it comes (the reference Antler is compared
with)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One llama-server process on 127.0.0.1:port; `kill` is SIGKILL, `start` again reuses the port."""

    def __init__(self, binary: Path, model: Path, template: Path, log_dir: Path, threads: int, api_key: str) -> None:
        self.binary, self.model, self.template, self.log_dir, self.threads = binary, model, template, log_dir, threads
        self.api_key = api_key
        self.port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Starts the server and waits for /health; returns the seconds it took."""
        self.starts += 1
        log = (self.log_dir / f"llama-server-{self.starts}.log").open("wb")
        args = [
            str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
            "--jinja", "--chat-template-file", str(self.template),
            # One slot: a request that the server still works on for a cancelled client blocks the next one,
            # so "the next request starts promptly" proves the slot was freed.
            "-np", "1", "-c", "8192", "--slots", "-t", str(self.threads), "--no-warmup", "--alias", "smollm2-135m-instruct",
            # A key, so the gateway's Authorization header is checked by the real server (/health stays public).
            "--api-key", self.api_key,
        ]
        began = time.monotonic()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} while starting; see {self.log_path()}")
            try:
                status, _ = get_json(self.base_url, "/health", timeout=2, api_key="")
                if status == 200:
                    return time.monotonic() - began
            except OSError:
                pass
            if time.monotonic() - began > START_TIMEOUT_S:
                raise RuntimeError(f"llama-server not healthy within {START_TIMEOUT_S:.0f} s; see {self.log_path()}")
            time.sleep(0.1)

    def log_path(self) -> Path:
        return self.log_dir / f"llama-server-{self.starts}.log"

    def kill(self) -> None:
        """SIGKILL: no goodbye on any connection, as when the machine or the OOM killer takes it."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def processing(self) -> bool:
        """Whether the (single) slot is working on a task, from GET /slots."""
        status, slots = get_json(self.base_url, "/slots", timeout=5, api_key=self.api_key)
        if status != 200 or not isinstance(slots, list) or not slots:
            raise RuntimeError(f"/slots answered {status}: {str(slots)[:200]}")
        return any(bool(s.get("is_processing")) for s in slots)


def get_json(base_url: str, path: str, timeout: float, api_key: str) -> tuple[int, Any]:
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        resp = conn.getresponse()
        body = resp.read()
        try:
            return resp.status, json.loads(body)
        except ValueError:
            return resp.status, body.decode(errors="replace")
    finally:
        conn.close()


@dataclass
class DirectToolCall:
    """One tool call as llama-server streamed it: every piece keeps its wire form."""

    id: str = ""
    names: list[str] = field(default_factory=list)  # every `function.name` piece, in order
    fragments: list[str] = field(default_factory=list)  # every `function.arguments` piece, in order
    ids_seen: list[str] = field(default_factory=list)

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)


@dataclass
class DirectStream:
    text: str = ""
    text_chunks: int = 0
    finish_reason: Optional[str] = None
    usage: Optional[dict] = None
    tool_calls: dict[int, DirectToolCall] = field(default_factory=dict)
    done: bool = False
    first_byte_s: float = 0.0
    first_content_s: float = 0.0  # until the first text or tool-call piece
    seconds: float = 0.0
    raw_lines: list[str] = field(default_factory=list)


def stream_direct(server: LlamaServer, body: dict, timeout: float = 300.0) -> DirectStream:
    """POSTs body (stream forced on, usage asked for) to /v1/chat/completions and reads the SSE stream.

    The body goes with its keys sorted, as Antler's provider sends it (serde_json without preserve_order): the
    tool schema is rendered into the prompt as it arrives, so another key order is another prompt."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    host, port = server.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    out = DirectStream()
    began = time.monotonic()
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body, sort_keys=True), headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"})
        resp = conn.getresponse()
        out.first_byte_s = time.monotonic() - began
        if resp.status != 200:
            raise RuntimeError(f"llama-server answered HTTP {resp.status}: {resp.read()[:500]!r}")
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.decode().rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            out.raw_lines.append(data)
            if data == "[DONE]":
                out.done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"llama-server streamed an error: {chunk['error']}")
            if chunk.get("usage"):
                out.usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if not out.first_content_s and (delta.get("content") or delta.get("tool_calls")):
                    out.first_content_s = time.monotonic() - began
                if delta.get("content"):
                    out.text += delta["content"]
                    out.text_chunks += 1
                for piece in delta.get("tool_calls") or []:
                    call = out.tool_calls.setdefault(int(piece["index"]), DirectToolCall())
                    if piece.get("id"):
                        call.ids_seen.append(piece["id"])
                        call.id = call.id or piece["id"]
                    function = piece.get("function") or {}
                    if function.get("name"):
                        call.names.append(function["name"])
                    if function.get("arguments"):
                        call.fragments.append(function["arguments"])
                if choice.get("finish_reason"):
                    out.finish_reason = choice["finish_reason"]
    finally:
        conn.close()
    out.seconds = time.monotonic() - began
    return out
