#!/usr/bin/env node
// Stream an Antler run from Node over @grpc/grpc-js, with the messages loaded from Antler's .proto files.
//
//     node examples/node/stream_run.js "Write a hello note to /mnt/user-data/outputs/hello.md and present it" \
//         --expect /mnt/user-data/outputs/hello.md --plan
//
// Against `antler up` with no models configured, the built-in `demo` model plays its shipped transcript
// (plan, write /mnt/user-data/outputs/hello.md, check it, present it, answer), whatever the prompt says;
// with a real model configured, ask for any file and --expect it.
//
// The server is --addr (default $ANTLER_ADDR, else http://127.0.0.1:50051), written as the `antler` CLI
// takes it: http://host:port, https://host:port (TLS; --ca / $ANTLER_CA names the CA of the server's
// certificate, default the system's roots) or host:port (plaintext).
//
// `npm install` in this folder fetches the two packages of package.json; the .proto files are read from
// ../../proto at run time, so nothing is generated. The exit status is 0 when the run ends SUCCESS,
// 1 otherwise, 2 when the address is not one, or the server cannot be reached or refuses the request.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const { parseArgs } = require("node:util");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO_ROOT = path.resolve(__dirname, "..", "..", "proto");

const { values: args, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    // http://host:port, https://host:port (TLS) or host:port (plaintext)
    addr: { type: "string", default: process.env.ANTLER_ADDR || "http://127.0.0.1:50051" },
    ca: { type: "string", default: process.env.ANTLER_CA || "" }, // PEM CA certificates of a TLS server
    token: { type: "string", default: process.env.ANTLER_TOKEN || "" }, // bearer token (API key or JWT)
    thread: { type: "string", default: "" }, // thread to run on (default: a new one)
    model: { type: "string", default: "" }, // model name (default: the server's default)
    plan: { type: "boolean", default: false }, // plan mode (the write_todos tool)
    expect: { type: "string", multiple: true, default: [] }, // an output the run must deliver
  },
});
if (positionals.length !== 1) {
  console.error("usage: stream_run.js TEXT [--addr [http(s)://]HOST:PORT] [--ca FILE] [--token T] [--thread ID] [--model NAME] [--plan] [--expect PATH]...");
  process.exit(2);
}

// keepCase: field names as in the .proto files; oneofs: `event.kind` names the set field; uint64 as strings.
const definition = protoLoader.loadSync("antler/runs/v1/run_service.proto", {
  includeDirs: [PROTO_ROOT], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
});
const { RunService } = grpc.loadPackageDefinition(definition).antler.runs.v1;

// google.protobuf.Struct / Value as decoded by proto-loader -> a plain JavaScript value.
const plain = (v) => {
  if (!v || !v.kind) return null;
  if (v.kind === "structValue") return fromStruct(v.structValue);
  if (v.kind === "listValue") return (v.listValue.values || []).map(plain);
  return v.kind === "nullValue" ? null : v[v.kind];
};
const fromStruct = (s) => Object.fromEntries(Object.entries((s && s.fields) || {}).map(([k, v]) => [k, plain(v)]));
const oneLine = (text, limit = 100) => {
  const flat = text.split(/\s+/).filter(Boolean).join(" ");
  return flat.length <= limit ? flat : flat.slice(0, limit) + "…";
};
const out = (text) => process.stdout.write(text);

// `http://host:port` or `host:port`: plaintext; `https://host:port`: TLS trusting --ca (or the system's roots).
function target(addr, ca) {
  const match = /^(?:([a-z][a-z0-9+.-]*):\/\/)?([^/]+)\/?$/i.exec(addr.trim());
  const scheme = match && (match[1] || "http").toLowerCase();
  if (!match || !["http", "https"].includes(scheme)) {
    throw new Error(`${JSON.stringify(addr)} is not an address: give host:port, http://host:port or https://host:port (--addr or ANTLER_ADDR)`);
  }
  if (scheme === "http") {
    if (ca) throw new Error(`--ca (ANTLER_CA) is for TLS, but ${addr} is plaintext: use https://`);
    return [match[2], grpc.credentials.createInsecure()];
  }
  return [match[2], grpc.credentials.createSsl(ca ? fs.readFileSync(ca) : null)];
}

