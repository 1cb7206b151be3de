-- outbox schema, version 12: WAL mode (issue #20). __SCHEMA__ is replaced by the quoted schema
-- name, __WAL_PREFIX__ by the prefix of this schema's logical messages as a string literal
-- ('outbox' for the schema outbox, else 'outbox:<schema>').
--
-- In WAL mode an enqueue inserts no row: it emits one transactional logical message per copy
-- (pg_logical_emit_message), which PostgreSQL decodes only if the writer commits, in commit order,
-- for the relay reading the schema's logical replication slot. Validation, ids and event ids are
-- those of table mode; stream_seq is assigned by that relay, in commit order.

-- 1. Where messages go: 'table' (rows of messages, as before) or 'wal'; per topic, NULL means the
--    settings' value. wal_slot is the slot `outboxctl migrate --wal-slot` made (EnsureWalSlot).
ALTER TABLE __SCHEMA__.settings
  ADD COLUMN delivery text NOT NULL DEFAULT 'table' CHECK (delivery IN ('table', 'wal')),
  ADD COLUMN wal_slot text;
ALTER TABLE __SCHEMA__.topic_settings
  ADD COLUMN delivery text CHECK (delivery IN ('table', 'wal'));

-- 2. What the WAL relay keeps (WalLedger, outbox/store/wal.h). One row per slot: the position up
--    to which every message's fate is durable, and the lease of the one relay that reads it.
CREATE TABLE __SCHEMA__.wal_progress (
  slot text PRIMARY KEY,
  position pg_lsn NOT NULL DEFAULT '0/0',
  owner text,
  epoch bigint NOT NULL DEFAULT 0,
  lease_until timestamptz
);
-- The latest stream_seq the WAL relay gave in each (target, stream), as of wal_progress.position.
CREATE TABLE __SCHEMA__.wal_stream_seqs (
  target text NOT NULL,
  stream_key text NOT NULL,
  seq bigint NOT NULL,
  PRIMARY KEY (target, stream_key)
);

-- 3. The guard: a logical message emitted while no slot exists is decoded by no one, lost for
--    good. So delivery becomes 'wal' only while settings.wal_slot names a pgoutput slot of this
--    database that has not lost WAL it needs (wal_status 'lost': max_slot_wal_keep_size).
--    Raises object_not_in_prerequisite_state (55000) otherwise.
CREATE FUNCTION __SCHEMA__.check_wal_slot(slot text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF slot IS NULL THEN
    RAISE EXCEPTION 'outbox: delivery ''wal'' needs a logical replication slot and settings.wal_slot is not set: run outboxctl migrate --wal-slot first'
      USING ERRCODE = '55000';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_replication_slots s
                  WHERE s.slot_name = slot AND s.slot_type = 'logical' AND s.plugin = 'pgoutput'
                    AND s.database = current_database() AND s.wal_status IS DISTINCT FROM 'lost') THEN
    RAISE EXCEPTION 'outbox: delivery ''wal'' needs the logical replication slot "%", which this database does not have (or not with plugin pgoutput, or it is lost): run outboxctl migrate --wal-slot to create it',
      slot USING ERRCODE = '55000';
  END IF;
END
$$;

-- Checked when delivery or wal_slot change (not on other updates: the topic_settings_count
-- trigger updates settings too), and whenever some topic still delivers by WAL.
CREATE FUNCTION __SCHEMA__.settings_delivery_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND NEW.delivery IS NOT DISTINCT FROM OLD.delivery
     AND NEW.wal_slot IS NOT DISTINCT FROM OLD.wal_slot THEN
    RETURN NEW;
  END IF;
  IF NEW.delivery = 'wal' OR EXISTS (SELECT 1 FROM __SCHEMA__.topic_settings t WHERE t.delivery = 'wal') THEN
    PERFORM __SCHEMA__.check_wal_slot(NEW.wal_slot);
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER settings_delivery_guard BEFORE INSERT OR UPDATE OF delivery, wal_slot
  ON __SCHEMA__.settings FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.settings_delivery_guard();

CREATE FUNCTION __SCHEMA__.topic_settings_delivery_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.delivery = 'wal' AND (TG_OP = 'INSERT' OR OLD.delivery IS DISTINCT FROM 'wal') THEN
    PERFORM __SCHEMA__.check_wal_slot((SELECT s.wal_slot FROM __SCHEMA__.settings s));
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER topic_settings_delivery_guard BEFORE INSERT OR UPDATE OF delivery
  ON __SCHEMA__.topic_settings FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.topic_settings_delivery_guard();

-- 4. The WAL record's strings (DecodeWalRecord, src/store/postgres/wal_record.h): a big-endian
--    int4 byte length, then the UTF-8 bytes; -1 and nothing for NULL.
CREATE FUNCTION __SCHEMA__.wal_text(value text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN value IS NULL THEN int4send(-1)
              ELSE int4send(octet_length(convert_to(value, 'UTF8'))) || convert_to(value, 'UTF8') END
$$;

-- 5. enqueue_messages: as in version 11, except that the topic's settings are read whenever
--    there are some (a topic may override the delivery), and the WAL branch after validation.
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
  topic_delivery text;
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
  event_and_time bytea;
  record_tail bytea;
  target_name text;
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

  -- The topic's settings, read whenever there are some: a topic may override the delivery.
  IF config.has_topic_settings THEN
    SELECT t.targets, t.sequenced, t.delivery INTO topic_targets, topic_sequenced, topic_delivery
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

  IF coalesce(topic_delivery, config.delivery) = 'wal' THEN
    -- WAL mode: one transactional logical message per copy, decoded only if this transaction
    -- commits; no row, no stream_seq (the relay assigns it in commit order), no wake-up (the
    -- relay streams). Whether the slot still exists is not checked here (a catalog read on every
    -- enqueue): the relay refuses to start without it, and says how to recover.
    -- Writers of one sequenced stream take turns until commit, as in table mode: a
    -- transaction-scoped advisory lock per (target, stream), taken in target order, before the
    -- ids. So a stream's ids follow its commit order, which is the order the relay numbers it in
    -- and the order the table relay publishes whatever of it is parked. (An advisory lock leaves
    -- no row version for an old snapshot to keep; two streams whose hashes collide only take
    -- turns.)
    IF stream_key IS NOT NULL AND sequenced THEN
      FOR target_name IN SELECT DISTINCT u.name FROM unnest(targets) AS u(name) ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(
          __WAL_PREFIX__ || chr(1) || target_name || chr(1) || stream_key, 0));
      END LOOP;
    END IF;
    FOR i IN 1 .. copies LOOP
      ids[i] := __SCHEMA__.uuid_v7();
    END LOOP;
    IF copies > 1 THEN
      event := ids[1];
    END IF;
    -- Record version 1 (wal_record.h): version, id, event id (zeros: none), created_at (now(),
    -- the table's default, in microseconds since 1970), partition, flags (bit 0: sequenced),
    -- target, then what every copy shares: topic, stream_key, type, content_type, headers,
    -- payload.
    record_tail := __SCHEMA__.wal_text(topic) || __SCHEMA__.wal_text(stream_key) ||
                   __SCHEMA__.wal_text(type) || __SCHEMA__.wal_text(content_type) ||
                   __SCHEMA__.wal_text(headers::text) || int4send(octet_length(payload)) || payload;
    event_and_time := coalesce(uuid_send(event), decode(repeat('00', 16), 'hex')) ||
                   int8send((extract(epoch FROM now()) * 1000000)::bigint);
    FOR i IN 1 .. copies LOOP
      PERFORM pg_logical_emit_message(true, __WAL_PREFIX__,
        decode('01', 'hex') || uuid_send(ids[i]) || event_and_time ||
        int4send(__SCHEMA__.partition_of(coalesce(stream_key, ids[i]::text), config.partition_count)) ||
        decode(CASE WHEN stream_key IS NOT NULL AND sequenced THEN '01' ELSE '00' END, 'hex') ||
        __SCHEMA__.wal_text(targets[i]) || record_tail);
    END LOOP;
    RETURN ids;
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
