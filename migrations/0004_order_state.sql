-- The state of an order as its change events set it (article 002: "setting
-- the balance to 100" looks idempotent, but an old event arriving late
-- overwrites the newer state). `version` is the event's business version:
-- a consumer that compares it keeps the newest; one that does not, the last
-- to arrive.
CREATE TABLE order_state (
  consumer_name varchar(128)  NOT NULL,
  order_id      varchar(64)   NOT NULL,
  version       bigint        NOT NULL,
  amount        numeric(12,2) NOT NULL,
  PRIMARY KEY (consumer_name, order_id)
);
