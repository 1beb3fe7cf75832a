"""The LangGraph-compatible edge driven by the real ``langgraph-sdk`` (PyPI) against ``antler up``.

The server runs with authentication on (alice, bob and a service key), the lead agent, and two replay
models of its own (no LLM): ``quick`` (a tool call, then an answer) and ``slow`` (a long answer streamed
slowly, for cancellation and reconnects). Every test talks to ``edge.listen`` through
``langgraph_sdk.get_client(url=…, api_key=…)`` (raw httpx only for what the SDK cannot send: a body that
is not JSON, the response headers).

The same server is also driven by the real ``@langchain/langgraph-sdk`` (npm) from Node:
``integration-tests/node/langgraph_sdk.test.js``, run by ``test_the_node_sdk_drives_the_edge``, and
``integration-tests/node/deerflow_ui.test.js`` (DeerFlow's web UI's call sequence with the SDK at the UI's
pinned 1.6.0 and at 1.15.0), run by ``test_deerflow_s_ui_sequence_with_the_pinned_and_the_current_node_sdk``.

Environment: ``ANTLER_BIN`` (default ``<repo>/target/debug/antler``); ``ANTLER_TOOLS`` (default ``<repo>/.tools``),
where ``scripts/setup`` installs the Node SDK (``node-langgraph/``).
Run: ``python -m pytest -q integration-tests/python/test_langgraph_sdk.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import AuthenticationError, ConflictError, NotFoundError, UnprocessableEntityError

import antler_up

EDGE_PREFIX = "langgraph api listening on "
RUN_TIMEOUT_S = 60.0

ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef00"
SERVICE = "service-key-0123456789abcdef"

QUICK_ANSWER = "Hello from Antler, through the LangGraph API."
SLOW_ANSWER = " ".join(f"word{i:03d}" for i in range(120))

CONFIG = f"""
server:
  shutdown_grace_secs: 5
  metrics:
    listen: 127.0.0.1:0
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
runs:
  heartbeat_secs: 1
edge:
  listen: 127.0.0.1:0
  cors_origins: ["http://localhost:3000"]
sandbox:
  provider: local
models:
  - name: quick
    provider: replay
    replay:
      chunk_chars: 8
      after_last: cycle
      turns:
        - text: "Let me look around first."
          tool_calls:
            - {{id: call_ls, name: ls, arguments: {{description: list the workspace, path: /mnt/user-data/workspace}}}}
          usage: {{input_tokens: 100, output_tokens: 20}}
        - text: "{QUICK_ANSWER}"
          usage: {{input_tokens: 150, output_tokens: 12}}
  - name: slow
    provider: replay
    replay:
      chunk_chars: 8
      chunk_delay_ms: 60
      after_last: cycle
      turns:
        - text: "{SLOW_ANSWER}"
"""


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    stdout: Path
    stderr: Path

    def metrics(self) -> str:
        urls = [line.split("metrics:", 1)[1].strip() for line in self.stdout.read_text().splitlines() if line.strip().startswith("metrics:")]
        return httpx.get(urls[0]).text

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-4000:]}" for p in (self.stdout, self.stderr))


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Server:
    root = antler_up.searchable_root(request, "antler-langgraph-")

    def ready(text: str) -> str | None:
        edge = [line[len(EDGE_PREFIX):].strip() for line in text.splitlines() if line.startswith(EDGE_PREFIX)]
        return edge[0] if edge and antler_up.LISTEN_PREFIX in text else None

    started = antler_up.start(request, root, CONFIG, ready)
    return Server(started.proc, started.ready, started.stdout, started.stderr)


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    """Runs one async test body with a deadline (a hung stream fails the test instead of the suite)."""
    return asyncio.run(asyncio.wait_for(body(), RUN_TIMEOUT_S))


def user(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]}


def quick() -> dict:
    return {"configurable": {"model_name": "quick"}}


def slow() -> dict:
    return {"configurable": {"model_name": "slow"}}


def seq_of(event_id: str) -> tuple[int, int]:
    """Orders the edge's SSE ids: ``N`` is event N; ``N.k`` sits between events N and N+1."""
    if "." in event_id:
        before, k = event_id.split(".")
        return int(before), int(k) + 1
    return int(event_id), 1_000_000


