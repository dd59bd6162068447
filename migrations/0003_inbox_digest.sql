-- The digest (md5) of the event's content (its JSON, keys in order) as it
-- was applied: article 002's "the same ID with another amount must not
-- quietly pass as a duplicate". A copy under a known (service, eventId)
-- whose digest differs is a conflict, isolated in the DLQ; so is one whose
-- row has no digest (a pattern that does not compare wrote it: whether the
-- content is the same cannot be told).
ALTER TABLE inbox_messages ADD COLUMN digest char(32);
