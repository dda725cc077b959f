// Sessions: the caller's sessions (GET /v1/sessions, a page at a time),
// filtered by agent and user, and a form to start one (POST /v1/sessions).

import * as api from "./api.js";
import { h, put, clear, errorBox, field, time } from "./dom.js";

/// Sessions shown per screen.
const PAGE = 50;
/// The API's largest page, and how many pages are read at most.
const FETCH = 1000;
const MAX_PAGES = 10;

export async function sessionsView(main) {
  document.title = "Sessions · cadre console";
  const agents = await api.get("/v1/agents").catch(() => ({ agents: [] }));
  const names = (agents.agents || []).map((a) => a.name);

  const agentFilter = h("input", { id: "filter-agent", list: "agent-names", autocomplete: "off" });
  const userFilter = h("input", { id: "filter-user", autocomplete: "off" });
  const rows = h("tbody");
  const status = h("p", { class: "muted", "aria-live": "polite" });
  const newer = h("button", { type: "button" }, "← Newer");
  const older = h("button", { type: "button" }, "Older →");
  let loaded = [];
  let truncated = false;
  let offset = 0;

  // GET /v1/sessions pages oldest first and filters nothing: the console
  // reads the pages (up to MAX_PAGES × FETCH sessions), then sorts newest
  // first, filters and pages here.
  function render() {
    clear(rows);
    const a = agentFilter.value.trim();
    const u = userFilter.value.trim();
    const matching = loaded
      .filter((s) => (!a || s.agent === a) && (!u || (s.user_id || "") === u))
      .sort((x, y) => (x.id < y.id ? 1 : x.id > y.id ? -1 : 0));
    offset = Math.max(0, Math.min(offset, Math.floor(Math.max(0, matching.length - 1) / PAGE) * PAGE));
    for (const s of matching.slice(offset, offset + PAGE)) {
      put(
        rows,
        h(
          "tr",
          {},
          h("td", {}, h("a", { href: "#/sessions/" + encodeURIComponent(s.id) }, s.id)),
          h("td", {}, s.agent),
          h("td", {}, s.user_id || "—"),
          h("td", {}, s.plan),
          h("td", {}, time(s.created_at))
        )
      );
    }
    status.textContent =
      (matching.length
        ? `Sessions ${offset + 1}–${Math.min(offset + PAGE, matching.length)} of ${matching.length}, newest first`
        : "No session matches") +
      (a || u ? ` (filtered from ${loaded.length})` : "") +
      (truncated ? `; only the oldest ${loaded.length} were read.` : ".");
    newer.disabled = offset === 0;
    older.disabled = offset + PAGE >= matching.length;
  }

  async function load() {
    let cursor = null;
    for (let i = 0; i < MAX_PAGES; i++) {
      const page = await api.get("/v1/sessions" + api.query({ limit: FETCH, cursor }));
      loaded = loaded.concat(page.sessions || []);
      cursor = page.next || null;
      if (!cursor) break;
    }
    truncated = cursor !== null;
    render();
  }
  newer.addEventListener("click", () => {
    offset -= PAGE;
    render();
  });
  older.addEventListener("click", () => {
    offset += PAGE;
    render();
  });
  const refilter = () => {
    offset = 0;
    render();
  };
  agentFilter.addEventListener("input", refilter);
  userFilter.addEventListener("input", refilter);

  const agentSelect = h("select", { id: "new-agent", required: true }, names.map((n) => h("option", { value: n }, n)));
  const newUser = h("input", { id: "new-user", autocomplete: "off", placeholder: "optional" });
  const newPlan = h(
    "select",
    { id: "new-plan" },
    ["free", "pro", "premium"].map((p) => h("option", { value: p }, p))
  );
  const createStatus = h("div", { "aria-live": "polite" });
  const create = h(
    "form",
    {
      class: "card row",
      onsubmit: async (ev) => {
        ev.preventDefault();
        clear(createStatus);
        try {
          const body = { agent: agentSelect.value, plan: newPlan.value };
          if (newUser.value.trim()) body.user_id = newUser.value.trim();
          const { body: s } = await api.post("/v1/sessions", body);
          location.hash = "#/sessions/" + encodeURIComponent(s.id);
        } catch (e) {
          put(createStatus, errorBox(e));
        }
      },
    },
    h("h2", {}, "New session"),
    field("Agent", agentSelect),
    field("User id", newUser),
    field("Plan", newPlan),
    h("button", { type: "submit" }, "Start session"),
    createStatus
  );

  put(main, 
    h("h1", {}, "Sessions"),
    create,
    h("datalist", { id: "agent-names" }, names.map((n) => h("option", { value: n }))),
    h(
      "div",
      { class: "card" },
      h("h2", {}, "Your sessions"),
      h("div", { class: "row" }, field("Filter by agent", agentFilter), field("Filter by user", userFilter)),
      h(
        "table",
        { class: "list", "aria-label": "Sessions" },
        h("thead", {}, h("tr", {}, ["Session", "Agent", "User", "Plan", "Created"].map((t) => h("th", { scope: "col" }, t)))),
        rows
      ),
      status,
      h("div", { class: "buttons", role: "group", "aria-label": "Pages" }, newer, older)
    )
  );
  await load();
}
