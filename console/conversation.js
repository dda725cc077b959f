// A conversation: the session's messages in order with each tool call under
// the assistant message that asked for it, its summary, tool usage and token
// usage, paused turns' confirmations (Approve / Decline), and a box that
// sends a message as the session with the reply streaming in.
//
// GET /v1/sessions/{id}/export ──▶ messages + call records (matched by tool_call_id)
// GET /v1/sessions/{id}/summary ──▶ rolling summary, tool usage, tokens
// GET /v1/sessions/{id}/turns ──▶ typed answers (`outcome.output`) under their
//   assistant message; failed turns (a guardrail, a schema miss) in place
// POST /v1/sessions/{id}/messages (Accept: text/event-stream) ──▶ live turn
// POST /v1/confirmations/{id} ──▶ the paused turn resumes; its record is polled
//
// POST /v1/sessions/{id}/fork {turn_id} ──▶ "Fork from here" under each
//   finished turn's last message; opens the new session (issue #34)
//
// Agents together (issue #31): an `ask_<agent>` call shows the asked agent
// and links to its child session; a `transfer_to_<agent>` call shows the
// handoff in the history; a child session's header links to its parent.

import * as api from "./api.js";
import { h, put, clear, errorBox, field, json, time } from "./dom.js";

/// Phases of a turn's record after which it does not move by itself.
const FINAL = new Set(["completed", "failed", "interrupted"]);

// Where a call stands: a call held for a person's confirmation is pending
// approval (a neutral badge, never the red "failed"), a declined one declined.
function callState(r) {
  if (r.status) return r.status;
  if (r.is_success) return "succeeded";
  if (r.error_type === "CONFIRMATION_REQUIRED") return "pending_approval";
  if (r.error_type === "TOOL_DECLINED") return "declined";
  return "failed";
}
const CALL_CLASS = { succeeded: "succeeded", failed: "failed", pending_approval: "pending", declined: "declined" };
const CALL_BADGE = { succeeded: "succeeded", failed: "failed", pending_approval: "pending approval", declined: "declined" };

