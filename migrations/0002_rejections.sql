-- Business rejections (article 000's "business rejection" class): the event
-- is valid but the business says no. It is recorded, with the inbox row, in
-- the same transaction, and acked: no retry, no DLQ.
CREATE TABLE business_rejections (
  id            bigserial     PRIMARY KEY,
  consumer_name varchar(128)  NOT NULL,
  event_id      varchar(64)   NOT NULL,
  reason        text          NOT NULL,
  rejected_at   timestamptz   NOT NULL DEFAULT now()
);
