#!/usr/bin/env node
// An inventory service that consumes order.created events: mqlab's example
// of a user's own consumer in Node.js (amqplib and pg from npm), run as a
// black box, the same service as examples/python/consumer.py.
//
// mqlab starts it under its role contract v1 (docs/byo.md, "Bring your own
// consumer") with MQLAB_AMQP_URL, MQLAB_DATABASE_URL, MQLAB_QUEUE,
// MQLAB_SERVICE and MQLAB_PREFETCH in its environment, and stops it with
// SIGTERM. Nothing in it knows about mqlab's fault windows: mqlab places
// them from outside, on the program's AMQP and PostgreSQL connections.
//
//   node consumer.js safe          inbox row + business row in one
//                                  transaction, COMMIT, then ack
//   node consumer.js ack-first     acks first, then writes and commits
//                                  (broken)
//   node consumer.js two-tx        inbox row in one transaction, business
//                                  row in a second, then ack (broken: a
//                                  crash between the two commits leaves the
//                                  inbox saying "done")
//   node consumer.js auto-ack      consumes with noAck, then writes and
//                                  commits (broken: the broker forgets each
//                                  message as it sends it)
//   node consumer.js memory-dedup  no inbox: skips an eventId it has seen,
//                                  by a Set in memory, acking it with no
//                                  database statement (broken: a restarted
//                                  process forgets)
//   node consumer.js check-then-insert  SELECTs the inbox row first, writes
//                                  the business row, then inserts the inbox
//                                  row ignoring a conflict (broken: two
//                                  instances with copies of one event both
//                                  pass the check)
//   node consumer.js batched       safe, with its own prefetch (10, whatever
//                                  MQLAB_PREFETCH says), one transaction per
//                                  message, acks in batches (ack with
//                                  allUpTo every second message, and what is
//                                  pending once the queue is quiet 0.3 s)
//   node consumer.js batch-acked-early  the same, acking each batch before
//                                  the COMMIT of its last message (broken)
//
//   node consumer.js MODE --declare '{"x-max-length": 100}'  first declares
//                                  its queue itself (durable, with these
//                                  arguments), as many programs do

"use strict";

const amqp = require("amqplib");
const { Client } = require("pg");

const MODES = [
  "safe",
  "ack-first",
  "two-tx",
  "auto-ack",
  "memory-dedup",
  "check-then-insert",
  "batched",
  "batch-acked-early",
];
const MODE = process.argv[2] || "safe";
// The program's own declaration of its queue: `--declare JSON`, an object
// of queue arguments; null without it or when it is not one.
function declaredArguments(argv) {
  if (argv[3] !== "--declare" || argv.length !== 5) {
    return null;
  }
  try {
    const args = JSON.parse(argv[4]);
    return args !== null && typeof args === "object" && !Array.isArray(args) ? args : null;
  } catch {
    return null;
  }
}
const DECLARE = declaredArguments(process.argv);
if (!MODES.includes(MODE) || (process.argv.length > 3 && DECLARE === null)) {
  console.error(
    `usage: consumer.js ${MODES.join("|")} [--declare JSON] (not ${JSON.stringify(process.argv.slice(2))})`
  );
  process.exit(2);
}

const SCHEMA = [
  `CREATE TABLE IF NOT EXISTS js_inbox (
     service  text NOT NULL,
     event_id text NOT NULL,
     PRIMARY KEY (service, event_id))`,
  `CREATE TABLE IF NOT EXISTS js_reservations (
     id       bigserial PRIMARY KEY,
     service  text    NOT NULL,
     event_id text    NOT NULL,
     order_id text    NOT NULL,
     amount   numeric NOT NULL)`,
];

const INBOX = "INSERT INTO js_inbox (service, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING";
const RESERVE =
  "INSERT INTO js_reservations (service, event_id, order_id, amount) VALUES ($1, $2, $3, $4)";

/** Messages are handled one at a time, in the order they arrive, as
 * pika's blocking loop does: amqplib calls back as frames arrive, so each
 * handler is chained after the one before. */
function serial(handle) {
  let last = Promise.resolve();
  return (msg) => {
    last = last.then(() => handle(msg)).catch(fail);
  };
}

function fail(err) {
  console.error(`consumer.js: ${err.stack || err}`);
  process.exit(1);
}

/** An ack that returns once its frame has been handed to the socket:
 * amqplib queues a frame and writes it a tick or two later (its mux, in a
 * setImmediate), while pg writes a query at once, so without the wait a
 * COMMIT sent after the ack would reach the wire first. pika writes the
 * ack before basic_ack returns. */