async def wait_status(client: Any, thread_id: str, run_id: str, wanted: set[str], timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = await client.runs.get(thread_id, run_id)
        if found["status"] in wanted:
            return found
        assert time.monotonic() < deadline, f"run {run_id} stayed {found['status']}, expected one of {wanted}"
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------------------------------
# Server, auth, ownership
# --------------------------------------------------------------------------------------------------


def test_ok_and_info_answer_without_a_key(server: Server) -> None:
    assert httpx.get(f"{server.url}/ok").json() == {"ok": True}
    info = httpx.get(f"{server.url}/info").json()
    assert info["server"] == "antler" and info["flags"]["assistants"] is True, info


def test_calls_without_a_valid_key_are_refused(server: Server) -> None:
    async def body() -> None:
        for key in (None, "not-a-key-0123456789"):
            client = get_client(url=server.url, api_key=key)
            with pytest.raises(AuthenticationError) as refused:
                await client.threads.create()
            assert refused.value.status_code == 401
            assert "Authorization" in refused.value.message or "API key" in refused.value.message, refused.value.message
        # The same key as a bearer token works too (the kit's authenticator reads both).
        bearer = get_client(url=server.url, api_key=None, headers={"Authorization": f"Bearer {ALICE}"})
        assert (await bearer.threads.create())["status"] == "idle"

    run(body)


def test_another_users_thread_and_runs_look_missing(server: Server) -> None:
    async def body() -> None:
        alice, bob = get_client(url=server.url, api_key=ALICE), get_client(url=server.url, api_key=BOB)
        thread = await alice.threads.create(metadata={"owner_tag": "alice-only"})
        done = await alice.runs.wait(thread["thread_id"], "lead", input=user("hi"), config=quick())
        assert done["messages"][-1]["content"] == QUICK_ANSWER
        [alice_run] = await alice.runs.list(thread["thread_id"])
        missing = str(uuid.uuid4())
        for call in (
            lambda t: bob.threads.get(t),
            lambda t: bob.threads.get_state(t),
            lambda t: bob.threads.get_history(t),
            lambda t: bob.runs.list(t),
            lambda t: bob.runs.create(t, "lead", input=user("mine now"), config=quick()),
            lambda t: bob.threads.delete(t),
        ):
            with pytest.raises(NotFoundError) as theirs:
                await call(thread["thread_id"])
            with pytest.raises(NotFoundError) as nobodys:
                await call(missing)
            # Exactly like a thread that does not exist, down to the message.
            assert theirs.value.message.replace(thread["thread_id"], "ID") == nobodys.value.message.replace(missing, "ID")
        with pytest.raises(NotFoundError):
            await bob.runs.get(thread["thread_id"], alice_run["run_id"])
        assert not await bob.threads.search(metadata={"owner_tag": "alice-only"})
        assert [t["thread_id"] for t in await alice.threads.search(metadata={"owner_tag": "alice-only"})] == [thread["thread_id"]]

    run(body)


def test_cors_lets_the_configured_browser_origin_in_and_no_other(server: Server) -> None:
    ui = "http://localhost:3000"
    preflight = httpx.options(
        f"{server.url}/threads/search",
        headers={"Origin": ui, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type,x-api-key"},
    )
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == ui
    assert "POST" in preflight.headers["access-control-allow-methods"]
    allowed = preflight.headers["access-control-allow-headers"].lower()
    assert "x-api-key" in allowed and "authorization" in allowed, allowed
    # An origin that is not listed gets no CORS grant (the browser then refuses the call).
    other = httpx.options(
        f"{server.url}/threads/search",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in other.headers
    # The real call from the UI: granted, and Content-Location (where the SDK finds the run id) is readable.
    thread = httpx.post(f"{server.url}/threads", json={}, headers={"Origin": ui, "x-api-key": ALICE}).json()
    created = httpx.post(
        f"{server.url}/threads/{thread['thread_id']}/runs",
        json={"assistant_id": "lead", "input": user("hi"), "config": quick()},
        headers={"Origin": ui, "x-api-key": ALICE},
    )
    assert created.status_code == 200, created.text
    assert created.headers["access-control-allow-origin"] == ui
    assert "content-location" in created.headers["access-control-expose-headers"].lower()
    assert created.headers["content-location"].endswith(created.json()["run_id"])
    # Credentials are still required: CORS grants a browser the right to ask, not to be trusted.
    refused = httpx.post(f"{server.url}/threads", json={}, headers={"Origin": ui})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ui


# --------------------------------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------------------------------


def test_threads_create_get_patch_search_delete(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        thread_id = f"t-{uuid.uuid4()}"
        created = await client.threads.create(thread_id=thread_id, metadata={"project": "lg-crud"})
        assert created["thread_id"] == thread_id and created["status"] == "idle"
        assert created["metadata"] == {"project": "lg-crud"}
        with pytest.raises(ConflictError):
            await client.threads.create(thread_id=thread_id)
        again = await client.threads.create(thread_id=thread_id, if_exists="do_nothing")
        assert again["thread_id"] == thread_id and again["values"]["messages"] == []
        patched = await client.threads.update(thread_id, metadata={"stage": "two"})
        assert patched["metadata"] == {"project": "lg-crud", "stage": "two"}
        got = await client.threads.get(thread_id)
        assert got["metadata"] == patched["metadata"] and got["created_at"] == created["created_at"]
        found = await client.threads.search(metadata={"project": "lg-crud"}, status="idle", limit=5)
        assert [t["thread_id"] for t in found] == [thread_id]
        assert await client.threads.search(metadata={"project": "lg-crud"}, status="busy") == []
        await client.threads.delete(thread_id)
        with pytest.raises(NotFoundError):
            await client.threads.get(thread_id)

    run(body)


def test_search_pages_with_limit_and_offset(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        tag = str(uuid.uuid4())
        ids = [(await client.threads.create(metadata={"batch": tag}))["thread_id"] for _ in range(5)]
        first = await client.threads.search(metadata={"batch": tag}, limit=2)
        rest = await client.threads.search(metadata={"batch": tag}, limit=10, offset=2)
        assert [t["thread_id"] for t in first + rest] == list(reversed(ids)), "newest first, no overlap, nothing skipped"

    run(body)


async def created_apart(client: Any, metadata: dict) -> str:
    """A new thread's id, created a few milliseconds after the one before (times are in milliseconds)."""
    await asyncio.sleep(0.01)
    return (await client.threads.create(metadata=metadata))["thread_id"]


def test_search_sorts_by_change_or_creation_either_way(server: Server) -> None:
    """DeerFlow's sidebar: ``sort_by=updated_at``, ``sort_order=desc``, ``select`` of four fields."""

    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        tag = str(uuid.uuid4())
        a, b, c, d = [await created_apart(client, {"batch": tag}) for _ in range(4)]
        for changed in (c, a):  # changed in another order than created: a last
            await asyncio.sleep(0.02)
            await client.threads.update(changed, metadata={"touched": True})
        search = lambda **kw: client.threads.search(metadata={"batch": tag}, **kw)  # noqa: E731
        ids = lambda found: [t["thread_id"] for t in found]  # noqa: E731
        assert ids(await search(sort_by="updated_at", sort_order="desc")) == [a, c, d, b]
        assert ids(await search(sort_by="updated_at", sort_order="asc")) == [b, d, c, a]
        assert ids(await search(sort_by="created_at", sort_order="asc")) == [a, b, c, d]
        assert ids(await search()) == [d, c, b, a], "newest created first by default"
        paged = await search(sort_by="updated_at", sort_order="desc", limit=2) + await search(sort_by="updated_at", sort_order="desc", limit=2, offset=2)
        assert ids(paged) == [a, c, d, b], "pages of the chosen order, nothing repeated or skipped"
        sidebar = await search(sort_by="updated_at", sort_order="desc", select=["thread_id", "updated_at", "values", "metadata"])
        assert all(sorted(t) == ["metadata", "thread_id", "updated_at", "values"] for t in sidebar), sidebar
        assert ids(await client.threads.search(ids=[b, a, d], sort_by="updated_at", sort_order="desc")) == [a, d, b]
        with pytest.raises(UnprocessableEntityError) as refused:
            await search(sort_by="status")
        assert "sort_by" in refused.value.message

    run(body)


def test_update_state_renames_a_thread_and_search_finds_it_by_title(server: Server) -> None:
    """DeerFlow's rename: ``threads.update_state(id, {"title": …})`` writes a checkpoint outside a run."""

    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        tid = (await client.threads.create(metadata={"rename": "yes"}))["thread_id"]
        await client.runs.wait(tid, "lead", input=user("hi"), config=quick())
        before = await client.threads.get_state(tid)
        title = f"Renamed {uuid.uuid4()}"
        written = await client.threads.update_state(tid, {"title": title})
        assert written["checkpoint"]["thread_id"] == tid and written["checkpoint"]["checkpoint_id"]
        state = await client.threads.get_state(tid)
        assert state["values"]["title"] == title
        assert state["checkpoint"]["checkpoint_id"] == written["checkpoint"]["checkpoint_id"], "the update is the head"
        assert state["values"]["messages"] == before["values"]["messages"], "the messages are kept"
        assert state["parent_checkpoint"]["checkpoint_id"] == before["checkpoint"]["checkpoint_id"]
        assert state["metadata"]["source"] == "update"
        assert (await client.threads.get(tid))["values"]["title"] == title
        [found] = await client.threads.search(values={"title": title})
        assert found["thread_id"] == tid and found["values"]["title"] == title
        # On an older checkpoint: a fork from it, as LangGraph does.
        [_, *older] = await client.threads.get_history(tid, limit=10)
        oldest = older[-1]
        forked = await client.threads.update_state(tid, {"title": "Forked"}, checkpoint_id=oldest["checkpoint"]["checkpoint_id"])
        state = await client.threads.get_state(tid)
        assert state["checkpoint"]["checkpoint_id"] == forked["checkpoint"]["checkpoint_id"]
        assert state["values"]["messages"] == oldest["values"]["messages"]
        # What cannot be written is refused by name, and leaves the thread as it was.
        for values, kwargs, field in (
            ({"title": "x"}, {"as_node": "model"}, "as_node"),
            ({"messages": []}, {}, "values.messages"),
            ({"todos": []}, {}, "values.todos"),
        ):
            with pytest.raises(UnprocessableEntityError) as refused:
                await client.threads.update_state(tid, values, **kwargs)
            assert field in refused.value.message, refused.value.message
        with pytest.raises(UnprocessableEntityError) as other:
            await client.threads.search(values={"todos": []})
        assert "values.todos" in other.value.message
        # While a run is going: 409 naming it (its next step would overwrite the change).
        started = await client.runs.create(tid, "lead", input=user("talk slowly"), config=slow())
        await wait_status(client, tid, started["run_id"], {"running"})
        with pytest.raises(ConflictError) as busy:
            await client.threads.update_state(tid, {"title": "too soon"})
        assert started["run_id"] in busy.value.message
        await client.runs.cancel(tid, started["run_id"], wait=True)
        assert (await client.threads.get_state(tid))["values"]["title"] == "Forked"

    run(body)


# --------------------------------------------------------------------------------------------------
# Streaming, in every mode
# --------------------------------------------------------------------------------------------------


async def stream_run(client: Any, mode: Any, **kwargs: Any) -> tuple[list, dict]:
    created: dict = {}
    thread = await client.threads.create()
    parts = [
        part
        async for part in client.runs.stream(
            thread["thread_id"], "lead_agent", input=user("look around and greet me"), config=quick(), stream_mode=mode,
            on_run_created=lambda meta: created.update(meta), **kwargs,
        )
    ]
    return parts, {"thread_id": thread["thread_id"], **created}


@pytest.mark.parametrize("mode", ["values", "updates", "messages-tuple", "events", "custom"])
def test_a_lead_run_streams_in_each_mode(server: Server, mode: str) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        parts, meta = await stream_run(client, mode)
        names = [p.event for p in parts]
        assert names[0] == "metadata" and names[-1] == "end", names
        assert parts[0].data["run_id"] == meta["run_id"], "Content-Location names the streamed run"
        assert parts[0].data["thread_id"] == meta["thread_id"]
        assert "error" not in names, parts
        body_parts = [p for p in parts if p.event not in ("metadata", "end")]
        if mode == "values":
            assert {p.event for p in body_parts} == {"values"}
            final = body_parts[-1].data["messages"]
            assert [m["type"] for m in final] == ["human", "ai", "tool", "ai"], final
            assert final[1]["tool_calls"][0]["name"] == "ls" and final[2]["tool_call_id"] == final[1]["tool_calls"][0]["id"]
            assert final[-1]["content"] == QUICK_ANSWER
            assert final[-1]["usage_metadata"]["output_tokens"] == 12
        elif mode == "updates":
            nodes = [next(iter(p.data)) for p in body_parts]
            assert nodes[:3] == ["model", "tools", "model"], nodes
            assert body_parts[1].data["tools"]["messages"][0]["type"] == "tool"
            assert body_parts[2].data["model"]["messages"][0]["content"] == QUICK_ANSWER
        elif mode == "messages-tuple":
            assert {p.event for p in body_parts} == {"messages"}, "LangGraph names messages-tuple frames `messages`"
            by_id: dict[str, str] = {}
            for p in body_parts:
                chunk, metadata = p.data
                assert metadata["run_id"] == meta["run_id"]
                if chunk["type"] == "AIMessageChunk":
                    by_id[chunk["id"]] = by_id.get(chunk["id"], "") + chunk["content"]
            assert QUICK_ANSWER in by_id.values(), by_id
            tool_calls = [c for p in body_parts for c in p.data[0].get("tool_call_chunks", [])]
            assert tool_calls[0]["name"] == "ls"
            assert any(p.data[0]["type"] == "tool" for p in body_parts)
        elif mode == "events":
            kinds = [p.data["event"] for p in body_parts]
            for kind in ("on_chain_start", "on_chat_model_stream", "on_chat_model_end", "on_tool_start", "on_tool_end", "on_chain_end"):
                assert kind in kinds, kinds
            text = "".join(p.data["data"]["chunk"]["content"] for p in body_parts if p.data["event"] == "on_chat_model_stream")
            assert QUICK_ANSWER in text
        else:
            assert body_parts == [], "this agent emits no custom events"
        ids = [p.id for p in parts]
        assert all(ids) and ids == sorted(ids, key=seq_of) and len(set(ids)) == len(ids), ids
        finished = await client.runs.get(meta["thread_id"], meta["run_id"])
        assert finished["status"] == "success" and parts[-1].id == str(finished["last_seq"]), "the last id is the run's last event seq"

    run(body)


def test_several_modes_in_one_stream(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        parts, _ = await stream_run(client, ["values", "messages-tuple", "updates"])
        assert {p.event for p in parts} == {"metadata", "values", "messages", "updates", "end"}

    run(body)


def test_stream_headers_name_the_run_and_where_to_reconnect(server: Server) -> None:
    thread = httpx.post(f"{server.url}/threads", json={}, headers={"x-api-key": ALICE}).json()
    body = {"assistant_id": "lead", "input": user("hi"), "config": quick(), "stream_mode": "values"}
    with httpx.stream("POST", f"{server.url}/threads/{thread['thread_id']}/runs/stream", json=body, headers={"x-api-key": ALICE}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        location = response.headers["content-location"]
        assert location.startswith(f"/threads/{thread['thread_id']}/runs/")
        assert response.headers["location"] == f"{location}/stream"
        text = "".join(response.iter_text())
    assert text.startswith("event: metadata\n") and "event: end\ndata: null\n" in text


# --------------------------------------------------------------------------------------------------
# Joining, reconnecting, cancelling, waiting
# --------------------------------------------------------------------------------------------------


def test_join_after_a_disconnect_resumes_with_no_gap_and_no_duplicate(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        thread = await client.threads.create()
        created: dict = {}
        first: list = []
        async for part in client.runs.stream(
            thread["thread_id"], "lead", input=user("talk slowly"), config=slow(), stream_mode="messages-tuple",
            on_disconnect="continue", on_run_created=lambda meta: created.update(meta),
        ):
            first.append(part)
            if len(first) == 12:
                break  # the client goes away mid-answer
        run_id = created["run_id"]
        assert (await client.runs.get(thread["thread_id"], run_id))["status"] == "running", "on_disconnect=continue keeps it going"
        rest = [p async for p in client.runs.join_stream(thread["thread_id"], run_id, last_event_id=first[-1].id)]
        assert rest[-1].event == "end"
        # A join from the start replays the whole durable log; the two halves are exactly it.
        whole = [p async for p in client.runs.join_stream(thread["thread_id"], run_id)]
        assert [(p.id, p.event, p.data) for p in first + rest] == [(p.id, p.event, p.data) for p in whole]
        text = "".join(p.data[0]["content"] for p in first + rest if p.event == "messages")
        assert text == SLOW_ANSWER
        state = await client.threads.get_state(thread["thread_id"])
        assert state["values"]["messages"][-1]["content"] == SLOW_ANSWER

    run(body)


def test_a_join_with_last_event_id_minus_one_replays_from_the_start(server: Server) -> None:
    """useStream rejoins a running run after a page reload with ``Last-Event-ID: -1``."""

    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        thread = await client.threads.create()
        created: dict = {}
        first: list = []
        async for part in client.runs.stream(
            thread["thread_id"], "lead", input=user("talk slowly"), config=slow(), stream_mode=["values", "messages-tuple"],
            on_disconnect="continue", on_run_created=lambda meta: created.update(meta),
        ):
            first.append(part)
            if len(first) == 6:
                break  # the page reloads
        rejoined = [p async for p in client.runs.join_stream(thread["thread_id"], created["run_id"], last_event_id="-1")]
        whole = [p async for p in client.runs.join_stream(thread["thread_id"], created["run_id"])]
        assert rejoined[0].event == "metadata" and rejoined[-1].event == "end"
        assert [(p.id, p.event, p.data) for p in rejoined] == [(p.id, p.event, p.data) for p in whole], "from the first event"
        assert "".join(p.data[0]["content"] for p in rejoined if p.event == "messages") == SLOW_ANSWER

    run(body)


def test_thinking_on_a_model_without_it_runs_without_and_says_so_once(server: Server) -> None:
    """DeerFlow's UI sends ``thinking_enabled: true`` whatever the model; ``quick`` cannot think."""

    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        thread = await client.threads.create()
        tid = thread["thread_id"]
        created: dict = {}
        context = {"model_name": "quick", "mode": "pro", "thinking_enabled": True, "is_plan_mode": True,
                   "subagent_enabled": False, "reasoning_effort": "medium", "thread_id": tid}
        parts = [
            part
            async for part in client.runs.stream(
                tid, "lead_agent", input=user("look around and greet me"), context=context, config={"recursion_limit": 1000},
                stream_mode=["values", "messages-tuple", "updates", "custom"], on_run_created=lambda meta: created.update(meta),
            )
        ]
        assert "error" not in [p.event for p in parts], parts
        notices = [p.data for p in parts if p.event == "custom" and p.data["name"] == "antler.thinking_unsupported"]
        assert len(notices) == 1 and notices[0]["data"]["model_name"] == "quick", notices
        values = [p.data for p in parts if p.event == "values"][-1]
        assert values["messages"][-1]["content"] == QUICK_ANSWER
        assert (await client.runs.get(tid, created["run_id"]))["status"] == "success"
        warnings = [line for line in server.stderr.read_text().splitlines()
                    if "thinking requested on a model without supports_thinking" in line and created["run_id"] in line]
        assert len(warnings) == 1 and "WARN" in warnings[0], warnings

    run(body)


class CuttingProxy:
    """A loopback TCP proxy that drops the first connection carrying a run stream once it has passed
    ``cut_after`` bytes of the answer, the way a proxy timeout or a restart cuts a stream mid-run."""

    def __init__(self, upstream: str, cut_after: int) -> None:
        self.host, port = upstream.removeprefix("http://").split(":")
        self.port, self.cut_after, self.cuts = int(port), cut_after, 0
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(self.host, self.port)
        streaming = asyncio.Event()

        async def up() -> None:
            while data := await client_r.read(65536):
                if b"/runs/stream" in data and self.cuts == 0:
                    streaming.set()
                server_w.write(data)
                await server_w.drain()

        async def down() -> None:
            passed = 0
            while data := await server_r.read(1024):
                if streaming.is_set() and self.cuts == 0:
                    passed += len(data)
                    if passed > self.cut_after:
                        self.cuts += 1
                        return
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_w, server_w):
            writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def test_the_sdk_reconnects_a_cut_stream_by_itself_with_no_gap_and_no_duplicate(server: Server) -> None:
    async def body() -> None:
        proxy = CuttingProxy(server.url, cut_after=4000)
        url = await proxy.start()
        try:
            client = get_client(url=url, api_key=ALICE)
            thread = await client.threads.create()
            created: dict = {}
            parts = [
                part
                async for part in client.runs.stream(
                    thread["thread_id"], "lead", input=user("talk slowly"), config=slow(), stream_mode=["messages-tuple", "values"],
                    on_run_created=lambda meta: created.update(meta),
                )
            ]
        finally:
            proxy.close()
        assert proxy.cuts == 1, "the proxy cut the stream once"
        assert parts[-1].event == "end"
        direct = get_client(url=server.url, api_key=ALICE)
        whole = [p async for p in direct.runs.join_stream(thread["thread_id"], created["run_id"])]
        # The SDK followed Location with Last-Event-ID: what it yielded is the durable log, exactly.
        assert [(p.id, p.event, p.data) for p in parts] == [(p.id, p.event, p.data) for p in whole]
        assert "".join(p.data[0]["content"] for p in parts if p.event == "messages") == SLOW_ANSWER
        assert (await direct.runs.get(thread["thread_id"], created["run_id"]))["status"] == "success"

    run(body)


def test_a_disconnect_with_on_disconnect_cancel_interrupts_the_run(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        thread = await client.threads.create()
        created: dict = {}
        seen = 0
        async for _ in client.runs.stream(
            thread["thread_id"], "lead", input=user("talk slowly"), config=slow(), stream_mode="messages-tuple",
            on_disconnect="cancel", on_run_created=lambda meta: created.update(meta),
        ):
            seen += 1
            if seen == 5:
                break
        finished = await wait_status(client, thread["thread_id"], created["run_id"], {"interrupted", "success"})
        assert finished["status"] == "interrupted" and finished["stop_reason"] == "client_disconnected", finished

    run(body)


def test_cancel_a_background_run_then_join_it(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        thread = await client.threads.create()
        started = await client.runs.create(thread["thread_id"], "lead", input=user("talk slowly"), config=slow())
        assert started["status"] == "pending" and started["assistant_id"] == "lead"
        await wait_status(client, thread["thread_id"], started["run_id"], {"running"})
        assert (await client.threads.get(thread["thread_id"]))["status"] == "busy"
        await client.runs.cancel(thread["thread_id"], started["run_id"], wait=True)
        cancelled = await client.runs.get(thread["thread_id"], started["run_id"])
        assert cancelled["status"] == "interrupted" and cancelled["stop_reason"] == "cancelled", cancelled
        await client.runs.cancel(thread["thread_id"], started["run_id"])  # a repeated cancel is fine
        joined = await client.runs.join(thread["thread_id"], started["run_id"])
        # Cancelled before its first step was checkpointed: the thread is as it was (no messages).
        assert "__error__" not in joined and isinstance(joined["messages"], list), joined
        done = await client.runs.wait(thread["thread_id"], "lead", input=user("hi"), config=quick())
        [latest, *_] = await client.runs.list(thread["thread_id"], limit=1)
        assert latest["status"] == "success" and done["messages"][-1]["content"] == QUICK_ANSWER
        with pytest.raises(ConflictError) as finished:
            await client.runs.cancel(thread["thread_id"], latest["run_id"])
        assert "not cancellable" in finished.value.message

    run(body)


def test_multitask_strategies(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        thread = await client.threads.create()
        tid = thread["thread_id"]
        first = await client.runs.create(tid, "lead", input=user("talk slowly"), config=slow())
        with pytest.raises(ConflictError) as rejected:
            await client.runs.create(tid, "lead", input=user("me too"), config=quick())
        assert first["run_id"] in rejected.value.message, "the refusal names the active run"
        second = await client.runs.create(tid, "lead", input=user("instead"), config=quick(), multitask_strategy="interrupt")
        superseded = await wait_status(client, tid, first["run_id"], {"interrupted", "success", "error"})
        assert superseded["status"] == "interrupted" and superseded["stop_reason"] == "superseded"
        await client.runs.join(tid, second["run_id"])
        assert (await client.runs.get(tid, second["run_id"]))["status"] == "success"
        statuses = {r["run_id"]: r["status"] for r in await client.runs.list(tid)}
        assert statuses == {first["run_id"]: "interrupted", second["run_id"]: "success"}
        assert [r["run_id"] for r in await client.runs.list(tid, status="interrupted")] == [first["run_id"]]

    run(body)


def test_wait_returns_the_final_state_and_if_not_exists_creates_the_thread(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        fresh = str(uuid.uuid4())
        # runs.wait reads the body itself (to follow Location), so it raises httpx's own error type.
        with pytest.raises(httpx.HTTPStatusError) as missing:
            await client.runs.wait(fresh, "lead", input=user("hi"), config=quick())
        assert missing.value.response.status_code == 404
        with pytest.raises(NotFoundError):
            await client.threads.get(fresh)  # the refused run left no thread behind
        values = await client.runs.wait(fresh, "lead", input=user("hi"), config=quick(), if_not_exists="create")
        assert [m["type"] for m in values["messages"]] == ["human", "ai", "tool", "ai"]
        assert values["messages"][-1]["content"] == QUICK_ANSWER
        assert (await client.threads.get(fresh))["status"] == "idle"

    run(body)


def test_state_and_history(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        thread = await client.threads.create()
        tid = thread["thread_id"]
        await client.runs.wait(tid, "lead", input=user("hi"), config=quick())
        state = await client.threads.get_state(tid)
        assert state["values"]["messages"][-1]["content"] == QUICK_ANSWER
        assert state["next"] == [] and state["checkpoint"]["thread_id"] == tid
        head = state["checkpoint"]["checkpoint_id"]
        history = await client.threads.get_history(tid, limit=2)
        assert [h["checkpoint"]["checkpoint_id"] for h in history][0] == head, "newest first"
        older = await client.threads.get_history(tid, limit=10, before={"checkpoint_id": history[-1]["checkpoint"]["checkpoint_id"]})
        ids = [h["checkpoint"]["checkpoint_id"] for h in history + older]
        assert len(ids) == len(set(ids)) and len(older) >= 1, ids
        assert history[0]["parent_checkpoint"]["checkpoint_id"] == history[1]["checkpoint"]["checkpoint_id"]
        past = await client.threads.get_state(tid, checkpoint_id=history[1]["checkpoint"]["checkpoint_id"])
        assert len(past["values"]["messages"]) < len(state["values"]["messages"])
        full = await client.threads.get(tid)
        assert full["values"]["messages"] == state["values"]["messages"]

    run(body)


# --------------------------------------------------------------------------------------------------
# DeerFlow's same-origin deployment: the API under /api/, and the gateway calls beside it
# --------------------------------------------------------------------------------------------------


def test_the_api_is_served_under_api_with_the_ui_s_history_and_channels(server: Server) -> None:
    """DeerFlow's Next.js rewrites send the SDK's calls (``/api/langgraph/*``) to the gateway's ``/api/*``."""

    async def body() -> None:
        client = get_client(url=f"{server.url}/api", api_key=ALICE)
        thread = await client.threads.create(metadata={"deployment": "same-origin"})
        tid = thread["thread_id"]
        created: dict = {}
        parts = [
            part
            async for part in client.runs.stream(
                tid, "lead_agent", input=user("look around and greet me"), config=quick(), stream_mode="values",
                on_run_created=lambda meta: created.update(meta),
            )
        ]
        assert parts[-1].event == "end" and parts[-2].data["messages"][-1]["content"] == QUICK_ANSWER
        [found] = await client.threads.search(metadata={"deployment": "same-origin"}, sort_by="updated_at", sort_order="desc")
        assert found["thread_id"] == tid
        headers = {"x-api-key": ALICE}
        # The chat view's history: the thread's messages, newest page first, each naming its run.
        page = httpx.get(f"{server.url}/api/threads/{tid}/messages/page", params={"limit": 2}, headers=headers).json()
        assert [r["seq"] for r in page["data"]] == [3, 4] and page["has_more"] is True and page["next_before_seq"] == 3, page
        assert page["data"][-1]["content"]["content"] == QUICK_ANSWER and page["data"][-1]["content"]["type"] == "ai"
        older = httpx.get(f"{server.url}/api/threads/{tid}/messages/page", params={"before_seq": 3}, headers=headers).json()
        assert [r["seq"] for r in older["data"]] == [1, 2] and older["has_more"] is False and older["next_before_seq"] is None
        rows = older["data"] + page["data"]
        assert [r["content"]["type"] for r in rows] == ["human", "ai", "tool", "ai"]
        assert {r["run_id"] for r in rows} == {created["run_id"]}, "every row names the run, also before its page's user message"
        refused = httpx.get(f"{server.url}/api/threads/{tid}/messages/page", params={"after_seq": 1}, headers=headers)
        assert refused.status_code == 422 and "after_seq" in refused.json()["detail"]
        assert httpx.get(f"{server.url}/api/threads/{uuid.uuid4()}/messages/page", headers=headers).status_code == 404
        assert httpx.get(f"{server.url}/threads/{tid}/messages/page", headers=headers).status_code == 404, "a gateway route, under /api/ only"
        assert httpx.get(f"{server.url}/api/threads/{tid}/messages/page").status_code == 401
        providers = httpx.get(f"{server.url}/api/channels/providers", headers=headers)
        assert providers.status_code == 200 and providers.json() == {"enabled": False, "providers": []}

    run(body)


# --------------------------------------------------------------------------------------------------
# Assistants and bad input
# --------------------------------------------------------------------------------------------------


def test_assistants_are_the_configured_agent(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        [assistant] = await client.assistants.search()
        assert assistant["assistant_id"] == "lead" and assistant["graph_id"] == "lead_agent"
        assert (await client.assistants.get("lead_agent"))["assistant_id"] == "lead"
        with pytest.raises(NotFoundError):
            await client.assistants.get("research-bot")
        assert await client.assistants.search(graph_id="other") == []

    run(body)


def test_bad_input_is_refused_naming_the_field(server: Server) -> None:
    async def body() -> None:
        client = get_client(url=server.url, api_key=ALICE)
        tid = (await client.threads.create())["thread_id"]
        cases = [
            (dict(input=user("x"), stream_mode="debug"), "stream_mode"),
            (dict(input={"messages": [{"role": "system", "content": "obey"}]}), "input.messages[0].role"),
            (dict(input=user("x"), interrupt_before=["model"]), "interrupt_before"),
            (dict(input=user("x"), webhook="https://example.invalid/hook"), "webhook"),
            (dict(input=user("x"), config={"configurable": {"temperature": 2}}), "config.configurable.temperature"),
            (dict(input=user("x"), config={"configurable": {"model_name": "gpt-99"}}), "model_name"),
        ]
        for kwargs, field in cases:
            with pytest.raises(UnprocessableEntityError) as refused:
                await client.runs.create(tid, "lead", **kwargs)
            assert field in refused.value.message, (field, refused.value.message)
        with pytest.raises(NotFoundError):
            await client.runs.create(tid, "no-such-assistant", input=user("x"))
        with pytest.raises(UnprocessableEntityError) as limit:
            await client.threads.search(limit=0)
        assert "limit" in limit.value.message
        assert await client.runs.list(tid) == [], "no refused request left a run behind"
        raw = httpx.post(f"{server.url}/threads/{tid}/runs", content=b"{not json", headers={"x-api-key": ALICE})
        assert raw.status_code == 400 and "JSON" in raw.json()["detail"]
        stateless = httpx.post(f"{server.url}/runs/stream", json={"assistant_id": "lead"}, headers={"x-api-key": ALICE})
        assert stateless.status_code == 501 and "stateless runs" in stateless.json()["detail"]

    run(body)


def test_requests_are_counted_by_endpoint_and_status(server: Server) -> None:
    def count(endpoint: str, status: str) -> float:
        labels = (f'endpoint="{endpoint}"', f'status="{status}"')
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in server.metrics().splitlines()
            if line.startswith("antler_langgraph_requests_total{") and all(label in line for label in labels)
        )

    before_ok, before_refused = count("threads", "200"), count("threads", "401")
    assert httpx.post(f"{server.url}/threads", json={}, headers={"x-api-key": ALICE}).status_code == 200
    assert httpx.post(f"{server.url}/threads", json={}).status_code == 401
    assert count("threads", "200") == before_ok + 1
    assert count("threads", "401") == before_refused + 1


# --------------------------------------------------------------------------------------------------
# The Node SDK
# --------------------------------------------------------------------------------------------------

NODE_SDK = Path(os.environ.get("ANTLER_TOOLS", antler_up.REPO / ".tools")) / "node-langgraph" / "node_modules"
NODE_TESTS = antler_up.REPO / "integration-tests" / "node"


def run_node_test(server: Server, name: str, tests: int) -> None:
    """Runs ``integration-tests/node/<name>`` with ``node --test`` against the server; all ``tests`` must pass."""
    for package in (NODE_SDK / "@langchain" / "langgraph-sdk", NODE_SDK / "langgraph-sdk-1-6"):
        if not (package / "package.json").is_file():
            pytest.fail(f"{package} is not installed (run scripts/setup)")
    env = {
        **os.environ,
        "NODE_PATH": str(NODE_SDK),
        "ANTLER_LANGGRAPH_URL": server.url,
        "ANTLER_KEY": ALICE,
        "QUICK_ANSWER": QUICK_ANSWER,
        "SLOW_ANSWER": SLOW_ANSWER,
    }
    done = subprocess.run(
        ["node", "--test", "--test-reporter=tap", str(NODE_TESTS / name)], env=env, capture_output=True, text=True, timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{output}\n{server.logs()}"
    assert f"# pass {tests}" in output and "# fail 0" in output, output


def test_the_node_sdk_drives_the_edge(server: Server) -> None:
    """``@langchain/langgraph-sdk``'s thread, stream (four modes), join, cancel, wait, state and history calls."""
    run_node_test(server, "langgraph_sdk.test.js", 3)


def test_deerflow_s_ui_sequence_with_the_pinned_and_the_current_node_sdk(server: Server) -> None:
    """DeerFlow's web UI's calls (sidebar, submit, reload, rename, stop, history, delete) with the SDK at 1.6.0
    and 1.15.0, the API at the root and under /api/: ``integration-tests/node/deerflow_ui.test.js``."""
    run_node_test(server, "deerflow_ui.test.js", 6)
