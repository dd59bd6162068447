-- The digest (md5) of the event's business content as it was applied:
-- article 002's "the same ID with another amount must not quietly pass as a
-- duplicate". A copy under a known eventId whose digest differs is a
-- conflict, isolated in the DLQ; a row written without a digest (a pattern
-- that does not compare) compares as a duplicate.
ALTER TABLE inbox_messages ADD COLUMN digest char(32);
