-- outbox schema, version 9: a claim while a target is paused costs what it claims (issue #14).
-- __SCHEMA__ is replaced by the quoted schema name.

-- While a target is paused, the claim holds back a keyed message whose stream has an earlier
-- message waiting (pending or failed) for that target (kHeadOfLine in statements.cpp). No index
-- served that test: each message the claim looked at scanned every older message of the table,
-- 3.3 s per claim of 500 behind 10,000 paused messages and past the statement timeout at 100,000
-- (bench/RESULTS.md). Here it is one probe per message. Unkeyed messages are never tested and
-- are left out. Its price is one more index entry per keyed message written, not appended at the
-- end like the id indexes' but among its stream's: 4.6 us per row in a bulk insert of 300,000
-- rows over 1,000 streams (2.0 -> 3.4 s), a small part of an enqueue's round trip and commit.
--
-- Not CONCURRENTLY: migrations run in one transaction, where CREATE INDEX CONCURRENTLY is not
-- allowed. CREATE INDEX holds off writers (not readers) of the outbox while it reads the table:
-- 1.4 to 2.9 s for a million waiting messages on the benchmark's machine. To avoid that pause on
-- a large live outbox, create the index first, outside a transaction, with the same name and
-- definition:
--   CREATE INDEX CONCURRENTLY messages_waiting_streams ON <schema>.messages
--     (target, stream_key, id) WHERE status IN ('pending', 'failed') AND stream_key IS NOT NULL;
-- then migrate: this step finds it and skips (if that build failed, drop the INVALID index it
-- left first).
CREATE INDEX IF NOT EXISTS messages_waiting_streams ON __SCHEMA__.messages
  (target, stream_key, id) WHERE status IN ('pending', 'failed') AND stream_key IS NOT NULL;
