// The console's calls to the HTTP API (docs/http.md): JSON requests with the signed-in user's
// bearer token, newline-delimited JSON streams, and the Server-Sent Events of a session.
//
// The token lives in sessionStorage (this tab only, gone when it closes) and travels only in the
// Authorization header: the API never reads a cookie, so no other site can act as the user.
// Every answer is asked for with json_names=proto: records then carry the field names the
// journal's content_hash is computed over, and the browser can recompute it (chain.js).

const TOKEN_KEY = "agentsessions.token";
const API = "/api/v1";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra = {}) {
  const all = { Accept: "application/json", ...extra };
  const bearer = token();
  if (bearer) all.Authorization = `Bearer ${bearer}`;
  return all;
}

function url(path, query = {}) {
  const params = new URLSearchParams({ json_names: "proto" });
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== "") params.set(key, String(value));
  }
  return `${API}${path}?${params}`;
}

async function failure(response) {
  let code = "UNKNOWN";
  let message = `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body && body.error) ({ code, message } = body.error);
  } catch {
    // not a JSON error body: keep the HTTP status
  }
  return new ApiError(response.status, code, message);
}

export async function get(path, query) {
  const response = await fetch(url(path, query), { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function post(path, body = {}) {
  const response = await fetch(url(path), {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// A streaming POST (Exec): calls onItem with each JSON line; a last {"error": ...} line throws.
export async function postLines(path, body, onItem, signal) {
  const response = await fetch(url(path), {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "application/x-ndjson" }),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await failure(response);
  for await (const line of lines(response.body)) {
    const item = JSON.parse(line);
    if (item.error) throw new ApiError(200, item.error.code, item.error.message);
    onItem(item);
  }
}

async function* lines(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += value;
    let newline;
    while ((newline = buffered.indexOf("\n")) >= 0) {
      const line = buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
      if (line.trim()) yield line;
    }
  }
  if (buffered.trim()) yield buffered;
}

// Follows /sessions/{uid}/events: onEvent(name, data, id) for each event. When a stream ends it
// reconnects after the server's retry interval with Last-Event-ID, so each record arrives once
// and in order. fetch (not EventSource) because EventSource cannot send the Authorization header.
export class Follower {
  constructor(uid, { onEvent, onError, onState }) {
    this.uid = uid;
    this.onEvent = onEvent;
    this.onError = onError;
    this.onState = onState || (() => {});
    this.lastEventId = "";
    this.retryMs = 2000;
    this.controller = new AbortController();
    this.stopped = false;
  }

  start() {
    this.run();
    return this;
  }

  stop() {
    this.stopped = true;
    this.controller.abort();
  }

  async run() {
    while (!this.stopped) {
      try {
        const extra = { Accept: "text/event-stream" };
        if (this.lastEventId) extra["Last-Event-ID"] = this.lastEventId;
        const response = await fetch(url(`/sessions/${encodeURIComponent(this.uid)}/events`, { deltas: "true" }), {
          headers: headers(extra),
          signal: this.controller.signal,
        });
        if (!response.ok) {
          // 401, 403, 404: reconnecting changes nothing until the user does something.
          this.onError(await failure(response));
          return;
        }
        this.onState("live");
        await this.read(response.body);
        this.onState("waiting");
      } catch (error) {
        if (this.stopped) return;
        this.onState("reconnecting");
      }
      await new Promise((resolve) => setTimeout(resolve, this.retryMs));
    }
  }

  async read(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffered += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        this.dispatch(buffered.slice(0, end));
        buffered = buffered.slice(end + 2);
      }
    }
  }

  dispatch(block) {
    let name = "message";
    let id = null;
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") name = value;
      else if (field === "data") data.push(value);
      else if (field === "id") id = value;
      else if (field === "retry" && /^\d+$/.test(value)) this.retryMs = Number(value);
    }
    if (id !== null) this.lastEventId = id;
    if (data.length) this.onEvent(name, JSON.parse(data.join("\n")), id);
  }
}
