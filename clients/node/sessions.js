'use strict';
// A small promise / async-iterator wrapper over the agentsessions.v1 Sessions service.
// The protos are read at runtime from the repository's proto/ directory; nothing is generated.
// Messages are plain objects in proto field names (keepCase), int64 values are decimal strings,
// enums are their names, unset fields are absent, and each oneof carries a virtual field naming
// the member that is set (for example an ExecUpdate has `update: 'record' | 'delta' | 'session'`).

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'proto');
const SESSION_PROTO = 'agentsessions/v1/session.proto';
const DEFAULT_TIMEOUT_MS = 60_000;

const LOADER_OPTIONS = Object.freeze({
  keepCase: true,
  longs: String,
  enums: String,
  defaults: false,
  oneofs: true,
});

/** The Sessions service client constructor, built from the .proto files under protoRoot. */
function loadSessionsService(protoRoot = PROTO_ROOT) {
  const definition = protoLoader.loadSync(SESSION_PROTO, {
    ...LOADER_OPTIONS,
    includeDirs: [protoRoot],
  });
  return grpc.loadPackageDefinition(definition).agentsessions.v1.Sessions;
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
    const Sessions = loadSessionsService(options.protoRoot);
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.stub = new Sessions(address, options.credentials ?? grpc.credentials.createInsecure());
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
  async *_stream(method, request) {
    const call = this.stub[method](request, this._callOptions());
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

  close() {
    this.stub.close();
  }
}

module.exports = {
  PROTO_ROOT,
  SessionsClient,
  loadSessionsService,
  messageText,
  textMessage,
};
