#!/usr/bin/env python3
"""scripts/real-model: Antler's OpenAI-compatible provider against a real server, llama.cpp's llama-server
running SmolLM2-135M-Instruct on loopback, driven through Antler's ModelService (ChatStream and Chat over gRPC)
and one lead run through `antler run`.

Every check prints PASS or FAIL with its figures; the exit status is 1 when any failed (or could not run), 0
only when every one passed. Nothing is skipped. The checks:

  stream_equals_direct    streamed text, usage and finish reason `stop` equal a direct request at temperature 0
  chat_equals_stream      unary Chat assembles the same message
  finish_length           max_tokens reached: LENGTH, the same text and counts as the direct request
  cached_prompt_usage     llama-server's prompt cache: input and cache_read tokens as it reports them
  tool_call_streamed      tools + tool_choice "required": llama-server's ids and argument fragments pass
                          through, and the assembled arguments equal what llama-server streamed directly
  tool_call_truncated     a tool call cut by max_tokens: arguments_invalid with the raw text, as documented
  tool_result_round_trip  a tool call and its result sent back: the answer equals the direct request's
  wrong_key               llama-server's 401 for a wrong key: FAILED_PRECONDITION naming the variable, no key shown
  context_overflow        a prompt over the context: llama-server's 400 becomes INVALID_ARGUMENT with its message
  cancel_frees_slot       a cancelled ChatStream frees llama-server's only slot; the next request starts at once
  lead_run                `antler run` with the lead agent on this model ends SUCCESS (exit 0), usage counted
  kill_mid_stream         SIGKILL while streaming: FINISH_REASON_ERROR with error code UNAVAILABLE, quickly
  kill_mid_chat           SIGKILL while a unary Chat waits: status UNAVAILABLE, quickly
  kill_idle               SIGKILL while idle (a pooled connection left): ChatStream and Chat UNAVAILABLE, quickly

Arguments: --antler (the antler binary), --llama-server, --model (the .gguf), --template, --work (a scratch
directory; logs are kept there).
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import grpc
from google.protobuf import json_format

from gateway import Antler, load_stubs
from upstream import LlamaServer, stream_direct

# Bounds. A stream the gateway left waiting on a dead server would end only at chunk_timeout_ms (120 s), a
# slot llama-server kept busy only at max_tokens (4096 tokens, about a minute here): each bound is far below.
FREED_BOUND_S = 5.0
UNAVAILABLE_BOUND_S = 10.0
NEXT_REQUEST_BOUND_S = 5.0
RPC_TIMEOUT_S = 300.0

SYSTEM = "You are a helpful assistant."
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
}
# An assistant turn that opens a tool call, for llama-server to continue (see Driver.tool_messages).
TOOL_CALL_PREFILL = "<tool_call>\n"
# llama-server's tool call ids (tools/server/server-common.cpp gen_tool_call_id): 32 letters and digits.
# Antler's own, for a call that arrives without one: call_ + 16 hex digits. A llama-server id seen at the
# gateway's end proves the id was passed through, not made up.
LLAMA_ID = re.compile(r"^[0-9A-Za-z]{32}$")


class Checks:
    def __init__(self) -> None:
        self.results: list[tuple[str, bool, str]] = []

    def run(self, name: str, fn: Callable[[], str]) -> None:
        """Runs one check; it returns its figures, or raises (AssertionError or anything else) to fail."""
        began = time.monotonic()
        try:
            figures = fn()
            ok = True
        except Exception as error:  # any failure to run is a failed check, never a skip
            ok = False
            detail = "".join(traceback.format_exception_only(type(error), error)).strip()
            figures = detail if isinstance(error, AssertionError) else f"{detail}\n{traceback.format_exc()}"
        took = time.monotonic() - began
        self.results.append((name, ok, figures))
        print(f"{'PASS' if ok else 'FAIL'} {name} ({took:.1f} s): {figures}", flush=True)

    def summary(self) -> int:
        failed = [name for name, ok, _ in self.results if not ok]
        print(f"\n{len(self.results) - len(failed)} of {len(self.results)} checks passed" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
        return 1 if failed or not self.results else 0


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.work: Path = args.work
        self.pb = load_stubs(self.work / "stubs")
        self.api_key, self.wrong_key = secrets.token_hex(16), secrets.token_hex(16)
        self.llama = LlamaServer(args.llama_server, args.model, args.template, self.work, args.threads, self.api_key)
        self.llama_start_s = self.llama.start()
        self.antler_bin: Path = args.antler
        self.antler = Antler(args.antler, self.work, self.llama.base_url, self.api_key, self.wrong_key)
        try:
            self.antler.start()
        except Exception:
            self.antler.stop()
            self.llama.stop()
            raise
        self.channel = grpc.insecure_channel(self.antler.address)
        self.models = self.pb.models_grpc.ModelServiceStub(self.channel)
        self.tokens_per_s = 0.0

    def close(self) -> None:
        self.channel.close()
        self.antler.stop()
        self.llama.stop()

    # ---- requests -------------------------------------------------------------------------------------

    def message(self, role: str, text: str = "", tool_calls: Optional[list] = None, tool_call_id: str = "") -> Any:
        c = self.pb.common
        roles = {"system": c.ROLE_SYSTEM, "user": c.ROLE_USER, "assistant": c.ROLE_ASSISTANT, "tool": c.ROLE_TOOL}
        content = [c.ContentPart(text=c.TextPart(text=text))] if text else []
        calls = []
        for call in tool_calls or []:
            proto = c.ToolCall(id=call["id"], name=call["name"])
            proto.arguments.update(call["arguments"])
            calls.append(proto)
        return c.Message(role=roles[role], content=content, tool_calls=calls, tool_call_id=tool_call_id)

    def request(self, model: str, messages: list, max_tokens: int, tools: bool = False, choice: str = "") -> Any:
        m, c = self.pb.models, self.pb.common
        req = m.ChatRequest(model_name=model, messages=messages, max_tokens=max_tokens, temperature=0.0)
        if tools:
            spec = c.ToolSpec(name=WEATHER_TOOL["name"], description=WEATHER_TOOL["description"])
            spec.parameters.update(WEATHER_TOOL["parameters"])
            req.tools.append(spec)
        if choice == "required":
            req.tool_choice.mode = m.TOOL_CHOICE_MODE_REQUIRED
        return req

    @staticmethod
    def direct_body(messages: list[dict], max_tokens: int, tools: bool = False, choice: str = "") -> dict:
        """The body Antler's provider sends for the same request (model entry settings included)."""
        body: dict = {"model": "smollm2-135m-instruct", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                      "seed": 42, "cache_prompt": False}
        if tools:
            body["tools"] = [{"type": "function", "function": WEATHER_TOOL}]
            body["tool_choice"] = choice or "auto"
        return body

    def stream(self, req: Any, on_response: Optional[Callable[[Any, Any], None]] = None) -> "AntlerStream":
        out = AntlerStream()
        call = self.models.ChatStream(self.pb.models.ChatStreamRequest(request=req), timeout=RPC_TIMEOUT_S)
        out.call = call
        began = time.monotonic()
        try:
            for resp in call:
                out.absorb(resp, began)
                if on_response:
                    on_response(resp, call)
        except grpc.RpcError as error:
            out.error = error
        out.seconds = time.monotonic() - began
        return out

    def finish_name(self, info: Any) -> str:
        return self.pb.models.FinishReason.Name(info.finish_reason)

    # ---- checks ---------------------------------------------------------------------------------------

    def compare_text(self, user: str, max_tokens: int, want_finish: str) -> str:
        direct = stream_direct(self.llama, self.direct_body(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}], max_tokens))
        got = self.stream(self.request("smollm2", [self.message("system", SYSTEM), self.message("user", user)], max_tokens))
        expect(got.error is None, f"ChatStream failed: {got.error_text()}")
        expect(direct.finish_reason == want_finish, f"direct request finished with {direct.finish_reason!r}, this check needs {want_finish!r} (text {direct.text!r})")
        expect(len(direct.text) >= 10, f"direct text too short to compare: {direct.text!r}")
        expect(got.text == direct.text, f"streamed text differs\n  antler: {got.text!r}\n  direct: {direct.text!r}")
        info = got.finish.info
        expect(self.finish_name(info) == f"FINISH_REASON_{want_finish.upper()}", f"finish {self.finish_name(info)}, raw {info.raw_finish_reason!r}; direct {direct.finish_reason!r}")
        expect(info.raw_finish_reason == direct.finish_reason, f"raw finish {info.raw_finish_reason!r} != {direct.finish_reason!r}")
        usage = direct.usage or {}
        expect(not info.usage_estimated, "usage was estimated, though llama-server reports it")
        figures = (info.usage.input_tokens, info.usage.output_tokens, info.usage.total_tokens)
        want = (usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens"))
        expect(figures == want, f"usage (input, output, total) {figures} != llama-server's (prompt, completion, total) {want}")
        if max_tokens and want_finish == "length":
            expect(info.usage.output_tokens == max_tokens, f"output {info.usage.output_tokens} != max_tokens {max_tokens}")
        expect(got.text_deltas > 1, f"{got.text_deltas} text deltas: not streamed")
        if direct.seconds > 0 and usage.get("completion_tokens", 0) >= 50:  # long enough for a rate
            self.tokens_per_s = usage["completion_tokens"] / direct.seconds
        self.last_text = (user, max_tokens, got)
        return (f"{len(got.text)} chars equal in {got.text_deltas} deltas (direct: {direct.text_chunks} chunks); finish {want_finish}; "
                f"usage in/out/total {figures[0]}/{figures[1]}/{figures[2]} = llama-server's; "
                f"first text {got.ttft_s * 1000:.0f} ms via Antler, {direct.first_content_s * 1000:.0f} ms direct; "
                f"{self.tokens_per_s:.0f} tokens/s")

    def chat_equals_stream(self) -> str:
        user, max_tokens, streamed = self.last_text
        reply = self.models.Chat(self.request("smollm2", [self.message("system", SYSTEM), self.message("user", user)], max_tokens), timeout=RPC_TIMEOUT_S)
        text = "".join(p.text.text for p in reply.message.content if p.WhichOneof("part") == "text")
        expect(text == streamed.text, f"Chat text {text!r} != ChatStream text {streamed.text!r}")
        expect(reply.info.usage == streamed.finish.info.usage, f"Chat usage {reply.info.usage} != stream's {streamed.finish.info.usage}")
        expect(reply.info.attempts == 1, f"{reply.info.attempts} attempts")
        return f"{len(text)} chars, usage {reply.info.usage.input_tokens}/{reply.info.usage.output_tokens}, 1 attempt, upstream model {reply.info.upstream_model!r}"

    def cached_prompt_usage(self) -> str:
        """With llama-server's prompt cache on, a repeated prompt is partly served from the cache: usage counts
        every prompt token as input and the cached ones as cache_read, as llama-server reports them."""
        user = "List the days of the week."
        req = self.request("smollm2-cached", [self.message("system", SYSTEM), self.message("user", user)], 8)
        first = self.stream(req)
        second = self.stream(req)
        expect(first.error is None and second.error is None, f"ChatStream failed: {first.error_text()} / {second.error_text()}")
        # The same prompt again, directly: the slot holds what it held before the second call.
        body = self.direct_body([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}], 8)
        body["cache_prompt"] = True
        direct = stream_direct(self.llama, body)
        usage, got = direct.usage or {}, second.finish.info.usage
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        expect(bool(cached), f"llama-server reported no cached tokens for a repeated prompt: {usage}")
        expect((got.input_tokens, got.cache_read_tokens, got.output_tokens) == (usage.get("prompt_tokens"), cached, usage.get("completion_tokens")),
               f"Antler's input/cache_read/output {got.input_tokens}/{got.cache_read_tokens}/{got.output_tokens} != llama-server's {usage}")
        expect(first.finish.info.usage.input_tokens == got.input_tokens, f"first call input {first.finish.info.usage.input_tokens} != {got.input_tokens}")
        return (f"second call: input {got.input_tokens} (first call {first.finish.info.usage.input_tokens}, cache_read "
                f"{first.finish.info.usage.cache_read_tokens}), cache_read {got.cache_read_tokens}, output {got.output_tokens} = llama-server's")

    def tool_messages(self, prefill: bool = True) -> tuple[list, list[dict]]:
        """The weather question, ending (with `prefill`) in an assistant turn that opens a tool call.

        Under tool_choice "required" llama-server's grammar still lets text come before the first <tool_call>
        (common/chat-auto-parser-generator.cpp), and SmolLM2-135M writes prose instead of calling, whatever the
        system prompt or a worked example says. llama-server continues a final assistant message (assistant
        prefill), so this one starts the call and the grammar makes the model finish it with schema-valid JSON."""
        user = "What is the weather in Paris? Answer in celsius."
        proto = [self.message("system", SYSTEM), self.message("user", user)]
        plain = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        if prefill:
            proto.append(self.message("assistant", TOOL_CALL_PREFILL))
            plain.append({"role": "assistant", "content": TOOL_CALL_PREFILL})
        return proto, plain

    def tool_call_streamed(self) -> str:
        proto_msgs, json_msgs = self.tool_messages()
        direct = stream_direct(self.llama, self.direct_body(json_msgs, 256, tools=True, choice="required"))
        got = self.stream(self.request("smollm2", proto_msgs, 256, tools=True, choice="required"))
        expect(got.error is None, f"ChatStream failed: {got.error_text()}")
        expect(direct.finish_reason == "tool_calls", f"direct finish {direct.finish_reason!r}, tool calls {direct.tool_calls}, text {direct.text!r}")
        expect(len(direct.tool_calls) >= 1, "llama-server streamed no tool call")
        expect(self.finish_name(got.finish.info) == "FINISH_REASON_TOOL_CALLS", f"finish {self.finish_name(got.finish.info)}")
        expect(len(got.starts) == len(direct.tool_calls), f"{len(got.starts)} calls via Antler, {len(direct.tool_calls)} direct")
        usage, info = direct.usage or {}, got.finish.info
        expect((info.usage.input_tokens, info.usage.output_tokens) == (usage.get("prompt_tokens"), usage.get("completion_tokens")),
               f"usage {info.usage.input_tokens}/{info.usage.output_tokens} != llama-server's {usage}")
        figures = [f"prompt {usage.get('prompt_tokens')} tokens and {usage.get('completion_tokens')} out = llama-server's"]
        for i, (index, d) in enumerate(sorted(direct.tool_calls.items())):
            start, end = got.starts[i], got.ends.get(i)
            expect(all(LLAMA_ID.match(x) for x in d.ids_seen) and d.ids_seen, f"direct ids {d.ids_seen} are not llama-server's format")
            expect(bool(LLAMA_ID.match(start.id)), f"Antler's id {start.id!r} is not llama-server's (a generated one?)")
            expect(len(set(d.ids_seen)) == 1, f"llama-server changed the id within one call: {d.ids_seen}")
            expect(start.name == "".join(d.names[-1:]) == WEATHER_TOOL["name"], f"name {start.name!r}, direct name pieces {d.names}")
            fragments = got.fragments.get(i, [])
            expect("".join(fragments) == d.arguments, f"arguments differ\n  antler: {''.join(fragments)!r}\n  direct: {d.arguments!r}")
            expect(len(d.fragments) > 1 and len(fragments) > 1, f"not fragmented: {len(d.fragments)} direct, {len(fragments)} via Antler")
            expect(end is not None and not end.arguments_invalid, f"tool_call_end {end}")
            parsed = json_format.MessageToDict(end.tool_call.arguments)
            expect(parsed == json.loads(d.arguments), f"parsed {parsed} != {d.arguments}")
            expect(end.tool_call.id == start.id, f"end id {end.tool_call.id} != start id {start.id}")
            final = got.finish.message.tool_calls[i]
            expect(final.id == start.id and json_format.MessageToDict(final.arguments) == parsed, f"finish message call {final}")
            figures.append(f"call {i}: id {start.id[:8]}…, {len(fragments)} fragments (direct {len(d.fragments)}), name pieces {len(d.names)}, arguments {d.arguments}")
        self.tool_calls = [(start.id, json.loads(d.arguments)) for start, d in zip(got.starts, (d for _, d in sorted(direct.tool_calls.items())))]
        return "; ".join(figures)

    def tool_call_truncated(self) -> str:
        """A weak model's malformed arguments, made certain: the output limit cuts the call mid-JSON. The docs
        (proto ToolCallEnd, services/models/README.md) say: arguments_invalid, arguments absent, raw_arguments the
        text as streamed, and the finish reason says why (LENGTH)."""
        proto_msgs, json_msgs = self.tool_messages()
        for max_tokens in (20, 17, 16, 13, 9):
            direct = stream_direct(self.llama, self.direct_body(json_msgs, max_tokens, tools=True, choice="required"))
            raw = "".join(c.arguments for c in direct.tool_calls.values())
            if direct.tool_calls and raw and not is_json_object(raw):
                break
        else:
            raise AssertionError(f"no max_tokens of 9..20 cut the arguments mid-JSON; last direct stream: {direct.raw_lines[-6:]}")
        expect(direct.finish_reason == "length", f"direct finish {direct.finish_reason!r}")
        got = self.stream(self.request("smollm2", proto_msgs, max_tokens, tools=True, choice="required"))
        expect(got.error is None, f"ChatStream failed: {got.error_text()}")
        expect(self.finish_name(got.finish.info) == "FINISH_REASON_LENGTH", f"finish {self.finish_name(got.finish.info)}")
        expect(got.finish.info.usage.input_tokens == (direct.usage or {}).get("prompt_tokens"), f"usage {got.finish.info.usage} != {direct.usage}")
        expect(len(got.starts) == 1 and 0 in got.ends, f"starts {got.starts}, ends {got.ends}")
        end = got.ends[0]
        expect(end.arguments_invalid, f"arguments_invalid false for {raw!r}")
        expect(not end.tool_call.HasField("arguments"), "arguments set although invalid")
        expect(end.tool_call.raw_arguments == raw, f"raw_arguments {end.tool_call.raw_arguments!r} != streamed {raw!r}")
        expect(bool(LLAMA_ID.match(end.tool_call.id)), f"id {end.tool_call.id!r}")
        final = got.finish.message.tool_calls[0]
        expect(final.raw_arguments == raw and not final.HasField("arguments"), f"finish message call {final}")
        return f"max_tokens {max_tokens}: raw {raw!r}, arguments_invalid, finish LENGTH, usage out {got.finish.info.usage.output_tokens}"

    def tool_result_round_trip(self) -> str:
        calls = self.tool_calls
        result = "Sunny, 21 degrees celsius."
        proto_msgs, json_msgs = self.tool_messages(prefill=False)
        proto_msgs.append(self.message("assistant", tool_calls=[{"id": i, "name": WEATHER_TOOL["name"], "arguments": a} for i, a in calls]))
        proto_msgs += [self.message("tool", result, tool_call_id=i) for i, _ in calls]
        # What Antler's provider sends: content null beside tool calls, arguments as compact JSON with sorted keys
        # (a protobuf Struct's order).
        json_msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": WEATHER_TOOL["name"], "arguments": json.dumps(a, sort_keys=True, separators=(",", ":"))}}
            for i, a in calls]})
        json_msgs += [{"role": "tool", "tool_call_id": i, "content": result} for i, _ in calls]
        direct = stream_direct(self.llama, self.direct_body(json_msgs, 128, tools=True))
        got = self.stream(self.request("smollm2", proto_msgs, 128, tools=True))
        expect(got.error is None, f"ChatStream failed: {got.error_text()}")
        expect(len(direct.text) >= 10, f"direct answer too short to compare: {direct.text!r}")
        expect(got.text == direct.text, f"answer differs\n  antler: {got.text!r}\n  direct: {direct.text!r}")
        expect(len(got.starts) == len(direct.tool_calls), f"{len(got.starts)} calls via Antler, {len(direct.tool_calls)} direct")
        usage = direct.usage or {}
        info = got.finish.info
        expect((info.usage.input_tokens, info.usage.output_tokens) == (usage.get("prompt_tokens"), usage.get("completion_tokens")),
               f"usage {info.usage.input_tokens}/{info.usage.output_tokens} != llama-server's {usage}")
        expect(self.finish_name(info).removeprefix("FINISH_REASON_").lower() == direct.finish_reason, f"finish {self.finish_name(info)} vs {direct.finish_reason}")
        return f"{len(calls)} calls and results sent back; prompt {usage.get('prompt_tokens')} tokens; answer equal ({len(got.text)} chars, finish {direct.finish_reason}): {got.text[:60]!r}"

    def wrong_key_refused(self) -> str:
        """llama-server answers a wrong key with HTTP 401: FAILED_PRECONDITION naming the key's variable, not
        retried, and the key itself nowhere in the message."""
        began = time.monotonic()
        got = self.stream(self.request("smollm2-wrong-key", [self.message("user", "Say hi.")], 8))
        took = time.monotonic() - began
        expect(got.error is not None and got.error.code() == grpc.StatusCode.FAILED_PRECONDITION, f"ChatStream ended with {got.error_text()}")
        details = got.error.details() or ""
        expect("REAL_MODEL_WRONG_KEY" in details, f"the message does not name the key's variable: {details!r}")
        expect(self.wrong_key not in details and self.api_key not in details, f"a key leaked into the message: {details!r}")
        expect(took < UNAVAILABLE_BOUND_S, f"took {took:.2f} s (bound {UNAVAILABLE_BOUND_S} s): retried?")
        return f"FAILED_PRECONDITION in {took * 1000:.0f} ms: {details!r}"

    def context_overflow(self) -> str:
        """A prompt longer than the server's context: llama-server's HTTP 400 (exceed_context_size_error) becomes
        INVALID_ARGUMENT with its message, at once."""
        figures = []
        for rpc in ("ChatStream", "Chat"):
            req = self.request("smollm2", [self.message("user", "hello world " * 6000)], 8)
            began = time.monotonic()
            if rpc == "ChatStream":
                error = self.stream(req).error
            else:
                try:
                    self.models.Chat(req, timeout=RPC_TIMEOUT_S)
                    error = None
                except grpc.RpcError as e:
                    error = e
            took = time.monotonic() - began
            expect(error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{rpc} ended with {describe(error) if error else 'success'}")
            expect("exceeds the available context size" in (error.details() or ""), f"{rpc}: llama-server's message lost: {error.details()!r}")
            expect(took < UNAVAILABLE_BOUND_S, f"{rpc} took {took:.2f} s")
            figures.append(f"{rpc} INVALID_ARGUMENT in {took * 1000:.0f} ms")
        return f"{'; '.join(figures)}: {error.details()!r}"

    def endless(self, user: str = "Count from 1 to 1000, one number per line.") -> Any:
        return self.request("smollm2-endless", [self.message("system", SYSTEM), self.message("user", user)], 4096)

    def cancel_frees_slot(self) -> str:
        expect(not self.llama.processing(), "the slot is busy before the check")
        state: dict = {}

        def on_response(resp: Any, call: Any) -> None:
            if resp.WhichOneof("delta") == "text":
                state["deltas"] = state.get("deltas", 0) + 1
                if state["deltas"] == 20:
                    state["busy_before_cancel"] = self.llama.processing()
                    state["cancelled_at"] = time.monotonic()
                    call.cancel()

        got = self.stream(self.endless(), on_response)
        expect("cancelled_at" in state, f"never cancelled: {state}, error {got.error_text()}")
        expect(got.error is not None and got.error.code() == grpc.StatusCode.CANCELLED, f"stream ended with {got.error_text()}")
        expect(state["busy_before_cancel"], "the slot was not processing while the stream ran")
        freed = wait_until(lambda: not self.llama.processing(), FREED_BOUND_S * 4)
        expect(freed is not None, f"slot still processing {FREED_BOUND_S * 4:.0f} s after the cancel")
        freed_s = time.monotonic() - state["cancelled_at"]
        remaining_s = (4096 - state["deltas"]) / max(self.tokens_per_s, 1.0)
        expect(freed_s < FREED_BOUND_S, f"slot freed {freed_s:.2f} s after the cancel (bound {FREED_BOUND_S} s)")
        # The one slot is free, so a new request is answered at once instead of queueing behind 4096 tokens.
        began = time.monotonic()
        nxt = stream_direct(self.llama, self.direct_body([{"role": "user", "content": "Say hi."}], 8))
        waited = time.monotonic() - began
        expect(nxt.first_byte_s < NEXT_REQUEST_BOUND_S and nxt.text, f"next request: first byte after {nxt.first_byte_s:.2f} s, text {nxt.text!r}")
        return (f"cancelled after {state['deltas']} deltas; slot idle {freed_s * 1000:.0f} ms later (bound {FREED_BOUND_S:.0f} s; "
                f"uncancelled it had ~{remaining_s:.0f} s of tokens left); next request first byte {nxt.first_byte_s * 1000:.0f} ms, done in {waited:.2f} s")

    def lead_run(self) -> str:
        began = time.monotonic()
        proc = subprocess.run(
            [str(self.antler_bin), "run", "Reply with one short sentence that greets the user.", "--model", "smollm2",
             "--addr", f"http://{self.antler.address}", "--color", "never"],
            capture_output=True, text=True, timeout=600, check=False,
        )
        took = time.monotonic() - began
        out = proc.stdout
        ids = re.search(r"run (\S+) on thread (\S+)", out)
        end = re.search(r"end: (\S+)(.*)", out)
        tail = f"\n--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{proc.stderr[-2000:]}"
        expect(ids is not None and end is not None, f"no run/end line (exit {proc.returncode}){tail}")
        run = self.pb.run_service_grpc.RunServiceStub(self.channel).GetRun(
            self.pb.run_service.GetRunRequest(run_id=ids.group(1), thread_id=ids.group(2)), timeout=30).run
        status = self.pb.runs.RunStatus.Name(run.status)
        expect(proc.returncode == 0 and status == "RUN_STATUS_SUCCESS", f"exit {proc.returncode}, status {status}, stop {run.stop_reason!r}, error {run.error}{tail}")
        expect(run.usage.llm_calls >= 1 and run.usage.input_tokens > 0 and run.usage.output_tokens > 0, f"usage {run.usage}")
        answer = [line for line in out.splitlines() if "assistant:" in line]
        return (f"SUCCESS in {took:.1f} s, {run.usage.llm_calls} model calls, {run.usage.input_tokens} in / {run.usage.output_tokens} out tokens; "
                f"answer {answer[-1].split('assistant:', 1)[1].strip()[:80]!r}" if answer else f"SUCCESS in {took:.1f} s, usage {run.usage}")

    def kill_mid_stream(self) -> str:
        state: dict = {}

        def on_response(resp: Any, call: Any) -> None:
            if resp.WhichOneof("delta") == "text":
                state["deltas"] = state.get("deltas", 0) + 1
                if state["deltas"] == 20:
                    state["killed_at"] = time.monotonic()
                    self.llama.kill()

        got = self.stream(self.endless(), on_response)
        expect("killed_at" in state, f"never killed: {state}, {got.error_text()}")
        ended_s = time.monotonic() - state["killed_at"]
        expect(got.error is None and got.finish is not None, f"stream ended with {got.error_text()} instead of a finish")
        info = got.finish.info
        expect(self.finish_name(info) == "FINISH_REASON_ERROR", f"finish {self.finish_name(info)}")
        expect(info.error.code == "UNAVAILABLE" and info.error.retryable, f"error {info.error}")
        expect(ended_s < UNAVAILABLE_BOUND_S, f"ended {ended_s:.2f} s after the kill (bound {UNAVAILABLE_BOUND_S} s)")
        text = "".join(p.text.text for p in got.finish.message.content if p.WhichOneof("part") == "text")
        expect(text == got.text and len(text) > 0, "the partial text was not kept")
        return f"ended {ended_s * 1000:.0f} ms after SIGKILL: FINISH_REASON_ERROR, {info.error.code}: {info.error.message!r}; {len(text)} chars kept, usage estimated {info.usage_estimated}"

    def kill_mid_chat(self) -> str:
        self.restart_llama()
        result: dict = {}

        def call() -> None:
            try:
                result["reply"] = self.models.Chat(self.endless(), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as error:
                result["error"] = error
            result["ended_at"] = time.monotonic()

        worker = threading.Thread(target=call)
        worker.start()
        busy = wait_until(self.llama.processing, 30)
        expect(busy is not None, "the slot never started processing the Chat")
        time.sleep(0.5)
        killed_at = time.monotonic()
        self.llama.kill()
        worker.join(timeout=UNAVAILABLE_BOUND_S * 6)
        expect(not worker.is_alive(), f"Chat still waiting {UNAVAILABLE_BOUND_S * 6:.0f} s after the kill")
        ended_s = result["ended_at"] - killed_at
        error = result.get("error")
        expect(error is not None and error.code() == grpc.StatusCode.UNAVAILABLE, f"Chat ended with {describe(error) if error else result.get('reply')}")
        expect(ended_s < UNAVAILABLE_BOUND_S, f"UNAVAILABLE {ended_s:.2f} s after the kill (bound {UNAVAILABLE_BOUND_S} s)")
        return f"UNAVAILABLE {ended_s * 1000:.0f} ms after SIGKILL (3 attempts): {error.details()!r}"

    def kill_idle(self) -> str:
        self.restart_llama()
        # One call first, so the gateway holds a kept-alive connection to the server that is about to die.
        warm = self.stream(self.request("smollm2", [self.message("user", "Say hi.")], 4))
        expect(warm.error is None, f"warm-up failed: {warm.error_text()}")
        self.llama.kill()
        figures = []
        for rpc in ("ChatStream", "Chat"):
            began = time.monotonic()
            req = self.request("smollm2", [self.message("user", "Say hi.")], 8)
            if rpc == "ChatStream":
                got = self.stream(req)
                error = got.error
                expect(not got.text_deltas, f"{rpc} streamed text from a dead server")
            else:
                try:
                    self.models.Chat(req, timeout=RPC_TIMEOUT_S)
                    error = None
                except grpc.RpcError as e:
                    error = e
            took = time.monotonic() - began
            expect(error is not None and error.code() == grpc.StatusCode.UNAVAILABLE, f"{rpc} ended with {describe(error) if error else 'success'}")
            details = error.details() or ""
            expect("127.0.0.1" in details or "connect" in details.lower(), f"{rpc}'s message does not say what failed: {details!r}")
            expect(took < UNAVAILABLE_BOUND_S, f"{rpc} took {took:.2f} s (bound {UNAVAILABLE_BOUND_S} s)")
            retry_after = dict(error.trailing_metadata() or ()).get("retry-after")
            figures.append(f"{rpc} UNAVAILABLE in {took * 1000:.0f} ms, retry-after {retry_after}: {details!r}")
        return "; ".join(figures)

    def restart_llama(self) -> None:
        self.llama.kill()
        self.llama.start()


class AntlerStream:
    """What one ChatStream delivered."""

    def __init__(self) -> None:
        self.text = ""
        self.text_deltas = 0
        self.starts: list = []
        self.fragments: dict[int, list[str]] = {}
        self.ends: dict[int, Any] = {}
        self.finish: Any = None
        self.error: Optional[grpc.RpcError] = None
        self.ttft_s = 0.0
        self.seconds = 0.0
        self.call: Any = None

    def absorb(self, resp: Any, began: float) -> None:
        kind = resp.WhichOneof("delta")
        if kind == "text":
            if not self.text_deltas:
                self.ttft_s = time.monotonic() - began
            self.text += resp.text.text
            self.text_deltas += 1
        elif kind == "tool_call_start":
            self.starts.append(resp.tool_call_start)
        elif kind == "tool_call_delta":
            self.fragments.setdefault(resp.tool_call_delta.index, []).append(resp.tool_call_delta.arguments_delta)
        elif kind == "tool_call_end":
            self.ends[resp.tool_call_end.index] = resp.tool_call_end
        elif kind == "finish":
            self.finish = resp.finish

    def error_text(self) -> str:
        return describe(self.error) if self.error else "no error"


def describe(error: grpc.RpcError) -> str:
    return f"{error.code().name}: {error.details()}"


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> Optional[float]:
    """Polls every 20 ms; the seconds it took, or None."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if predicate():
            return time.monotonic() - began
        time.sleep(0.02)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--antler", type=Path, required=True)
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    checks = Checks()
    try:
        driver = Driver(args)
    except Exception as error:
        print(f"FAIL setup: {error}")
        return 1
    print(f"llama-server {driver.llama.base_url} healthy after {driver.llama_start_s:.1f} s; antler up on {driver.antler.address}; logs in {args.work}", flush=True)
    try:
        checks.run("stream_equals_direct", lambda: driver.compare_text("Name three colours of the rainbow.", 256, "stop"))
        checks.run("chat_equals_stream", driver.chat_equals_stream)
        checks.run("finish_length", lambda: driver.compare_text("Write a short poem about the sea.", 12, "length"))
        checks.run("cached_prompt_usage", driver.cached_prompt_usage)
        checks.run("tool_call_streamed", driver.tool_call_streamed)
        checks.run("tool_call_truncated", driver.tool_call_truncated)
        checks.run("tool_result_round_trip", driver.tool_result_round_trip)
        checks.run("wrong_key", driver.wrong_key_refused)
        checks.run("context_overflow", driver.context_overflow)
        checks.run("cancel_frees_slot", driver.cancel_frees_slot)
        checks.run("lead_run", driver.lead_run)
        checks.run("kill_mid_stream", driver.kill_mid_stream)
        checks.run("kill_mid_chat", driver.kill_mid_chat)
        checks.run("kill_idle", driver.kill_idle)
    finally:
        driver.close()
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
