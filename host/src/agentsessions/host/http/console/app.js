// The web console: the sessions of a project (by state, a page at a time) and one session's
// timeline, live tail, pending approval, fork tree and usage. Plain DOM; every value from the
// journal goes in as text (textContent), never as markup. docs/console.md says what it shows.

import * as api from "./api.js";
import { Chain, canHash } from "./chain.js";
import * as rec from "./records.js";

const STATES = ["", "PENDING", "RUNNING", "AWAITING", "COMPLETED", "FAILED", "CANCELED"];
const view = document.getElementById("view");
const signin = document.getElementById("signin");
const notice = document.getElementById("notice");
const STREAM_STATES = {
  live: "● following the journal",
  waiting: "○ up to date; looking again shortly",
  reconnecting: "○ reconnecting…",
};
let current = null; // what the shown page must release when another is shown

// -- a few DOM helpers -------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function link(uid, text) {
  return h("a", { href: `#/session/${encodeURIComponent(uid)}`, text: text || uid });
}

function say(message, kind = "info") {
  notice.replaceChildren(message ? h("p", { class: `notice ${kind}`, role: "status", text: message }) : "");
}

function sayError(error) {
  if (error instanceof api.ApiError) {
    const hint = error.status === 401 ? " Sign in with a token of this host (top right)." : "";
    say(`${error.code} (HTTP ${error.status}): ${error.message}.${hint}`, "error");
    if (error.status === 401) renderSignin(true);
  } else {
    say(String(error), "error");
  }
}

function badge(state) {
  const name = rec.stateName(state);
  return h("span", { class: `state state-${name}`, text: name });
}

function when(stamp) {
  return stamp ? stamp.replace("T", " ").replace(/\.\d+Z$/, "Z") : "-";
}

// -- signing in ---------------------------------------------------------------------------------

function renderSignin(open = false) {
  if (api.token() && !open) {
    signin.replaceChildren(
      h("span", { class: "who", text: "signed in with a token" }),
      h("button", { type: "button", id: "sign-out", onclick: () => { api.setToken(""); renderSignin(); route(); } }, "Sign out"),
    );
    return;
  }
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", placeholder: "bearer token", size: 28 });
  signin.replaceChildren(
    h("form", {
      id: "sign-in",
      onsubmit: (event) => {
        event.preventDefault();
        api.setToken(input.value.trim());
        say("");
        renderSignin();
        route();
      },
    }, h("label", { for: "token", text: "Token " }), input, h("button", { type: "submit" }, "Sign in")),
  );
}

// -- the list of sessions ------------------------------------------------------------------------

function listHash(params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value) query.set(key, value);
  return `#/sessions?${query}`;
}

