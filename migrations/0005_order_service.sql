-- The order service a producer stands for (article 002's outbox: "订单提交后，
-- 发布前 → 同事务 Outbox"). An order row, and, for a service with an outbox,
-- the event to publish in the same transaction; the relay marks a row sent
-- once the broker confirmed its publish. The checker reads the orders: a
-- committed order whose event no service applied is a loss no producer
-- line shows.
CREATE TABLE service_orders (
  event_id   varchar(64)  PRIMARY KEY,
  order_id   varchar(64)  NOT NULL,
  created_at timestamptz  NOT NULL DEFAULT now()
);

CREATE TABLE service_outbox (
  seq        bigserial    PRIMARY KEY,
  event_id   varchar(64)  NOT NULL UNIQUE,
  message_id varchar(64)  NOT NULL,
  sent_at    timestamptz
);
