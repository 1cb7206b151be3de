-- outbox schema, version 14: one numbering and one order per (target, stream) whatever the
-- delivery mode, and no WAL-mode enqueue without its slot (issue #39). __SCHEMA__ is replaced by
-- the quoted schema name, __WAL_PREFIX__ by the prefix of this schema's logical messages.
--
-- Before: changing `delivery` while writers ran restarted stream_seq in the other mode (each
-- mode numbered from its own counter) and let a later message of one mode out before an earlier
-- one of the other; and an enqueue in WAL mode succeeded without a slot to read it (lost).
--
-- Now a change of delivery (schema-wide or per topic) is a switch (switch_delivery):
--  1. Leaving WAL mode, it first waits, writers still writing, until the WAL relay has confirmed
--     the slot up to where the WAL was (everything committed before is published or parked).
--  2. It takes an exclusive advisory lock, which every enqueue takes shared: enqueues in flight
--     finish, new ones wait until the switch commits. Each enqueue is wholly on one side of it.
--  3. Leaving WAL mode, it waits again, now for the little written since step 1.
--  4. It emits a transactional WAL record of its own (version 2, nothing else in it): the WAL
--     relay, reading it at the switch's commit, takes each stream's number again from both
--     counters and looks at the table before publishing a stream's next WAL message.
-- Numbers: a table-mode enqueue continues from max(stream_seqs, wal_seqs); the WAL relay from the
-- same maximum. Order: a WAL message whose stream has a row waiting in the table is parked behind
-- it (the relay's stream states), and the table relay publishes a stream by id.
--
-- The wait is bounded by the setting outbox.switch_wait (milliseconds, default 30000): without a
-- WAL relay confirming the slot, the switch fails and changes nothing. `SET outbox.switch_wait =
-- 0` switches without waiting: WAL messages not yet relayed then take numbers after the table's.

-- The transaction id of the latest switch. A sequence is not transactional: an enqueue reads its
-- latest value whatever its snapshot, and tells from it whether its snapshot predates a switch.
CREATE SEQUENCE __SCHEMA__.delivery_switch MINVALUE 0 START 0;

-- Waits until the slot's reader has confirmed `target` (bounded by `wait_ms`): every WAL message
-- committed before it is then published or parked, with its number in wal_seqs. Returns at once
-- when the slot is gone (nothing is left to read in it).
CREATE FUNCTION __SCHEMA__.wait_for_wal_relay(slot text, target pg_lsn, wait_ms bigint)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  deadline timestamptz := clock_timestamp() + wait_ms * interval '1 millisecond';
  reached pg_lsn;
  reading boolean;
  unread_since timestamptz;
BEGIN
  LOOP
    SELECT s.confirmed_flush_lsn, s.active INTO reached, reading FROM pg_catalog.pg_replication_slots s
     WHERE s.slot_name = slot AND s.database = current_database();
    IF NOT FOUND OR reached >= target THEN
      RETURN;
    END IF;
    -- Nobody reading the slot for 5 s (more than a relay's reconnection takes): no use waiting on.
    unread_since := CASE WHEN reading THEN NULL ELSE coalesce(unread_since, clock_timestamp()) END;
    IF clock_timestamp() >= deadline OR clock_timestamp() >= unread_since + interval '5 seconds' THEN
      RAISE EXCEPTION 'outbox: delivery was not changed: the WAL relay has confirmed the slot "%" up to %, not yet % (waited up to % ms, outbox.switch_wait; no reader stops the wait after 5 s). Is outboxd running in WAL mode and its sinks up? Try again, or SET outbox.switch_wait = 0 to switch now (WAL messages not yet relayed then get stream_seq numbers after the table''s)',
        slot, coalesce(reached::text, 'nothing'), target, wait_ms USING ERRCODE = '55000';
    END IF;
    PERFORM pg_sleep(0.05);
  END LOOP;
END
$$;

-- The switch itself (steps 1 to 4 above); called by the delivery guards below.
CREATE FUNCTION __SCHEMA__.switch_delivery(leaving_wal boolean, slot text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  wait_ms bigint := coalesce(nullif(current_setting('outbox.switch_wait', true), ''), '30000')::bigint;
  lock_timeout_before text := current_setting('lock_timeout');
BEGIN
  IF leaving_wal AND slot IS NOT NULL AND wait_ms > 0 THEN
    PERFORM __SCHEMA__.wait_for_wal_relay(slot, pg_current_wal_insert_lsn(), wait_ms);
  END IF;
  -- Queued behind the enqueues in flight, the lock holds new ones back: a writer's transaction
  -- left open would stall every writer. Bounded by the same wait, then nothing changes.
  BEGIN
    IF wait_ms > 0 THEN
      PERFORM set_config('lock_timeout', wait_ms::text, true);
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext(__WAL_PREFIX__), 1);
    PERFORM set_config('lock_timeout', lock_timeout_before, true);
  EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'outbox: delivery was not changed: enqueues in transactions still open held the switch off for % ms (outbox.switch_wait); look for long transactions that enqueued (pg_stat_activity) and try again',
      wait_ms USING ERRCODE = '55P03';
  END;
  PERFORM setval('__SCHEMA__.delivery_switch', txid_current());
  IF leaving_wal AND slot IS NOT NULL AND wait_ms > 0 THEN
    PERFORM __SCHEMA__.wait_for_wal_relay(slot, pg_current_wal_insert_lsn(), wait_ms);
  END IF;
  IF slot IS NOT NULL THEN
    PERFORM pg_logical_emit_message(true, __WAL_PREFIX__, decode('02', 'hex'));
  END IF;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.settings_delivery_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND NEW.delivery IS NOT DISTINCT FROM OLD.delivery
     AND NEW.wal_slot IS NOT DISTINCT FROM OLD.wal_slot THEN
    RETURN NEW;
  END IF;
  IF NEW.delivery = 'wal' OR EXISTS (SELECT 1 FROM __SCHEMA__.topic_settings t WHERE t.delivery = 'wal') THEN
    PERFORM __SCHEMA__.check_wal_slot(NEW.wal_slot);
  END IF;
  IF TG_OP = 'UPDATE' AND NEW.delivery IS DISTINCT FROM OLD.delivery THEN
    PERFORM __SCHEMA__.switch_delivery(OLD.delivery = 'wal', coalesce(OLD.wal_slot, NEW.wal_slot));
  END IF;
  RETURN NEW;
END
$$;

-- A topic's override set, changed or removed is a switch of that topic when its delivery
-- changes.
CREATE OR REPLACE FUNCTION __SCHEMA__.topic_settings_delivery_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  config __SCHEMA__.settings%ROWTYPE;
  before text;
  after text;
BEGIN
  SELECT * INTO config FROM __SCHEMA__.settings;
  before := CASE WHEN TG_OP = 'INSERT' THEN config.delivery ELSE coalesce(OLD.delivery, config.delivery) END;
  after := CASE WHEN TG_OP = 'DELETE' THEN config.delivery ELSE coalesce(NEW.delivery, config.delivery) END;
  IF TG_OP <> 'DELETE' AND NEW.delivery = 'wal' AND (TG_OP = 'INSERT' OR OLD.delivery IS DISTINCT FROM 'wal') THEN
    PERFORM __SCHEMA__.check_wal_slot(config.wal_slot);
  END IF;
  IF before IS DISTINCT FROM after THEN
    PERFORM __SCHEMA__.switch_delivery(before = 'wal', config.wal_slot);
  END IF;
  RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;
DROP TRIGGER topic_settings_delivery_guard ON __SCHEMA__.topic_settings;
CREATE TRIGGER topic_settings_delivery_guard BEFORE INSERT OR UPDATE OF delivery OR DELETE
  ON __SCHEMA__.topic_settings FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.topic_settings_delivery_guard();

-- enqueue_messages: as in version 12, with the shared switch lock and the stale-snapshot check
-- first, the slot checked in WAL mode, and table-mode numbers continuing from the WAL relay's.
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
  switch_xid bigint;
  wal_latest bigint;
BEGIN
  -- A change of delivery (switch_delivery) waits for the enqueues in flight and holds new ones
  -- back until it commits, so each enqueue is wholly on one side of it. A shared advisory lock:
  -- in memory, no row written.
  PERFORM pg_advisory_xact_lock_shared(hashtext(__WAL_PREFIX__), 1);
  -- In READ COMMITTED the settings are read after the lock, on a new snapshot. A REPEATABLE READ
  -- or SERIALIZABLE transaction keeps the snapshot it started with: if a switch committed after
  -- it, its settings are stale, and it must start again (40001, as any serialization failure).
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    SELECT d.last_value INTO switch_xid FROM __SCHEMA__.delivery_switch d;
    IF switch_xid > 0 AND pg_xact_status(switch_xid::text::xid8) = 'committed'
       AND NOT pg_visible_in_snapshot(switch_xid::text::xid8, pg_current_snapshot()) THEN
      RAISE EXCEPTION 'outbox.enqueue: the delivery mode changed after this transaction took its snapshot; retry the transaction'
        USING ERRCODE = '40001';
    END IF;
  END IF;
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
    -- relay streams). A message emitted while no slot exists is decoded by no one: without the
    -- slot the enqueue fails (about 14 us a call, measured). A drop between this check and the
    -- commit is not seen (a drop takes no lock a writer could wait on).
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots s
                    WHERE s.slot_name = config.wal_slot AND s.database = current_database()
                      AND s.wal_status IS DISTINCT FROM 'lost') THEN
      RAISE EXCEPTION 'outbox.enqueue: delivery is ''wal'' but the logical replication slot "%" is gone (dropped, or its WAL lost): nothing was written. Recreate it with outboxctl migrate --wal-slot, or set delivery to ''table''',
        coalesce(config.wal_slot, '(none)') USING ERRCODE = '55000';
    END IF;
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
      -- One numbering whatever the mode: after WAL mode, the pair continues from the WAL relay's
      -- latest number (a switch back to the table waits until that relay has numbered everything
      -- committed before it: switch_delivery).
      wal_latest := 0;
      IF config.wal_slot IS NOT NULL THEN
        SELECT q.seq INTO wal_latest FROM __SCHEMA__.wal_seqs q
         WHERE q.target = targets[i] AND q.stream_key = enqueue_messages.stream_key
         ORDER BY q.seq DESC LIMIT 1;
        wal_latest := coalesce(wal_latest, 0);
      END IF;
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
            VALUES (targets[i], enqueue_messages.stream_key, greatest(latest, wal_latest) + 1,
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
          SELECT targets[i], enqueue_messages.stream_key,
                 greatest(coalesce(ts.last_seq, legacy.last_seq, 0), wal_latest),
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
