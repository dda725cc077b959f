// Sessions: the caller's sessions, newest first, a page at a time, filtered
// by agent and user (GET /v1/sessions?order=newest&agent=&user_id=), and a
// form to start one (POST /v1/sessions).

import * as api from "./api.js";
import { h, put, clear, errorBox, field, time } from "./dom.js";

/// Sessions per page.
const PAGE = 50;

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
  // The cursor of each page shown so far (`null`: the newest page).
  let cursors = [null];
  let next = null;
  let loading = 0;

  // GET /v1/sessions does the ordering, filtering and paging.
  async function load() {
    const mine = ++loading;
    const agent = agentFilter.value.trim();
    const user = userFilter.value.trim();
    let page;
    try {
      page = await api.get(
        "/v1/sessions" +
          api.query({ order: "newest", limit: PAGE, agent, user_id: user, cursor: cursors.at(-1) })
      );
    } catch (e) {
      if (mine === loading) {
        clear(rows);
        status.textContent = "";
        put(status, errorBox(e));
      }
      return;
    }
    if (mine !== loading) return;
    clear(rows);
    for (const s of page.sessions || []) {
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
    next = page.next || null;
    const first = (cursors.length - 1) * PAGE;
    status.textContent = page.count
      ? `Sessions ${first + 1}–${first + page.count}, newest first` + (agent || user ? " (filtered)" : "") + "."
      : "No session" + (agent || user ? " matches." : " yet: start one above.");
    newer.disabled = cursors.length === 1;
    older.disabled = !next;
  }
  newer.addEventListener("click", () => {
    cursors.pop();
    load();
  });
  older.addEventListener("click", () => {
    cursors.push(next);
    load();
  });
  let typing = null;
  const refilter = () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      cursors = [null];
      load();
    }, 250);
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
  return () => clearTimeout(typing);
}
