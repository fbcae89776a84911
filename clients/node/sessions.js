'use strict';
// A small promise / async-iterator wrapper over the agentsessions.v1 Sessions service and the
// agentsessions.ext.v1 LiveSessions service beside it (watch a session from any offset).
// The protos are read at runtime from the repository's proto/ directory; nothing is generated.
// Messages are plain objects in proto field names (keepCase), int64 values are decimal strings,
// enums are their names, unset fields are absent, and each oneof carries a virtual field naming
// the member that is set (for example an ExecUpdate has `update: 'record' | 'delta' | 'session'`).

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');
const SESSION_PROTO = 'agentsessions/v1/session.proto';
const LIVE_PROTO = 'agentsessions/ext/v1/live.proto';
const DEFAULT_TIMEOUT_MS = 60_000;
// A watch the host broke (UNAVAILABLE: a restart, a lost connection) is opened again after this long.
const RECONNECT_MS = 200;
const RECONNECT_CAP_MS = 5_000;
const UNAVAILABLE = 14;

const LOADER_OPTIONS = Object.freeze({
  keepCase: true,
  longs: String,
  enums: String,
  defaults: false,
  oneofs: true,
});

/** The package definition of the Sessions and LiveSessions protos under protoRoot. */
function loadPackage(protoRoot = PROTO_ROOT) {
  const definition = protoLoader.loadSync([SESSION_PROTO, LIVE_PROTO], {
    ...LOADER_OPTIONS,
    includeDirs: [protoRoot],
  });
  return grpc.loadPackageDefinition(definition).agentsessions;
}

/** The Sessions service client constructor, built from the .proto files under protoRoot. */
function loadSessionsService(protoRoot = PROTO_ROOT) {
  return loadPackage(protoRoot).v1.Sessions;
}

/** A Message with one text part, the shape Exec takes as input. */
function textMessage(text, role = 'user') {
  return { role, parts: [{ text: { text } }] };
}

/** The concatenated text parts of a Message (empty when it has none). */
function messageText(message) {
  if (!message || !Array.isArray(message.parts)) return '';
  return message.parts
    .filter((part) => part.text && typeof part.text.text === 'string')
    .map((part) => part.text.text)
    .join('');
}

class SessionsClient {
  /**
   * @param {string} address HOST:PORT of an agentsessions host.
   * @param {object} [options]
   * @param {object} [options.credentials] grpc channel credentials; plaintext when omitted.
   * @param {number} [options.timeoutMs] deadline applied to every call (streams included).
   * @param {string} [options.protoRoot] directory holding agentsessions/v1/*.proto.
   */
  constructor(address, options = {}) {
    const agentsessions = loadPackage(options.protoRoot);
    const credentials = options.credentials ?? grpc.credentials.createInsecure();
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.stub = new agentsessions.v1.Sessions(address, credentials);
    this.live = new agentsessions.ext.v1.LiveSessions(address, credentials, { channelOverride: this.stub.getChannel() });
  }

  _callOptions() {
    return { deadline: new Date(Date.now() + this.timeoutMs) };
  }

  _unary(method, request) {
    return new Promise((resolve, reject) => {
      this.stub[method](request, this._callOptions(), (error, response) => {
        if (error) reject(error);
        else resolve(response);
      });
    });
  }

  // Yields each message of a server stream; a failed call throws its grpc error, and leaving
  // the loop early (break, return or a throw in the body) cancels the call.
  async *_stream(method, request, stub = this.stub, options = this._callOptions()) {
    const call = stub[method](request, options);
    let finished = false;
    call.on('status', () => {
      finished = true;
    });
    try {
      for await (const message of call) {
        yield message;
      }
      finished = true;
    } finally {
      if (!finished) call.cancel();
    }
  }

  /** CreateSession: resolves to the created Session (its uid is session.metadata.uid). */
  createSession(session = {}) {
    return this._unary('CreateSession', { session });
  }

  /** GetSession: resolves to the Session with its derived state. */
  getSession(uid) {
    return this._unary('GetSession', { uid });
  }

  /** Exec: an async iterator of ExecUpdate frames (the session first, then records and deltas). */
  exec(request) {
    return this._stream('Exec', request);
  }

  /** Replay: an async iterator of the stored LogRecords of a session, in seq order. */
  replay(session, { fromSeq = 0, toSeq = 0 } = {}) {
    return this._stream('Replay', {
      session,
      from_seq: String(fromSeq),
      to_seq: String(toSeq),
    });
  }

  /**
   * Watch (LiveSessions): an async iterator of WatchUpdate frames (`update` is 'session', 'record',
   * 'delta' or 'queue'): the session first, every record with seq > afterSeq, then, with follow,
   * each new record as soon as it is durable and the session's state changes. A stream the host
   * breaks (UNAVAILABLE) is opened again after the last record seen, so each record arrives once;
   * leave the loop to stop. No deadline applies unless timeoutMs is given.
   */
  async *watch(session, { afterSeq = 0, follow = true, includeDeltas = false, reconnect = true, timeoutMs } = {}) {
    let last = BigInt(afterSeq);
    let wait = RECONNECT_MS;
    const options = timeoutMs ? { deadline: new Date(Date.now() + timeoutMs) } : {};
    for (;;) {
      const request = { session, after_seq: String(last), follow, include_deltas: includeDeltas };
      try {
        for await (const update of this._stream('Watch', request, this.live, options)) {
          wait = RECONNECT_MS;
          if (update.update === 'record') last = BigInt(update.record.seq);
          yield update;
        }
        return;
      } catch (error) {
        if (!reconnect || error.code !== UNAVAILABLE) throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, wait));
      wait = Math.min(RECONNECT_CAP_MS, wait * 2);
    }
  }

  close() {
    this.stub.close();
  }
}

module.exports = {
  PROTO_ROOT,
  SessionsClient,
  loadPackage,
  loadSessionsService,
  messageText,
  textMessage,
};
