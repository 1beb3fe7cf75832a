"""Gateway answers DeerFlow's web UI needs so that a walk through it (scripts/deerflow-ui-check) leaves no error in
the browser console, driven with httpx against ``antler up`` (auth on, alice and bob):

* the upload limits of a new chat: the UI asks ``/api/threads/{id}/uploads/limits`` under the thread id it is about
  to create, before the thread or its sandbox exists — answered with the sandbox's limits (DeerFlow answers its
  configured limits for any thread id), without a sandbox per new chat;
* ``/api/threads/{id}/runs/{run_id}/workspace-changes``, which the UI asks after each answer — DeerFlow's answer for a
  run without a record (``available: false``), for the caller's run only, and ``workspace_changes`` off in
  ``/api/features``.

Environment: ``ANTLER_BIN`` (default ``<repo>/target/debug/antler``).
Run: ``python -m pytest -q integration-tests/python/test_gateway_deerflow_ui.py``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import antler_up

EDGE_PREFIX = "langgraph api listening on "
ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
SERVICE = "service-key-0123456789abcdef"
LIMITS = {"max_files": 4, "max_file_size": 2097152, "max_total_size": 3145728}


def config() -> str:
    return f"""
server:
  shutdown_grace_secs: 5
  auth:
    enabled: true
    api_keys:
      - {{key: {ALICE}, user: alice}}
      - {{key: {BOB}, user: bob}}
      - {{key: {SERVICE}, user: antler-runs, service: true}}
clients:
  sandbox: {{service_token: {SERVICE}}}
  models: {{service_token: {SERVICE}}}
  mcp: {{service_token: {SERVICE}}}
  memory: {{service_token: {SERVICE}}}
edge:
  listen: 127.0.0.1:0
runs:
  lead:
    mcp: {{enabled: false}}
    title: {{enabled: false}}
sandbox:
  provider: local
  uploads: {{max_files: {LIMITS["max_files"]}, max_file_bytes: {LIMITS["max_file_size"]}, max_total_bytes: {LIMITS["max_total_size"]}}}
models:
  - name: answerer
    provider: replay
    replay:
      after_last: cycle
      turns:
        - text: "Done."
"""


@dataclass
class Server:
    url: str
    root: Path

    def client(self, key: str = ALICE, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"x-api-key": key}, timeout=60.0, **kwargs)

    def sandbox_dir(self, user: str, thread_id: str) -> Path:
        return self.root / "data" / "sandbox" / "users" / user / "threads" / thread_id


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest) -> Server:
    root = antler_up.searchable_root(request, "antler-gateway-ui-")

    def ready(text: str) -> str | None:
        edge = [line[len(EDGE_PREFIX):].strip() for line in text.splitlines() if line.startswith(EDGE_PREFIX)]
        return edge[0] if edge and antler_up.LISTEN_PREFIX in text else None

    started = antler_up.start(request, root, config(), ready)
    return Server(started.ready, root)


def finished_run(server: Server, key: str = ALICE) -> tuple[str, str]:
    """A thread of the key's user with one finished run: (thread_id, run_id)."""
    with server.client(key) as http:
        thread_id = http.post("/threads", json={}).json()["thread_id"]
        done = http.post(f"/threads/{thread_id}/runs/wait", json={
            "assistant_id": "lead_agent",
            "input": {"messages": [{"role": "user", "content": "hello"}]},
        })
        assert done.status_code == 200 and "__error__" not in done.json(), done.text
        return thread_id, http.get(f"/threads/{thread_id}/runs").json()[0]["run_id"]


def test_a_new_chat_gets_the_upload_limits_before_its_thread_exists(server: Server) -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    with server.client() as http:
        # The process has seen no sandbox yet: this one is acquired for the caller (as an upload would).
        answer = http.get(f"/api/threads/{first}/uploads/limits")
        assert answer.status_code == 200 and answer.json() == LIMITS, answer.text
        # Every later new chat is answered from the limits already seen: no sandbox is made for it.
        answer = http.get(f"/api/threads/{second}/uploads/limits")
        assert answer.status_code == 200 and answer.json() == LIMITS, answer.text
        assert not server.sandbox_dir("alice", second).exists()
        # Uploading to it then works as before, within those limits.
        up = http.post(f"/api/threads/{second}/uploads", files=[("files", ("a.txt", b"a", "text/plain"))])
        assert up.status_code == 200, up.text
        assert server.sandbox_dir("alice", second).is_dir()
        too_many = [("files", (f"f{i}.txt", b"x", "text/plain")) for i in range(LIMITS["max_files"] + 1)]
        refused = http.post(f"/api/threads/{str(uuid.uuid4())}/uploads", files=too_many)
        assert refused.status_code == 413 and "max_files" in refused.json()["detail"], refused.text
        bad = http.get("/api/threads/not a thread!/uploads/limits")
        assert bad.status_code == 422 and "thread_id" in bad.json()["detail"], bad.text
    with server.client(BOB) as bob:
        # Another user's thread id reads as one bob has not created yet: the limits, which are no secret, and
        # still no sandbox of alice's touched.
        answer = bob.get(f"/api/threads/{second}/uploads/limits")
        assert answer.status_code == 200 and answer.json() == LIMITS, answer.text
        assert not server.sandbox_dir("bob", second).exists()
        listed = bob.get(f"/api/threads/{second}/uploads/list")
        assert listed.status_code == 404, listed.text


def test_a_thread_of_the_callers_without_a_sandbox_gets_one_for_its_limits(server: Server) -> None:
    with server.client() as http:
        thread_id = http.post("/threads", json={}).json()["thread_id"]
        assert not server.sandbox_dir("alice", thread_id).exists()
        answer = http.get(f"/api/threads/{thread_id}/uploads/limits")
        assert answer.status_code == 200 and answer.json() == LIMITS, answer.text
        assert server.sandbox_dir("alice", thread_id).is_dir()


def test_workspace_changes_answer_no_record_for_the_callers_run_only(server: Server) -> None:
    thread_id, run_id = finished_run(server)
    url = f"/api/threads/{thread_id}/runs/{run_id}/workspace-changes"
    with server.client() as http:
        answer = http.get(url, params={"include_files": "true", "include_diff": "false"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["available"] is False and body["files"] == [] and body["version"] == 1, body
        assert body["summary"] == {"created": 0, "modified": 0, "deleted": 0, "symlink_created": 0, "additions": 0,
                                   "deletions": 0, "truncated": False}, body
        bad = http.get(url, params={"include_diff": "sometimes"})
        assert bad.status_code == 422 and "include_diff" in bad.json()["detail"], bad.text
        assert http.get(f"/api/threads/{thread_id}/runs/{uuid.uuid4()}/workspace-changes").status_code == 404
        other_thread = http.post("/threads", json={}).json()["thread_id"]
        assert http.get(f"/api/threads/{other_thread}/runs/{run_id}/workspace-changes").status_code == 404
        features = http.get("/api/features").json()
        assert features["workspace_changes"] == {"enabled": False}, features
    with server.client(BOB) as bob:
        assert bob.get(url).status_code == 404