export async function conversationView(main, id) {
  document.title = `Session ${id} · cadre console`;
  const base = "/v1/sessions/" + encodeURIComponent(id);
  const controller = new AbortController();
  let timer = null;

  const header = h("div", { class: "session-head" });
  const log = h("ol", { class: "messages", "aria-label": "Messages" });
  const side = h("aside", { class: "side", "aria-label": "Session summary" });
  const pending = h("section", { class: "pending", "aria-label": "Waiting for a decision", "aria-live": "polite" });
  const live = h("div", { class: "live-turn", "aria-live": "polite" });

  // A new session with this one's history up to the end of the turn.
  async function forkAt(turnId, button) {
    button.disabled = true;
    try {
      const r = await api.post(base + "/fork", { turn_id: turnId });
      location.hash = "#/sessions/" + encodeURIComponent(r.body.id);
    } catch (e) {
      button.disabled = false;
      button.replaceWith(errorBox(e));
    }
  }

  async function refresh() {
    const [doc, summary, confirmations, turns] = await Promise.all([
      api.get(base + "/export"),
      api.get(base + "/summary"),
      api.get("/v1/confirmations?limit=200").catch(() => ({ confirmations: [] })),
      api.get(base + "/turns?limit=1000").catch(() => ({ turns: [] })),
    ]);
    renderHeader(header, doc.session);
    renderMessages(log, doc.messages || [], doc.calls || [], turns.turns || [], forkAt);
    renderSide(side, summary);
    const asked = new Set();
    for (const m of doc.messages || []) for (const c of m.tool_calls || []) asked.add(c.id);
    const mine = (confirmations.confirmations || []).filter(
      (c) => asked.has(c.tool_call_id) || (c.context && c.context.conversation_id === id)
    );
    renderPending(mine);
  }

  function renderPending(list) {
    clear(pending);
    if (!list.length) return;
    put(pending, h("h2", {}, "Waiting for your decision"));
    for (const c of list) put(pending, confirmationCard(c));
  }

  function confirmationCard(c) {
    const status = h("div", { "aria-live": "polite" });
    const decide = (approve) => async () => {
      for (const b of card.querySelectorAll("button")) b.disabled = true;
      try {
        const { body } = await api.post("/v1/confirmations/" + encodeURIComponent(c.confirmation_id), { approve });
        put(status, h("p", { class: "ok" }, `${approve ? "Approved" : "Declined"}: ${body.status}`));
        await followTurn(c.confirmation_id);
      } catch (e) {
        put(status, errorBox(e));
      }
    };
    const card = h(
      "article",
      { class: "confirmation card", dataset: { confirmation: c.confirmation_id } },
      h("h3", {}, c.tool_name),
      c.summary ? h("p", {}, c.summary) : null,
      c.params ? json(c.params) : null,
      c.expires_at ? h("p", { class: "muted" }, "Expires " + time(c.expires_at)) : null,
      h(
        "div",
        { class: "buttons" },
        h("button", { type: "button", class: "approve", onclick: decide(true) }, "Approve"),
        h("button", { type: "button", class: "decline", onclick: decide(false) }, "Decline")
      ),
      status
    );
    return card;
  }

  /// After a decision the turn resumes on the server: read the newest
  /// turn's record until it is final or paused on another confirmation,
  /// then redraw.
  async function followTurn(decided) {
    for (let i = 0; i < 600 && !controller.signal.aborted; i++) {
      const turns = await api.get(base + "/turns?limit=1000");
      const last = (turns.turns || []).at(-1);
      if (!last || FINAL.has(last.phase)) break;
      const waitsOn = (last.confirmations || []).map((c) => c.confirmation_id);
      if (last.phase === "awaiting_approval" && !waitsOn.includes(decided)) break;
      await new Promise((r) => (timer = setTimeout(r, 250)));
    }
    clear(live);
    await refresh();
  }

  const input = h("textarea", { id: "message", rows: 3, required: true, placeholder: "Write as this session's user…" });
  const send = h("button", { type: "submit" }, "Send");
  const form = h(
    "form",
    {
      class: "send card",
      onsubmit: async (ev) => {
        ev.preventDefault();
        const content = input.value.trim();
        if (!content) return;
        send.disabled = true;
        try {
          await streamTurn(content);
          input.value = "";
        } finally {
          send.disabled = false;
          input.focus();
        }
      },
    },
    field("Message", input, "Ctrl+Enter sends. The reply streams in below."),
    send
  );
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) form.requestSubmit();
  });

  async function streamTurn(content) {
    clear(live);
    const you = h("li", { class: "msg user" }, h("span", { class: "role" }, "user"), h("div", { class: "content" }, content));
    const answer = h("div", { class: "content streaming" });
    const calls = h("ul", { class: "calls", "aria-label": "Tool calls of this turn" });
    const state = h("p", { class: "muted turn-state" }, "Waiting for the model…");
    const reply = h("li", { class: "msg assistant" }, h("span", { class: "role" }, "assistant"), calls, answer, state);
    put(live, h("ol", { class: "messages" }, you, reply));
    const byId = new Map();
    let ended = null;
    try {
      await api.stream(
        "POST",
        base + "/messages",
        { content },
        (name, data) => {
          if (name === "turn_started") state.textContent = "Turn " + data.turn_id + " running…";
          else if (name === "model_delta") put(answer, data.text);
          else if (name === "tool_call_started") {
            const li = h(
              "li",
              { class: "call running", dataset: { call: data.id, tool: data.name, phases: "running" } },
              h("strong", {}, data.name),
              " ",
              h("span", { class: "badge" }, "running"),
              json(data.arguments)
            );
            byId.set(data.id, li);
            put(calls, li);
          } else if (name === "tool_call_completed") {
            const li = byId.get(data.id) || calls.appendChild(h("li", { class: "call" }, h("strong", {}, data.name)));
            const st = callState(data);
            li.className = "call " + CALL_CLASS[st];
            // What the call went through, in order (the element is reused).
            li.dataset.phases = (li.dataset.phases ? li.dataset.phases + " " : "") + st;
            const badge = li.querySelector(".badge");
            if (badge) badge.textContent = st === "failed" ? "failed " + (data.error_type || "") : CALL_BADGE[st];
            if (data.error) put(li, h("p", { class: "error" }, data.error));
          } else if (name === "turn_completed") {
            ended = "completed";
            if (data.output !== undefined) put(answer, typedAnswer(data.output));
            state.textContent = "Turn completed.";
          } else if (name === "turn_paused") {
            ended = "paused";
            state.textContent = "Turn paused: a call waits for a decision.";
            renderPending(
              (data.confirmations || []).map((c) => ({ ...c, params: null }))
            );
          } else if (name === "turn_interrupted") {
            ended = "interrupted";
            state.textContent = "Turn interrupted by a newer message.";
          } else if (name === "turn_failed") {
            ended = "failed";
            state.replaceWith(errorBox(data.error || data));
          }
        },
        controller.signal
      );
    } catch (e) {
      state.replaceWith(errorBox(e));
      return;
    }
    if (ended === "completed") {
      clear(live);
      await refresh();
    } else if (ended === "paused") {
      await refresh();
      clear(live);
    }
  }

  // Read first: a session this key may not see (SESSION_NOT_FOUND) shows
  // its error alone, not under an empty conversation and a message box.
  await refresh();
  put(main, 
    h("p", {}, h("a", { href: "#/sessions" }, "← Sessions")),
    header,
    h("div", { class: "conversation" }, h("div", { class: "thread" }, log, live, pending, form), side)
  );
  return () => {
    controller.abort();
    clearTimeout(timer);
  };
}

