-- outbox schema, version 1. __SCHEMA__ is replaced by the quoted schema name, __CHANNEL__ by the
-- wakeup channel and __WAKEUP_LOCK__ by the wakeup lock's name, both as string literals.
-- Runs inside the migration transaction; see migrations.cpp.

-- One row of settings that the SQL functions read, so that every writer in every language gets
-- the same limits and partitioning.
CREATE TABLE __SCHEMA__.settings (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  partition_count integer NOT NULL DEFAULT 64 CHECK (partition_count BETWEEN 1 AND 4096),
  max_payload_bytes integer NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes > 0),
  -- Whether keyed messages get a gap-free stream_seq when neither the call nor topic_settings say.
  sequenced_by_default boolean NOT NULL DEFAULT true
);
INSERT INTO __SCHEMA__.settings DEFAULT VALUES;

-- Per-topic overrides of settings.sequenced_by_default.
CREATE TABLE __SCHEMA__.topic_settings (
  topic text PRIMARY KEY,
  sequenced boolean NOT NULL
);

-- The relay sets `idle` before it sleeps on LISTEN; the first enqueue after that flips it back and
-- sends one NOTIFY. Writers of a busy relay send none: a NOTIFY in every transaction serializes
-- commits on the notification queue lock.
CREATE TABLE __SCHEMA__.wakeup (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  idle boolean NOT NULL DEFAULT false
);
INSERT INTO __SCHEMA__.wakeup DEFAULT VALUES;

-- The per-stream counter behind stream_seq. Writers of one stream serialize on its row until they
-- commit, which makes stream_seq gap-free and in commit order.
CREATE TABLE __SCHEMA__.streams (
  stream_key text PRIMARY KEY,
  last_seq bigint NOT NULL,
  -- The id of the stream's last message: the next one's id is made greater, so that within a
  -- stream id order is stream_seq order whatever the clocks of the writers' backends do.
  last_id uuid NOT NULL
);

CREATE TABLE __SCHEMA__.messages (
  id uuid PRIMARY KEY,
  topic text NOT NULL,
  stream_key text,
  stream_seq bigint,
  partition integer NOT NULL,
  target text NOT NULL,
  type text,
  payload bytea NOT NULL,  -- stored as given, never re-rendered
  content_type text NOT NULL,
  headers jsonb NOT NULL DEFAULT '{}',
  status text NOT NULL DEFAULT 'pending'
    CHECK (status IN ('pending', 'processing', 'failed', 'published', 'abandoned')),
  attempts integer NOT NULL DEFAULT 0,
  available_at timestamptz NOT NULL DEFAULT now(),
  last_error text,
  lease_owner text,
  lease_until timestamptz,
  lease_epoch bigint NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now(),
  published_at timestamptz,
  abandoned_at timestamptz
) WITH (
  -- A queue table: rows are inserted, updated once and deleted. Vacuum it early so that claims do
  -- not wade through dead index entries.
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_insert_scale_factor = 0.01,
  autovacuum_analyze_scale_factor = 0.02
);

-- The claim walks this index in id (= creation time) order.
CREATE INDEX messages_claimable ON __SCHEMA__.messages (id)
  WHERE status IN ('pending', 'failed');
-- Small: only leased and failed rows. Serves the per-stream head-of-line check and lease reclaim.
CREATE INDEX messages_in_flight ON __SCHEMA__.messages (stream_key, id)
  WHERE status IN ('processing', 'failed');
-- Retention and operator listings.
CREATE INDEX messages_published ON __SCHEMA__.messages (published_at) WHERE status = 'published';
CREATE INDEX messages_abandoned ON __SCHEMA__.messages (abandoned_at) WHERE status = 'abandoned';

-- UUIDv7 (RFC 9562) on the database clock: 48-bit Unix milliseconds, then the sub-millisecond
-- fraction in the 12 bits of rand_a (method 3), so that ids taken one after another by serialized
-- writers of a stream sort in that order; the rest is random. (All of PostgreSQL's bit operators
-- share one precedence, hence the parentheses.)
CREATE FUNCTION __SCHEMA__.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  SELECT encode(
    set_byte(set_byte(
      overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send(micros / 1000) FROM 3) FROM 1),
      6, (112 | (((micros % 1000) * 4096 / 1000) >> 8))::int),
      7, (((micros % 1000) * 4096 / 1000) & 255)::int),
    'hex')::uuid
  FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS micros) AS now
