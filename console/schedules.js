// Schedules: the caller's tenant's schedules, oldest first, a page at a
// time (GET /v1/schedules), each with its next fire and its last runs
// (GET /v1/schedules/{id}/runs?limit=3), redrawn every 10 s; a form that
// creates one (POST /v1/schedules) and a Delete button per schedule
// (DELETE /v1/schedules/{id}).

import * as api from "./api.js";
import { h, put, clear, errorBox, field, time } from "./dom.js";

/// Schedules per page (each costs one more request for its runs).
const PAGE = 20;
/// Runs shown per schedule.
const RUNS = 3;
/// How often the page is read again (next fires move, runs arrive).
const REFRESH_MS = 10000;

export async function schedulesView(main) {
  document.title = "Schedules · cadre console";
  const [agents, workflows] = await Promise.all([
    api.get("/v1/agents").catch(() => ({ agents: [] })),
    api.get("/v1/workflows").catch(() => ({ workflows: [] })),
  ]);

  const rows = h("tbody");
  const status = h("p", { class: "muted", "aria-live": "polite" });
  const listStatus = h("div", { "aria-live": "polite" });
  const earlier = h("button", { type: "button" }, "← Earlier");
  const later = h("button", { type: "button" }, "Later →");
  // The cursor of each page shown so far (`null`: the first page).
  let cursors = [null];
  let next = null;
  let loading = 0;

  async function load() {
    // The view was replaced (sign-out clears the page): nothing to redraw.
    if (!rows.isConnected) return;
    const mine = ++loading;
    let page, runs;
    try {
      page = await api.get("/v1/schedules" + api.query({ limit: PAGE, cursor: cursors.at(-1) }));
      runs = await Promise.all(
        (page.schedules || []).map((s) =>
          api
            .get(`/v1/schedules/${encodeURIComponent(s.id)}/runs?limit=${RUNS}`)
            .then((r) => r.runs || [])
            .catch(() => null)
        )
      );
    } catch (e) {
      if (mine === loading) {
        clear(listStatus);
        put(listStatus, errorBox(e));
      }
      return;
    }
    if (mine !== loading) return;
    clear(rows);
    clear(listStatus);
    (page.schedules || []).forEach((s, i) => put(rows, row(s, runs[i])));
    next = page.next || null;
    const n = (page.schedules || []).length;
    const first = (cursors.length - 1) * PAGE;
    status.textContent = n
      ? `Schedules ${first + 1}–${first + n}, oldest first.`
      : cursors.length > 1
        ? "No more schedules."
        : "No schedule yet: create one above.";
    earlier.disabled = cursors.length === 1;
    later.disabled = !next;
  }

  function row(s, runs) {
    const what = s.agent
      ? h("span", {}, "agent ", h("code", {}, s.agent), s.message ? h("small", { class: "muted" }, " “" + truncate(s.message, 60) + "”") : null)
      : h("span", {}, "workflow ", h("a", { href: "#/workflows/" + encodeURIComponent(s.workflow) }, s.workflow));
    const when = s.cron ? h("span", {}, h("code", {}, s.cron), " ", s.timezone) : `every ${s.interval_s} s`;
    const remove = h(
      "button",
      {
        type: "button",
        class: "decline",
        "aria-label": "Delete schedule " + s.id,
        onclick: async () => {
          remove.disabled = true;
          try {
            await api.call("DELETE", "/v1/schedules/" + encodeURIComponent(s.id));
          } catch (e) {
            remove.disabled = false;
            clear(listStatus);
            put(listStatus, errorBox(e));
            return;
          }
          await load();
        },
      },
      "Delete"
    );
    return h(
      "tr",
      { dataset: { schedule: s.id } },
      h("td", {}, h("code", {}, s.id)),
      h("td", {}, what, s.session && s.session !== "new" ? h("div", { class: "muted" }, "in ", h("a", { href: "#/sessions/" + encodeURIComponent(s.session) }, s.session)) : null),
      h("td", {}, when),
      h(
        "td",
        { class: "next-fire", dataset: { next: s.next_fire_at || "" } },
        s.next_fire_at ? h("time", { datetime: s.next_fire_at, title: s.next_fire_at }, time(s.next_fire_at)) : "firing now",
        s.active ? null : h("div", {}, h("span", { class: "status failed" }, "inactive"), h("small", { class: "muted" }, " its key is revoked or expired"))
      ),
      h("td", { class: "last-runs" }, lastRuns(runs)),
      h("td", {}, remove)
    );
  }

  const form = createForm(
    (agents.agents || []).map((a) => a.name),
    (workflows.workflows || []).map((w) => w.name),
    async () => {
      cursors = [null];
      await load();
    }
  );

  put(
    main,
    h("h1", {}, "Schedules"),
    form,
    h(
      "div",
      { class: "card" },
      h("h2", {}, "Your schedules"),
      h(
        "table",
        { class: "list", "aria-label": "Schedules" },
        h("thead", {}, h("tr", {}, ["Schedule", "What", "When", "Next fire", "Last runs", "Actions"].map((t) => h("th", { scope: "col" }, t)))),
        rows
      ),
      listStatus,
      status,
      h("div", { class: "buttons", role: "group", "aria-label": "Pages" }, earlier, later)
    )
  );
  earlier.addEventListener("click", () => {
    cursors.pop();
    load();
  });
  later.addEventListener("click", () => {
    cursors.push(next);
    load();
  });
  await load();
  const timer = setInterval(load, REFRESH_MS);
  return () => clearInterval(timer);
}