function renderHeader(el, s) {
  clear(el);
  put(el, 
    h("h1", {}, "Session ", h("code", {}, s.id)),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Agent"),
      h("dd", {}, s.agent),
      h("dt", {}, "User"),
      h("dd", {}, s.user_id || "—"),
      h("dt", {}, "Plan"),
      h("dd", {}, s.plan),
      h("dt", {}, "Created"),
      h("dd", {}, time(s.created_at)),
      parentOf(s),
      forkedFrom(s)
    )
  );
}

function sessionLink(id, text) {
  return h("a", { href: "#/sessions/" + encodeURIComponent(id), class: "session-link" }, text || id);
}

// A child session (an agent asked by another): who asked, linked.
function parentOf(s) {
  const by = s.metadata && s.metadata.delegated_by;
  if (!by || !by.session_id) return null;
  return [h("dt", {}, "Asked by"), h("dd", { class: "delegated-by" }, (by.agent || "an agent") + " in ", sessionLink(by.session_id))];
}

// A fork: the session and turn it was forked from, linked.
function forkedFrom(s) {
  const f = s.forked_from;
  if (!f) return null;
  return [h("dt", {}, "Forked from"), h("dd", { class: "forked-from" }, sessionLink(f.session_id), " after turn ", h("code", {}, f.turn_id))];
}

// What an agent tool did, from its record's outcome: the child asked
// (`ask_`, with a link to its session) or the handoff (`transfer_to_`).
function agentTool(name, record) {
  const out = (record && record.output) || {};
  if (name.startsWith("ask_")) {
    const child = out.session_id || out.delegated_to;
    if (!child) return null;
    return h("p", { class: "delegation" }, "Asked agent ", h("strong", {}, out.agent || name.slice(4)), ": ", sessionLink(child, "open its conversation"));
  }
  if (name.startsWith("transfer_to_") && out.transferred_to) {
    return h(
      "p",
      { class: "handoff" },
      "Handed over from ",
      h("strong", {}, out.from || "?"),
      " to ",
      h("strong", {}, out.transferred_to),
      out.reason ? " (" + out.reason + ")" : ""
    );
  }
  return null;
}

