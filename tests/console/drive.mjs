// Drives the console in headless Chromium (Debian's, through playwright-core)
// against a running cadre; run by tests/console.rs, which starts cadre and
// the mock model and scripts the model's replies in the order below.
//
//   node drive.mjs <base-url> <scenario.json>
//
// scenario.json: {acme, globex, admin (keys), acme_session, globex_session, lead_session, typed_session,
// schedule and schedule_next (one of acme's and its next fire), skipped_schedule (one whose key is revoked),
// (acme's memory: users.alice pet and tea, teams.acme deploys; globex's: users.alice pet),
// node_modules (where `npm ci` put playwright-core), screenshots (a dir),
// user_data_dir (a fresh dir for Chromium's profile)}.
//
// Prints one `ok <step>` line per step that passed; exits 1 at the first
// that failed, saying why (with the page's console errors).

import { createRequire } from "node:module";
import { mkdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";

const [base, scenarioFile] = process.argv.slice(2);
const s = JSON.parse(readFileSync(scenarioFile, "utf8"));
const require = createRequire(join(s.node_modules, "package.json"));
const { chromium } = require("playwright-core");

const TIMEOUT = 20_000;
// The conversation as stored (redrawn from the API), not the live turn.
const STORED = "ol.messages[aria-label=Messages]";
// A fresh set: no screenshot of an earlier run is left to mislead.
rmSync(s.screenshots, { recursive: true, force: true });
mkdirSync(s.screenshots, { recursive: true });

const browser = await chromium.launchPersistentContext(s.user_data_dir, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1280, height: 860 },
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const page = browser.pages()[0] || (await browser.newPage());
page.setDefaultTimeout(TIMEOUT);
const pageErrors = [];
page.on("pageerror", (e) => pageErrors.push(String(e)));
// Chromium logs every 4xx answer as "Failed to load resource"; the
// scenarios cause some on purpose (a wrong key, another tenant's session).
page.on("console", (m) => {
  if (m.type() === "error" && !/Failed to load resource/.test(m.text())) pageErrors.push(m.text());
});
// Content-Security-Policy violations are page errors too: the console must
// run under its own policy.
page.on("console", (m) => {
  if (/Content Security Policy/i.test(m.text())) pageErrors.push("CSP: " + m.text());
});

let step = "start";
async function shot(name) {
  await page.screenshot({ path: join(s.screenshots, name + ".png"), fullPage: true });
}
function check(cond, what) {
  if (!cond) throw new Error(what);
}
async function signIn(key) {
  await page.goto(base + "/console/");
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("table[aria-label=Sessions]").waitFor();
}
async function signOut() {
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("API key").waitFor();
}
function ok(name) {
  console.log("ok " + name);
}

try {
  step = "sign-in page";
  await page.goto(base + "/console");
  await page.getByRole("heading", { name: "Sign in" }).waitFor();
  // A keyed server: the header does not claim open mode before sign-in.
  const who = await page.locator("#who").innerText();
  check(!who.includes("open mode"), `the sign-in page's header says "${who}"`);
  check(who.includes("not signed in"), `the sign-in page's header says "${who}"`);
  await shot("01-sign-in");
  ok(step);

  step = "a wrong key is refused";
  await page.getByLabel("API key").fill("cadre_nope_" + "x".repeat(20));
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("alert").waitFor();
  check((await page.getByRole("alert").innerText()).includes("not accepted"), "no refusal shown");
  ok(step);

  step = "sign in with acme's key; acme's session is listed, globex's is not";
  await signIn(s.acme);
  await page.locator(`a[href="#/sessions/${s.acme_session}"]`).waitFor();
  check((await page.locator(`a[href="#/sessions/${s.globex_session}"]`).count()) === 0, "globex's session shown to acme");
  await shot("02-sessions");
  ok(step);

  step = "filter the sessions by user";
  await page.getByLabel("Filter by user").fill("nobody-has-this-user");
  await page.getByText("No session matches.").waitFor();
  check((await page.locator(`a[href="#/sessions/${s.acme_session}"]`).count()) === 0, "filter kept a session of another user");
  await page.getByLabel("Filter by user").fill("alice");
  await page.getByLabel("Filter by agent").fill("trading-copilot");
  await page.getByText("Sessions 1–1, newest first (filtered).").waitFor();
  await page.locator(`a[href="#/sessions/${s.acme_session}"]`).waitFor();
  ok(step);

  step = "open the session";
  await page.locator(`a[href="#/sessions/${s.acme_session}"]`).click();
  await page.locator(".session-head h1").waitFor();
  await page.getByRole("textbox", { name: /^Message/ }).waitFor();
  ok(step);

  step = "send a message: the tool call and the streamed answer appear";
  // Record what the live turn shows while it runs (it is redrawn from the
  // store once the turn completes).
  // Record what the live turn shows while it runs (it is redrawn from the
  // store once the turn completes): each call's phases, and how many
  // deltas (text nodes) the answer was written with.
  await page.evaluate(() => {
    window.__seen = { calls: [], deltas: 0 };
    new MutationObserver(() => {
      for (const c of document.querySelectorAll(".live-turn .call")) {
        const v = c.dataset.tool + ": " + c.dataset.phases;
        if (!window.__seen.calls.includes(v)) window.__seen.calls.push(v);
      }
      const t = document.querySelector(".live-turn .streaming");
      if (t) window.__seen.deltas = Math.max(window.__seen.deltas, t.childNodes.length);
    }).observe(document.body, { subtree: true, childList: true, characterData: true, attributes: true });
  });
  await page.getByRole("textbox", { name: /^Message/ }).fill("What is AAPL trading at?");
  await page.getByRole("textbox", { name: /^Message/ }).press("Control+Enter");
  const answer = page.locator(STORED + " .msg.assistant .content", { hasText: "AAPL closed at 205.87" });
  await answer.waitFor();
  const seen = await page.evaluate(() => window.__seen);
  check(seen.calls.includes("get_price: running succeeded"), "get_price was not seen start then succeed: " + JSON.stringify(seen.calls));
  check(seen.deltas >= 2, "the answer did not stream in pieces: " + seen.deltas + " delta(s)");
  const inline = page.locator(STORED + " .msg.assistant .call.succeeded[data-tool=get_price]");
  await inline.waitFor();
  check((await inline.innerText()).includes("tool:price:v1"), "the call's source id is not shown");
  await page.locator("aside.side", { hasText: "get_price" }).waitFor();
  await shot("03-conversation");
  ok(step);

  step = "a paused turn shows its confirmation; Approve resumes it";
  await page.getByRole("textbox", { name: /^Message/ }).fill("Buy one AAPL at market.");
  await page.getByRole("button", { name: "Send" }).click();
  const approve = page.getByRole("button", { name: "Approve" });
  await approve.waitFor();
  check(await page.getByRole("button", { name: "Decline" }).isVisible(), "no Decline button");
  check((await page.locator(".confirmation h3").innerText()).includes("create_paper_order"), "the confirmation is not the order's");
  // The held call waits: a neutral "pending approval", never a red "failed".
  await page.locator(".call.pending[data-tool=create_paper_order] .badge", { hasText: "pending approval" }).first().waitFor();
  check((await page.locator(".call.failed[data-tool=create_paper_order]").count()) === 0, "the held order is shown as failed");
  await shot("04-paused-turn");
  await approve.click();
  await page.locator(STORED + " .msg.assistant .content", { hasText: "Your order filled" }).waitFor();
  await page.locator(STORED + " .call.succeeded[data-tool=create_paper_order]").waitFor();
  check((await page.locator(".confirmation").count()) === 0, "the confirmation is still shown");
  await shot("05-approved");
  ok(step);

  step = "Decline refuses a held call; the turn goes on without it";
  await page.getByRole("textbox", { name: /^Message/ }).fill("Buy two AAPL at market.");
  await page.getByRole("button", { name: "Send" }).click();
  await page.getByRole("button", { name: "Decline" }).click();
  await page.locator(STORED + " .msg.assistant .content", { hasText: "The order was not placed" }).waitFor();
  check((await page.locator(".confirmation").count()) === 0, "the declined confirmation is still shown");
  check((await page.locator(STORED + " .call.succeeded[data-tool=create_paper_order]").count()) === 1, "a declined order shows as run");
  ok(step);

  step = "start a workflow run; every node reaches its final state";
  await page.getByRole("link", { name: "Workflows", exact: true }).click();
  await page.getByRole("link", { name: "market-brief", exact: true }).click();
  await page.locator("svg.dag g.node").first().waitFor();
  check((await page.locator("svg.dag g.node").count()) === 4, "the graph does not draw 4 nodes");
  check((await page.locator("svg.dag path.edge").count()) === 3, "the graph does not draw 3 edges");
  await shot("06-workflow");
  await page.getByRole("textbox", { name: /^symbol \*/ }).fill("AAPL");
  await page.getByRole("button", { name: "Start run" }).click();
  await page.locator(".run-status[data-status=succeeded]").waitFor();
  await page.waitForFunction(
    () => {
      const nodes = [...document.querySelectorAll("svg.dag g.node")];
      return nodes.length === 4 && nodes.every((n) => n.dataset.status === "succeeded");
    },
    null,
    { timeout: TIMEOUT }
  );
  await page.locator(".node-list details summary", { hasText: "Output" }).first().waitFor();
  await shot("07-run");
  ok(step);

  step = "tools: the registry and a tool's form";
  await page.getByRole("link", { name: "Tools", exact: true }).click();
  await page.locator("table[aria-label=Tools] a", { hasText: /^get_price$/ }).click();
  await page.getByRole("textbox", { name: /^symbol \*/ }).fill("AAPL");
  await page.getByRole("button", { name: "Validate" }).click();
  await page.locator("p.ok", { hasText: "HTTP 200: Valid arguments." }).waitFor();
  await page.getByRole("button", { name: "Invoke" }).click();
  await page.locator("p.ok", { hasText: "HTTP 200: The call succeeded." }).waitFor();
  await shot("08-tool");
  ok(step);

  step = "schedules: listed with their next fire and last runs; one created with the form, then deleted";
  await page.getByRole("link", { name: "Schedules", exact: true }).click();
  const listed = page.locator(`table[aria-label=Schedules] tr[data-schedule="${s.schedule}"]`);
  await listed.waitFor();
  const next = await listed.locator("td.next-fire").getAttribute("data-next");
  check(next === s.schedule_next, `the next fire is "${next}", the API says "${s.schedule_next}"`);
  check((await listed.locator("td.next-fire time").innerText()).trim() !== "", "the next fire is not shown");
  check((await listed.locator("td.last-runs").innerText()).includes("No runs yet."), "a schedule that never fired shows runs");
  const revoked = page.locator(`table[aria-label=Schedules] tr[data-schedule="${s.skipped_schedule}"]`);
  await revoked.locator("td.last-runs li[data-state=skipped]").first().waitFor();
  check((await revoked.locator("td.next-fire").innerText()).includes("inactive"), "a revoked key's schedule is not shown inactive");
  await shot("08b-schedules");
  // A refusal of the API is shown with its code; the fixed form creates it.
  await page.getByLabel("Message", { exact: true }).fill("The weekly digest, please.");
  await page.getByLabel("Cron", { exact: true }).fill("every monday");
  await page.getByRole("button", { name: "Create schedule" }).click();
  await page.getByRole("alert").filter({ hasText: "VALIDATION_ERROR" }).waitFor();
  await page.getByLabel("Cron", { exact: true }).fill("0 8 1 1 *");
  await page.getByLabel("Time zone", { exact: true }).fill("Europe/Paris");
  await page.getByRole("button", { name: "Create schedule" }).click();
  const createdId = await page.locator("p.ok", { hasText: "Created" }).locator("code").innerText();
  const made = page.locator(`table[aria-label=Schedules] tr[data-schedule="${createdId}"]`);
  await made.waitFor();
  check((await made.locator("td.next-fire").getAttribute("data-next")) !== "", "the new schedule has no next fire");
  check((await made.innerText()).includes("Europe/Paris"), "the new schedule's time zone is not shown");
  await page.getByRole("button", { name: "Delete schedule " + createdId }).click();
  await made.waitFor({ state: "detached" });
  await listed.waitFor();
  ok(step);

  step = "memory: namespaces, items and a ranked search; an item deleted";
  await page.getByRole("link", { name: "Memory", exact: true }).click();
  const items = page.locator("table[aria-label='Memory items'] tbody tr");
  await page.locator("ul.namespaces button[data-namespace='users.alice']").waitFor();
  await page.locator("ul.namespaces button[data-namespace='teams.acme']").waitFor();
  await items.nth(2).waitFor();
  check((await items.count()) === 3, `acme's three items are listed, not ${await items.count()}`);
  check(!(await page.locator("main").innerText()).includes("Fido"), "globex's memory shown to acme");
  await page.locator("ul.namespaces button[data-namespace='users.alice']").click();
  await page.locator("table[aria-label='Memory items'] tr[data-namespace='teams.acme']").waitFor({ state: "detached" });
  check((await items.count()) === 2, "the namespace does not narrow the list");
  await page.getByLabel("Query", { exact: true }).fill("what is the dog called");
  await page.getByRole("button", { name: "Search memory" }).click();
  await page.locator("p.muted", { hasText: "best first" }).waitFor();
  check((await items.first().getAttribute("data-key")) === "pet", "the dog's item is not ranked first");
  check(Number(await items.first().locator("td.score").innerText()) > 0, "the ranked item has no score");
  await page.getByLabel("Query", { exact: true }).fill("");
  await page.getByRole("button", { name: "Search memory" }).click();
  await page.locator("table[aria-label='Memory items'] tr[data-key='tea']").waitFor();
  await shot("08c-memory");
  await page.getByRole("button", { name: "Delete users.alice tea" }).click();
  await page.locator("table[aria-label='Memory items'] tr[data-key='tea']").waitFor({ state: "detached" });
  ok(step);

  step = "globex's key does not see acme's sessions";
  await signOut();
  await signIn(s.globex);
  await page.locator(`a[href="#/sessions/${s.globex_session}"]`).waitFor();
  check((await page.locator(`a[href="#/sessions/${s.acme_session}"]`).count()) === 0, "acme's session shown to globex");
  await page.goto(base + "/console/#/sessions/" + s.acme_session);
  await page.getByRole("alert").waitFor();
  check((await page.getByRole("alert").innerText()).includes("SESSION_NOT_FOUND"), "acme's session opened for globex");
  // Only the error: no message box to type into, no empty conversation.
  check((await page.locator("textarea").count()) === 0, "a message box under another tenant's session");
  check((await page.locator("ol.messages").count()) === 0, "a conversation shell under another tenant's session");
  await shot("09-other-tenant");
  ok(step);

  step = "a delegation links to the asked agent's session, which links back";
  await signOut();
  await signIn(s.acme);
  await page.evaluate((id) => {
    location.hash = "#/sessions/" + encodeURIComponent(id);
  }, s.lead_session);
  await page.locator(".delegation a").waitFor();
  const asked = await page.locator(".delegation").innerText();
  check(asked.includes("brokerage"), `the delegation says "${asked}"`);
  await shot("10-delegation");
  await page.locator(".delegation a").click();
  await page.locator(".delegated-by a").waitFor();
  const back = await page.locator(".delegated-by a").getAttribute("href");
  check(back === "#/sessions/" + encodeURIComponent(s.lead_session), `the child links back to ${back}`);
  const agent = await page.locator(".session-head").innerText();
  check(agent.includes("brokerage"), `the child's header says "${agent}"`);
  ok(step);

  step = "a typed answer and a failed turn show in the conversation";
  await page.evaluate((id) => {
    location.hash = "#/sessions/" + encodeURIComponent(id);
  }, s.typed_session);
  await page.locator(".typed-answer").waitFor();
  const typed = await page.locator(".typed-answer").innerText();
  check(typed.includes("Lyon"), `the typed answer says "${typed}"`);
  await page.locator(".turn-failed").waitFor();
  const failed = await page.locator(".turn-failed").innerText();
  check(failed.includes("OUTPUT_SCHEMA_VIOLATION"), `the failed turn says "${failed}"`);
  await shot("10b-typed-answer");
  ok(step);

  step = "live view (admin): gauges and the event stream";
  await signOut();
  await signIn(s.admin);
  await page.getByRole("link", { name: "Live", exact: true }).click();
  await page.getByText("Running calls").waitFor();
  await page.getByText(/^(Connected; waiting for events\.|Streaming\.)$/).waitFor();
  // A call made now shows up in the stream.
  await page.evaluate(async (key) => {
    const r = await fetch("/v1/tools/get_price/invoke", {
      method: "POST",
      headers: { Authorization: "Bearer " + key, "Content-Type": "application/json" },
      body: JSON.stringify({ params: { symbol: "MSFT" } }),
    });
    if (!r.ok) throw new Error("invoke: HTTP " + r.status);
  }, s.admin);
  await page.locator(".events li[data-kind=execution_completed]").first().waitFor();
  await page.locator("table[aria-label='Per-tool counters'] td", { hasText: "get_price" }).waitFor();
  await shot("11-live");
  ok(step);

  check(pageErrors.length === 0, "errors in the page: " + pageErrors.join(" | "));
  ok("no errors in the page");
} catch (e) {
  console.error(`FAILED at "${step}": ${e.message}`);
  if (pageErrors.length) console.error("page errors: " + pageErrors.join(" | "));
  await shot("failed").catch(() => {});
  await browser.close();
  process.exit(1);
}
await browser.close();
