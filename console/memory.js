// Memory: the caller's tenant's memory across sessions (docs/memory.md).
// The namespaces holding items (GET /v1/memory/namespaces), each a button
// that narrows the list to it; the items under the chosen prefix, newest
// first, or ranked for a query with their scores (POST
// /v1/memory/items/search), a page at a time; and a Delete button per
// item (DELETE /v1/memory/items?namespace=…&key=…).

import * as api from "./api.js";
import { h, put, clear, errorBox, field, json, time } from "./dom.js";

/// Items per page.
const PAGE = 20;

export async function memoryView(main) {
  document.title = "Memory · cadre console";
  const namespaces = h("ul", { class: "namespaces", "aria-label": "Namespaces" });
  const rows = h("tbody");
  const status = h("p", { class: "muted", "aria-live": "polite" });
  const listStatus = h("div", { "aria-live": "polite" });
  const prefix = h("input", { id: "memory-prefix", autocomplete: "off", spellcheck: "false", placeholder: "users.u1" });
  const query = h("input", { id: "memory-query", type: "search", autocomplete: "off", placeholder: "what is the dog called" });
  const earlier = h("button", { type: "button" }, "← Earlier");
  const later = h("button", { type: "button" }, "Later →");
  let offset = 0;
  let loading = 0;

  const segments = () =>
    prefix.value
      .split(".")
      .map((s) => s.trim())
      .filter((s) => s);

  async function loadNamespaces() {
    let listed;
    try {
      listed = await api.get("/v1/memory/namespaces");
    } catch (e) {
      clear(namespaces);
      put(namespaces, h("li", {}, errorBox(e)));
      return;
    }
    clear(namespaces);
    const all = listed.namespaces || [];
    if (!all.length) put(namespaces, h("li", { class: "muted" }, "No memory yet."));
    for (const ns of all) {
      const dotted = ns.join(".");
      put(
        namespaces,
        h(
          "li",
          {},
          h(
            "button",
            {
              type: "button",
              class: "link",
              dataset: { namespace: dotted },
              onclick: () => {
                prefix.value = dotted;
                offset = 0;
                load();
              },
            },
            dotted
          )
        )
      );
    }
  }

  async function load() {
    if (!rows.isConnected) return;
    const mine = ++loading;
    const q = query.value.trim();
    const body = { namespace_prefix: segments(), limit: PAGE, offset };
    if (q) body.query = q;
    let found;
    try {
      found = (await api.post("/v1/memory/items/search", body)).body;
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
    const items = found.items || [];
    for (const item of items) put(rows, row(item, Boolean(q)));
    const where = segments().length ? ` under ${segments().join(".")}` : "";
    status.textContent = items.length
      ? `Items ${offset + 1}–${offset + items.length}${where}, ${q ? "best first for “" + q + "”" : "newest first"}.`
      : offset > 0
        ? "No more items."
        : q
          ? `Nothing${where} matches “${q}”.`
          : `No item${where}.`;
    earlier.disabled = offset === 0;
    later.disabled = items.length < PAGE;
  }

  function row(item, ranked) {
    const dotted = item.namespace.join(".");
    const remove = h(
      "button",
      {
        type: "button",
        class: "decline",
        "aria-label": `Delete ${dotted} ${item.key}`,
        onclick: async () => {
          remove.disabled = true;
          try {
            await api.call("DELETE", "/v1/memory/items" + api.query({ namespace: dotted, key: item.key }));
          } catch (e) {
            remove.disabled = false;
            clear(listStatus);
            put(listStatus, errorBox(e));
            return;
          }
          await Promise.all([load(), loadNamespaces()]);
        },
      },
      "Delete"
    );
    return h(
      "tr",
      { dataset: { namespace: dotted, key: item.key } },
      h("td", {}, h("code", {}, dotted)),
      h("td", {}, h("code", {}, item.key)),
      h("td", { class: "value" }, json(item.value)),
      h("td", { class: "score" }, ranked ? Number(item.score).toFixed(3) : "—"),
      h(
        "td",
        {},
        h("time", { datetime: item.updated_at, title: item.updated_at }, time(item.updated_at)),
        item.expires_at ? h("div", { class: "muted" }, "expires ", h("time", { datetime: item.expires_at }, time(item.expires_at))) : null
      ),
      h("td", {}, remove)
    );
  }

  const search = h(
    "form",
    {
      class: "card",
      role: "search",
      onsubmit: (ev) => {
        ev.preventDefault();
        offset = 0;
        load();
      },
    },
    h("h2", {}, "Search"),
    h(
      "div",
      { class: "row" },
      field("Namespace prefix", prefix, "segments joined with “.”; empty: all the tenant's memory"),
      field("Query", query, "ranked by relevance (BM25, fused with semantic ranking when it is on); empty: newest first")
    ),
    h("button", { type: "submit" }, "Search memory")
  );

  put(
    main,
    h("h1", {}, "Memory"),
    h("div", { class: "card" }, h("h2", {}, "Namespaces"), namespaces),
    search,
    h(
      "div",
      { class: "card" },
      h("h2", {}, "Items"),
      h(
        "table",
        { class: "list", "aria-label": "Memory items" },
        h("thead", {}, h("tr", {}, ["Namespace", "Key", "Value", "Score", "Updated", "Actions"].map((t) => h("th", { scope: "col" }, t)))),
        rows
      ),
      listStatus,
      status,
      h("div", { class: "buttons", role: "group", "aria-label": "Pages" }, earlier, later)
    )
  );
  earlier.addEventListener("click", () => {
    offset = Math.max(0, offset - PAGE);
    load();
  });
  later.addEventListener("click", () => {
    offset += PAGE;
    load();
  });
  await Promise.all([loadNamespaces(), load()]);
}