async function showList(params) {
  const project = params.get("project") || "";
  const state = params.get("state") || "";
  const pageSize = params.get("page_size") || "25";
  const pageToken = params.get("page_token") || "";
  const previous = (params.get("previous") || "").split(",").filter((t) => t !== "");

  const projectInput = h("input", { id: "project", name: "project", value: project, placeholder: "the host's default project", size: 24 });
  const stateSelect = h("select", { id: "state", name: "state" },
    STATES.map((name) => h("option", { value: name, selected: name === state }, name || "every state")));
  const sizeSelect = h("select", { id: "page-size", name: "page_size" },
    ["10", "25", "50", "100"].map((size) => h("option", { value: size, selected: size === pageSize }, `${size} a page`)));
  const filters = h("form", {
    class: "filters",
    onsubmit: (event) => {
      event.preventDefault();
      location.hash = listHash({ project: projectInput.value.trim(), state: stateSelect.value, page_size: sizeSelect.value });
    },
  }, h("label", {}, "Project ", projectInput), h("label", {}, "State ", stateSelect), sizeSelect, h("button", { type: "submit" }, "Show"));

  const table = h("tbody", { id: "sessions" });
  const summary = h("p", { class: "summary", id: "summary", text: "loading…" });
  const paging = h("nav", { class: "paging" });
  view.replaceChildren(
    h("h1", { text: "Sessions" }),
    filters,
    summary,
    h("table", { class: "sessions" },
      h("thead", {}, h("tr", {}, ["Session", "Name", "State", "Compute", "Last seq", "Harness", "Forked from", "Updated"].map((t) => h("th", { text: t })))),
      table),
    paging,
    createForm(project),
  );

  let page;
  try {
    page = await api.get("/sessions", { project, state, page_size: pageSize, page_token: pageToken });
  } catch (error) {
    summary.textContent = "";
    sayError(error);
    return;
  }
  const sessions = page.sessions || [];
  const counts = new Map();
  for (const session of sessions) {
    const name = rec.stateName(session.exec_state);
    counts.set(name, (counts.get(name) || 0) + 1);
    table.append(h("tr", { "data-uid": session.metadata.uid },
      h("td", {}, link(session.metadata.uid)),
      h("td", { text: session.metadata.name || "" }),
      h("td", {}, badge(session.exec_state)),
      h("td", { text: rec.computeName(session.compute_state) }),
      h("td", { class: "num", text: session.last_seq || "0" }),
      h("td", { text: session.harness || "" }),
      h("td", {}, session.parent_uid ? [link(session.parent_uid), ` at seq ${session.fork_seq || 0}`] : ""),
      h("td", { text: when(session.metadata.update_time) })));
  }
  const byState = [...counts].map(([name, n]) => `${name} ${n}`).join(" · ");
  const where = `project ${sessions[0] ? sessions[0].metadata.project : project || "(the host's default)"}`;
  summary.textContent = sessions.length
    ? `${sessions.length} session(s) on this page, ${where}: ${byState}`
    : `No sessions on this page (${where}${state ? `, state ${state}` : ""}).`;

  const base = { project, state, page_size: pageSize };
  if (pageToken) {
    paging.append(h("a", { href: listHash(base), id: "first-page" }, "First page"), " ");
    paging.append(h("a", {
      href: listHash({ ...base, page_token: previous.at(-1) || "", previous: previous.slice(0, -1).join(",") }),
      id: "previous-page",
    }, "← Previous"), " ");
  }
  if (page.next_page_token) {
    paging.append(h("a", {
      href: listHash({ ...base, page_token: page.next_page_token, previous: [...previous, pageToken].join(",") }),
      id: "next-page",
    }, "Next page →"));
  }
}

function createForm(project) {
  const harness = h("input", { id: "new-harness", placeholder: "echo", size: 12 });
  const name = h("input", { id: "new-name", placeholder: "name", size: 16 });
  return h("form", {
    class: "create",
    onsubmit: async (event) => {
      event.preventDefault();
      try {
        const body = { session: { harness: harness.value.trim(), metadata: { name: name.value.trim(), project } } };
        const session = await api.post("/sessions", body);
        location.hash = `#/session/${encodeURIComponent(session.metadata.uid)}`;
      } catch (error) {
        sayError(error);
      }
    },
  }, h("h2", { text: "New session" }), h("label", {}, "Harness ", harness), h("label", {}, "Name ", name), h("button", { type: "submit" }, "Create"));
}

// -- one session ---------------------------------------------------------------------------------

// Subagents (docs/subagents.md): a child of a task call names its parent in its labels.
const SUBAGENT_PARENT = "agentsessions.io/subagent-parent";
const SUBAGENT_CALL = "agentsessions.io/subagent-call";

function subagentParent(session) {
  return (session.labels || {})[SUBAGENT_PARENT] || "";
}

// The session this one came from: its fork parent, or the parent whose task call started it.
function parentOf(session) {
  return session.parent_uid || subagentParent(session);
}

// How a session came from its parent, as its parent's line in the tree says it.
function linkText(session) {
  if (subagentParent(session)) return `delegated task ${(session.labels || {})[SUBAGENT_CALL] || ""} to it`;
  return `forked at seq ${session.fork_seq || 0}`;
}

function childText(child) {
  if (subagentParent(child)) return `subagent of task ${(child.labels || {})[SUBAGENT_CALL] || ""}`;
  return `from seq ${child.fork_seq || 0}`;
}

class SessionPage {
  constructor(uid) {
    this.uid = uid;
    this.session = null;
    this.records = new Map(); // seq -> record
    this.shown = new Set(); // the seqs drawn in the timeline
    this.rendered = 0; // the highest of them
    this.chain = new Chain();
    this.follower = null;
    this.tail = "";
    this.forksShown = false;
    this.parts = {
      header: h("section", { id: "session-header" }),
      chain: h("p", { id: "chain", class: "chain", text: "chain: waiting for records" }),
      approval: h("section", { id: "approval" }),
      turn: this.turnForm(),
      tail: h("pre", { id: "live-tail", class: "tail", hidden: true }),
      forks: h("section", { id: "forks" }),
      usage: h("section", { id: "usage" }),
      timeline: h("tbody", { id: "timeline" }),
      stream: h("span", { id: "stream-state", class: "stream" }),
    };
  }

