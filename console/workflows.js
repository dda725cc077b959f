// Workflows: the definitions, each drawn as a DAG (SVG, one column per
// depth), a form from its input schema that starts a run, and a run's view
// whose nodes change colour as its events arrive (GET …/runs/{id}/events:
// a snapshot, then node and run events), with each node's output and a
// Resume button for an interrupted run.

import * as api from "./api.js";
import { h, put, svg, clear, errorBox, field, json, time } from "./dom.js";
import { schemaForm } from "./schema_form.js";

export async function workflowsView(main) {
  document.title = "Workflows · cadre console";
  const [defs, runs] = await Promise.all([api.get("/v1/workflows"), api.get("/v1/workflows/runs?limit=20")]);
  put(main, 
    h("h1", {}, "Workflows"),
    h(
      "ul",
      { class: "cards" },
      (defs.workflows || []).map((w) =>
        h(
          "li",
          { class: "card" },
          h("h2", {}, h("a", { href: "#/workflows/" + encodeURIComponent(w.name) }, w.name)),
          h("p", {}, w.description || ""),
          h("p", { class: "muted" }, `${w.nodes.length} nodes · on error: ${w.on_error}`)
        )
      )
    ),
    (defs.errors || []).length ? h("div", { class: "card" }, h("h2", {}, "Files that did not load"), json(defs.errors)) : null,
    h("h2", {}, "Recent runs"),
    runsTable(runs.runs || [])
  );
}

function runsTable(runs) {
  if (!runs.length) return h("p", { class: "muted" }, "No runs yet.");
  return h(
    "table",
    { class: "list", "aria-label": "Runs" },
    h("thead", {}, h("tr", {}, ["Run", "Workflow", "Status", "Started"].map((t) => h("th", { scope: "col" }, t)))),
    h(
      "tbody",
      {},
      runs.map((r) =>
        h(
          "tr",
          {},
          h("td", {}, h("a", { href: "#/workflows/runs/" + encodeURIComponent(r.id) }, r.id)),
          h("td", {}, r.workflow),
          h("td", {}, h("span", { class: "status " + r.status }, r.status)),
          h("td", {}, time(r.created_at))
        )
      )
    )
  );
}

export async function workflowView(main, name) {
  document.title = `Workflow ${name} · cadre console`;
  const w = await api.get("/v1/workflows/" + encodeURIComponent(name));
  const form = schemaForm(w.input);
  const user = h("input", { id: "run-user", autocomplete: "off", placeholder: "optional" });
  const status = h("div", { "aria-live": "polite" });
  const runs = await api.get("/v1/workflows/runs" + api.query({ workflow: name, limit: 20 }));
  put(main, 
    h("p", {}, h("a", { href: "#/workflows" }, "← Workflows")),
    h("h1", {}, "Workflow ", h("code", {}, w.name)),
    h("p", {}, w.description || ""),
    h("div", { class: "card" }, h("h2", {}, "Graph"), dag(w.nodes, {})),
    h(
      "form",
      {
        class: "card",
        onsubmit: async (ev) => {
          ev.preventDefault();
          clear(status);
          try {
            const body = { input: form.read() };
            if (user.value.trim()) body.user_id = user.value.trim();
            const { body: run } = await api.post("/v1/workflows/" + encodeURIComponent(name) + "/runs", body);
            location.hash = "#/workflows/runs/" + encodeURIComponent(run.id);
          } catch (e) {
            put(status, errorBox(e));
            if (e.details && e.details.validation_errors) put(status, json(e.details.validation_errors));
          }
        },
      },
      h("h2", {}, "Start a run"),
      form.fields,
      field("User id", user),
      h("button", { type: "submit" }, "Start run"),
      status
    ),
    h("h2", {}, "Runs of this workflow"),
    runsTable(runs.runs || [])
  );
}

