-- The state of an order as its change events set it (article 002: "setting
-- the balance to 100" looks idempotent, but an old event arriving late
-- overwrites the newer state). `version` is the event's business version:
-- a consumer that compares it keeps the newest; one that does not, the last
-- to arrive. `status` is what a delayed check reads (article 002, delayed
-- messages: "cancel if still unpaid" must look at the state when it runs).
CREATE TABLE order_state (
  consumer_name varchar(128)  NOT NULL,
  order_id      varchar(64)   NOT NULL,
  version       bigint        NOT NULL,
  amount        numeric(12,2) NOT NULL,
  status        varchar(32)   NOT NULL,
  PRIMARY KEY (consumer_name, order_id)
);
