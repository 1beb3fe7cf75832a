// DeerFlow's web UI, replayed against Antler's edge: the calls its frontend makes (frontend/src/core/threads/
// hooks.ts, thread-search-query.ts, api/api-client.ts, and useStream of @langchain/langgraph-sdk/react), in
// its order, with its bodies, through the real @langchain/langgraph-sdk at the UI's pinned version (1.6.0,
// installed as the npm alias `langgraph-sdk-1-6`) and at the current one (1.15.0). Each sequence runs in
// both of the UI's deployments: the browser pointed at the edge (NEXT_PUBLIC_LANGGRAPH_BASE_URL: the API at
// the root) and the same-origin one (its Next.js rewrites send /api/langgraph/* to the gateway's /api/*).
//
// Steps: the sidebar's thread search; a submit with the UI's run context (thinking_enabled on a model
// without thinking); a reload that rejoins the running run with Last-Event-ID -1; a rename
// (threads.updateState with a title); the stop button; the history the chat view loads; delete. Each
// step asserts what the UI shows (titles, order, messages, statuses), not only that a call succeeded.
//
// Run by integration-tests/python/test_langgraph_sdk.py against its `antler up` (models `quick`: a tool
// call then QUICK_ANSWER, no thinking; `slow`: SLOW_ANSWER streamed slowly). Environment: ANTLER_LANGGRAPH_URL,
// ANTLER_KEY, QUICK_ANSWER, SLOW_ANSWER; the SDKs are found through NODE_PATH (scripts/setup installs
// integration-tests/node/package-lock.json into $ANTLER_TOOLS/node-langgraph).
"use strict";

const test = require("node:test");
const assert = require("node:assert/strict");
const { randomUUID } = require("node:crypto");

const url = process.env.ANTLER_LANGGRAPH_URL;
const apiKey = process.env.ANTLER_KEY;
const QUICK_ANSWER = process.env.QUICK_ANSWER;
const SLOW_ANSWER = process.env.SLOW_ANSWER;
assert.ok(url && apiKey && QUICK_ANSWER && SLOW_ANSWER, "ANTLER_LANGGRAPH_URL, ANTLER_KEY, QUICK_ANSWER and SLOW_ANSWER must be set");

const SDKS = [
  { name: "1.6.0 (DeerFlow's pinned version)", module: "langgraph-sdk-1-6", version: "1.6.0" },
  { name: "1.15.0", module: "@langchain/langgraph-sdk", version: "1.15.0" },
];
const DEPLOYMENTS = [
  { name: "browser at the edge", prefix: "" },
  { name: "same origin, under /api/", prefix: "/api" },
];

// thread-search-query.ts: DEFAULT_THREAD_SEARCH_PARAMS.
const SIDEBAR = { limit: 50, offset: 0, sortBy: "updated_at", sortOrder: "desc", select: ["thread_id", "updated_at", "values", "metadata"] };
// useStream's modes for DeerFlow's hook: values and messages-tuple (read by the view), updates
// (onUpdateEvent) and custom (onCustomEvent).
const STREAM_MODE = ["values", "messages-tuple", "updates", "custom"];

// hooks.ts buildThreadSubmitMessages: a human message with one text block and additional_kwargs.
function uiMessage(text) {
  return { messages: [{ type: "human", content: [{ type: "text", text }], additional_kwargs: {} }] };
}

// hooks.ts sendMessage's run context, mode unset: thinking on, plan mode and subagents off.
function uiContext(threadId, model) {
  return { model_name: model, mode: "pro", thinking_enabled: true, is_plan_mode: true, subagent_enabled: false, reasoning_effort: "medium", thread_id: threadId };
}

async function collect(stream) {
  const parts = [];
  for await (const part of stream) parts.push(part);
  return parts;
}

function lastValues(parts) {
  const values = parts.filter((p) => p.event === "values");
  assert.ok(values.length > 0, `no values frame in ${parts.map((p) => p.event)}`);
  return values.at(-1).data;
}

function text(message) {
  if (typeof message.content === "string") return message.content;
  return message.content.map((block) => block.text ?? "").join("");
}

