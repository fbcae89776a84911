'use strict';
// node demo.js HOST:PORT
// Creates a session on the echo harness, runs one turn ("hi") printing every journal record as it
// becomes durable, replays the journal and checks it against what Exec streamed, then prints one
// JSON line: {"session": uid, "records": N, "output": "echo:hi"}. Any error exits non-zero.

const { SessionsClient, messageText, textMessage } = require('./sessions');

function fail(message) {
  throw new Error(message);
}

async function runDemo(address) {
  const client = new SessionsClient(address);
  try {
    const created = await client.createSession({
      metadata: { name: 'node-demo' },
      harness: 'echo',
      labels: { client: 'node' },
    });
    const uid = created.metadata && created.metadata.uid;
    if (!uid) fail('CreateSession answered a session without a uid');
    console.log(`session ${uid}`);

    const streamed = [];
    let output = '';
    let frames = 0;
    for await (const update of client.exec({ session: uid, inputs: [textMessage('hi')] })) {
      frames += 1;
      if (frames === 1 && update.update !== 'session') {
        fail(`the first Exec frame is ${update.update}, not the session`);
      }
      if (update.update !== 'record') continue;
      const record = update.record;
      const kind = record.event.kind;
      streamed.push(record);
      if (kind === 'EVENT_OUTPUT') {
        const text = messageText(record.event.message);
        output += text;
        console.log(`record ${record.seq} ${kind} ${JSON.stringify(text)}`);
      } else {
        console.log(`record ${record.seq} ${kind}`);
      }
    }
    if (streamed.length === 0) fail('Exec streamed no records');
    const last = streamed[streamed.length - 1].event.kind;
    if (last !== 'EVENT_END') fail(`the turn ended with ${last}, not EVENT_END`);

    const replayed = [];
    for await (const record of client.replay(uid)) {
      replayed.push(record);
    }
    console.log(`replayed ${replayed.length} records`);
    replayed.forEach((record, index) => {
      if (record.seq !== String(index + 1)) {
        fail(`replay record ${index + 1} has seq ${record.seq}`);
      }
      const previous = index === 0 ? '' : replayed[index - 1].content_hash;
      if ((record.prev_hash ?? '') !== previous) {
        fail(`replay record ${record.seq} does not chain to the record before it`);
      }
    });
    if (replayed.length !== streamed.length) {
      fail(`Exec streamed ${streamed.length} records but Replay returned ${replayed.length}`);
    }
    streamed.forEach((record, index) => {
      if (record.content_hash !== replayed[index].content_hash) {
        fail(`record ${record.seq}: the streamed and the replayed content hashes differ`);
      }
    });

    const session = await client.getSession(uid);
    const lastSeq = session.last_seq ?? '0';
    if (lastSeq !== String(replayed.length)) {
      fail(`GetSession reports last_seq ${lastSeq}, the journal holds ${replayed.length} records`);
    }
    console.log(`session ${uid} exec_state ${session.exec_state} last_seq ${lastSeq}`);

    return { session: uid, records: replayed.length, output };
  } finally {
    client.close();
  }
}

async function main(argv) {
  const address = argv[2];
  if (!address || argv.length > 3) {
    console.error('usage: node demo.js HOST:PORT');
    return 2;
  }
  try {
    const result = await runDemo(address);
    console.log(JSON.stringify(result));
    return 0;
  } catch (error) {
    // A grpc error's message reads "<code> <STATUS>: <details>".
    console.error(`demo failed: ${error instanceof Error ? error.message : String(error)}`);
    return 1;
  }
}

main(process.argv).then((code) => {
  process.exitCode = code;
});
