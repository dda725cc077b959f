// Tools: the registry (GET /v1/tools?view=definitions, with MCP status from
// the default view), and per tool a form built from its JSON Schema that
// validates (POST /v1/tools/{name}/validate) or invokes it (…/invoke).

import * as api from "./api.js";
import { h, put, clear, errorBox, field, json } from "./dom.js";
import { schemaForm } from "./schema_form.js";

export async function toolsView(main) {
  document.title = "Tools · cadre console";
  const [defs, openai] = await Promise.all([api.get("/v1/tools?view=definitions"), api.get("/v1/tools")]);
  const status = new Map(
    (openai.tools || []).map((t) => [t.function ? t.function.name : t.name, t.status || "available"])
  );
  const filter = h("input", { id: "tool-filter", type: "search", autocomplete: "off" });
  const body = h("tbody");
  const render = () => {
    clear(body);
    const f = filter.value.trim().toLowerCase();
    for (const t of defs.tools || []) {
      if (f && !(t.name + " " + (t.category || "") + " " + sourceOf(t) + " " + (t.description || "")).toLowerCase().includes(f)) continue;
      put(body, 
        h(
          "tr",
          {},
          h("td", {}, h("a", { href: "#/tools/" + encodeURIComponent(t.name) }, t.name)),
          h("td", {}, sourceOf(t)),
          h("td", {}, t.required_plan || "free"),
          h("td", {}, t.category || "—"),
          h("td", {}, h("span", { class: "status " + (status.get(t.name) || "") }, status.get(t.name) || "—"))
        )
      );
    }
  };
  filter.addEventListener("input", render);
  put(main, 
    h("h1", {}, "Tools"),
    field("Filter", filter),
    h(
      "table",
      { class: "list", "aria-label": "Tools" },
      h("thead", {}, h("tr", {}, ["Tool", "Source", "Plan", "Category", "Status"].map((t) => h("th", { scope: "col" }, t)))),
      body
    ),
    (defs.withheld || []).length ? h("div", { class: "card" }, h("h2", {}, "Withheld"), json(defs.withheld)) : null
  );
  render();
}

function sourceOf(t) {
  const s = t.source || t.entry || t.kind;
  if (!s) return "builtin";
  if (typeof s === "string") return s;
  return s.type || s.kind || Object.keys(s)[0] || "—";
}

export async function toolView(main, name) {
  document.title = `Tool ${name} · cadre console`;
  const t = await api.get("/v1/tools/" + encodeURIComponent(name));
  const def = t.definition || t;
  const schema = def.parameters || (def.function && def.function.parameters) || def.input_schema || {};
  const form = schemaForm(schema);
  const user = h("input", { id: "tool-user", autocomplete: "off", placeholder: "anonymous" });
  const plan = h("select", { id: "tool-plan" }, ["free", "pro", "premium"].map((p) => h("option", { value: p }, p)));
  const out = h("div", { "aria-live": "polite" });
  const run = (what) => async () => {
    clear(out);
    try {
      const body = { params: form.read() };
      if (what === "invoke") {
        body.plan = plan.value;
        if (user.value.trim()) body.user_id = user.value.trim();
      }
      const r = await api.post("/v1/tools/" + encodeURIComponent(name) + "/" + what, body);
      const verdict =
        what === "validate"
          ? r.body.is_valid
            ? "Valid arguments."
            : "Invalid arguments."
          : r.status === 202
            ? "Held for a confirmation (see the session or /v1/confirmations)."
            : r.body.is_success
              ? "The call succeeded."
              : "The call failed.";
      put(out, h("p", { class: r.body.is_valid === false || r.body.is_success === false ? "error" : "ok" }, `HTTP ${r.status}: ${verdict}`), json(r.body));
    } catch (e) {
      put(out, errorBox(e));
      if (e.details) put(out, json(e.details));
    }
  };
  put(main, 
    h("p", {}, h("a", { href: "#/tools" }, "← Tools")),
    h("h1", {}, "Tool ", h("code", {}, name)),
    h("p", {}, def.description || ""),
    h(
      "form",
      { class: "card", onsubmit: (ev) => ev.preventDefault() },
      h("h2", {}, "Parameters"),
      form.fields,
      field("User id (invoke)", user),
      field("Plan (invoke)", plan),
      h(
        "div",
        { class: "buttons" },
        h("button", { type: "button", onclick: run("validate") }, "Validate"),
        h("button", { type: "button", onclick: run("invoke") }, "Invoke")
      ),
      out
    ),
    h("details", { class: "card" }, h("summary", {}, "Definition"), json(t))
  );
}
