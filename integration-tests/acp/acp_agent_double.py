#!/usr/bin/env python3
"""An ACP agent double for the `invoke_acp_agent` tests: newline-delimited JSON-RPC 2.0 on stdio,
the standard library only.

It answers `initialize` and `session/new`; on `session/prompt` it streams `session/update`
notifications (message chunks, a tool call and its update), asks `session/request_permission` for
an edit, writes a file inside its cwd (the ACP workspace) and one outside it through
`fs/write_text_file`, reads the first back with `fs/read_text_file`, and says what each got. A
prompt containing HANG makes it start a grandchild, write `hanging` into the workspace, and never
end its turn (a `session/cancel` is written down and ignored; SIGTERM is ignored too), for the timeout
and cancel tests. Its first argument, when given, is a mark the grandchild carries on its command line
too, so a test can find both among the host's processes (their pids inside a bwrap sandbox are not
the host's).

A prompt `CONFINE outside=DIR data=DIR` tests the sandbox the agent runs in: with its own open(), not
through the client, it writes `direct.txt` in its cwd, reads `DIR/visible.txt` and writes
`DIR/escape.txt` outside, looks for the runs database `data/runs.db` and writes `data/escape.txt`, and
says what each got.
"""

import json
import os
import signal
import subprocess
import sys
import time

CWD = os.getcwd()
MARK = sys.argv[1] if len(sys.argv) > 1 else "acp-double"
next_id = 0
session_id = None


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def note_cancel(message):
    if message.get("method") == "session/cancel":
        with open(os.path.join(CWD, "cancel-received"), "w") as f:
            f.write(json.dumps(message.get("params", {})))


def call(method, params):
    """Sends a request to the client and waits for its answer (noting anything else that arrives)."""
    global next_id
    next_id += 1
    my_id = "double-%d" % next_id
    send({"jsonrpc": "2.0", "id": my_id, "method": method, "params": params})
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if message.get("id") == my_id and "method" not in message:
            return message
        note_cancel(message)
    sys.exit(0)


def update(session_update, **fields):
    fields["sessionUpdate"] = session_update
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": fields}})


def say(text):
    update("agent_message_chunk", content={"type": "text", "text": text})


def prompt(request_id, params):
    text = " ".join(block.get("text", "") for block in params.get("prompt", []) if block.get("type") == "text")
    say("Working ")
    say("on it.\n")
    if "HANG" in text:
        # Ignored here and (inherited through exec) in the grandchild: only SIGKILL ends them.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", MARK])
        with open(os.path.join(CWD, "hanging"), "w") as f:
            f.write(MARK)
        for line in sys.stdin:
            if line.strip():
                note_cancel(json.loads(line))
        time.sleep(600)
        return
    if text.startswith("CONFINE"):
        confine(dict(word.split("=", 1) for word in text.split()[1:] if "=" in word))
        send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})
        return
    update("tool_call", toolCallId="edit-1", title="Edit result.txt", kind="edit", status="pending")
    answer = call(
        "session/request_permission",
        {
            "sessionId": session_id,
            "toolCall": {"toolCallId": "edit-1", "title": "Edit result.txt", "kind": "edit"},
            "options": [
                {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
            ],
        },
    )
    outcome = answer.get("result", {}).get("outcome", {})
    granted = outcome.get("outcome") == "selected" and outcome.get("optionId") == "allow"
    say("permission: %s (%s)\n" % ("granted" if granted else "denied", outcome.get("optionId", outcome.get("outcome"))))
    inside = call("fs/write_text_file", {"sessionId": session_id, "path": os.path.join(CWD, "result.txt"), "content": "ACP-DOUBLE-RESULT\n"})
    say("inside write: %s\n" % ("ok" if "result" in inside else "refused " + json.dumps(inside.get("error"))))
    outside_path = os.path.join(os.path.dirname(CWD), "escape.txt")
    outside = call("fs/write_text_file", {"sessionId": session_id, "path": outside_path, "content": "ESCAPED\n"})
    say("outside write: %s\n" % ("ok" if "result" in outside else "refused: " + outside.get("error", {}).get("message", "")))
    back = call("fs/read_text_file", {"sessionId": session_id, "path": os.path.join(CWD, "result.txt")})
    say("read back: %s" % back.get("result", {}).get("content", "nothing"))
    update("tool_call_update", toolCallId="edit-1", status="completed")
    say("Done.")
    send({"jsonrpc": "2.0", "id": request_id, "result": {"stopReason": "end_turn"}})


def attempt(what, action):
    """Runs `action` and says `what: ok` (or its value) or `what: refused (the error)`."""
    try:
        value = action()
        say("%s: %s\n" % (what, "ok" if value is None else value))
    except OSError as e:
        say("%s: refused (%s)\n" % (what, e.strerror))


def write(path, content):
    with open(path, "w") as f:
        f.write(content)


def read(path):
    with open(path) as f:
        return f.read()


def confine(places):
    outside, data = places.get("outside", "/nonexistent"), places.get("data", "/nonexistent")
    attempt("cwd write", lambda: write(os.path.join(CWD, "direct.txt"), "DIRECT\n"))
    attempt("outside read", lambda: read(os.path.join(outside, "visible.txt")))
    attempt("outside write", lambda: write(os.path.join(outside, "escape.txt"), "ESCAPED\n"))
    say("data db: %s\n" % ("present" if os.path.exists(os.path.join(data, "runs.db")) else "missing"))
    attempt("data list", lambda: ",".join(sorted(os.listdir(data))))
    attempt("data write", lambda: write(os.path.join(data, "escape.txt"), "ESCAPED\n"))


def main():
    global session_id
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, request_id, params = message.get("method"), message.get("id"), message.get("params", {})
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": request_id, "result": {
                "protocolVersion": 1, "agentCapabilities": {}, "authMethods": [],
                "agentInfo": {"name": "acp-agent-double", "version": "1.0.0"}}})
        elif method == "session/new":
            session_id = "session-1"
            with open(os.path.join(CWD, "session-cwd"), "w") as f:
                f.write(params.get("cwd", ""))
            send({"jsonrpc": "2.0", "id": request_id, "result": {"sessionId": session_id}})
        elif method == "session/prompt":
            prompt(request_id, params)
        elif request_id is not None:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "method not found"}})
        else:
            note_cancel(message)


if __name__ == "__main__":
    main()
