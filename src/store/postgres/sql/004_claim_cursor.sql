-- outbox schema, version 4: claims start from a cursor instead of the oldest message.
--
-- A message that has not left 'pending' since it was written still has lease_epoch 0 (every claim
-- bumps the epoch; an operator's replay bumps it too): it is "fresh". A message given back
-- (released, retried, voided by a takeover, reclaimed after its lease, replayed) has
-- lease_epoch > 0: it is "returned". The relay claims fresh messages from a cursor it keeps (see
-- claim_cursor.h), so a claim no longer walks, from the oldest id, over every message deleted
-- since the oldest snapshot still open: with vacuum held back by a long transaction those are
-- all still in the index, and each claim stepped over all of them. Returned messages are few and
-- are walked whole, in their own index.
--
-- CREATE INDEX (not CONCURRENTLY: this runs in the migration's transaction) blocks writers of
-- the outbox while it runs: migrate while the outbox is small, or expect a pause.
CREATE INDEX messages_fresh ON __SCHEMA__.messages (id)
  WHERE status = 'pending' AND lease_epoch = 0;
CREATE INDEX messages_returned ON __SCHEMA__.messages (id)
  WHERE status IN ('pending', 'failed') AND lease_epoch > 0;
-- The head-of-line check of claims on leased partitions: there, a stream waits only for a failed
-- message ahead of it (another relay's leases in the partition were given back or voided when it
-- changed hands), and this index holds only failed messages.
CREATE INDEX messages_failed ON __SCHEMA__.messages (stream_key, id) WHERE status = 'failed';
-- messages_fresh and messages_returned together cover what it covered.
DROP INDEX __SCHEMA__.messages_claimable;
-- A failed or abandoned message that was never claimed (an operator abandoned it while pending)
-- must count as returned when it is replayed.
UPDATE __SCHEMA__.messages SET lease_epoch = 1
WHERE status IN ('failed', 'abandoned') AND lease_epoch = 0;