  async show() {
    const p = this.parts;
    view.replaceChildren(
      h("p", {}, h("a", { href: "#/" }, "← Sessions"), " ", p.stream),
      p.header, p.chain, p.approval, p.tail, p.turn,
      h("h2", { text: "Timeline" }),
      h("table", { class: "timeline" },
        h("thead", {}, h("tr", {}, ["Seq", "Kind", "Actor", "What happened", "Hash", "Chain"].map((t) => h("th", { text: t })))),
        p.timeline),
      h("div", { class: "side" }, p.forks, p.usage),
    );
    try {
      this.setSession(await api.get(`/sessions/${encodeURIComponent(this.uid)}`));
    } catch (error) {
      sayError(error);
      return;
    }
    this.follower = new api.Follower(this.uid, {
      onEvent: (name, data) => this.onEvent(name, data),
      onError: (error) => sayError(error),
      onState: (state) => { p.stream.textContent = STREAM_STATES[state] || state; },
    }).start();
  }

  release() {
    if (this.follower) this.follower.stop();
  }

  onEvent(name, data) {
    if (name === "record") this.addRecords([data]);
    else if (name === "session") this.setSession(data);
    else if (name === "delta") this.addDelta(data);
    else if (name === "error") say(`${data.error.code}: ${data.error.message}`, "error");
  }

  setSession(session) {
    this.session = session;
    this.renderHeader();
    this.renderApproval();
    if (!this.forksShown) {
      this.forksShown = true;
      this.renderForks();
    }
    this.renderChain();
  }

  addDelta(delta) {
    if (delta.chunk) this.tail += delta.chunk;
    this.parts.tail.hidden = !this.tail;
    this.parts.tail.textContent = this.tail ? `▸ ${this.tail}` : "";
  }

  addRecords(records) {
    let fresh = false;
    for (const record of records) {
      const seq = Number(record.seq);
      if (!this.records.has(seq)) {
        this.records.set(seq, record);
        fresh = true;
        // the output a turn streamed is now a record of its own
        if (record.event && record.event.kind === "EVENT_OUTPUT") this.tail = "";
      }
    }
    if (!fresh) return;
    this.parts.tail.hidden = !this.tail;
    this.renderTimeline();
    this.renderUsage();
    if (this.session && this.session.pending_approval) this.renderApproval();
    this.chain.take(this.records).then(() => {
      this.renderMarks();
      this.renderChain();
    });
  }

