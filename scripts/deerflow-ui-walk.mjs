// Walks DeerFlow's web UI (served by its own Next.js app, pointed at `antler up`) in headless Chromium and
// reports what a user would see: the thread list, a streamed run with its tool calls and artifact, a file
// upload, a reload in the middle of the run (the UI rejoins it), rename, delete, and the memory, skills and
// tools (MCP) settings pages. Every console error, page error, failed request and HTTP status >= 400 is
// collected; the walk fails when a step's visible result is missing or anything was collected.
//
// Run by scripts/deerflow-ui-check, which starts antler and the UI. Arguments (environment):
//   UI_URL         the UI's origin, e.g. http://localhost:3300
//   CHROMIUM       the browser binary (Debian's /usr/bin/chromium); playwright-core only drives it
//   SHOTS_DIR      where screenshots go (one per step)
//   PLAYWRIGHT_CORE  the playwright-core module path (installed from npm by the check script)
//   WALK_LABEL     a prefix for screenshot names (the deployment)
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const { chromium } = await import(pathToFileURL(process.env.PLAYWRIGHT_CORE).href);
const UI = process.env.UI_URL.replace(/\/+$/, "");
const SHOTS = process.env.SHOTS_DIR;
const LABEL = process.env.WALK_LABEL ?? "walk";
mkdirSync(SHOTS, { recursive: true });

const problems = [];
const passed = [];
let step = "start";
let shotNo = 0;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM,
  headless: true,
  // The check runs as root in a container: Chromium's own sandbox needs user namespaces it may not get.
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
const context = await browser.newContext({ viewport: { width: 1440, height: 900 } });
// A returning user's sidebar is open (the UI keeps that in its `sidebar_state` cookie); the thread list lives there.
await context.addCookies([{ name: "sidebar_state", value: "true", url: UI }]);
const page = await context.newPage();

page.on("console", (msg) => {
  if (msg.type() === "error") problems.push(`[${step}] console error: ${msg.text()}`);
});
page.on("pageerror", (err) => problems.push(`[${step}] page error: ${err.message}`));
page.on("requestfailed", (req) => {
  const why = req.failure()?.errorText ?? "";
  // A navigation or a reload cancels the page's open requests (the run's stream among them): not a failure.
  if (why.includes("ERR_ABORTED")) return;
  problems.push(`[${step}] request failed: ${req.method()} ${req.url()} (${why})`);
});
page.on("response", async (res) => {
  if (res.status() < 400) return;
  let body = "";
  try {
    body = (await res.text()).slice(0, 300);
  } catch {
    body = "(no body)";
  }
  problems.push(`[${step}] HTTP ${res.status()}: ${res.request().method()} ${res.url()} ${body}`);
});

async function shot(name) {
  shotNo += 1;
  const path = join(SHOTS, `${LABEL}-${String(shotNo).padStart(2, "0")}-${name}.png`);
  await page.screenshot({ path, fullPage: false });
  return path;
}

async function check(name, fn) {
  step = name;
  try {
    await fn();
    passed.push(name);
    console.log(`ok   ${name}`);
  } catch (err) {
    problems.push(`[${name}] step failed: ${String(err?.message ?? err).split("\n")[0]}`);
    console.log(`FAIL ${name}: ${String(err?.message ?? err).split("\n")[0]}`);
  }
  await shot(name.replace(/[^a-z0-9]+/gi, "-").toLowerCase()).catch(() => {});
}

const sidebar = page.locator("[data-sidebar='sidebar']");
const chat = page.locator("#chat");
const composer = page.getByRole("textbox").first();
const uploadName = `antler-upload-${Date.now()}.txt`;
const newTitle = `Renamed by the check ${Date.now() % 100000}`;
let threadUrl = "";

await check("open the workspace", async () => {
  await page.goto(`${UI}/workspace/chats/new`, { waitUntil: "domcontentloaded" });
  await composer.waitFor({ state: "visible", timeout: 120_000 });
});