async function waitStatus(client, threadId, runId, wanted) {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const run = await client.runs.get(threadId, runId);
    if (wanted.includes(run.status)) return run;
    assert.ok(Date.now() < deadline, `run ${runId} stayed ${run.status}, expected ${wanted}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

// The UI's own fetches beside the SDK (api/fetcher.ts: `${getBackendBaseURL()}/api/...`, the gateway), with the
// key the SDK sends. In both deployments they reach the edge under /api/.
async function gateway(path, init = {}) {
  const response = await fetch(`${url}/api${path}`, { ...init, headers: { "x-api-key": apiKey, ...(init.headers ?? {}) } });
  const body = response.status === 204 ? null : await response.json();
  return { status: response.status, body };
}

for (const sdk of SDKS) {
  const { Client } = require(sdk.module);
  test(`the SDK installed as ${sdk.module} is ${sdk.version}`, () => {
    const manifest = require(`${sdk.module}/package.json`);
    assert.equal(manifest.version, sdk.version);
  });

  for (const deployment of DEPLOYMENTS) {
    test(`DeerFlow's UI sequence, SDK ${sdk.name}, ${deployment.name}`, async () => {
      const base = `${url}${deployment.prefix}`;
      const client = new Client({ apiUrl: base, apiKey });
      const title = `Renamed ${randomUUID()}`;

      // 1. The sidebar loads: the search answers, newest change first, only the selected fields.
      const before = await client.threads.search(SIDEBAR);
      assert.ok(Array.isArray(before), "the sidebar gets a list");
      for (const thread of before) {
        assert.deepEqual(Object.keys(thread).sort(), ["metadata", "thread_id", "updated_at", "values"], "select is honoured");
      }
      const times = before.map((t) => Date.parse(t.updated_at));
      assert.deepEqual(times, [...times].sort((a, b) => b - a), "newest change first");

      // 2. A message is sent: useStream creates the thread (the UI picks its id), then streams the run
      // with the UI's context — thinking on, on a model that cannot think. The run answers anyway.
      const threadId = randomUUID();
      const created = await client.threads.create({ threadId });
      assert.equal(created.thread_id, threadId);
      let runMeta;
      const parts = await collect(
        client.runs.stream(threadId, "lead_agent", {
          input: uiMessage("look around and greet me"),
          config: { recursion_limit: 1000 },
          context: uiContext(threadId, "quick"),
          streamMode: STREAM_MODE,
          onDisconnect: "continue",
          onRunCreated: (meta) => {
            runMeta = meta;
          },
        }),
      );
      assert.equal(parts[0].event, "metadata");
      assert.ok(runMeta && runMeta.run_id === parts[0].data.run_id, "onRunCreated names the run (sessionStorage lg:stream key)");
      assert.ok(!parts.some((p) => p.event === "error"), JSON.stringify(parts.filter((p) => p.event === "error")));
      const answered = lastValues(parts).messages;
      assert.deepEqual(answered.map((m) => m.type), ["human", "ai", "tool", "ai"]);
      assert.equal(text(answered.at(-1)), QUICK_ANSWER, "the answer shows");
      const streamed = parts.filter((p) => p.event === "messages" && p.data[0].type === "AIMessageChunk").map((p) => p.data[0].content).join("");
      assert.ok(streamed.includes(QUICK_ANSWER), "the answer streamed token by token");
      const notices = parts.filter((p) => p.event === "custom" && p.data.name === "antler.thinking_unsupported");
      assert.equal(notices.length, 1, "one event says thinking was dropped");
      assert.equal(notices[0].data.data.model_name, "quick");
      assert.equal((await client.runs.get(threadId, runMeta.run_id)).status, "success");
      // The sidebar refetches: the new thread is on top with its generated title.
      const listed = await client.threads.search(SIDEBAR);
      assert.equal(listed[0].thread_id, threadId, "the thread just used is first");
      assert.ok(listed[0].values.title, "it has a title");

      // 3. A page reload while a run is going: useStream keeps the run id, the UI checks the run is not
      // over (runs.get), then rejoins with Last-Event-ID -1 — the whole run replays, then follows it.
      let slowMeta;
      const unloaded = new AbortController();
      const seen = [];
      try {
        for await (const part of client.runs.stream(threadId, "lead_agent", {
          input: uiMessage("talk slowly"),
          context: uiContext(threadId, "slow"),
          streamMode: STREAM_MODE,
          onDisconnect: "continue",
          signal: unloaded.signal,
          onRunCreated: (meta) => {
            slowMeta = meta;
          },
        })) {
          seen.push(part);
          if (seen.filter((p) => p.event === "messages").length === 5) unloaded.abort(); // the page goes away
        }
      } catch (error) {
        assert.match(String(error.name ?? error), /Abort/, String(error));
      }
      assert.equal((await client.runs.get(threadId, slowMeta.run_id)).status, "running", "the run goes on without the page");
      const history = await client.threads.getHistory(threadId, { limit: 1 });
      assert.equal(history.length, 1, "useStream's fetchStateHistory {limit: 1}");
      const rejoined = await collect(client.runs.joinStream(threadId, slowMeta.run_id, { lastEventId: "-1" }));
      assert.equal(rejoined[0].event, "metadata", "the replay starts at the run's first event");
      assert.equal(rejoined.at(-1).event, "end");
      const replayed = rejoined.filter((p) => p.event === "messages").map((p) => p.data[0].content).join("");
      assert.equal(replayed, SLOW_ANSWER, "every token, once");
      assert.equal(text(lastValues(rejoined).messages.at(-1)), SLOW_ANSWER, "the reloaded view shows the whole answer");
      assert.ok(rejoined.some((p) => p.event === "updates"), "the stored stream modes are used");

      // 4. Rename from the sidebar: threads.updateState with the title; the list shows it.
      const update = await client.threads.updateState(threadId, { values: { title } });
      assert.ok(update.checkpoint && update.checkpoint.checkpoint_id, JSON.stringify(update));
      const renamed = await client.threads.search(SIDEBAR);
      assert.equal(renamed[0].thread_id, threadId, "a renamed thread moves to the top");
      assert.equal(renamed[0].values.title, title);
      assert.equal((await client.threads.getState(threadId)).values.title, title);
      const head = await client.threads.getHistory(threadId, { limit: 1 });
      assert.equal(head[0].values.messages.length, 6, "the rename kept the messages");

      // 5. The stop button: useStream aborts its stream and cancels the run it remembered.
      let stopMeta;
      const stop = new AbortController();
      // useStream sends the head it read from the history, without its thread_id.
      const { thread_id: _threadOfCheckpoint, ...checkpoint } = head[0].checkpoint;
      try {
        let count = 0;
        for await (const part of client.runs.stream(threadId, "lead_agent", {
          input: uiMessage("talk slowly again"),
          context: uiContext(threadId, "slow"),
          streamMode: STREAM_MODE,
          onDisconnect: "continue",
          checkpoint,
          signal: stop.signal,
          onRunCreated: (meta) => {
            stopMeta = meta;
          },
        })) {
          if (part.event === "messages" && ++count === 3) {
            await client.runs.cancel(threadId, stopMeta.run_id);
            stop.abort();
          }
        }
      } catch (error) {
        assert.match(String(error.name ?? error), /Abort/, String(error));
      }
      const stopped = await waitStatus(client, threadId, stopMeta.run_id, ["interrupted", "success", "error"]);
      assert.equal(stopped.status, "interrupted", "the run stopped");
      // A second click on the stopped run changes nothing; a click on a run that finished otherwise (the
      // stop button during the finish window) is 409 "is not cancellable", which the UI's wrapper swallows.
      await client.runs.cancel(threadId, stopMeta.run_id);
      await assert.rejects(client.runs.cancel(threadId, slowMeta.run_id), (error) => error.status === 409 && /is not cancellable/.test(error.message));
      const afterStop = await client.threads.get(threadId);
      assert.equal(afterStop.status, "idle", "the composer is usable again");
      assert.equal(afterStop.values.title, title, "the run started from the renamed checkpoint");

      // 6. History: the chat view pages the thread's messages through the gateway's route.
      {
        const page = await gateway(`/threads/${threadId}/messages/page?limit=2`);
        assert.equal(page.status, 200, JSON.stringify(page.body));
        assert.equal(page.body.has_more, true);
        assert.equal(page.body.data.length, 2);
        const all = await gateway(`/threads/${threadId}/messages/page?before_seq=${page.body.next_before_seq}&limit=200`);
        const rows = [...all.body.data, ...page.body.data];
        assert.deepEqual(rows.map((r) => r.seq), rows.map((_, i) => i + 1), "seq numbers the thread's messages");
        assert.equal(all.body.has_more, false);
        assert.equal(rows[0].content.type, "human");
        assert.equal(rows[0].run_id, runMeta.run_id, "each message names its run");
        assert.equal(text(rows[3].content), QUICK_ANSWER);
        assert.equal(rows[4].run_id, slowMeta.run_id);
        const providers = await gateway("/channels/providers");
        assert.deepEqual(providers.body, { enabled: false, providers: [] }, "no IM channels: the sidebar shows none");
      }
      const runs = await client.runs.list(threadId);
      assert.deepEqual(runs.map((r) => r.status).sort(), ["interrupted", "success", "success"]);

      // 7. Delete: the SDK's delete, then the UI's gateway delete (404 is treated as done), and the
      // thread leaves the sidebar.
      await client.threads.delete(threadId);
      const again = await gateway(`/threads/${threadId}`, { method: "DELETE" });
      assert.equal(again.status, 404);
      const after = await client.threads.search(SIDEBAR);
      assert.ok(!after.some((t) => t.thread_id === threadId), "the thread is gone from the sidebar");
      await assert.rejects(client.threads.get(threadId), (error) => error.status === 404);
    });
  }
}