  renderHeader() {
    const s = this.session;
    const m = s.metadata;
    const rows = [
      ["Session", m.uid],
      ["Project", m.project],
      ["Harness", s.harness || "-"],
      ["Model", s.model || "-"],
      ["Compute", rec.computeName(s.compute_state)],
      ["Last seq", s.last_seq || "0"],
      ["Created", when(m.create_time)],
      ["Identity", s.identity ? rec.actorName(s.identity) : "-"],
    ];
    if (s.labels) rows.push(["Labels", Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(", ")]);
    this.parts.header.replaceChildren(
      h("h1", {}, m.name || m.uid, " ", h("span", { id: "session-state" }, badge(s.exec_state))),
      h("dl", { class: "meta" }, rows.map(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })])),
      this.actions(),
    );
  }

  actions() {
    const s = this.session;
    const busy = ["EXEC_RUNNING", "EXEC_AWAITING"].includes(s.exec_state);
    const at = h("input", { id: "fork-at", type: "number", min: "0", value: s.last_seq || "0", size: 6 });
    return h("div", { class: "actions" },
      busy ? h("button", { type: "button", id: "cancel-turn", onclick: () => this.act("cancel", {}) }, "Cancel turn") : "",
      h("form", {
        class: "fork",
        onsubmit: async (event) => {
          event.preventDefault();
          try {
            const answer = await api.post(`/sessions/${encodeURIComponent(this.uid)}/fork`, { at_seq: at.value, count: 1 });
            const child = answer.children[0].metadata.uid;
            say(`forked ${child} at seq ${at.value}`);
            location.hash = `#/session/${encodeURIComponent(child)}`;
          } catch (error) {
            sayError(error);
          }
        },
      }, h("label", {}, "Fork at seq ", at), h("button", { type: "submit" }, "Fork")));
  }

  async act(verb, body) {
    try {
      this.setSession(await api.post(`/sessions/${encodeURIComponent(this.uid)}/${verb}`, body));
    } catch (error) {
      sayError(error);
    }
  }

  renderChain() {
    const node = this.parts.chain;
    const last = Number((this.session && this.session.last_seq) || 0);
    if (!canHash()) {
      this.verifyOnHost(node);
      return;
    }
    const { count, head, failure } = this.chain;
    node.className = "chain";
    if (failure) {
      node.classList.add("broken");
      node.textContent = `✗ chain broken at seq ${failure.seq}: ${failure.why}`;
    } else if (count === 0 && last === 0) {
      node.textContent = "chain: no records yet";
    } else if (count < last) {
      node.textContent = `chain: ${count} of ${last} records verified so far…`;
    } else {
      node.classList.add("verified");
      node.textContent = `✓ chain verified in this browser: ${count} records from genesis, head ${head.slice(0, 16)}…`;
    }
  }

  async verifyOnHost(node) {
    try {
      const check = await api.get(`/sessions/${encodeURIComponent(this.uid)}/verify`);
      node.className = `chain ${check.verified ? "verified" : "broken"}`;
      node.textContent = check.verified
        ? `✓ chain verified by the host: ${check.records} records from genesis (this page cannot hash: not https or loopback)`
        : `✗ chain broken at seq ${check.failedSeq}: ${check.why}`;
    } catch (error) {
      sayError(error);
    }
  }

  renderTimeline() {
    const body = this.parts.timeline;
    const seqs = [...this.records.keys()].sort((x, y) => x - y);
    const all = seqs.map((seq) => this.records.get(seq));
    const unshown = seqs.filter((seq) => !this.shown.has(seq));
    if (unshown.length && unshown[0] < this.rendered) {
      // a record older than the last one shown (a reconnect filled a gap): draw again in order
      body.replaceChildren();
      this.shown.clear();
      this.rendered = 0;
    }
    for (const seq of seqs) {
      if (this.shown.has(seq)) continue;
      const record = this.records.get(seq);
      const event = record.event || {};
      body.append(h("tr", { "data-seq": seq, class: `kind-${rec.kindName(event)}` },
        h("td", { class: "num", text: seq }),
        h("td", { class: "kind", text: rec.kindName(event) }),
        h("td", { class: "actor", text: event.actor ? rec.actorName(event.actor) : "" }),
        h("td", { class: "detail", text: rec.detail(record, all) }),
        h("td", {}, h("code", { title: record.content_hash, text: (record.content_hash || "").slice(0, 12) })),
        h("td", { class: "mark", "data-mark": seq })));
      this.shown.add(seq);
      this.rendered = Math.max(this.rendered, seq);
    }
    this.renderMarks();
  }

  renderMarks() {
    for (const [seq, ok] of this.chain.checked) {
      const cell = this.parts.timeline.querySelector(`[data-mark="${seq}"]`);
      if (cell) cell.textContent = ok ? "✓" : "✗";
    }
  }

  renderApproval() {
    const node = this.parts.approval;
    const pending = this.session && this.session.pending_approval;
    if (!pending) {
      node.replaceChildren();
      return;
    }
    const all = [...this.records.values()];
    const tool = rec.toolOf(all, pending.tool_call_id);
    const request = this.records.get(Number(pending.request_seq));
    const reasonText = request && request.event.approval ? request.event.approval.reason : "";
    const reason = h("input", { id: "approval-reason", placeholder: "reason (journaled with the decision)", size: 40 });
    const decide = (approved) => async () => {
      for (const button of node.querySelectorAll("button")) button.disabled = true;
      try {
        const answer = await api.post(`/sessions/${encodeURIComponent(this.uid)}/approve`, {
          execution_id: pending.execution_id,
          tool_call_id: pending.tool_call_id,
          request_seq: pending.request_seq,
          approved,
          reason: reason.value,
        });
        this.addRecords([answer.decision]);
        this.setSession(answer.session);
        const actor = rec.actorName(answer.decision.event.actor);
        say(`${approved ? "Approved" : "Denied"} by ${actor} (seq ${answer.decision.seq}); continuing the turn…`);
        await this.continueTurn([]);
      } catch (error) {
        sayError(error);
        for (const button of node.querySelectorAll("button")) button.disabled = false;
      }
    };
    node.replaceChildren(h("div", { class: "approval" },
      h("h2", { text: `${tool ? tool.tool : "A tool call"} awaits approval` }),
      tool ? h("pre", { class: "args", text: JSON.stringify(tool.args || {}, null, 2) }) : "",
      h("p", { text: `call ${pending.tool_call_id}, request #${pending.request_seq}${reasonText ? `: ${reasonText}` : ""}` }),
      reason,
      h("div", { class: "buttons" },
        h("button", { type: "button", id: "approve", class: "approve", onclick: decide(true) }, "Approve"),
        h("button", { type: "button", id: "deny", class: "deny", onclick: decide(false) }, "Deny"))));
  }

  turnForm() {
    const text = h("textarea", { id: "turn-input", rows: 2, cols: 60, placeholder: "an input for the next turn" });
    return h("form", {
      id: "turn",
      class: "turn",
      onsubmit: async (event) => {
        event.preventDefault();
        const input = text.value.trim();
        if (!input) return;
        text.value = "";
        await this.continueTurn([{ role: "user", parts: [{ text: { text: input } }] }]);
      },
    }, text, h("button", { type: "submit" }, "Run turn"));
  }

  // A turn (or the rest of a parked one, with no inputs), submitted: it runs on the host without
  // this page, whose event stream shows its records as they are written.
  async continueTurn(inputs) {
    const path = `/sessions/${encodeURIComponent(this.uid)}`;
    try {
      await api.post(`${path}/submit`, { exec: { session: this.uid, inputs } });
      say("");
    } catch (error) {
      sayError(error);
    }
  }

  async renderForks() {
    const node = this.parts.forks;
    const s = this.session;
    const line = [];
    const chain = [];
    let parent = parentOf(s);
    let how = linkText(s);
    try {
      for (let depth = 0; parent && depth < 20; depth += 1) {
        const up = await api.get(`/sessions/${encodeURIComponent(parent)}`);
        chain.unshift([up, how]);
        parent = parentOf(up);
        how = linkText(up);
      }
    } catch (error) {
      line.push(h("li", { text: `parent ${parent}: ${error.message}` }));
    }
    const children = [];
    try {
      let token = "";
      for (let pages = 0; pages < 10; pages += 1) {
        const page = await api.get("/sessions", { project: s.metadata.project, page_size: 100, page_token: token });
        for (const other of page.sessions || []) if (parentOf(other) === this.uid) children.push(other);
        token = page.next_page_token;
        if (!token) break;
      }
    } catch (error) {
      sayError(error);
    }
    for (const [ancestor, text] of chain) {
      line.push(h("li", {}, link(ancestor.metadata.uid, ancestor.metadata.name || ancestor.metadata.uid), ` ${text}`));
    }
    const self = h("li", { class: "self" }, h("strong", { text: s.metadata.name || s.metadata.uid }));
    if (children.length) {
      self.append(h("ul", { id: "children" }, children.map((child) =>
        h("li", {}, link(child.metadata.uid, child.metadata.name || child.metadata.uid), ` ${childText(child)}`))));
    }
    line.push(self);
    node.replaceChildren(h("h2", { text: "Fork tree" }),
      chain.length || children.length ? h("ul", { class: "tree" }, line) : h("p", { text: "Not forked, no forks." }));
  }

  renderUsage() {
    const models = rec.usageByModel(this.records.values());
    const rows = [...models].map(([model, u]) => h("tr", {},
      h("td", { text: model }), h("td", { class: "num", text: u.calls }), h("td", { class: "num", text: u.input }),
      h("td", { class: "num", text: u.output }), h("td", { class: "num", text: u.reasoning })));
    this.parts.usage.replaceChildren(h("h2", { text: "Usage per model" }), rows.length
      ? h("table", { class: "usage", id: "usage-table" },
        h("thead", {}, h("tr", {}, ["Model", "Calls", "Input", "Output", "Reasoning"].map((t) => h("th", { text: t })))),
        h("tbody", {}, rows))
      : h("p", { text: "No model calls yet." }));
  }
}

// -- routing -------------------------------------------------------------------------------------

function route() {
  if (current) current.release();
  current = null;
  say("");
  const hash = location.hash || "#/";
  if (hash.startsWith("#/session/")) {
    current = new SessionPage(decodeURIComponent(hash.slice("#/session/".length)));
    current.show();
  } else {
    showList(new URLSearchParams(hash.split("?")[1] || ""));
  }
}

window.addEventListener("hashchange", route);
renderSignin();
route();
