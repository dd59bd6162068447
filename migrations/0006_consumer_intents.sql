-- A consumer's outbox of intents (article 002: a side effect that must not
-- be lost is recorded with the business change and executed after it). The
-- downstream call an event owes, written in the business transaction; made
-- after the ack and then marked done; a consumer that starts makes the calls
-- of the intents still pending. `meta` is the message's identity (JSON) for
-- the transcript lines of a call made at start.
CREATE TABLE consumer_intents (
  seq           bigserial    NOT NULL,
  consumer_name varchar(128) NOT NULL,
  event_id      varchar(64)  NOT NULL,
  meta          text         NOT NULL,
  body          bytea        NOT NULL,
  done_at       timestamptz,
  PRIMARY KEY (consumer_name, event_id)
);