/// A schedule's newest runs: when each fired, its state and (once known)
/// its turn's or run's status, linking to the session or the run.
function lastRuns(runs) {
  if (runs === null) return h("span", { class: "muted" }, "runs not readable");
  if (!runs.length) return h("span", { class: "muted" }, "No runs yet.");
  return h(
    "ul",
    { class: "runs" },
    runs.map((r) => {
      const status = r.status || r.state;
      const link = r.session_id
        ? h("a", { href: "#/sessions/" + encodeURIComponent(r.session_id) }, "session")
        : r.run_id
          ? h("a", { href: "#/workflows/runs/" + encodeURIComponent(r.run_id) }, "run")
          : null;
      return h(
        "li",
        { dataset: { state: r.state } },
        h("time", { datetime: r.fired_at, title: "slot " + r.slot }, time(r.fired_at)),
        " ",
        // A failure says why in full; a skip's reason (the key) is a title.
        h("span", { class: "status " + status, title: r.state === "failed" ? null : r.error }, status),
        link ? [" ", link] : null,
        r.error && r.state === "failed" ? h("div", { class: "error" }, r.error) : null
      );
    })
  );
}

/// The create form: an agent turn or a workflow run, on a cron expression
/// or an interval; the API's refusal is shown under it.
function createForm(agentNames, workflowNames, created) {
  const kind = h("select", { id: "sched-kind" }, h("option", { value: "agent" }, "Agent turn"), h("option", { value: "workflow" }, "Workflow run"));
  const agent = h("select", { id: "sched-agent" }, agentNames.map((n) => h("option", { value: n }, n)));
  const message = h("textarea", { id: "sched-message", rows: 2 });
  const session = h("input", { id: "sched-session", autocomplete: "off", placeholder: "new" });
  const workflow = h("select", { id: "sched-workflow" }, workflowNames.map((n) => h("option", { value: n }, n)));
  const input = h("textarea", { id: "sched-input", rows: 3, placeholder: "{}", spellcheck: "false" });
  const timing = h("select", { id: "sched-timing" }, h("option", { value: "cron" }, "Cron expression"), h("option", { value: "interval" }, "Interval"));
  const cron = h("input", { id: "sched-cron", autocomplete: "off", spellcheck: "false", placeholder: "0 9 * * 1-5" });
  const timezone = h("input", { id: "sched-timezone", autocomplete: "off", placeholder: "UTC" });
  const interval = h("input", { id: "sched-interval", type: "number", min: 1, step: 1, placeholder: "300" });
  const user = h("input", { id: "sched-user", autocomplete: "off", placeholder: "optional" });
  const webhook = h("input", { id: "sched-webhook", type: "url", autocomplete: "off", placeholder: "optional" });
  const catchUp = h("select", { id: "sched-catch-up" }, ["one", "none", "all"].map((c) => h("option", { value: c }, c)));
  const out = h("div", { "aria-live": "polite" });

  const agentFields = [field("Agent", agent), field("Message", message), field("Session", session, "new (a session per fire) or a session id of the same agent")];
  const workflowFields = [field("Workflow", workflow), field("Input (JSON)", input, "checked against the workflow's input schema")];
  const cronFields = [field("Cron", cron, "5 fields (minute hour day month weekday), or 6 with seconds first"), field("Time zone", timezone, "IANA name; UTC when empty")];
  const intervalFields = [field("Every (seconds)", interval)];
  const show = () => {
    for (const f of agentFields) f.hidden = kind.value !== "agent";
    for (const f of workflowFields) f.hidden = kind.value !== "workflow";
    for (const f of cronFields) f.hidden = timing.value !== "cron";
    for (const f of intervalFields) f.hidden = timing.value !== "interval";
  };
  kind.addEventListener("change", show);
  timing.addEventListener("change", show);
  show();

  return h(
    "form",
    {
      class: "card",
      onsubmit: async (ev) => {
        ev.preventDefault();
        clear(out);
        const body = {};
        if (kind.value === "agent") {
          body.agent = agent.value;
          body.message = message.value;
          if (session.value.trim()) body.session = session.value.trim();
        } else {
          body.workflow = workflow.value;
          if (input.value.trim()) {
            try {
              body.input = JSON.parse(input.value);
            } catch (e) {
              put(out, errorBox({ message: "Input is not JSON: " + e.message }));
              return;
            }
          }
        }
        if (timing.value === "cron") {
          body.cron = cron.value.trim();
          if (timezone.value.trim()) body.timezone = timezone.value.trim();
        } else {
          body.interval_s = Number(interval.value);
        }
        if (user.value.trim()) body.user_id = user.value.trim();
        if (webhook.value.trim()) body.webhook = webhook.value.trim();
        body.catch_up = catchUp.value;
        try {
          const { body: s } = await api.post("/v1/schedules", body);
          put(out, h("p", { class: "ok" }, "Created ", h("code", {}, s.id), s.next_fire_at ? ": next fire " + time(s.next_fire_at) + "." : "."));
          await created(s);
        } catch (e) {
          put(out, errorBox(e));
        }
      },
    },
    h("h2", {}, "New schedule"),
    h("div", { class: "row" }, field("What", kind), field("Timing", timing), field("Missed slots", catchUp, "after downtime: fire one, none or all")),
    agentFields,
    workflowFields,
    h("div", { class: "row" }, cronFields, intervalFields),
    h("div", { class: "row" }, field("User id", user), field("Webhook URL", webhook)),
    h("button", { type: "submit" }, "Create schedule"),
    out
  );
}

function truncate(s, n) {
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}
