// Small DOM helpers: elements are built with `h`, never from HTML strings,
// so text from the API is always text (no markup injection).

/// `h("div", {class: "x", onclick: f}, child, "text", [more])`.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "value") el.value = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

/// An SVG element (namespaced); same arguments as `h`.
export function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) el.setAttribute(k, v);
  }
  append(el, children);
  return el;
}

/// Appends children to `el` as `h` does: arrays flattened, null and false
/// skipped (the DOM's own `append` would write "null").
export function put(el, ...children) {
  append(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

/// JSON, indented, as a `<pre>`.
export function json(value, attrs) {
  return h("pre", { class: "json", ...attrs }, JSON.stringify(value, null, 2));
}

/// A readable local time from an RFC 3339 string.
export function time(s) {
  if (!s) return "";
  const d = new Date(s);
  return isNaN(d) ? s : d.toLocaleString();
}

/// An error box (role=alert) for a failed request.
export function errorBox(e) {
  const code = e && e.code ? e.code + ": " : "";
  return h("p", { class: "error", role: "alert" }, code + (e && e.message ? e.message : String(e)));
}

let ids = 0;

/// A labelled form control: `<div class="field"><label for>…</label>
/// control <small>hint</small></div>`, the hint tied to the control with
/// `aria-describedby`. The label does not wrap the control, so a select's
/// options do not become part of its name.
export function field(label, control, hint) {
  if (!control.id) control.id = "c" + ++ids;
  const note = hint ? h("small", { id: control.id + "-hint" }, hint) : null;
  if (note) control.setAttribute("aria-describedby", note.id);
  return h("div", { class: "field" }, h("label", { for: control.id }, label), control, note);
}
