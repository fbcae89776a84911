// The journal's hash chain recomputed in the browser (spec 3.2):
//
//   content_hash = lowercase hex SHA-256 of JCS({"event": event, "prev_hash": prev, "seq": "N"})
//
// where event is the record's event in proto3 JSON with the proto field names (what the API
// answers with json_names=proto) and JCS is RFC 8785. JavaScript's own JSON.stringify of a string
// or a finite number is exactly RFC 8785's serialization of it (the RFC defines numbers by
// ECMAScript's Number-to-String), and the default sort orders keys by UTF-16 code units as RFC
// 8785 requires, so canonical() is the whole of JCS for JSON.parse's output.

export function canonical(value) {
  if (value === null) return "null";
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new Error("JSON has no form for NaN or Infinity");
    return JSON.stringify(value);
  }
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  const keys = Object.keys(value).sort();
  return `{${keys.map((key) => `${JSON.stringify(key)}:${canonical(value[key])}`).join(",")}}`;
}

// Whether this page may hash: browsers offer SubtleCrypto on https and on loopback only.
export function canHash() {
  return Boolean(globalThis.crypto && crypto.subtle && window.isSecureContext);
}

async function sha256(text) {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (byte) => byte.toString(16).padStart(2, "0")).join("");
}

// A session's chain checked record by record as records arrive, from genesis: each record's
// prev_hash must be the content_hash before it, and its own content_hash must be the one
// recomputed here. The first record that fails stops the check (`failure` says where and why).
export class Chain {
  constructor() {
    this.count = 0;
    this.head = "";
    this.failure = null;
    this.checked = new Map(); // seq -> true (verified) or false (the record that failed)
    this.pending = Promise.resolve();
  }

  // Check every record of bySeq (a Map seq -> record) that extends the verified prefix.
  take(bySeq) {
    this.pending = this.pending.then(() => this.extend(bySeq));
    return this.pending;
  }

  async extend(bySeq) {
    while (!this.failure && bySeq.has(this.count + 1)) {
      const seq = this.count + 1;
      const record = bySeq.get(seq);
      const prev = record.prev_hash || "";
      let why = "";
      if (prev !== this.head) why = "prev_hash does not link to the record before it";
      else {
        const envelope = { event: record.event || {}, prev_hash: prev, seq: String(seq) };
        if ((await sha256(canonical(envelope))) !== record.content_hash) {
          why = "content_hash is not the hash recomputed in this browser";
        }
      }
      this.checked.set(seq, !why);
      if (why) {
        this.failure = { seq, why };
        return;
      }
      this.count = seq;
      this.head = record.content_hash;
    }
  }
}
