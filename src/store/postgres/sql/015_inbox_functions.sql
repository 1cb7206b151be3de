-- outbox schema, version 15: the inbox in SQL (issue #44), so that a consumer in any language gets
-- exactly-once processing from one call in its own transaction, with the rules the C++ Inbox has
-- (include/outbox/inbox/inbox.h, which now calls it: one implementation of the rules).
-- __SCHEMA__ is replaced by the quoted schema name.

-- Marks are kept per (origin, target, stream) instead of per stream: stream_seq counts per
-- (target, stream), so a consumer fed copies of one stream by two targets took the second
-- target's seq 1 for a duplicate. origin is the database a relay names when it serves several
-- ('' when the delivery names none), target the outbox-target of the delivery ('' likewise).
-- Existing marks keep '' for both; the first delivery that names a target adopts the mark of its
-- stream (inbox_begin), so nothing is processed again after the upgrade.
ALTER TABLE __SCHEMA__.inbox_streams
  ADD COLUMN origin text NOT NULL DEFAULT '',
  ADD COLUMN target text NOT NULL DEFAULT '';
ALTER TABLE __SCHEMA__.inbox_streams DROP CONSTRAINT inbox_streams_pkey;
ALTER TABLE __SCHEMA__.inbox_streams
  ADD CONSTRAINT inbox_streams_pkey PRIMARY KEY (consumer, origin, target, stream_key);

ALTER TABLE __SCHEMA__.inbox_skipped
  ADD COLUMN origin text NOT NULL DEFAULT '',
  ADD COLUMN target text NOT NULL DEFAULT '';
ALTER TABLE __SCHEMA__.inbox_skipped DROP CONSTRAINT inbox_skipped_pkey;
ALTER TABLE __SCHEMA__.inbox_skipped
  ADD CONSTRAINT inbox_skipped_pkey PRIMARY KEY (consumer, origin, target, stream_key, first_seq);

-- What a consumer does with a delivery, decided and recorded in the caller's transaction:
--   'process'    new: apply its effect in this same transaction, then COMMIT, then ack the broker;
--                a rollback undoes the record with the effect, so it will be processed again
--   'duplicate'  already processed by this consumer: ack it, do nothing
--   'gap'        a predecessor of its stream has not been processed and gap_policy is 'refuse':
--                nothing recorded; requeue it (after a short delay)
--   'invalid'    its sequence numbers are out of range: nothing recorded, and it never becomes
--                processable; dead-letter it
-- A sequenced delivery (stream_key and stream_seq) is checked against its stream's high-water
-- mark; any other against the ids this consumer processed (inbox_messages; inbox_cleanup).
-- stream_prev_seq (header outbox-stream-prev-seq) says the messages before it were abandoned:
-- a gap up to it is passed, and the seqs passed are remembered so that a replay of one is
-- processed once (inbox_skipped). Arguments the caller controls are checked: SQLSTATE 22023.
CREATE FUNCTION __SCHEMA__.inbox_begin(
  consumer text,
  message_id uuid,
  stream_key text DEFAULT NULL,
  stream_seq bigint DEFAULT NULL,
  stream_prev_seq bigint DEFAULT NULL,
  target text DEFAULT NULL,
  gap_policy text DEFAULT 'refuse',
  origin text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
AS $$
#variable_conflict use_variable
DECLARE
  max_seq constant bigint := 4611686018427387904;  -- 2^62, inbox.h kMaxStreamSeq
  the_origin text := coalesce(origin, '');
  the_target text := coalesce(target, '');
  mark bigint;
  skip_from bigint;
  gap record;
BEGIN
  IF consumer IS NULL OR consumer = '' THEN
    RAISE EXCEPTION 'outbox.inbox_begin: consumer must not be empty' USING ERRCODE = '22023';
  END IF;
  IF message_id IS NULL THEN
    RAISE EXCEPTION 'outbox.inbox_begin: message_id must not be null' USING ERRCODE = '22023';
  END IF;
  IF gap_policy IS NULL OR gap_policy NOT IN ('refuse', 'process') THEN
    RAISE EXCEPTION 'outbox.inbox_begin: gap_policy must be ''refuse'' or ''process'', got %',
      coalesce(quote_literal(gap_policy), 'NULL') USING ERRCODE = '22023';
  END IF;
  IF stream_seq IS NOT NULL AND (stream_seq < 1 OR stream_seq > max_seq) THEN
    RETURN 'invalid';
  END IF;
  IF stream_prev_seq IS NOT NULL
     AND (stream_seq IS NULL OR stream_prev_seq < 0 OR stream_prev_seq >= stream_seq) THEN
    RETURN 'invalid';
  END IF;

  IF stream_key IS NULL OR stream_seq IS NULL THEN
    INSERT INTO __SCHEMA__.inbox_messages (consumer, message_id)
    VALUES (consumer, message_id) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
      RETURN 'duplicate';
    END IF;
    RETURN 'process';
  END IF;

  -- The stream's mark, locked: the consumers of one stream take turns here until they commit.
  SELECT s.last_seq INTO mark FROM __SCHEMA__.inbox_streams s
  WHERE s.consumer = consumer AND s.origin = the_origin AND s.target = the_target
    AND s.stream_key = stream_key
  FOR UPDATE;
  IF NOT FOUND AND (the_origin <> '' OR the_target <> '') THEN
    -- A mark made before marks were kept per target: the first target to come adopts it.
    UPDATE __SCHEMA__.inbox_streams s SET origin = the_origin, target = the_target
    WHERE s.consumer = consumer AND s.origin = '' AND s.target = '' AND s.stream_key = stream_key
    RETURNING s.last_seq INTO mark;
    IF FOUND THEN
      UPDATE __SCHEMA__.inbox_skipped k SET origin = the_origin, target = the_target
      WHERE k.consumer = consumer AND k.origin = '' AND k.target = ''
        AND k.stream_key = stream_key;
    END IF;
  END IF;
  IF mark IS NULL THEN
    INSERT INTO __SCHEMA__.inbox_streams AS s (consumer, origin, target, stream_key, last_seq)
    VALUES (consumer, the_origin, the_target, stream_key, 0)
    ON CONFLICT ON CONSTRAINT inbox_streams_pkey DO UPDATE SET last_seq = s.last_seq
    RETURNING s.last_seq INTO mark;
  END IF;

  IF stream_seq <= mark THEN
    -- A duplicate, unless the mark skipped it as abandoned and an operator replayed it: then it
    -- is processed once and forgotten.
    SELECT k.first_seq, k.last_seq INTO gap FROM __SCHEMA__.inbox_skipped k
    WHERE k.consumer = consumer AND k.origin = the_origin AND k.target = the_target
      AND k.stream_key = stream_key AND k.first_seq <= stream_seq
    ORDER BY k.first_seq DESC LIMIT 1;
    IF NOT FOUND OR gap.last_seq < stream_seq THEN
      RETURN 'duplicate';
    END IF;
    IF gap.first_seq < stream_seq THEN
      UPDATE __SCHEMA__.inbox_skipped k SET last_seq = stream_seq - 1
      WHERE k.consumer = consumer AND k.origin = the_origin AND k.target = the_target
        AND k.stream_key = stream_key AND k.first_seq = gap.first_seq;
    ELSE
      DELETE FROM __SCHEMA__.inbox_skipped k
      WHERE k.consumer = consumer AND k.origin = the_origin AND k.target = the_target
        AND k.stream_key = stream_key AND k.first_seq = gap.first_seq;
    END IF;
    IF stream_seq < gap.last_seq THEN
      INSERT INTO __SCHEMA__.inbox_skipped
        (consumer, origin, target, stream_key, first_seq, last_seq)
      VALUES (consumer, the_origin, the_target, stream_key, stream_seq + 1, gap.last_seq);
    END IF;
    RETURN 'process';
  END IF;

  skip_from := stream_seq;
  IF stream_seq > mark + 1 THEN
    -- Abandoned predecessors (stream_prev_seq at or below the mark) will not come: passed.
    -- Otherwise one is on its way, and gap_policy decides.
    IF NOT (stream_prev_seq IS NOT NULL AND stream_prev_seq <= mark) AND gap_policy = 'refuse' THEN
      RETURN 'gap';
    END IF;
    IF stream_prev_seq IS NOT NULL THEN
      skip_from := greatest(mark, stream_prev_seq) + 1;
    END IF;
  END IF;
  IF skip_from < stream_seq THEN
    INSERT INTO __SCHEMA__.inbox_skipped
      (consumer, origin, target, stream_key, first_seq, last_seq)
    VALUES (consumer, the_origin, the_target, stream_key, skip_from, stream_seq - 1);
  END IF;
  UPDATE __SCHEMA__.inbox_streams s SET last_seq = stream_seq, updated_at = now()
  WHERE s.consumer = consumer AND s.origin = the_origin AND s.target = the_target
    AND s.stream_key = stream_key;
  RETURN 'process';
END;
$$;

-- Deletes this consumer's id records older than `retention`, at most max_rows; returns how many.
-- Sequenced streams keep one mark each and need no cleanup.
CREATE FUNCTION __SCHEMA__.inbox_cleanup(consumer text, retention interval, max_rows integer)
RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_variable
DECLARE
  deleted bigint;
BEGIN
  IF consumer IS NULL OR consumer = '' THEN
    RAISE EXCEPTION 'outbox.inbox_cleanup: consumer must not be empty' USING ERRCODE = '22023';
  END IF;
  IF retention IS NULL OR retention < interval '0' THEN
    RAISE EXCEPTION 'outbox.inbox_cleanup: retention must not be negative, got %',
      coalesce(retention::text, 'NULL') USING ERRCODE = '22023';
  END IF;
  IF max_rows IS NULL OR max_rows < 1 THEN
    RAISE EXCEPTION 'outbox.inbox_cleanup: max_rows must be at least 1, got %',
      coalesce(max_rows::text, 'NULL') USING ERRCODE = '22023';
  END IF;
  DELETE FROM __SCHEMA__.inbox_messages m
  WHERE (m.consumer, m.message_id) IN (
    SELECT o.consumer, o.message_id FROM __SCHEMA__.inbox_messages o
    WHERE o.consumer = consumer AND o.processed_at < now() - retention
    LIMIT max_rows);
  GET DIAGNOSTICS deleted = ROW_COUNT;
  RETURN deleted;
END;
$$;
