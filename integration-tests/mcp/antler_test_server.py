"""A small MCP server (Python `mcp` package, MCPServer) for Antler's MCP integration tests.

    antler_test_server.py stdio                         stdio transport
    antler_test_server.py http --port P [--oauth] [--stateless] [--tools-ttl-ms N]

Tools: echo, whoami (pid, cwd, TMPDIR), spawn_child (a grandchild process), write_output (writes a file under the cwd and returns its host
path and a file:// link), crash (the process exits at once, mid-call), hang (waits until cancelled and
records the cancellation), add_tool (registers one more tool at run time).

The HTTP variant puts an ASGI gate in front of the MCP app that the tests drive through /admin/*:
  GET  /admin/stats            counters: initializes, tool calls by name, 404s sent, token grants, cancels
  POST /admin/expire           every session id seen so far answers 404 from now on (an expired session)
  POST /admin/expire-always    every tools/call on an existing session answers 404 (re-init cannot help)
With --oauth the MCP endpoint requires a bearer token issued by POST /token (client_credentials with
client "antler"/"s3cret-client-value", or refresh_token with the current refresh token, which rotates on
every use); tokens live for --token-ttl seconds (default 3600).

Cancellation: `hang` writes "<MARK_DIR>/cancelled-<tag>" when its task is cancelled (stdio; MARK_DIR from
the environment) and the HTTP gate counts it in /admin/stats.
"""

import argparse
import asyncio
import json
import os
import secrets
import sys
import time

from mcp.server.mcpserver import MCPServer

STATE = {
    "initializes": 0,
    "discovers": 0,
    "tool_calls": {},
    "not_found": 0,
    "tool_call_404s": 0,
    "grants": {"client_credentials": 0, "refresh_token": 0},
    "cancelled": [],
    "issued": [],
    "refresh_tokens_used": [],
    "expired_sessions": set(),
    "seen_sessions": set(),
    "expire_always": False,
    "bad_tokens": 0,
}
TOKENS = {}  # access token -> expiry (monotonic)
REFRESH = {"current": "rt-initial-0123456789"}

def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--oauth", action="store_true")
    parser.add_argument("--stateless", action="store_true")
    parser.add_argument("--token-ttl", type=int, default=3600)
    parser.add_argument("--tools-ttl-ms", type=int, default=None)
    return parser.parse_args()


ARGS = parse_args()


def cache_hints():
    if ARGS.tools_ttl_ms is None:
        return None
    from mcp.server.caching import CacheHint

    return {"tools/list": CacheHint(ttl_ms=ARGS.tools_ttl_ms, scope="public")}


server = MCPServer("antler-test", cache_hints=cache_hints())


@server.tool(description="Echoes the message back.")
def echo(message: str) -> str:
    return f"Echo: {message}"


@server.tool(description="Reports the server's process id, working directory and TMPDIR.")
def whoami() -> str:
    return json.dumps({"pid": os.getpid(), "cwd": os.getcwd(), "tmpdir": os.environ.get("TMPDIR", "")})


@server.tool(description="Writes a small file under the working directory and reports where it is.")
def write_output(name: str, text: str) -> list:
    from mcp_types import ResourceLink, TextContent

    path = os.path.join(os.getcwd(), name)
    with open(path, "w") as f:
        f.write(text)
    return [TextContent(type="text", text=f"wrote {path}"), ResourceLink(type="resource_link", uri=f"file://{path}", name=name)]


@server.tool(description="Starts a long-running child process and reports its pid.")
def spawn_child() -> str:
    import subprocess

    return str(subprocess.Popen(["sleep", "600"]).pid)