let address, credentials;
try {
  [address, credentials] = target(args.addr, args.ca);
} catch (error) {
  console.error(`error: ${error.message}`);
  process.exit(2);
}
const client = new RunService(address, credentials);
const metadata = new grpc.Metadata();
if (args.token) metadata.set("authorization", `Bearer ${args.token}`);
const create = {
  thread_id: args.thread,
  input: [{ role: "ROLE_USER", content: [{ text: { text: positionals[0] } }] }],
  expected_outputs: args.expect,
  config: { model_name: args.model, plan_mode: args.plan },
};

let statusName = "RUN_STATUS_UNSPECIFIED";
let streaming = null; // "text" or "thinking" while a streamed line is open
const call = client.StreamRun({ create }, metadata);
call.on("data", ({ event }) => {
  const kind = event.kind;
  const seq = `[${String(event.seq).padStart(3)}]`;
  const delta = kind === "message_delta" ? event.message_delta : null;
  const pieceKind = delta ? (delta.thinking ? "thinking" : delta.text ? "text" : streaming) : streaming;
  if (streaming && (!["message_delta", "message", "heartbeat"].includes(kind) || pieceKind !== streaming)) {
    out("\n");
    streaming = null;
  }
  if (kind === "metadata") {
    const m = event.metadata;
    out(`${seq} run ${m.run_id} on thread ${m.thread_id} (attempt ${m.attempt})\n`);
  } else if (delta) {
    const piece = delta.thinking || delta.text;
    if (piece) {
      if (streaming === null) {
        out(`${seq} ${delta.thinking ? "thinking" : "assistant"}: `);
        streaming = pieceKind;
      }
      out(piece);
    }
  } else if (kind === "tool_started") {
    const t = event.tool_started;
    const { description, ...shown } = fromStruct(t.arguments);
    out(`${seq} tool ${t.name}(${oneLine(JSON.stringify(shown), 80)})\n`);
  } else if (kind === "tool_finished") {
    const t = event.tool_finished;
    const verdict = t.outcome_unknown ? "outcome unknown" : t.is_error ? "failed" : "ok";
    out(`${seq}   → ${t.name} ${verdict}: ${oneLine(t.result_summary)}\n`);
  } else if (kind === "clarification") {
    out(`${seq} the agent asks: ${event.clarification.question}\n`);
  } else if (kind === "delivery") {
    const d = event.delivery;
    out(`${seq} delivery receipt: ${d.satisfied ? "satisfied" : "NOT satisfied, missing " + d.missing.join(", ")}\n`);
    for (const f of d.produced) out(`        ${f.path} (${f.size} bytes, sha256 ${f.sha256.slice(0, 12)}…)\n`);
  } else if (kind === "end") {
    const end = event.end;
    statusName = end.status;
    const reason = end.stop_reason ? ` (${end.stop_reason})` : "";
    out(`${seq} end: ${statusName.replace(/^RUN_STATUS_/, "")}${reason}\n`);
    const u = end.usage || {};
    out(`        usage: ${u.total_tokens} tokens in ${u.llm_calls} model calls (${u.input_tokens} in, ${u.output_tokens} out)\n`);
    if (end.error) out(`        ${end.error.code}: ${end.error.message}\n`);
  }
});
call.on("error", (error) => {
  console.error(`\nerror: ${grpc.status[error.code]}: ${error.details}`);
  process.exitCode = 2;
  client.close();
});
call.on("end", () => {
  if (process.exitCode === 2) return; // the error handler has spoken
  process.exitCode = statusName === "RUN_STATUS_SUCCESS" ? 0 : 1;
  client.close();
});
