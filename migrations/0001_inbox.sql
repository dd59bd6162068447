-- The inbox of LABS.md: one row per (consumer, event) the consumer has applied.
CREATE TABLE inbox_messages (
  consumer_name varchar(128) NOT NULL,
  event_id      varchar(64)  NOT NULL,
  processed_at  timestamptz  NOT NULL,
  PRIMARY KEY (consumer_name, event_id)
);

-- The business effect. Deliberately without a unique key on the event: a
-- consumer that skips the inbox must be able to apply an event twice, so that
-- the checker can see it.
CREATE TABLE inventory_reservations (
  id            bigserial     PRIMARY KEY,
  consumer_name varchar(128)  NOT NULL,
  message_id    varchar(64)   NOT NULL,
  event_id      varchar(64)   NOT NULL,
  order_id      varchar(64)   NOT NULL,
  amount        numeric(12,2) NOT NULL,
  currency      char(3)       NOT NULL,
  reserved_at   timestamptz   NOT NULL DEFAULT now()
);