@server.tool(description="Exits the server process at once, in the middle of the call.")
def crash() -> str:
    sys.stderr.write("antler-test-server: crashing on request\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool(description="Waits until the call is cancelled (or an hour passes).")
async def hang(tag: str) -> str:
    try:
        await asyncio.sleep(3600)
        return "finished"
    except asyncio.CancelledError:
        STATE["cancelled"].append(tag)
        mark = os.environ.get("MARK_DIR")
        if mark:
            with open(os.path.join(mark, f"cancelled-{tag}"), "w") as f:
                f.write(str(time.time()))
        raise


@server.tool(description="Registers one more tool, named by the argument.")
def add_tool(name: str) -> str:
    def extra() -> str:
        return name

    server.add_tool(extra, name=name, description=f"added at run time: {name}")
    return f"added {name}"


class Gate:
    """Counts and steers requests before the MCP app sees them."""

    def __init__(self, app, oauth, token_ttl):
        self.app = app
        self.oauth = oauth
        self.token_ttl = token_ttl

    async def respond(self, send, status, body, content_type=b"application/json"):
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
        await send({"type": "http.response.body", "body": data})

    async def read_body(self, receive):
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        return b"".join(chunks)

    async def token(self, body, send):
        from urllib.parse import parse_qs

        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        grant = form.get("grant_type")
        if grant == "client_credentials":
            if form.get("client_id") != "antler" or form.get("client_secret") != "s3cret-client-value":
                return await self.respond(send, 401, {"error": "invalid_client"})
        elif grant == "refresh_token":
            STATE["refresh_tokens_used"].append(form.get("refresh_token"))
            if form.get("refresh_token") != REFRESH["current"]:
                return await self.respond(send, 400, {"error": "invalid_grant"})
        else:
            return await self.respond(send, 400, {"error": "unsupported_grant_type"})
        STATE["grants"][grant] += 1
        access = "at-" + secrets.token_hex(16)
        TOKENS[access] = time.monotonic() + self.token_ttl
        STATE["issued"].append(access)
        answer = {"access_token": access, "token_type": "bearer", "expires_in": self.token_ttl}
        if grant == "refresh_token":
            REFRESH["current"] = "rt-" + secrets.token_hex(16)
            answer["refresh_token"] = REFRESH["current"]
        await self.respond(send, 200, answer)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        method = scope["method"]
        if path == "/admin/stats":
            stats = {k: (sorted(v) if isinstance(v, set) else v) for k, v in STATE.items()}
            return await self.respond(send, 200, stats)
        if path == "/admin/expire":
            STATE["expired_sessions"] |= STATE["seen_sessions"]
            return await self.respond(send, 200, {"expired": len(STATE["expired_sessions"])})
        if path == "/admin/expire-always":
            STATE["expire_always"] = True
            return await self.respond(send, 200, {})
        if path == "/token" and method == "POST":
            return await self.token(await self.read_body(receive), send)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if self.oauth:
            auth = headers.get("authorization", "")
            token = auth[7:] if auth.lower().startswith("bearer ") else ""
            if TOKENS.get(token, 0) < time.monotonic():
                STATE["bad_tokens"] += 1
                return await self.respond(send, 401, {"error": "invalid_token"})
        body = await self.read_body(receive) if method == "POST" else b""
        try:
            messages = json.loads(body) if body else []
        except ValueError:
            messages = []
        if isinstance(messages, dict):
            messages = [messages]
        methods = [m.get("method") for m in messages if isinstance(m, dict)]
        sid = headers.get("mcp-session-id")
        calls = [m for m in messages if isinstance(m, dict) and m.get("method") == "tools/call"]
        if sid and (sid in STATE["expired_sessions"] or (STATE["expire_always"] and calls)):
            STATE["not_found"] += 1
            STATE["tool_call_404s"] += len(calls)
            return await self.respond(send, 404, {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "Session not found"}})
        if sid:
            STATE["seen_sessions"].add(sid)
        STATE["initializes"] += methods.count("initialize")
        STATE["discovers"] += methods.count("server/discover")
        for call in calls:
            name = (call.get("params") or {}).get("name", "")
            STATE["tool_calls"][name] = STATE["tool_calls"].get(name, 0) + 1
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def main():
    args = ARGS
    if args.mode == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app(stateless_http=args.stateless)
    config = uvicorn.Config(Gate(app, args.oauth, args.token_ttl), host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)

    async def serve():
        task = asyncio.create_task(uv.serve())
        while not uv.started:
            await asyncio.sleep(0.02)
        port = uv.servers[0].sockets[0].getsockname()[1]
        print(f"listening on {port}", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