/// The DAG as SVG: nodes placed in columns by depth (longest path from a
/// root), edges from each dependency; `states` colours them by status.
function dag(nodes, states) {
  const depth = new Map();
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const depthOf = (id, seen = new Set()) => {
    if (depth.has(id)) return depth.get(id);
    if (seen.has(id)) return 0;
    seen.add(id);
    const n = byId.get(id);
    const d = n && n.depends_on.length ? 1 + Math.max(...n.depends_on.map((p) => depthOf(p, seen))) : 0;
    depth.set(id, d);
    return d;
  };
  const columns = [];
  for (const n of nodes) {
    const d = depthOf(n.id);
    (columns[d] = columns[d] || []).push(n);
  }
  const W = 230,
    H = 54,
    GX = 70,
    GY = 22;
  // LANE: room above and below the nodes for edges that skip a column.
  const LANE = 18;
  const pos = new Map();
  const rows = Math.max(1, ...columns.map((c) => (c ? c.length : 0)));
  columns.forEach((col, x) =>
    (col || []).forEach((n, y) => {
      const offset = ((rows - col.length) * (H + GY)) / 2;
      pos.set(n.id, { x: 10 + x * (W + GX), y: 10 + LANE + offset + y * (H + GY) });
    })
  );
  const width = 20 + columns.length * (W + GX) - GX;
  const height = 20 + 2 * LANE + rows * (H + GY) - GY;
  const root = svg("svg", {
    class: "dag",
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    role: "img",
    "aria-label": "Workflow graph: " + nodes.map((n) => n.id + (n.depends_on.length ? " after " + n.depends_on.join(", ") : "")).join("; "),
  });
  put(root, 
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 8, markerHeight: 8, orient: "auto" }, svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrowhead" })))
  );
  for (const n of nodes) {
    for (const p of n.depends_on) {
      const a = pos.get(p),
        b = pos.get(n.id);
      if (!a || !b) continue;
      const x1 = a.x + W,
        y1 = a.y + H / 2,
        x2 = b.x,
        y2 = b.y + H / 2;
      // Next column: one curve. Further: out to a lane above (or below)
      // every node, along it, and back in, so it crosses no node.
      let d = `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}`;
      if (x2 - x1 > GX + 1) {
        const lane = y1 < height / 2 ? 10 + LANE / 2 : height - 10 - LANE / 2;
        d =
          `M${x1},${y1} C${x1 + GX / 2},${y1} ${x1 + GX / 2},${lane} ${x1 + GX},${lane} ` +
          `L${x2 - GX},${lane} C${x2 - GX / 2},${lane} ${x2 - GX / 2},${y2} ${x2},${y2}`;
      }
      put(root, svg("path", { class: "edge", d, "marker-end": "url(#arrow)" }));
    }
  }
  for (const n of nodes) {
    const p = pos.get(n.id);
    const state = (states[n.id] && states[n.id].status) || "pending";
    const shown = states[n.id] ? " · " + state : "";
    const what = n.tool ? "tool " + n.tool : n.agent ? "agent " + n.agent : n.kind;
    put(root, 
      svg(
        "g",
        { class: "node " + state, "data-node": n.id, "data-status": state, transform: `translate(${p.x},${p.y})` },
        svg("title", {}, `${n.id}: ${state}`),
        svg("rect", { width: W, height: H, rx: 8 }),
        svg("text", { x: 10, y: 21, class: "node-id" }, n.id + (n.map ? " ×" : "") + shown),
        svg("text", { x: 10, y: 41, class: "node-what" }, truncate(what, 30))
      )
    );
  }
  return h("div", { class: "dag-wrap" }, root);
}

function truncate(s, n) {
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}

export async function runView(main, id) {
  document.title = `Run ${id} · cadre console`;
  const path = "/v1/workflows/runs/" + encodeURIComponent(id);
  const controller = new AbortController();
  let run = await api.get(path);
  const def = await api.get("/v1/workflows/" + encodeURIComponent(run.workflow)).catch(() => null);
  const graph = h("div", { class: "card" });
  const head = h("div", { "aria-live": "polite" });
  const nodes = h("div", {});
  const events = h("ol", { class: "events", "aria-label": "Run events" });

  function render() {
    clear(head);
    put(head, 
      h("h1", {}, "Run ", h("code", {}, run.id)),
      h(
        "p",
        {},
        "Workflow ",
        h("a", { href: "#/workflows/" + encodeURIComponent(run.workflow) }, run.workflow),
        " · ",
        h("span", { class: "status run-status " + run.status, dataset: { status: run.status } }, run.status),
        " · started " + time(run.created_at),
        run.finished_at ? " · finished " + time(run.finished_at) : ""
      ),
      run.error ? errorBox({ message: run.error }) : null,
      run.status === "interrupted"
        ? h(
            "button",
            {
              type: "button",
              onclick: async () => {
                try {
                  await api.post(path + "/resume", {});
                  follow();
                } catch (e) {
                  put(head, errorBox(e));
                }
              },
            },
            "Resume run"
          )
        : null
    );
    clear(graph);
    put(graph, h("h2", {}, "Graph"), def ? dag(def.nodes, run.nodes) : json(run.nodes));
    clear(nodes);
    put(nodes, 
      h("h2", {}, "Nodes"),
      h(
        "ul",
        { class: "node-list" },
        Object.entries(run.nodes).map(([nid, n]) =>
          h(
            "li",
            { class: "card" },
            h("h3", {}, nid, " ", h("span", { class: "status " + n.status }, n.status)),
            h("p", { class: "muted" }, `attempts ${n.attempts}` + (n.session_id ? " · session " : "")),
            n.session_id ? h("a", { href: "#/sessions/" + encodeURIComponent(n.session_id) }, n.session_id) : null,
            n.error ? h("p", { class: "error" }, n.error) : null,
            n.reason ? h("p", { class: "muted" }, "skipped: " + n.reason) : null,
            n.output !== null && n.output !== undefined ? h("details", {}, h("summary", {}, "Output"), json(n.output)) : null
          )
        )
      ),
      run.output ? [h("h2", {}, "Run output"), json(run.output)] : null
    );
  }

  async function follow() {
    try {
      await api.stream(
        "GET",
        path + "/events",
        undefined,
        (name, data) => {
          if (name === "snapshot") {
            run = data;
          } else if (name === "lagged") {
            put(events, h("li", {}, "missed events; reloading"));
          } else {
            put(events, h("li", {}, h("code", {}, name), " ", data.node || "", data.item !== undefined ? "[" + data.item + "]" : "", data.error ? " — " + data.error : ""));
            const n = data.node && run.nodes[data.node];
            if (n) {
              const status = { node_started: "running", node_succeeded: "succeeded", node_failed: "failed", node_skipped: "skipped" }[name];
              if (status) n.status = status;
            }
            if (name === "run_finished") run.status = data.status;
          }
          render();
        },
        controller.signal
      );
    } catch (e) {
      put(main, errorBox(e));
    }
    // The stream ends with the run: read it whole (outputs) once more.
    if (!controller.signal.aborted) {
      run = await api.get(path);
      render();
    }
  }

  render();
  put(main, h("p", {}, h("a", { href: "#/workflows" }, "← Workflows")), head, graph, nodes, h("h2", {}, "Events"), events);
  if (run.status === "running") follow();
  return () => controller.abort();
}
