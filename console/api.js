// The console's one way to the server: the public v1 API, with the key from
// this tab's session storage as `Authorization: Bearer` (none in open mode).
// Streams (turns, run events, runtime events) are Server-Sent Events read
// with fetch, since EventSource can neither POST nor send the header.

const KEY = "cadre.console.key";

export function key() {
  return sessionStorage.getItem(KEY) || "";
}

export function setKey(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, body) {
    const e = body && body.error ? body.error : {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "HTTP_" + status;
    this.details = e.details;
  }
}

function headers(extra) {
  const h = { ...extra };
  const k = key();
  if (k) h.Authorization = "Bearer " + k;
  return h;
}

/// A JSON request; resolves to `{status, body}`, throws ApiError on 4xx/5xx.
export async function call(method, path, body) {
  const init = { method, headers: headers({ Accept: "application/json" }) };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = { raw: text };
  }
  if (!response.ok) {
    if (response.status === 401) window.dispatchEvent(new CustomEvent("cadre:unauthorized"));
    throw new ApiError(response.status, json);
  }
  return { status: response.status, body: json };
}

export const get = (path) => call("GET", path).then((r) => r.body);
export const post = (path, body) => call("POST", path, body);

/// Query string from an object, skipping empty values.
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, v);
  }
  const s = q.toString();
  return s ? "?" + s : "";
}

/// Reads a Server-Sent Events response: calls `onEvent(name, data)` per
/// event (data parsed as JSON when it is). Resolves when the stream ends or
/// `signal` aborts it. `onOpen` (optional) runs once the server accepted it.
export async function stream(method, path, body, onEvent, signal, onOpen) {
  const init = { method, headers: headers({ Accept: "text/event-stream" }), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    let json = null;
    try {
      json = await response.json();
    } catch {
      /* not JSON */
    }
    if (response.status === 401) window.dispatchEvent(new CustomEvent("cadre:unauthorized"));
    throw new ApiError(response.status, json);
  }
  if (onOpen) onOpen();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const val = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") name = val;
          else if (field === "data") data.push(val);
        }
        if (!data.length) continue;
        const text = data.join("\n");
        let parsed = text;
        try {
          parsed = JSON.parse(text);
        } catch {
          /* plain text */
        }
        onEvent(name, parsed);
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") throw e;
  }
}

/// The status of a cheap authenticated read with the current key, without
/// raising the "unauthorized" signal: how sign-in checks a key.
export async function probe() {
  const response = await fetch("/v1/sessions?limit=1", { headers: headers({ Accept: "application/json" }) });
  return response.status;
}