// A turn's typed answer: the parsed object its schema promised.
function typedAnswer(output) {
  return h("details", { class: "typed-answer", open: true }, h("summary", {}, "Typed answer (output)"), json(output));
}

// A turn that ended without an answer: its code, message and what refused it.
function failedTurn(t) {
  const e = t.error || {};
  const d = e.details || {};
  return h(
    "li",
    { class: "msg turn-failed", dataset: { turn: t.turn_id, code: e.code || "" } },
    h("span", { class: "role" }, "turn failed ", h("small", {}, time(t.updated_at))),
    h("p", { class: "error" }, (e.code || "FAILED") + ": " + (e.message || "")),
    d.guardrail ? h("p", { class: "muted" }, "Guardrail " + d.guardrail + " (" + d.stage + ")") : null,
    d.errors ? h("details", {}, h("summary", {}, "Schema errors"), json(d.errors)) : null
  );
}

function renderMessages(el, messages, records, turns, onFork) {
  clear(el);
  const byCall = new Map(records.filter((r) => r.tool_call_id).map((r) => [r.tool_call_id, r]));
  // Each turn's messages run from its first_seq to the next turn's.
  const sorted = [...(turns || [])].sort((a, b) => a.first_seq - b.first_seq);
  const typed = new Map();
  const failed = [];
  const forkAfter = new Map();
  sorted.forEach((t, i) => {
    const end = i + 1 < sorted.length ? sorted[i + 1].first_seq : Infinity;
    if (t.outcome && t.outcome.output !== undefined) {
      const last = messages.filter((m) => m.role === "assistant" && m.seq >= t.first_seq && m.seq < end).at(-1);
      if (last) typed.set(last.seq, t.outcome.output);
    }
    if (t.phase === "failed") failed.push(t);
    // A finished turn can be forked after its last message.
    const own = messages.filter((m) => m.seq >= t.first_seq && m.seq < end);
    if (FINAL.has(t.phase) && own.length) forkAfter.set(own.at(-1).seq, t.turn_id);
  });
  const failedAfter = (seq, next) => failed.filter((t) => t.first_seq >= seq && t.first_seq < next);
  if (messages.length) for (const t of failedAfter(-Infinity, messages[0].seq)) put(el, failedTurn(t));
  messages.forEach((m, i) => {
    renderMessage(el, m, byCall, typed);
    if (onFork && forkAfter.has(m.seq)) put(el, forkButton(forkAfter.get(m.seq), onFork));
    const next = i + 1 < messages.length ? messages[i + 1].seq : Infinity;
    for (const t of failedAfter(m.seq, next)) put(el, failedTurn(t));
  });
  if (!messages.length) for (const t of failed) put(el, failedTurn(t));
  if (!el.children.length) put(el, h("li", { class: "muted" }, "No messages yet: send the first one below."));
}

function forkButton(turnId, onFork) {
  const button = h("button", { type: "button", class: "fork", title: "A new session with the history up to here" }, "Fork from here");
  button.onclick = () => onFork(turnId, button);
  return h("li", { class: "fork-point", dataset: { turn: turnId } }, button);
}

function renderMessage(el, m, byCall, typed) {
  {
    if (m.role === "tool" || m.role === "system") return;
    const asked = m.tool_calls || [];
    const li = h(
      "li",
      { class: "msg " + m.role + (m.rolled_back ? " rolled-back" : ""), dataset: { seq: m.seq } },
      h("span", { class: "role" }, m.role, " ", h("small", {}, "#" + m.seq + " · " + time(m.created_at))),
      asked.length
        ? h("ul", { class: "calls", "aria-label": "Tool calls" }, asked.map((c) => callItem(c, byCall.get(c.id))))
        : null,
      m.content ? h("div", { class: "content" }, typeof m.content === "string" ? m.content : JSON.stringify(m.content)) : null,
      typed.has(m.seq) ? typedAnswer(typed.get(m.seq)) : null
    );
    put(el, li);
  }
}

