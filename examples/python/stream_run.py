#!/usr/bin/env python3
"""Stream an Antler run from Python over stubs generated from Antler's .proto files.

    python examples/python/stream_run.py "Write a hello note to /mnt/user-data/outputs/hello.md and present it" \
        --expect /mnt/user-data/outputs/hello.md --plan

Against ``antler up`` with no models configured, the built-in ``demo`` model plays its shipped transcript
(plan, write /mnt/user-data/outputs/hello.md, check it, present it, answer), whatever the prompt says; with
a real model configured, ask for any file and ``--expect`` it.

The server is ``--addr`` (default ``$ANTLER_ADDR``, else ``http://127.0.0.1:50051``), written as the
``antler`` CLI takes it: ``http://host:port``, ``https://host:port`` (TLS; ``--ca`` / ``$ANTLER_CA`` names the
CA of the server's certificate, default the system's roots) or ``host:port`` (plaintext).

The stubs are generated with ``grpcio-tools`` on first use into ``--stubs`` (default: a ``.stubs`` folder
next to this file); nothing else is needed than ``pip install grpcio grpcio-tools``. The exit status is 0
when the run ends SUCCESS, 1 otherwise, 2 when the address is not one, or the server cannot be reached or
refuses the request.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import grpc

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parents[1] / "proto"


def load_stubs(stubs: Path):
    """Imports the generated runs modules, generating every .proto first when they are missing."""
    if not (stubs / "antler" / "runs" / "v1" / "run_service_pb2_grpc.py").is_file():
        import grpc_tools  # from grpcio-tools

        stubs.mkdir(parents=True, exist_ok=True)
        well_known = Path(grpc_tools.__file__).parent / "_proto"
        protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}",
             f"--python_out={stubs}", f"--grpc_python_out={stubs}", *protos],
            check=True,
        )
    sys.path.insert(0, str(stubs))
    importlib.invalidate_caches()
    run_pb2 = importlib.import_module("antler.runs.v1.run_pb2")
    service_pb2 = importlib.import_module("antler.runs.v1.run_service_pb2")
    service_grpc = importlib.import_module("antler.runs.v1.run_service_pb2_grpc")
    common_pb2 = importlib.import_module("antler.common.v1.common_pb2")
    return run_pb2, service_pb2, service_grpc, common_pb2


def channel_for(addr: str, ca: str | None) -> grpc.Channel:
    """A channel to ``addr``: ``http://host:port`` or ``host:port`` plaintext, ``https://host:port`` over TLS
    trusting ``ca`` (a PEM file; None: the system's roots). Raises ValueError for anything else."""
    scheme, sep, target = addr.strip().partition("://")
    if not sep:
        scheme, target = "http", addr.strip()
    target = target.rstrip("/")
    if scheme not in ("http", "https") or not target or "/" in target:
        raise ValueError(f"{addr!r} is not an address: give host:port, http://host:port or https://host:port (--addr or ANTLER_ADDR)")
    if scheme == "http":
        if ca:
            raise ValueError(f"--ca (ANTLER_CA) is for TLS, but {addr} is plaintext: use https://")
        return grpc.insecure_channel(target)
    root = Path(ca).read_bytes() if ca else None
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=root))


