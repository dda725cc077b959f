// The console's shell: sign-in, the hash router and the header.
//
// location.hash ──route──▶ one view module (sessions, conversation, workflows, schedules, memory, tools, live)
//                              └──▶ api.js (v1 API, Bearer key from session storage)
//
// A view is `async (main, ...params) => cleanup?`; the cleanup (abort a
// stream, stop a timer) runs when the route changes.

import * as api from "./api.js";
import { h, put, clear, errorBox, field } from "./dom.js";
import { sessionsView } from "./sessions.js";
import { conversationView } from "./conversation.js";
import { workflowsView, workflowView, runView } from "./workflows.js";
import { schedulesView } from "./schedules.js";
import { memoryView } from "./memory.js";
import { toolsView, toolView } from "./tools.js";
import { liveView } from "./live.js";

const main = document.getElementById("main");
let cleanup = null;

const routes = [
  [/^#\/sessions\/([^/]+)$/, conversationView],
  [/^#\/sessions$/, sessionsView],
  [/^#\/workflows\/runs\/([^/]+)$/, runView],
  [/^#\/workflows\/([^/]+)$/, workflowView],
  [/^#\/workflows$/, workflowsView],
  [/^#\/schedules$/, schedulesView],
  [/^#\/memory$/, memoryView],
  [/^#\/tools\/([^/]+)$/, toolView],
  [/^#\/tools$/, toolsView],
  [/^#\/live$/, liveView],
];

/// Whether this tab was let in (with its key, or with none in open mode):
/// the header says "open mode" only when the server let a keyless tab in.
let admitted = false;

/// Whether the stored key (or none, in open mode) is let in.
async function signedIn() {
  const status = await api.probe();
  admitted = !(status === 401 || status === 403);
  if (!admitted) return false;
  if (status >= 400) throw new api.ApiError(status, null);
  return true;
}

function signInView(message) {
  clear(main);
  document.title = "Sign in · cadre console";
  const input = h("input", {
    id: "key",
    name: "key",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    placeholder: "cadre_…",
    required: true,
  });
  const status = h("div", { "aria-live": "polite" });
  const form = h(
    "form",
    {
      class: "card signin",
      onsubmit: async (ev) => {
        ev.preventDefault();
        api.setKey(input.value.trim());
        clear(status);
        try {
          if (await signedIn()) {
            showWho();
            if (!location.hash || location.hash === "#/signin") location.hash = "#/sessions";
            else route();
          } else {
            api.setKey("");
            put(status, errorBox({ message: "This key is not accepted (unknown, revoked or expired)." }));
          }
        } catch (e) {
          put(status, errorBox(e));
        }
      },
    },
    h("h1", {}, "Sign in"),
    h(
      "p",
      {},
      "Paste an API key (",
      h("code", {}, "cadre keys create"),
      "). It stays in this tab's session storage and is sent as ",
      h("code", {}, "Authorization: Bearer"),
      " to the v1 API only."
    ),
    message ? errorBox({ message }) : null,
    field("API key", input),
    h("button", { type: "submit" }, "Sign in"),
    status
  );
  put(main, form);
  input.focus();
}

/// Runs the current view's cleanup (its timers and streams stop): on a
/// route change, and when the tab signs out (the view's timer would
/// otherwise go on asking the API without a key).
function leave() {
  if (cleanup) {
    try {
      cleanup();
    } catch {
      /* a view's cleanup does not stop the next */
    }
    cleanup = null;
  }
}

async function route() {
  leave();
  const hash = location.hash || "#/sessions";
  for (const a of document.querySelectorAll("nav a")) {
    const current = hash.startsWith("#/" + a.dataset.view);
    if (current) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const match = routes.find(([re]) => re.test(hash));
  if (!match) {
    location.hash = "#/sessions";
    return;
  }
  const [re, view] = match;
  const params = hash.match(re).slice(1).map(decodeURIComponent);
  clear(main);
  try {
    cleanup = (await view(main, ...params)) || null;
  } catch (e) {
    if (e.status === 401) return;
    put(main, errorBox(e));
  }
}

function showWho() {
  const who = document.getElementById("who");
  const out = document.getElementById("signout");
  const k = api.key();
  who.textContent = !admitted ? "not signed in" : k ? "key " + k.slice(0, 14) + "…" : "no key (open mode)";
  out.hidden = !k;
}

window.addEventListener("cadre:unauthorized", () => {
  leave();
  admitted = false;
  api.setKey("");
  showWho();
  signInView("Sign in with an API key: this server asks for one.");
});

document.getElementById("signout").addEventListener("click", () => {
  leave();
  admitted = false;
  api.setKey("");
  showWho();
  signInView();
});

// The skip link moves focus without touching the hash (the router's).
document.querySelector(".skip").addEventListener("click", (ev) => {
  ev.preventDefault();
  main.focus();
});

window.addEventListener("hashchange", () => {
  showWho();
  route();
});

(async () => {
  showWho();
  try {
    const inside = await signedIn();
    showWho();
    if (inside) route();
    else signInView();
  } catch (e) {
    put(main, errorBox(e));
  }
})();
