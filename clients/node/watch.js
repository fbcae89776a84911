'use strict';
// node watch.js HOST:PORT SESSION [--after SEQ] [--until SEQ] [--no-follow]
// Follows a session (LiveSessions.Watch) and prints one JSON line per journal record as it
// becomes durable: {"seq": N, "kind": "EVENT_...", "hash": "..."}; then, with --until, stops once
// it has printed the record with that seq (without it, at the end of the stored records when
// --no-follow is given, else never). Any error exits non-zero.

const { SessionsClient } = require('./sessions');

function parse(argv) {
  const [address, session, ...rest] = argv;
  if (!address || !session) throw new Error('usage: node watch.js HOST:PORT SESSION [--after SEQ] [--until SEQ] [--no-follow]');
  const options = { address, session, after: 0, until: 0, follow: true };
  for (let i = 0; i < rest.length; i += 1) {
    if (rest[i] === '--after') options.after = Number(rest[(i += 1)]);
    else if (rest[i] === '--until') options.until = Number(rest[(i += 1)]);
    else if (rest[i] === '--no-follow') options.follow = false;
    else throw new Error(`unknown argument ${rest[i]}`);
  }
  return options;
}

async function main(argv) {
  const options = parse(argv);
  const client = new SessionsClient(options.address);
  try {
    for await (const update of client.watch(options.session, { afterSeq: options.after, follow: options.follow })) {
      if (update.update !== 'record') continue;
      const record = update.record;
      console.log(JSON.stringify({ seq: Number(record.seq), kind: record.event.kind, hash: record.content_hash }));
      if (options.until && Number(record.seq) >= options.until) return;
    }
  } finally {
    client.close();
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).catch((error) => {
    console.error(`watch failed: ${error.message}`);
    process.exitCode = 1;
  });
}

module.exports = { main };