function acker(connection, channel) {
  const socket = connection.connection.stream;
  return async (msg, allUpTo = false) => {
    const before = socket.bytesWritten;
    channel.ack(msg, allUpTo);
    while (socket.bytesWritten === before) {
      await new Promise((done) => setImmediate(done));
    }
  };
}

/** The body of a delivery; a consumer the broker cancelled gets `null`,
 * and this process ends as pika's start_consuming returns: exit 0. */
function eventOf(msg) {
  if (msg === null) {
    process.exit(0);
  }
  return JSON.parse(msg.content.toString());
}

async function main() {
  const service = process.env.MQLAB_SERVICE;
  const queue = process.env.MQLAB_QUEUE;
  const db = new Client({ connectionString: process.env.MQLAB_DATABASE_URL });
  await db.connect();
  for (const statement of SCHEMA) {
    await db.query(statement);
  }
  // noDelay: each frame goes out as it is written, as pika's TCP_NODELAY.
  const connection = await amqp.connect(process.env.MQLAB_AMQP_URL, { noDelay: true });
  const channel = await connection.createChannel();
  process.on("SIGTERM", () => process.exit(0));
  // A lost connection is the end of this process (mqlab reads its exit).
  connection.on("error", fail);
  connection.on("close", () => process.exit(1));
  channel.on("error", fail);
  db.on("error", fail);
  if (DECLARE !== null) {
    await channel.assertQueue(queue, { durable: true, arguments: DECLARE });
  }
  const ack = acker(connection, channel);
  if (MODE === "batched" || MODE === "batch-acked-early") {
    await consumeInBatches(channel, ack, db, service, queue);
    return;
  }
  await channel.prefetch(Number(process.env.MQLAB_PREFETCH || "1"));
  const seen = new Set();
  const reserve = (event) => db.query(RESERVE, [service, event.eventId, event.orderId, event.amount]);

  const onMessage = async (msg) => {
    const event = eventOf(msg);
    if (MODE === "memory-dedup") {
      if (!seen.has(event.eventId)) {
        await db.query("BEGIN");
        await reserve(event);
        await db.query("COMMIT");
        seen.add(event.eventId);
      }
      await ack(msg);
      return;
    }
    if (MODE === "check-then-insert") {
      await db.query("BEGIN");
      const found = await db.query("SELECT 1 FROM js_inbox WHERE service = $1 AND event_id = $2", [
        service,
        event.eventId,
      ]);
      if (found.rowCount === 0) {
        await reserve(event);
        await db.query(INBOX, [service, event.eventId]);
        await db.query("COMMIT");
      } else {
        await db.query("ROLLBACK"); // seen: skipped
      }
      await ack(msg);
      return;
    }
    if (MODE === "ack-first") {
      await ack(msg);
    }
    await db.query("BEGIN");
    const inbox = await db.query(INBOX, [service, event.eventId]);
    if (inbox.rowCount === 1) {
      if (MODE === "two-tx") {
        await db.query("COMMIT"); // the inbox row on its own: the mistake
        await db.query("BEGIN");
      }
      await reserve(event);
      await db.query("COMMIT");
    } else {
      await db.query("ROLLBACK"); // a duplicate: applied before
    }
    seen.add(event.eventId);
    if (MODE === "safe" || MODE === "two-tx") {
      await ack(msg);
    }
  };
  await channel.consume(queue, serial(onMessage), { noAck: MODE === "auto-ack" });
}

/** Prefetch 10, one transaction per message, one ack per two messages
 * (allUpTo), and the rest acked once the queue is quiet for 0.3 s. */
async function consumeInBatches(channel, ack, db, service, queue) {
  await channel.prefetch(10);
  let pending = null; // the last message not acked yet
  let count = 0;
  let quiet = null;
  const onMessage = async (msg) => {
    clearTimeout(quiet);
    const event = eventOf(msg);
    count += 1;
    const endsBatch = count % 2 === 0;
    await db.query("BEGIN");
    const applies = (await db.query(INBOX, [service, event.eventId])).rowCount === 1;
    if (applies) {
      await db.query(RESERVE, [service, event.eventId, event.orderId, event.amount]);
    }
    if (MODE === "batch-acked-early" && endsBatch) {
      // The mistake: the batch is acked while its last message's
      // transaction is still open.
      await ack(msg, true);
    }
    await db.query(applies ? "COMMIT" : "ROLLBACK"); // ROLLBACK: applied before
    if (endsBatch) {
      if (MODE === "batched") {
        await ack(msg, true);
      }
      pending = null;
    } else {
      pending = msg;
      quiet = setTimeout(() => {
        if (pending !== null) {
          channel.ack(pending, true);
          pending = null;
        }
      }, 300);
    }
  };
  await channel.consume(queue, serial(onMessage), { noAck: false });
}

main().catch(fail);
