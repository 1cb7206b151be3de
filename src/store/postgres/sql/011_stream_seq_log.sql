-- outbox schema, version 11: stream_seq numbers that an old snapshot does not slow down (issue #21).
-- __SCHEMA__ is replaced by the quoted schema name.
--
-- Before: every sequenced enqueue updated its (target, stream) counter row in target_streams. An
-- UPDATE leaves the old version behind, and while any transaction holds a snapshot older than it
-- (a long report, a forgotten BEGIN, a replication slot) vacuum may not remove it, so each writer
-- of a stream walked every version written since that snapshot: over 10 minutes of one held
-- snapshot, writers fell to about half their rate.
--
-- Now each number is a row of its own in stream_seqs, keyed by (target, stream_key, seq). A writer
-- finds the pair's latest row by a backward scan of that key, which stops at the first visible
-- row however many dead ones an old snapshot keeps below it; marks it taken (its one update); and
-- inserts the successor. The row lock of that mark, held until commit, is what the next writer of
-- the pair waits for (as it waited for the counter row), so numbers stay gap-free and follow the
-- commit order; no row gets more than two versions, so nothing grows with the snapshot's age.
-- Rows that have a successor are deleted by the relay's purge (Store::Purge), except a pair's
-- first row; a writer that deleted them itself would wait on the locks of the writers after it.
-- target_streams (version 10) and streams (versions 1 to 9) are read, never written: a pair's
-- first row continues from them.
CREATE TABLE __SCHEMA__.stream_seqs (
  target text NOT NULL,
  stream_key text NOT NULL,
  seq bigint NOT NULL,
  -- The id of the message that took this number: the next one's id is made greater.
  last_id uuid NOT NULL,
  -- This number has a successor: it is no longer the latest. Set once, by the writer that takes
  -- the successor, whose row lock on it is what the next writer of the pair waits for.
  taken boolean NOT NULL DEFAULT false,
  -- The pair's first row (the counter it continues from): never deleted, so that a writer that
  -- looked before the pair existed meets it instead of starting the pair again.
  first boolean NOT NULL DEFAULT false,
  CONSTRAINT stream_seqs_pkey PRIMARY KEY (target, stream_key, seq)
);
-- Writers of version 10 still in flight finish first, and none starts until this commits: no
-- number they take is missed here.
LOCK TABLE __SCHEMA__.target_streams IN SHARE MODE;
INSERT INTO __SCHEMA__.stream_seqs (target, stream_key, seq, last_id, first)
  SELECT target, stream_key, last_seq, last_id, true FROM __SCHEMA__.target_streams;
COMMENT ON TABLE __SCHEMA__.target_streams IS
  'stream_seq counters of schema version 10, per (target, stream); since version 11 read only, as the floor of stream_seqs';

-- settings.has_topic_settings and its trigger, which the enqueue below reads, joined version 10
-- before its release: a schema that a development build brought to version 10 earlier lacks them.
-- Made sure here, as version 10 defines them.
ALTER TABLE __SCHEMA__.settings
  ADD COLUMN IF NOT EXISTS has_topic_settings boolean NOT NULL DEFAULT false;
UPDATE __SCHEMA__.settings SET has_topic_settings = EXISTS (SELECT 1 FROM __SCHEMA__.topic_settings);
CREATE OR REPLACE FUNCTION __SCHEMA__.topic_settings_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE __SCHEMA__.settings
     SET has_topic_settings = EXISTS (SELECT 1 FROM __SCHEMA__.topic_settings)
   WHERE has_topic_settings IS DISTINCT FROM EXISTS (SELECT 1 FROM __SCHEMA__.topic_settings);
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS topic_settings_count ON __SCHEMA__.topic_settings;
CREATE TRIGGER topic_settings_count AFTER INSERT OR DELETE OR TRUNCATE ON __SCHEMA__.topic_settings
  FOR EACH STATEMENT EXECUTE FUNCTION __SCHEMA__.topic_settings_count();

CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue_messages(
  topic text,
  payload bytea,
  content_type text,
  stream_key text,
  type text,
  headers jsonb,
  targets text[],
  sequenced boolean
) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  config __SCHEMA__.settings%ROWTYPE;
  topic_targets text[];
  topic_sequenced boolean;
  copies integer;
  lock_order integer[];
  i integer;
  seqs bigint[];
  ids uuid[];
  latest bigint;
  got_seq bigint;
  got_id uuid;
  new_id uuid;
  event uuid;
BEGIN
  SELECT * INTO config FROM __SCHEMA__.settings;
  PERFORM __SCHEMA__.check_text('topic', topic, 255);
  PERFORM __SCHEMA__.check_text('content_type', content_type, 255);
  IF type IS NOT NULL THEN
    PERFORM __SCHEMA__.check_text('type', type, 255);
  END IF;
  IF payload IS NULL THEN
    RAISE EXCEPTION 'outbox.enqueue: payload must not be null' USING ERRCODE = '22023';
  END IF;
  IF octet_length(payload) > config.max_payload_bytes THEN
    RAISE EXCEPTION 'outbox.enqueue: payload is % bytes, over the limit of % (settings.max_payload_bytes)',
      octet_length(payload), config.max_payload_bytes USING ERRCODE = '22023';
  END IF;
  IF jsonb_typeof(headers) IS DISTINCT FROM 'object' THEN
    RAISE EXCEPTION 'outbox.enqueue: headers must be a JSON object' USING ERRCODE = '22023';
  END IF;

  -- The topic's settings, read only when there are some and the call leaves something to them.
  IF config.has_topic_settings AND (targets IS NULL OR (stream_key IS NOT NULL AND sequenced IS NULL)) THEN
    SELECT t.targets, t.sequenced INTO topic_targets, topic_sequenced
      FROM __SCHEMA__.topic_settings t WHERE t.topic = enqueue_messages.topic;
  END IF;
  IF targets IS NULL THEN
    targets := coalesce(topic_targets, ARRAY['default']);
  ELSIF cardinality(targets) = 1 AND array_ndims(targets) = 1 THEN
    PERFORM __SCHEMA__.check_text('target', targets[1], 255);
  ELSE
    PERFORM __SCHEMA__.check_targets(targets);
  END IF;
  copies := cardinality(targets);

  IF stream_key IS NOT NULL THEN
    PERFORM __SCHEMA__.check_text('stream_key', stream_key, 255);
    sequenced := coalesce(sequenced, topic_sequenced, config.sequenced_by_default);
  END IF;
  IF stream_key IS NOT NULL AND sequenced THEN
    IF copies = 1 THEN
      lock_order := ARRAY[1];
    ELSE
      SELECT array_agg(n ORDER BY name) INTO lock_order
        FROM unnest(targets) WITH ORDINALITY AS u(name, n);
    END IF;
    FOREACH i IN ARRAY lock_order LOOP
      seqs[i] := NULL;
      WHILE seqs[i] IS NULL LOOP
        -- The pair's latest number: the first visible entry of a backward index scan, however
        -- many deleted ones an old snapshot keeps below it.
        SELECT s.seq, s.last_id INTO latest, new_id FROM __SCHEMA__.stream_seqs s
         WHERE s.target = targets[i] AND s.stream_key = enqueue_messages.stream_key
         ORDER BY s.seq DESC LIMIT 1;
        IF FOUND THEN
          -- Its successor is taken by marking it taken: the row lock, held until commit, is what
          -- the next writer of this (target, stream) waits for, so numbers follow the commit
          -- order. When another writer marked (or deleted) it first and committed, this one looks
          -- again (READ COMMITTED) or gets 40001 (REPEATABLE READ, SERIALIZABLE). A number is
          -- never inserted without its predecessor taken this way.
          UPDATE __SCHEMA__.stream_seqs s SET taken = true
           WHERE s.target = targets[i] AND s.stream_key = enqueue_messages.stream_key
             AND s.seq = latest AND NOT s.taken;
          IF FOUND THEN
            INSERT INTO __SCHEMA__.stream_seqs (target, stream_key, seq, last_id)
            VALUES (targets[i], enqueue_messages.stream_key, latest + 1,
                    greatest(__SCHEMA__.uuid_v7(), __SCHEMA__.uuid_successor(new_id)))
            RETURNING stream_seqs.seq, stream_seqs.last_id INTO got_seq, got_id;
            seqs[i] := got_seq;
            ids[i] := got_id;
          END IF;
        ELSE
          -- A new pair: its first row is the counter it continues from (versions 1 to 10, else
          -- 0); the number is then taken from it like from any latest row. Two first writers meet
          -- on the primary key: the second waits for the first's transaction, then looks again.
          -- A writer whose snapshot is older than the pair meets its first row too (never
          -- deleted): it looks again (READ COMMITTED) or gets 40001.
          INSERT INTO __SCHEMA__.stream_seqs (target, stream_key, seq, last_id, first)
          SELECT targets[i], enqueue_messages.stream_key, coalesce(ts.last_seq, legacy.last_seq, 0),
                 coalesce(ts.last_id, legacy.last_id, '00000000-0000-0000-0000-000000000000'), true
            FROM (VALUES (1)) AS one(row)
            LEFT JOIN __SCHEMA__.target_streams ts
              ON ts.target = targets[i] AND ts.stream_key = enqueue_messages.stream_key
            LEFT JOIN __SCHEMA__.streams legacy ON legacy.stream_key = enqueue_messages.stream_key
          ON CONFLICT ON CONSTRAINT stream_seqs_pkey DO NOTHING;
        END IF;
      END LOOP;
    END LOOP;
  ELSE
    FOR i IN 1 .. copies LOOP
      ids[i] := __SCHEMA__.uuid_v7();
    END LOOP;
  END IF;

  IF copies > 1 THEN
    event := ids[1];
  END IF;
  FOR i IN 1 .. copies LOOP
    INSERT INTO __SCHEMA__.messages
      (id, topic, stream_key, stream_seq, partition, target, type, payload, content_type, headers,
       event_id)
    VALUES
      (ids[i], topic, stream_key, seqs[i],
       __SCHEMA__.partition_of(coalesce(stream_key, ids[i]::text), config.partition_count),
       targets[i], type, payload, content_type, headers, event);
  END LOOP;

  PERFORM __SCHEMA__.wake_relay();
  RETURN ids;
END
$$;