$$;

-- The next UUID after `u` in sort order: its last 8 bytes plus one (the version and timestamp
-- bytes are untouched; a carry into the variant bits would need 62 one-bits in a row).
CREATE FUNCTION __SCHEMA__.uuid_successor(u uuid) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT encode(substring(uuid_send(u) FROM 1 FOR 8) ||
                int8send(('x' || encode(substring(uuid_send(u) FROM 9 FOR 8), 'hex'))::bit(64)::bigint + 1),
                'hex')::uuid
$$;

-- 32-bit FNV-1a over the bytes of `data`: the partition hash shared with the C++ core
-- (outbox::Fnv1a32). Never change it: it decides which relay publishes which stream.
CREATE FUNCTION __SCHEMA__.fnv1a32(data bytea) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
  hash bigint := 2166136261;
BEGIN
  FOR i IN 0 .. length(data) - 1 LOOP
    hash := ((hash # get_byte(data, i)) * 16777619) & 4294967295;
  END LOOP;
  RETURN hash;
END
$$;

CREATE FUNCTION __SCHEMA__.partition_of(key text, partition_count integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT (__SCHEMA__.fnv1a32(convert_to(key, 'UTF8')) % partition_count)::integer
$$;

-- Raises invalid_parameter_value (22023) naming the argument; every message reads
-- "outbox.enqueue: <argument> ...".
CREATE FUNCTION __SCHEMA__.check_text(argument text, value text, max_bytes integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF value IS NULL OR value = '' THEN
    RAISE EXCEPTION 'outbox.enqueue: % must not be empty', argument USING ERRCODE = '22023';
  END IF;
  IF octet_length(value) > max_bytes THEN
    RAISE EXCEPTION 'outbox.enqueue: % is % bytes, over the limit of %',
      argument, octet_length(value), max_bytes USING ERRCODE = '22023';
  END IF;
  IF value ~ '[\x01-\x1f\x7f]' THEN
    RAISE EXCEPTION 'outbox.enqueue: % contains a control character', argument
      USING ERRCODE = '22023';
  END IF;
END
$$;

-- Validates headers (a JSON object of string values, no control characters, no reserved names)
-- and folds the correlation and causation ids into them.
CREATE FUNCTION __SCHEMA__.build_headers(headers jsonb, correlation_id text, causation_id text)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  entry record;
BEGIN
  headers := coalesce(headers, '{}'::jsonb);
  IF jsonb_typeof(headers) <> 'object' THEN
    RAISE EXCEPTION 'outbox.enqueue: headers must be a JSON object, got %', jsonb_typeof(headers)
      USING ERRCODE = '22023';
  END IF;
  IF correlation_id IS NOT NULL THEN
    headers := headers || jsonb_build_object('correlation_id', correlation_id);
  END IF;
  IF causation_id IS NOT NULL THEN
    headers := headers || jsonb_build_object('causation_id', causation_id);
  END IF;
  IF headers = '{}'::jsonb THEN
    RETURN headers;
  END IF;
  FOR entry IN SELECT key, value FROM jsonb_each(headers) LOOP
    PERFORM __SCHEMA__.check_text('header name', entry.key, 4096);
    IF lower(entry.key) = 'message_id' OR lower(entry.key) LIKE 'outbox-%' THEN
      RAISE EXCEPTION 'outbox.enqueue: header "%" is reserved (message_id and names starting with "outbox-" are set by the outbox)',
        entry.key USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(entry.value) <> 'string' THEN
      RAISE EXCEPTION 'outbox.enqueue: header "%" must be a string, got %', entry.key,
        jsonb_typeof(entry.value) USING ERRCODE = '22023';
    END IF;
    IF octet_length(entry.value #>> '{}') > 4096 THEN
      RAISE EXCEPTION 'outbox.enqueue: header "%" value is over the limit of 4096 bytes', entry.key
        USING ERRCODE = '22023';
    END IF;
    IF (entry.value #>> '{}') ~ '[\x01-\x1f\x7f]' THEN
      RAISE EXCEPTION 'outbox.enqueue: header "%" value contains a control character', entry.key
        USING ERRCODE = '22023';
    END IF;
  END LOOP;
  RETURN headers;
END
$$;

-- The one place a message is written. Both enqueue overloads, the batch form and the C++ writer
-- end here.
CREATE FUNCTION __SCHEMA__.enqueue_message(
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

  -- Wake an idle relay, once; NOTIFY is delivered only if this transaction commits. The shared
  -- advisory lock, held to commit, tells a relay about to sleep that a writer which may have seen
  -- "not idle" has yet to commit (the relay try-locks it exclusively: see postgres::Wakeup). It
  -- never blocks a writer.
  PERFORM pg_advisory_xact_lock_shared(hashtext(__WAKEUP_LOCK__));
  UPDATE __SCHEMA__.wakeup SET idle = false WHERE idle;
  IF FOUND THEN
    PERFORM pg_notify(__CHANNEL__, '');
  END IF;
  RETURN new_id;
END
$$;

-- Enqueue a JSON message. Named arguments beyond topic and payload are optional:
--   SELECT outbox.enqueue(topic => 'orders', payload => '{"id": 42}', stream_key => 'order-42');
CREATE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload json,
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  target text DEFAULT 'default',
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
  SELECT __SCHEMA__.enqueue_message(topic, convert_to(payload::text, 'UTF8'), 'application/json',
    stream_key, type, __SCHEMA__.build_headers(headers, correlation_id, causation_id), target,
    sequenced)
$$;

-- Enqueue opaque bytes; content_type is required.
CREATE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload bytea,
  content_type text,
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  target text DEFAULT 'default',
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
  SELECT __SCHEMA__.enqueue_message(topic, payload, content_type, stream_key, type,
    __SCHEMA__.build_headers(headers, correlation_id, causation_id), target, sequenced)
$$;

-- Batch form: a JSON array of objects with the same keys as enqueue's arguments ("payload" is any
-- JSON value). Returns the new ids in array order.
--   SELECT * FROM outbox.enqueue_batch('[{"topic": "orders", "payload": {"id": 1}}]');
CREATE FUNCTION __SCHEMA__.enqueue_batch(messages jsonb)
RETURNS TABLE (ordinal bigint, id uuid)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  message jsonb;
  position bigint;
  unknown text;
BEGIN
  IF jsonb_typeof(messages) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION 'outbox.enqueue_batch: messages must be a JSON array' USING ERRCODE = '22023';
  END IF;
  FOR message, position IN SELECT value, n FROM jsonb_array_elements(messages) WITH ORDINALITY AS e(value, n) LOOP
    IF jsonb_typeof(message) <> 'object' THEN
      RAISE EXCEPTION 'outbox.enqueue_batch: element % must be a JSON object', position
        USING ERRCODE = '22023';
    END IF;
    SELECT k INTO unknown FROM jsonb_object_keys(message) AS k
     WHERE k NOT IN ('topic', 'payload', 'stream_key', 'type', 'headers', 'target',
                     'correlation_id', 'causation_id', 'sequenced')
     LIMIT 1;
    IF unknown IS NOT NULL THEN
      RAISE EXCEPTION 'outbox.enqueue_batch: element %: unknown key "%"', position, unknown
        USING ERRCODE = '22023';
    END IF;
    IF NOT message ? 'payload' THEN
      RAISE EXCEPTION 'outbox.enqueue_batch: element %: payload is missing', position
        USING ERRCODE = '22023';
    END IF;
    ordinal := position;
    id := __SCHEMA__.enqueue_message(
      message ->> 'topic', convert_to((message -> 'payload')::text, 'UTF8'), 'application/json',
      message ->> 'stream_key', message ->> 'type',
      __SCHEMA__.build_headers(coalesce(message -> 'headers', '{}'), message ->> 'correlation_id',
                             message ->> 'causation_id'),
      coalesce(message ->> 'target', 'default'), (message ->> 'sequenced')::boolean);
    RETURN NEXT;
  END LOOP;
END
$$;