await check("send a message with an uploaded file", async () => {
  await page.locator("input[type=file]").first().setInputFiles({
    name: uploadName,
    mimeType: "text/plain",
    buffer: Buffer.from("Notes for the check: Antler serves DeerFlow's UI.\n"),
  });
  await page.getByText(uploadName).first().waitFor({ timeout: 15_000 });
  await composer.click();
  await page.keyboard.type("Write me a short note as a file, please.");
  await page.keyboard.press("Enter");
  await page.waitForURL(/\/workspace\/chats\/[0-9a-f-]{36}/, { timeout: 60_000 });
  threadUrl = page.url();
  // The upload reached the sandbox and the message carries it.
  await chat.getByText(uploadName).first().waitFor({ timeout: 30_000 });
});

await check("stream: text and the write_file tool call", async () => {
  await chat.getByText("I'll write the note in the sandbox").first().waitFor({ timeout: 60_000 });
  await chat.getByText(/hello\.md/).first().waitFor({ timeout: 60_000 });
});

await check("reload mid-run and rejoin the stream", async () => {
  // The script's second turn runs `sleep 4` in bash: reload while the run is still going.
  await chat.getByText("Checking what landed.").first().waitFor({ timeout: 60_000 });
  await page.reload({ waitUntil: "domcontentloaded" });
  await chat.getByText("Checking what landed.").first().waitFor({ timeout: 60_000 });
  // The rest of the run arrives over the rejoined stream.
  await chat.getByText(/The note is in .*hello\.md/).first().waitFor({ timeout: 90_000 });
});

await check("artifact: the presented file opens", async () => {
  const trigger = page.getByTestId("artifact-trigger");
  if (await trigger.count()) await trigger.first().click();
  const panel = page.locator("#artifacts");
  await panel.waitFor({ state: "visible", timeout: 30_000 });
  await panel.getByText("hello.md").first().click({ timeout: 15_000 }).catch(() => {});
  await panel.getByText(/Hello from Antler/).first().waitFor({ timeout: 30_000 });
});

// Opening an artifact collapses the sidebar (the UI makes room for the panel): open it again with the
// UI's own shortcut (Ctrl+B), as its trigger only shows while the pointer is over the header.
async function openSidebar() {
  const expanded = page.locator("[data-state='expanded'] [data-sidebar='sidebar']").first();
  await page.locator("[data-sidebar='sidebar']").first().waitFor({ timeout: 30_000 });
  if (!(await expanded.count())) await page.keyboard.press("Control+b");
  await expanded.waitFor({ timeout: 15_000 });
}

await check("thread list shows the thread", async () => {
  const id = threadUrl.split("/").pop();
  await page.goto(threadUrl, { waitUntil: "domcontentloaded" });
  await composer.waitFor({ state: "visible", timeout: 60_000 });
  await openSidebar();
  await sidebar.locator(`a[href$='${id}']`).first().waitFor({ timeout: 30_000 });
});

async function openThreadMenu() {
  const id = threadUrl.split("/").pop();
  const item = sidebar.locator("li", { has: page.locator(`a[href$='${id}']`) }).first();
  await item.hover();
  await item.getByRole("button", { name: /more/i }).click();
}

await check("rename the thread", async () => {
  await openThreadMenu();
  await page.getByRole("menuitem", { name: /rename/i }).click();
  const dialog = page.getByRole("dialog");
  await dialog.getByRole("textbox").fill(newTitle);
  await dialog.getByRole("button", { name: /save/i }).click();
  await sidebar.getByText(newTitle).first().waitFor({ timeout: 30_000 });
  await page.reload({ waitUntil: "domcontentloaded" });
  await openSidebar();
  await sidebar.getByText(newTitle).first().waitFor({ timeout: 60_000 });
});

