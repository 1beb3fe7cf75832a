// Antler's LangGraph-compatible edge driven by the real @langchain/langgraph-sdk (npm), the client
// DeerFlow's web UI uses: a thread, a lead-agent run streamed in the values / updates / messages-tuple /
// events modes, a join after the client went away (no gap, no duplicate), a cancel, a wait, the state
// and the history. Run by integration-tests/python/test_langgraph_sdk.py against its `antler up`
// (models `quick`: a tool call then QUICK_ANSWER; `slow`: SLOW_ANSWER streamed slowly).
//
// Environment: ANTLER_LANGGRAPH_URL, ANTLER_KEY, QUICK_ANSWER, SLOW_ANSWER; the SDK is found through
// NODE_PATH (scripts/setup installs integration-tests/node/package-lock.json into .tools/node-langgraph).
// Uses node:test, so a failed assertion fails the process with a readable report.
"use strict";

const test = require("node:test");
const assert = require("node:assert/strict");
const { Client } = require("@langchain/langgraph-sdk");

const url = process.env.ANTLER_LANGGRAPH_URL;
const apiKey = process.env.ANTLER_KEY;
const QUICK_ANSWER = process.env.QUICK_ANSWER;
const SLOW_ANSWER = process.env.SLOW_ANSWER;
assert.ok(url && apiKey && QUICK_ANSWER && SLOW_ANSWER, "ANTLER_LANGGRAPH_URL, ANTLER_KEY, QUICK_ANSWER and SLOW_ANSWER must be set");

const client = new Client({ apiUrl: url, apiKey });
const user = (text) => ({ messages: [{ role: "user", content: text }] });
const quick = { configurable: { model_name: "quick" } };
const slow = { configurable: { model_name: "slow" } };

async function collect(stream) {
  const parts = [];
  for await (const part of stream) parts.push(part);
  return parts;
}

async function waitStatus(threadId, runId, wanted) {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const run = await client.runs.get(threadId, runId);
    if (wanted.includes(run.status)) return run;
    assert.ok(Date.now() < deadline, `run ${runId} stayed ${run.status}, expected ${wanted}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

test("a lead run streams in the values, updates, messages-tuple and events modes", async () => {
  const thread = await client.threads.create({ metadata: { from: "node" } });
  assert.equal(thread.status, "idle");
  let created;
  const parts = await collect(
    client.runs.stream(thread.thread_id, "lead", {
      input: user("hi"),
      config: quick,
      streamMode: ["values", "updates", "messages-tuple", "events"],
      onRunCreated: (meta) => {
        created = meta;
      },
    }),
  );
  const names = parts.map((p) => p.event);
  assert.equal(names[0], "metadata");
  assert.ok(created && created.run_id === parts[0].data.run_id, "onRunCreated got the run id (from Content-Location)");
  assert.deepEqual(new Set(names), new Set(["metadata", "values", "updates", "messages", "events", "end"]));

  const values = parts.filter((p) => p.event === "values").at(-1).data.messages;
  assert.deepEqual(values.map((m) => m.type), ["human", "ai", "tool", "ai"]);
  assert.equal(values.at(-1).content, QUICK_ANSWER);
  const nodes = parts.filter((p) => p.event === "updates").map((p) => Object.keys(p.data)[0]);
  assert.deepEqual(nodes.slice(0, 3), ["model", "tools", "model"]);
  const streamed = parts
    .filter((p) => p.event === "messages" && p.data[0].type === "AIMessageChunk")
    .map((p) => p.data[0].content)
    .join("");
  assert.ok(streamed.includes(QUICK_ANSWER), streamed);
  const kinds = parts.filter((p) => p.event === "events").map((p) => p.data.event);
  for (const kind of ["on_chain_start", "on_chat_model_stream", "on_tool_start", "on_tool_end", "on_chain_end"]) {
    assert.ok(kinds.includes(kind), `${kind} in ${kinds}`);
  }
  const finished = await client.runs.get(thread.thread_id, created.run_id);
  assert.equal(finished.status, "success");
});

test("a join after the client went away resumes with no gap and no duplicate", async () => {
  const thread = await client.threads.create();
  let created;
  const first = [];
  const abort = new AbortController();
  try {
    for await (const part of client.runs.stream(thread.thread_id, "lead", {
      input: user("talk slowly"),
      config: slow,
      streamMode: "messages-tuple",
      onDisconnect: "continue",
      signal: abort.signal,
      onRunCreated: (meta) => {
        created = meta;
      },
    })) {
      first.push(part);
      if (first.length === 12) abort.abort(); // the client goes away mid-answer
    }
  } catch (error) {
    assert.equal(error.name, "AbortError", String(error));
  }
  assert.ok(first.length >= 12, `${first.length} parts before the disconnect`);
  const running = await client.runs.get(thread.thread_id, created.run_id);
  assert.equal(running.status, "running", "onDisconnect: continue keeps the run going");

  const rest = await collect(client.runs.joinStream(thread.thread_id, created.run_id, { lastEventId: first.at(-1).id }));
  assert.equal(rest.at(-1).event, "end");
  const whole = await collect(client.runs.joinStream(thread.thread_id, created.run_id));
  const key = (p) => JSON.stringify([p.id, p.event, p.data]);
  assert.deepEqual([...first, ...rest].map(key), whole.map(key), "the two halves are exactly the durable log");
  const text = [...first, ...rest]
    .filter((p) => p.event === "messages")
    .map((p) => p.data[0].content)
    .join("");
  assert.equal(text, SLOW_ANSWER);
});

test("cancel, wait, state and history", async () => {
  const thread = await client.threads.create();
  const started = await client.runs.create(thread.thread_id, "lead", { input: user("talk slowly"), config: slow });
  await waitStatus(thread.thread_id, started.run_id, ["running"]);
  await client.runs.cancel(thread.thread_id, started.run_id, true);
  const cancelled = await client.runs.get(thread.thread_id, started.run_id);
  assert.equal(cancelled.status, "interrupted");

  const values = await client.runs.wait(thread.thread_id, "lead", { input: user("hi"), config: quick });
  assert.equal(values.messages.at(-1).content, QUICK_ANSWER);

  const state = await client.threads.getState(thread.thread_id);
  assert.equal(state.values.messages.at(-1).content, QUICK_ANSWER);
  assert.ok(state.checkpoint && state.checkpoint.checkpoint_id, JSON.stringify(state.checkpoint));
  const history = await client.threads.getHistory(thread.thread_id, { limit: 5 });
  assert.ok(history.length >= 2, `${history.length} history entries`);
  assert.deepEqual(history[0].values.messages, state.values.messages, "the newest history entry is the state");
  assert.ok(history.at(-1).values.messages.length < state.values.messages.length, "older entries hold fewer messages");
  const runs = await client.runs.list(thread.thread_id);
  assert.deepEqual(runs.map((r) => r.status).sort(), ["interrupted", "success"]);
});
