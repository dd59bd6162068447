#!/usr/bin/env python3
"""An inventory service that consumes order.created events: mqlab's example
of a user's own consumer, in another language, run as a black box.

mqlab starts it under its role contract v1 (see docs/byo.md, "Bring your
own consumer") with MQLAB_AMQP_URL, MQLAB_DATABASE_URL, MQLAB_QUEUE,
MQLAB_SERVICE and MQLAB_PREFETCH in its environment, and stops it with
SIGTERM. Nothing in it knows about mqlab's fault windows: mqlab places them
from outside, on the program's AMQP and PostgreSQL connections.

    consumer.py safe       inbox row + business row in one transaction,
                           COMMIT, then ack
    consumer.py ack-first  acks first, then writes and commits (broken)
    consumer.py two-tx     inbox row in one transaction, business row in a
                           second, then ack (broken: a crash between the two
                           commits leaves the inbox saying "done")
    consumer.py auto-ack   consumes with autoAck, then writes and commits
                           (broken: the broker forgets each message as it
                           sends it)
    consumer.py memory-dedup  no inbox: skips an eventId it has seen, by a
                           set in memory, acking it with no database
                           statement (broken: a restarted process forgets)
    consumer.py check-then-insert  SELECTs the inbox row first, writes the
                           business row, then inserts the inbox row ignoring
                           a conflict (broken: two instances with copies of
                           one event both pass the check)
    consumer.py cached-inbox  safe, with a cache of its inbox read at start:
                           an eventId it knows is acked with no database
                           statement (the inbox still decides the others)
    consumer.py batched    safe, shaped as many production consumers are: its
                           own prefetch (10, whatever MQLAB_PREFETCH says),
                           each message's inbox and business rows in one
                           transaction, acks in batches (basic.ack with
                           multiple=True every second message, and whatever
                           is pending once the queue is quiet for 0.3 s)
    consumer.py batch-acked-early  the same, acking each batch before the
                           COMMIT of its last message (broken: a crash
                           between that ack and that COMMIT loses it)

    consumer.py MODE --declare '{"x-max-length": 100}'  first declares its
                           queue itself (durable, with these arguments), as
                           many programs do when they start
"""

import json
import os
import signal
import sys

import pika
import psycopg

MODE = sys.argv[1] if len(sys.argv) > 1 else "safe"


def declared_arguments(argv):
    """The program's own declaration of its queue: `--declare JSON`, an
    object of queue arguments; None without it or when it is not one."""
    if argv[2:3] != ["--declare"] or len(argv) != 4:
        return None
    try:
        arguments = json.loads(argv[3])
    except ValueError:
        return None
    return arguments if isinstance(arguments, dict) else None


