// Sessions: the caller's sessions (GET /v1/sessions, a page at a time),
// filtered by agent and user, and a form to start one (POST /v1/sessions).

import * as api from "./api.js";
import { h, put, clear, errorBox, field, time } from "./dom.js";

const PAGE = 50;

export async function sessionsView(main) {
  document.title = "Sessions · cadre console";
  const agents = await api.get("/v1/agents").catch(() => ({ agents: [] }));
  const names = (agents.agents || []).map((a) => a.name);

  const agentFilter = h("input", { id: "filter-agent", list: "agent-names", autocomplete: "off" });
  const userFilter = h("input", { id: "filter-user", autocomplete: "off" });
  const rows = h("tbody");
  const status = h("p", { class: "muted", "aria-live": "polite" });
  const more = h("button", { type: "button", hidden: true }, "Load older pages");
  let loaded = [];
  let next = null;

  function render() {
    clear(rows);
    const a = agentFilter.value.trim();
    const u = userFilter.value.trim();
    // Newest first: the API pages oldest first, so the loaded pages are turned around.
    const shown = loaded
      .filter((s) => (!a || s.agent === a) && (!u || (s.user_id || "") === u))
      .slice()
      .sort((x, y) => (x.created_at < y.created_at ? 1 : x.created_at > y.created_at ? -1 : 0));
    for (const s of shown) {
      put(rows, 
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
      `${shown.length} of ${loaded.length} loaded session(s) shown` + (next ? "; more pages on the server." : ".");
    more.hidden = !next;
  }

  async function load() {
    const page = await api.get("/v1/sessions" + api.query({ limit: PAGE, cursor: next }));
    loaded = loaded.concat(page.sessions || []);
    next = page.next || null;
    // Filters apply to what is loaded: keep reading pages while one is set.
    render();
  }
  more.addEventListener("click", () => load().catch((e) => status.replaceWith(errorBox(e))));
  agentFilter.addEventListener("input", render);
  userFilter.addEventListener("input", render);

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
      more
    )
  );
  await load();
}