// Each settings section must finish loading (no "Loading…", no "Error:") and show what antler serves:
// the memory document (a fact is added), the MCP server from the extensions file, the public skills (one
// is switched off and on again, PUT /api/skills/{name}).
for (const [section, expect] of [
  ["memory", /memory/i],
  ["tools", new RegExp(process.env.WALK_MCP_SERVER ?? "docs")],
  ["skills", new RegExp(process.env.WALK_SKILL ?? "data-analysis")],
]) {
  await check(`settings: ${section}`, async () => {
    await page.goto(`${UI}/workspace/chats/new?settings=${section}`, { waitUntil: "domcontentloaded" });
    const dialog = page.getByRole("dialog");
    await dialog.waitFor({ state: "visible", timeout: 60_000 });
    await dialog.getByText(/^Loading/).first().waitFor({ state: "detached", timeout: 60_000 }).catch(() => {});
    if (await dialog.getByText(/^Loading/).count()) throw new Error(`the ${section} page is still loading after 60 s`);
    if (await dialog.getByText(/^Error:/).count()) throw new Error(`the ${section} page shows an error`);
    await dialog.getByText(expect).first().waitFor({ timeout: 30_000 });
    if (section === "skills") {
      const toggle = dialog.getByRole("switch").first();
      const before = await toggle.getAttribute("aria-checked");
      await toggle.click();
      await page.waitForFunction(
        ([el, was]) => el.getAttribute("aria-checked") !== was,
        [await toggle.elementHandle(), before],
        { timeout: 15_000 },
      );
      await toggle.click();
      await page.waitForFunction(
        ([el, was]) => el.getAttribute("aria-checked") === was,
        [await toggle.elementHandle(), before],
        { timeout: 15_000 },
      );
    }
    if (section === "memory") {
      // Add a fact (POST /api/memory/facts); the page shows it from the memory document that comes back.
      const fact = `The check was here at ${new Date().toISOString()}`;
      await dialog.getByRole("button", { name: /add fact/i }).click();
      const editor = page.getByRole("dialog").filter({ has: page.getByPlaceholder(/memory fact/i) });
      await editor.getByPlaceholder(/memory fact/i).fill(fact);
      await editor.getByRole("button", { name: /^save fact$/i }).click();
      await page.getByText(fact).first().waitFor({ timeout: 30_000 });
    }
    // Let the section's own requests settle, so their errors are counted here.
    await page.waitForLoadState("networkidle", { timeout: 15_000 }).catch(() => {});
  });
}

// Deleted from the sidebar of a new chat, as a user clears out old threads. The UI deletes twice:
// threads.delete (LangGraph), then DELETE /api/threads/{id} for the gateway's local data, and takes that
// second call's 404 as success (hooks.ts, deleteLocalThreadData) — DeerFlow's own gateway answers 404
// there too, as the thread is gone. That one answer is expected; anything else counts.
let deletedId = "";
await check("delete the thread", async () => {
  deletedId = threadUrl.split("/").pop();
  await page.goto(`${UI}/workspace/chats/new`, { waitUntil: "domcontentloaded" });
  await openSidebar();
  await sidebar.getByText(newTitle).first().waitFor({ timeout: 60_000 });
  await openThreadMenu();
  await page.getByRole("menuitem", { name: /delete/i }).click();
  const confirm = page.getByRole("alertdialog");
  if (await confirm.count()) await confirm.getByRole("button", { name: /delete/i }).click();
  await sidebar.getByText(newTitle).first().waitFor({ state: "detached", timeout: 30_000 });
  await page.waitForLoadState("networkidle", { timeout: 15_000 }).catch(() => {});
  await page.reload({ waitUntil: "domcontentloaded" });
  await composer.waitFor({ state: "visible", timeout: 60_000 });
  await openSidebar();
  await page.waitForTimeout(3000);
  if (await sidebar.getByText(newTitle).count()) throw new Error("the deleted thread is back after a reload");
});
const secondDelete = (p) => p.includes(`HTTP 404: DELETE `) && p.includes(`/api/threads/${deletedId} `);
const expected = problems.filter(secondDelete);
if (expected.length === 1) {
  // Its console line ("Failed to load resource: … 404") is the same response.
  const consoleLine = problems.findIndex((p) => p.startsWith("[delete the thread] console error: Failed to load resource") && p.includes("404"));
  if (consoleLine >= 0) problems.splice(consoleLine, 1);
  problems.splice(problems.findIndex(secondDelete), 1);
  console.log(`note the UI's second DELETE /api/threads/${deletedId} answered 404, which it expects`);
}

step = "end";
await browser.close();
writeFileSync(join(SHOTS, `${LABEL}-report.txt`), [...passed.map((p) => `ok ${p}`), ...problems].join("\n") + "\n");
console.log(`${LABEL}: ${passed.length} steps passed, ${problems.length} problems`);
for (const p of problems) console.log(`  ${p}`);
process.exit(problems.length ? 1 : 0);