def one_line(text: str, limit: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("text", help="the user message")
    parser.add_argument("--addr", default=os.environ.get("ANTLER_ADDR", "http://127.0.0.1:50051"),
                        help="server: http://host:port, https://host:port (TLS) or host:port (plaintext)")
    parser.add_argument("--ca", default=os.environ.get("ANTLER_CA"), help="PEM CA certificates of a TLS server (https://)")
    parser.add_argument("--token", default=os.environ.get("ANTLER_TOKEN"), help="bearer token (API key or JWT)")
    parser.add_argument("--thread", default="", help="thread to run on (default: a new one)")
    parser.add_argument("--model", default="", help="model name (default: the server's default)")
    parser.add_argument("--plan", action="store_true", help="plan mode (the write_todos tool)")
    parser.add_argument("--expect", action="append", default=[], metavar="PATH", help="an output the run must deliver")
    parser.add_argument("--stubs", type=Path, default=HERE / ".stubs", help="where generated stubs live")
    args = parser.parse_args()

    try:
        channel = channel_for(args.addr, args.ca)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    run_pb2, service_pb2, service_grpc, common_pb2 = load_stubs(args.stubs)
    message = common_pb2.Message(role=common_pb2.ROLE_USER, content=[common_pb2.ContentPart(text=common_pb2.TextPart(text=args.text))])
    create = service_pb2.CreateRunRequest(
        thread_id=args.thread,
        input=[message],
        expected_outputs=args.expect,
        config=run_pb2.RunConfig(model_name=args.model, plan_mode=args.plan),
    )
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else []

    status_name = "RUN_STATUS_UNSPECIFIED"
    streaming = None  # "text" or "thinking" while a streamed line is open
    with channel:
        stub = service_grpc.RunServiceStub(channel)
        try:
            for item in stub.StreamRun(service_pb2.StreamRunRequest(create=create), metadata=metadata):
                event = item.event
                kind = event.WhichOneof("kind")
                delta = event.message_delta if kind == "message_delta" else None
                piece_kind = ("thinking" if delta.thinking else "text" if delta.text else streaming) if delta else streaming
                if streaming and (kind not in ("message_delta", "message", "heartbeat") or piece_kind != streaming):
                    print()
                    streaming = None
                if kind == "metadata":
                    m = event.metadata
                    print(f"[{event.seq:>3}] run {m.run_id} on thread {m.thread_id} (attempt {m.attempt})")
                elif delta is not None:
                    piece = delta.thinking or delta.text
                    if piece:
                        if streaming is None:
                            print(f"[{event.seq:>3}] {'thinking' if delta.thinking else 'assistant'}: ", end="")
                            streaming = piece_kind
                        print(piece, end="", flush=True)
                elif kind == "tool_started":
                    t = event.tool_started
                    shown = {k: v for k, v in t.arguments.items() if k != "description"}
                    print(f"[{event.seq:>3}] tool {t.name}({one_line(str(shown), 80)})")
                elif kind == "tool_finished":
                    t = event.tool_finished
                    verdict = "outcome unknown" if t.outcome_unknown else "failed" if t.is_error else "ok"
                    print(f"[{event.seq:>3}]   → {t.name} {verdict}: {one_line(t.result_summary)}")
                elif kind == "clarification":
                    print(f"[{event.seq:>3}] the agent asks: {event.clarification.question}")
                elif kind == "delivery":
                    d = event.delivery
                    print(f"[{event.seq:>3}] delivery receipt: {'satisfied' if d.satisfied else 'NOT satisfied, missing ' + ', '.join(d.missing)}")
                    for f in d.produced:
                        print(f"        {f.path} ({f.size} bytes, sha256 {f.sha256[:12]}…)")
                elif kind == "end":
                    end = event.end
                    status_name = run_pb2.RunStatus.Name(end.status)
                    reason = f" ({end.stop_reason})" if end.stop_reason else ""
                    print(f"[{event.seq:>3}] end: {status_name.removeprefix('RUN_STATUS_')}{reason}")
                    u = end.usage
                    print(f"        usage: {u.total_tokens} tokens in {u.llm_calls} model calls ({u.input_tokens} in, {u.output_tokens} out)")
                    if end.HasField("error"):
                        print(f"        {end.error.code}: {end.error.message}")
                sys.stdout.flush()
        except grpc.RpcError as error:
            print(f"\nerror: {error.code().name}: {error.details()}", file=sys.stderr)
            return 2
    return 0 if status_name == "RUN_STATUS_SUCCESS" else 1


if __name__ == "__main__":
    sys.exit(main())
