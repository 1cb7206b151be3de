-- outbox schema, version 13: a WAL ledger that an old snapshot does not slow down (issue #20).
-- __SCHEMA__ is replaced by the quoted schema name.
--
-- Before: each WAL batch updated the slot's wal_progress row (its position) and one
-- wal_stream_seqs row per stream it numbered. While a transaction holds an old snapshot (a
-- forgotten BEGIN, a long pg_dump) no version of those rows may be removed, and each commit
-- walked every version written since: under `outbox-bench bloat --wal` the commit took 45-113 ms
-- after three minutes (auto_explain) and the relay fell behind.
--
-- Now both are insert-only logs, as stream_seq numbers became in version 11: a commit inserts the
-- position it reached and each stream's latest number; readers take the latest by a backward
-- scan of the key, which stops at the first (newest, live) entry however many dead ones lie below
-- it. The relay deletes what its later commits superseded (WalLedger::Purge), from where its last
-- purge ended, so a purge does not walk what earlier ones removed either. The lease stays an
-- updated row in wal_progress, written only when it is taken or renewed (every few seconds); a
-- commit locks it FOR SHARE to be fenced, which writes no new version.

CREATE TABLE __SCHEMA__.wal_positions (
  slot text NOT NULL,
  -- Every message of transactions that end at or before it has its fate durable: confirmed by
  -- the broker or parked in messages.
  position pg_lsn NOT NULL,
  -- The lease epoch of the relay that committed it.
  epoch bigint NOT NULL,
  committed_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT wal_positions_pkey PRIMARY KEY (slot, position)
);

CREATE TABLE __SCHEMA__.wal_seqs (
  target text NOT NULL,
  stream_key text NOT NULL,
  seq bigint NOT NULL,
  CONSTRAINT wal_seqs_pkey PRIMARY KEY (target, stream_key, seq)
);

-- A relay of version 12 still committing waits for this migration, then fails loudly on the
-- missing column and table (rather than writing counters nobody reads).
LOCK TABLE __SCHEMA__.wal_progress IN ACCESS EXCLUSIVE MODE;
INSERT INTO __SCHEMA__.wal_positions (slot, position, epoch)
  SELECT slot, position, epoch FROM __SCHEMA__.wal_progress WHERE position > '0/0';
ALTER TABLE __SCHEMA__.wal_progress DROP COLUMN position;
COMMENT ON TABLE __SCHEMA__.wal_progress IS
  'The lease of each WAL slot (the one relay that reads it); its position is in wal_positions';

INSERT INTO __SCHEMA__.wal_seqs (target, stream_key, seq)
  SELECT target, stream_key, seq FROM __SCHEMA__.wal_stream_seqs;
DROP TABLE __SCHEMA__.wal_stream_seqs;

-- For people (and outboxctl): where each slot is, and each stream's latest number.
CREATE FUNCTION __SCHEMA__.wal_position(slot_name text) RETURNS pg_lsn
LANGUAGE sql STABLE AS $$
  SELECT coalesce((SELECT p.position FROM __SCHEMA__.wal_positions p WHERE p.slot = slot_name
                    ORDER BY p.position DESC LIMIT 1), '0/0')
$$;
CREATE VIEW __SCHEMA__.wal_stream_seqs AS
  SELECT target, stream_key, max(seq) AS seq FROM __SCHEMA__.wal_seqs GROUP BY target, stream_key;
