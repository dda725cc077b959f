// Live: the runtime's event stream (GET /v1/events, admin) as a scrolling,
// filterable list; the executor's pool, queue and buckets (GET /v1/limits)
// and per-tool counters (GET /v1/stats) refreshed every two seconds; and a
// user's rate-limit quota for a tool (GET /v1/limits/quota).

import * as api from "./api.js";
import { h, put, clear, errorBox, field, json, time } from "./dom.js";

const REFRESH_MS = 2000;
const MAX_EVENTS = 500;

export async function liveView(main) {
  document.title = "Live · cadre console";
  const controller = new AbortController();
  const gauges = h("div", { class: "gauges", "aria-live": "off" });
  const counters = h("div", {});
  const list = h("ol", { class: "events", "aria-label": "Runtime events" });
  const filter = h("input", { id: "event-filter", type: "search", autocomplete: "off", placeholder: "e.g. execution_failed" });
  const streamState = h("p", { class: "muted", "aria-live": "polite" }, "Connecting…");

  async function poll() {
    try {
      const [limits, stats] = await Promise.all([api.get("/v1/limits"), api.get("/v1/stats").catch(() => null)]);
      renderGauges(gauges, limits.concurrency || {});
      clear(counters);
      if (stats) put(counters, statsTable(stats));
    } catch (e) {
      clear(gauges).append(errorBox(e));
    }
  }
  await poll();
  const timer = setInterval(poll, REFRESH_MS);

  const matches = (li) => !filter.value.trim() || li.dataset.kind.includes(filter.value.trim());
  filter.addEventListener("input", () => {
    for (const li of list.children) li.hidden = !matches(li);
  });
  api
    .stream(
      "GET",
      "/v1/events",
      undefined,
      (name, data) => {
        streamState.textContent = "Streaming.";
        const li = h(
          "li",
          { dataset: { kind: name } },
          h("code", {}, name),
          " ",
          h("small", {}, time(data.at || data.timestamp)),
          " ",
          summary(data)
        );
        li.hidden = !matches(li);
        list.prepend(li);
        while (list.children.length > MAX_EVENTS) list.lastChild.remove();
      },
      controller.signal,
      () => (streamState.textContent = "Connected; waiting for events.")
    )
    .then(() => (streamState.textContent = "The stream ended."))
    .catch((e) => streamState.replaceWith(errorBox(e)));

  const qUser = h("input", { id: "quota-user", autocomplete: "off", placeholder: "anonymous" });
  const qTool = h("input", { id: "quota-tool", autocomplete: "off", required: true });
  const qOut = h("div", { "aria-live": "polite" });
  const quota = h(
    "form",
    {
      class: "card",
      onsubmit: async (ev) => {
        ev.preventDefault();
        clear(qOut);
        try {
          const q = await api.get("/v1/limits/quota" + api.query({ user_id: qUser.value.trim(), tool: qTool.value.trim() }));
          put(qOut, 
            h(
              "table",
              { class: "list" },
              h("thead", {}, h("tr", {}, ["Window", "Limit", "Remaining", "Resets"].map((t) => h("th", { scope: "col" }, t)))),
              h(
                "tbody",
                {},
                (q.windows || []).map((w) =>
                  h("tr", {}, h("td", {}, String(w.window)), h("td", {}, String(w.limit)), h("td", {}, String(w.remaining)), h("td", {}, time(w.reset_at)))
                )
              )
            ),
            (q.windows || []).length ? null : h("p", { class: "muted" }, "This tool has no rate limit.")
          );
        } catch (e) {
          put(qOut, errorBox(e));
        }
      },
    },
    h("h2", {}, "Rate-limit quota"),
    h("div", { class: "row" }, field("User id", qUser), field("Tool", qTool), h("button", { type: "submit" }, "Read quota")),
    qOut
  );

  put(main, 
    h("h1", {}, "Live"),
    h("div", { class: "card" }, h("h2", {}, "Executor"), gauges),
    h("div", { class: "card" }, h("h2", {}, "Per-tool counters"), counters),
    quota,
    h("div", { class: "card" }, h("h2", {}, "Runtime events"), field("Filter by kind", filter), streamState, list)
  );
  return () => {
    controller.abort();
    clearInterval(timer);
  };
}

function summary(e) {
  const parts = [];
  for (const k of ["tool_name", "tool", "name", "agent", "server", "user_id", "error", "execution_time_ms"]) {
    if (e[k] !== undefined && e[k] !== null) parts.push(`${k}=${typeof e[k] === "object" ? JSON.stringify(e[k]) : e[k]}`);
  }
  return parts.join(" ");
}

function meter(label, value, max) {
  const id = "m-" + label.replace(/\W/g, "_");
  return h(
    "div",
    { class: "gauge" },
    h(max ? "label" : "span", max ? { for: id } : {}, label, ": ", h("strong", {}, String(value)), max ? " / " + max : ""),
    max ? h("meter", { id, min: 0, max, value, high: max * 0.8 }) : null
  );
}

function renderGauges(el, c) {
  clear(el);
  put(el, 
    meter("Running calls", c.current_concurrent ?? 0, 0),
    meter("Queued calls", c.queue_length ?? 0, 0),
    meter("Tenants running", c.tenants_running ?? 0, 0),
    meter("Tenants waiting", c.tenants_waiting ?? 0, 0),
    h(
      "p",
      { class: "muted" },
      `per tenant: at most ${c.max_per_tenant ?? "?"} running, ${c.max_queued_per_tenant ?? "?"} queued · ` +
        `acquired ${c.total_acquired ?? 0} · bypassed ${c.total_bypassed ?? 0} · rejected ${c.total_rejected ?? 0} · ` +
        `timed out ${c.total_timeout ?? 0} · mean ${Math.round(c.avg_execution_time_ms ?? 0)} ms`
    )
  );
  const entries = Object.entries(c.buckets || {});
  put(el, h("h3", {}, "Buckets"));
  if (!entries.length) put(el, h("p", { class: "muted" }, "No bucket configured."));
  for (const [name, b] of entries) {
    if (b && typeof b === "object") {
      const current = b.current ?? b.current_concurrent ?? b.in_use ?? 0;
      const max = b.max ?? b.max_concurrent ?? b.limit ?? 0;
      put(el, meter("Bucket " + name, current, max));
    } else {
      put(el, h("p", {}, `${name}: ${b}`));
    }
  }
}

function statsTable(stats) {
  const rows = Object.entries(stats.tools || {});
  if (!rows.length) return h("p", { class: "muted" }, "No tool has been called yet.");
  return h(
    "table",
    { class: "list", "aria-label": "Per-tool counters" },
    h("thead", {}, h("tr", {}, ["Tool", "Calls", "Succeeded", "Failed", "Mean time"].map((t) => h("th", { scope: "col" }, t)))),
    h(
      "tbody",
      {},
      rows.map(([name, t]) =>
        h(
          "tr",
          {},
          h("td", {}, name),
          h("td", {}, String(t.total_calls ?? 0)),
          h("td", {}, String(t.successful_calls ?? 0)),
          h("td", {}, String(t.failed_calls ?? 0)),
          h("td", {}, (t.avg_execution_time_ms ?? 0).toFixed(1) + " ms")
        )
      )
    )
  );
}
