-- outbox schema, version 6: waking an idle relay without a lock that one writer holds against
-- another.
--
-- Before: the first enqueue after the relay went idle ran `UPDATE wakeup SET idle = false` and
-- kept that row lock until its transaction ended, so every other writer, of any stream, waited for
-- it (a 70 s transaction stopped all writers for 70 s) and two writers could deadlock through it.
--
-- Now the flag lives in two sequences. Sequences are not transactional: `SELECT last_value` reads
-- what the last nextval/setval wrote, whatever the reader's snapshot or isolation level, and
-- reading takes no lock a writer could wait on.
--   wakeup_idle_gen   a relay about to sleep takes the next value (its idle generation);
--   wakeup_woken_gen  a relay that got a notification sets it to the generation the notification
--                     named.
-- A writer notifies while idle_gen > woken_gen, with idle_gen as the payload: only writers that
-- commit between a relay's sleep and its wake-up notify (PostgreSQL folds equal notifications of
-- one transaction into one), never a busy relay's writers. Several relays may sleep at once: each
-- takes a newer generation, and a notification can only mark as woken the generations up to the
-- one its writer saw.
--
-- No lost wake-up: each enqueue first takes the shared advisory lock __WAKEUP_LOCK__ (held to
-- commit; shared locks never wait for each other) and then reads the generations. A relay about
-- to sleep takes its generation first and then lists the transactions holding that lock
-- (relay_idle): a writer that read the generations before they changed is on that list, and the
-- relay waits for the listed transactions to end (writers_running, polled at a bounded rate)
-- before its last look at the table. Writers that come later see the new generation and notify.
CREATE SEQUENCE __SCHEMA__.wakeup_idle_gen;
CREATE SEQUENCE __SCHEMA__.wakeup_woken_gen;
-- Both at 1 and called, so that they read equal until a relay sleeps (a sequence not yet called
-- reads its start value, which its first nextval returns again).
SELECT setval('__SCHEMA__.wakeup_idle_gen'::regclass, 1), setval('__SCHEMA__.wakeup_woken_gen'::regclass, 1);

-- Called by every enqueue, after its row is written.
CREATE FUNCTION __SCHEMA__.wake_relay() RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  idle bigint;
  woken bigint;
BEGIN
  PERFORM pg_advisory_xact_lock_shared(hashtext(__WAKEUP_LOCK__));
  SELECT last_value INTO idle FROM __SCHEMA__.wakeup_idle_gen;
  SELECT last_value INTO woken FROM __SCHEMA__.wakeup_woken_gen;
  IF idle > woken THEN
    PERFORM pg_notify(__CHANNEL__, idle::text);  -- delivered only if this transaction commits
  END IF;
END
$$;

-- A relay about to sleep: its idle generation, and the writers (virtual transaction ids) that may
-- have read an older one and are still to commit.
CREATE FUNCTION __SCHEMA__.relay_idle(OUT gen bigint, OUT writers text[])
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  lock_key bigint := hashtext(__WAKEUP_LOCK__);
BEGIN
  gen := nextval('__SCHEMA__.wakeup_idle_gen'::regclass);
  -- pg_locks shows a one-bigint advisory key as (classid, objid) = (high, low) 32 bits.
  SELECT coalesce(array_agg(l.virtualtransaction), '{}') INTO writers
  FROM pg_locks l
  WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND l.classid = ((lock_key >> 32) & 4294967295)::oid
    AND l.objid = (lock_key & 4294967295)::oid AND l.objsubid = 1;
END
$$;

-- Which of `writers` (from relay_idle) are still running.
CREATE FUNCTION __SCHEMA__.writers_running(writers text[]) RETURNS text[]
LANGUAGE sql VOLATILE AS $$
  SELECT coalesce(array_agg(l.virtualxid), '{}') FROM pg_locks l
  WHERE l.locktype = 'virtualxid' AND l.virtualxid = ANY (writers)
$$;

-- A relay was notified for generation `gen`: writers stop notifying until a relay sleeps again.
CREATE FUNCTION __SCHEMA__.relay_woken(gen bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF gen > (SELECT last_value FROM __SCHEMA__.wakeup_woken_gen) THEN
    PERFORM setval('__SCHEMA__.wakeup_woken_gen'::regclass, gen);
  END IF;
END
$$;

-- A relay that announced `gen` found work before any notification came: writers stop notifying.
-- Marking `gen` woken also marks older generations; one not yet woken may be another relay's,
-- asleep, so that relay is notified (a spurious wake-up costs it one claim).
CREATE FUNCTION __SCHEMA__.relay_withdraw(gen bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF (SELECT last_value FROM __SCHEMA__.wakeup_woken_gen) < gen - 1 THEN
    PERFORM pg_notify(__CHANNEL__, gen::text);
  END IF;
  PERFORM __SCHEMA__.relay_woken(gen);
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue_message(
  topic text,
  payload bytea,
  content_type text,
  stream_key text,
  type text,
  headers jsonb,
  target text,
  sequenced boolean
) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  config __SCHEMA__.settings%ROWTYPE;
  seq bigint;
  new_id uuid;
BEGIN
  SELECT * INTO config FROM __SCHEMA__.settings;
  PERFORM __SCHEMA__.check_text('topic', topic, 255);
  PERFORM __SCHEMA__.check_text('target', target, 255);
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

  IF stream_key IS NOT NULL THEN
    PERFORM __SCHEMA__.check_text('stream_key', stream_key, 255);
    IF sequenced IS NULL THEN
      SELECT t.sequenced INTO sequenced FROM __SCHEMA__.topic_settings t WHERE t.topic = enqueue_message.topic;
      sequenced := coalesce(sequenced, config.sequenced_by_default);
    END IF;
    IF sequenced THEN
      -- Holds the stream's counter row until commit: the next writer of this stream waits here.
      -- The id is made greater than the stream's previous one, so ids of one stream sort in
      -- stream_seq order (claims and batches are ordered by id).
      INSERT INTO __SCHEMA__.streams AS s (stream_key, last_seq, last_id)
      VALUES (enqueue_message.stream_key, 1, __SCHEMA__.uuid_v7())
      ON CONFLICT ON CONSTRAINT streams_pkey DO UPDATE
        SET last_seq = s.last_seq + 1,
            last_id = greatest(__SCHEMA__.uuid_v7(), __SCHEMA__.uuid_successor(s.last_id))
      RETURNING s.last_seq, s.last_id INTO seq, new_id;
    END IF;
  END IF;

  IF new_id IS NULL THEN
    new_id := __SCHEMA__.uuid_v7();
  END IF;
  INSERT INTO __SCHEMA__.messages
    (id, topic, stream_key, stream_seq, partition, target, type, payload, content_type, headers)
  VALUES
    (new_id, topic, stream_key, seq,
     __SCHEMA__.partition_of(coalesce(stream_key, new_id::text), config.partition_count),
     target, type, payload, content_type, headers);

  PERFORM __SCHEMA__.wake_relay();
  RETURN new_id;
END
$$;

DROP TABLE __SCHEMA__.wakeup;