DECLARE = declared_arguments(sys.argv)
MODES = (
    "safe",
    "ack-first",
    "two-tx",
    "auto-ack",
    "memory-dedup",
    "check-then-insert",
    "cached-inbox",
    "batched",
    "batch-acked-early",
)
if MODE not in MODES or (len(sys.argv) > 2 and DECLARE is None):
    sys.exit(f"usage: consumer.py {'|'.join(MODES)} [--declare JSON] (not {sys.argv[1:]!r})")

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS py_inbox (
         service  text NOT NULL,
         event_id text NOT NULL,
         PRIMARY KEY (service, event_id))""",
    """CREATE TABLE IF NOT EXISTS py_reservations (
         id       bigserial PRIMARY KEY,
         service  text    NOT NULL,
         event_id text    NOT NULL,
         order_id text    NOT NULL,
         amount   numeric NOT NULL)""",
]


def main():
    service = os.environ["MQLAB_SERVICE"]
    db = psycopg.connect(os.environ["MQLAB_DATABASE_URL"])
    with db.cursor() as cur:
        for statement in SCHEMA:
            cur.execute(statement)
    db.commit()

    connection = pika.BlockingConnection(pika.URLParameters(os.environ["MQLAB_AMQP_URL"]))
    channel = connection.channel()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if DECLARE is not None:
        channel.queue_declare(os.environ["MQLAB_QUEUE"], durable=True, arguments=DECLARE)
    if MODE in ("batched", "batch-acked-early"):
        consume_in_batches(channel, db, service)
        return
    channel.basic_qos(prefetch_count=int(os.environ.get("MQLAB_PREFETCH", "1")))

    seen = set()
    if MODE == "cached-inbox":
        with db.cursor() as cur:
            cur.execute("SELECT event_id FROM py_inbox WHERE service = %s", (service,))
            seen.update(row[0] for row in cur.fetchall())
        db.rollback()

    def on_message(ch, method, properties, body):
        event = json.loads(body)
        if MODE == "memory-dedup":
            if event["eventId"] not in seen:
                with db.cursor() as cur:
                    cur.execute(
                        "INSERT INTO py_reservations (service, event_id, order_id, amount) "
                        "VALUES (%s, %s, %s, %s)",
                        (service, event["eventId"], event["orderId"], event["amount"]),
                    )
                db.commit()
                seen.add(event["eventId"])
            ch.basic_ack(method.delivery_tag)
            return
        if MODE == "check-then-insert":
            with db.cursor() as cur:
                cur.execute(
                    "SELECT 1 FROM py_inbox WHERE service = %s AND event_id = %s",
                    (service, event["eventId"]),
                )
                if cur.fetchone() is None:
                    cur.execute(
                        "INSERT INTO py_reservations (service, event_id, order_id, amount) "
                        "VALUES (%s, %s, %s, %s)",
                        (service, event["eventId"], event["orderId"], event["amount"]),
                    )
                    cur.execute(
                        "INSERT INTO py_inbox (service, event_id) VALUES (%s, %s) "
                        "ON CONFLICT DO NOTHING",
                        (service, event["eventId"]),
                    )
                    db.commit()
                else:
                    db.rollback()  # seen: skipped
            ch.basic_ack(method.delivery_tag)
            return
        if MODE == "cached-inbox" and event["eventId"] in seen:
            ch.basic_ack(method.delivery_tag)  # known: no statement at all
            return
        if MODE == "ack-first":
            ch.basic_ack(method.delivery_tag)
        with db.cursor() as cur:
            cur.execute(
                "INSERT INTO py_inbox (service, event_id) VALUES (%s, %s) "
                "ON CONFLICT DO NOTHING",
                (service, event["eventId"]),
            )
            if cur.rowcount == 1:
                if MODE == "two-tx":
                    db.commit()  # the inbox row on its own: the mistake
                cur.execute(
                    "INSERT INTO py_reservations (service, event_id, order_id, amount) "
                    "VALUES (%s, %s, %s, %s)",
                    (service, event["eventId"], event["orderId"], event["amount"]),
                )
                db.commit()
            else:
                db.rollback()  # a duplicate: applied before
        seen.add(event["eventId"])
        if MODE in ("safe", "two-tx", "cached-inbox"):
            ch.basic_ack(method.delivery_tag)

    channel.basic_consume(
        os.environ["MQLAB_QUEUE"], on_message, auto_ack=(MODE == "auto-ack")
    )
    channel.start_consuming()


def consume_in_batches(channel, db, service):
    """Prefetch 10, one transaction per message, one ack per two messages
    (multiple=True), and the rest acked once the queue is quiet."""
    channel.basic_qos(prefetch_count=10)
    pending = None  # the delivery tag of the last message not acked yet
    count = 0
    queue = os.environ["MQLAB_QUEUE"]
    for method, _properties, body in channel.consume(queue, inactivity_timeout=0.3):
        if method is None:  # quiet: ack what is pending
            if pending is not None:
                channel.basic_ack(pending, multiple=True)
                pending = None
            continue
        event = json.loads(body)
        count += 1
        ends_batch = count % 2 == 0
        with db.cursor() as cur:
            cur.execute(
                "INSERT INTO py_inbox (service, event_id) VALUES (%s, %s) "
                "ON CONFLICT DO NOTHING",
                (service, event["eventId"]),
            )
            applies = cur.rowcount == 1
            if applies:
                cur.execute(
                    "INSERT INTO py_reservations (service, event_id, order_id, amount) "
                    "VALUES (%s, %s, %s, %s)",
                    (service, event["eventId"], event["orderId"], event["amount"]),
                )
            if MODE == "batch-acked-early" and ends_batch:
                # The mistake: the batch is acked while its last message's
                # transaction is still open.
                channel.basic_ack(method.delivery_tag, multiple=True)
            if applies:
                db.commit()
            else:
                db.rollback()  # a duplicate: applied before
        if ends_batch:
            if MODE == "batched":
                channel.basic_ack(method.delivery_tag, multiple=True)
            pending = None
        else:
            pending = method.delivery_tag


if __name__ == "__main__":
    main()