function callItem(asked, record) {
  const fn = asked.function || asked;
  const name = fn.name || (record && record.tool_name);
  let args = fn.arguments;
  try {
    args = typeof args === "string" ? JSON.parse(args) : args;
  } catch {
    /* shown as sent */
  }
  if (!record) {
    return h(
      "li",
      { class: "call pending", dataset: { call: asked.id, tool: name } },
      h("strong", {}, name),
      " ",
      h("span", { class: "badge" }, "no outcome (waiting or not run)"),
      json(args)
    );
  }
  const cached = record.cached === true;
  const st = callState(record);
  return h(
    "li",
    { class: "call " + CALL_CLASS[st], dataset: { call: asked.id, tool: name } },
    h("strong", {}, name),
    " ",
    h("span", { class: "badge" }, CALL_BADGE[st]),
    h(
      "dl",
      { class: "facts small" },
      record.error_type ? [h("dt", {}, "Error type"), h("dd", {}, record.error_type)] : null,
      h("dt", {}, "Time"),
      h("dd", {}, record.execution_time_ms + " ms"),
      h("dt", {}, "Attempts"),
      h("dd", {}, String(record.attempts)),
      h("dt", {}, "Cached"),
      h("dd", {}, cached ? "yes" : "no"),
      record.source_id ? [h("dt", {}, "Source"), h("dd", {}, h("code", {}, record.source_id))] : null
    ),
    agentTool(name, record),
    h("details", {}, h("summary", {}, "Arguments"), json(args)),
    record.error ? h("p", { class: "error" }, record.error) : null,
    record.output !== null && record.output !== undefined
      ? h("details", {}, h("summary", {}, "Outcome"), json(record.output))
      : null
  );
}

function renderSide(el, s) {
  clear(el);
  const u = s.tool_usage_summary || {};
  const t = s.token_usage || {};
  put(el, 
    h("h2", {}, "Summary"),
    s.conversation_summary
      ? [h("p", {}, s.conversation_summary), h("p", { class: "muted" }, "Covers messages up to #" + s.covers_until_seq)]
      : h("p", { class: "muted" }, "No rolling summary yet."),
    h("h2", {}, "Tool usage"),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Calls"),
      h(
        "dd",
        {},
        `${u.total_calls || 0} (${u.successful_calls || 0} ok, ${u.failed_calls || 0} failed` +
          (u.pending_calls ? `, ${u.pending_calls} pending approval` : "") +
          (u.declined_calls ? `, ${u.declined_calls} declined` : "") +
          ")"
      ),
      Object.entries(u.tool_usage || {}).map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))])
    ),
    h("h2", {}, "Tokens"),
    h(
      "dl",
      { class: "facts" },
      h("dt", {}, "Prompt"),
      h("dd", {}, String(t.prompt_tokens || 0)),
      h("dt", {}, "Completion"),
      h("dd", {}, String(t.completion_tokens || 0)),
      h("dt", {}, "Model calls"),
      h("dd", {}, String(t.model_calls || 0)),
      (s.delegated_token_usage || {}).model_calls
        ? [
            h("dt", {}, "Asked agents"),
            h("dd", {}, `${s.delegated_token_usage.total_tokens || 0} tokens in ${plural(s.delegated_token_usage.model_calls, "model call")}`),
          ]
        : null
    ),
    h("p", { class: "muted" }, `${plural(s.message_count, "message")}, ${plural(s.turns, "turn")}; last activity ${time(s.last_activity_at)}`)
  );
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}
