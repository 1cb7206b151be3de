-- outbox schema, version 10: one enqueue, several targets (issue #24). __SCHEMA__ is replaced by
-- the quoted schema name.
--
-- A message written to several targets is one row per target (each published, retried and
-- abandoned on its own), sharing an event id: the first copy's id.

-- 1. The event id. NULL for a message written to one target: its event id is its own id. The
--    partial index serves the operator's "all copies of this event" and costs nothing for
--    single-target messages.
ALTER TABLE __SCHEMA__.messages ADD COLUMN event_id uuid;
CREATE INDEX messages_event ON __SCHEMA__.messages (event_id) WHERE event_id IS NOT NULL;

-- 2. stream_seq per (target, stream). One business stream sent to two destinations is two
--    streams: each destination's consumers see 1, 2, 3... with no gaps, and a target that is down
--    holds back only its own copies (head-of-line per target and stream in the claim). Writers of
--    one (target, stream) serialize on its row until commit, as they did on the stream's.
--    The counters of versions 1 to 9 (`streams`, per stream across targets) are read, never
--    written, from now on: a (target, stream) pair's first seq continues from its stream's old
--    counter, so that a consumer that has seen seq N of a stream never gets a seq <= N again (an
--    inbox would take it for a duplicate and drop it).
CREATE TABLE __SCHEMA__.target_streams (
  target text NOT NULL,
  stream_key text NOT NULL,
  last_seq bigint NOT NULL,
  -- The id of the pair's last message: the next one's id is made greater (see enqueue_messages).
  last_id uuid NOT NULL,
  PRIMARY KEY (target, stream_key)
);
-- The claim's head-of-line is per (target, stream) too (statements.cpp): a paused target's
-- messages are not claimed and hold back no other target's. The index version 9 made for the
-- clause "an earlier message of the stream waits for a paused target" serves nothing now, and
-- cost an index entry per keyed message written.
DROP INDEX IF EXISTS __SCHEMA__.messages_waiting_streams;
COMMENT ON TABLE __SCHEMA__.streams IS
  'stream_seq counters of schema versions 1 to 9, per stream across targets; since version 10 read only, as the floor of target_streams';

-- 3. A topic's default targets: where an enqueue that names no target writes its copies.
--    `sequenced` may now be left NULL (settings.sequenced_by_default decides).
ALTER TABLE __SCHEMA__.topic_settings ALTER COLUMN sequenced DROP NOT NULL,
  ADD COLUMN targets text[];

-- Raises invalid_parameter_value (22023) unless `targets` is a list of 1 to 32 distinct valid
-- target names (the C++ core has the same rule: ValidateTargets, kMaxTargets).
CREATE FUNCTION __SCHEMA__.check_targets(targets text[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  target text;
  position integer := 0;
BEGIN
  IF targets IS NULL OR cardinality(targets) = 0 THEN
    RAISE EXCEPTION 'outbox.enqueue: targets must name at least one target'
      USING ERRCODE = '22023';
  END IF;
  IF array_ndims(targets) > 1 THEN
    RAISE EXCEPTION 'outbox.enqueue: targets must be a one-dimensional array'
      USING ERRCODE = '22023';
  END IF;
  IF cardinality(targets) > 32 THEN
    RAISE EXCEPTION 'outbox.enqueue: targets: % targets, over the limit of 32',
      cardinality(targets) USING ERRCODE = '22023';
  END IF;
  FOREACH target IN ARRAY targets LOOP
    position := position + 1;
    PERFORM __SCHEMA__.check_text('target', target, 255);
    IF array_position(targets, target) < position THEN
      RAISE EXCEPTION 'outbox.enqueue: targets: "%" is named twice', target
        USING ERRCODE = '22023';
    END IF;
  END LOOP;
END
$$;

CREATE FUNCTION __SCHEMA__.topic_settings_check() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.targets IS NOT NULL THEN
    PERFORM __SCHEMA__.check_targets(NEW.targets);
  END IF;
  RETURN NEW;
END
$$;
CREATE TRIGGER topic_settings_check BEFORE INSERT OR UPDATE ON __SCHEMA__.topic_settings
  FOR EACH ROW EXECUTE FUNCTION __SCHEMA__.topic_settings_check();

-- Whether topic_settings has any row. Every enqueue reads settings anyway; with this it probes
-- topic_settings only when there is something to find there (the probe is about 3 us of an
-- enqueue's 60 in PL/pgSQL, and every enqueue that names no target would pay it).
ALTER TABLE __SCHEMA__.settings
  ADD COLUMN has_topic_settings boolean NOT NULL DEFAULT false;
UPDATE __SCHEMA__.settings SET has_topic_settings = EXISTS (SELECT 1 FROM __SCHEMA__.topic_settings);

CREATE FUNCTION __SCHEMA__.topic_settings_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE __SCHEMA__.settings
     SET has_topic_settings = EXISTS (SELECT 1 FROM __SCHEMA__.topic_settings)
   WHERE has_topic_settings IS DISTINCT FROM EXISTS (SELECT 1 FROM __SCHEMA__.topic_settings);
  RETURN NULL;
END
$$;
CREATE TRIGGER topic_settings_count AFTER INSERT OR DELETE OR TRUNCATE ON __SCHEMA__.topic_settings
  FOR EACH STATEMENT EXECUTE FUNCTION __SCHEMA__.topic_settings_count();

-- 4. event_id joins the reserved header names: the sinks send the event id under it.
CREATE OR REPLACE FUNCTION __SCHEMA__.build_headers(headers jsonb, correlation_id text,
                                                    causation_id text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
  config __SCHEMA__.settings%ROWTYPE;
  entry record;
  header_count bigint;
  total_bytes bigint := 0;
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
  SELECT * INTO config FROM __SCHEMA__.settings;
  SELECT count(*) INTO header_count FROM jsonb_object_keys(headers);
  IF header_count > config.max_header_count THEN
    RAISE EXCEPTION 'outbox.enqueue: % headers, over the limit of % (settings.max_header_count)',
      header_count, config.max_header_count USING ERRCODE = '22023';
  END IF;
  FOR entry IN SELECT key, value FROM jsonb_each(headers) LOOP
    IF octet_length(entry.key) > config.max_header_name_bytes THEN
      RAISE EXCEPTION 'outbox.enqueue: header name is % bytes, over the limit of % (settings.max_header_name_bytes)',
        octet_length(entry.key), config.max_header_name_bytes USING ERRCODE = '22023';
    END IF;
    PERFORM __SCHEMA__.check_text('header name', entry.key, config.max_header_name_bytes);
    IF lower(entry.key) IN ('message_id', 'event_id') OR lower(entry.key) LIKE 'outbox-%' THEN
      RAISE EXCEPTION 'outbox.enqueue: header "%" is reserved (message_id, event_id and names starting with "outbox-" are set by the outbox)',
        entry.key USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(entry.value) <> 'string' THEN
      RAISE EXCEPTION 'outbox.enqueue: header "%" must be a string, got %', entry.key,
        jsonb_typeof(entry.value) USING ERRCODE = '22023';
    END IF;
    IF octet_length(entry.value #>> '{}') > config.max_header_value_bytes THEN
      RAISE EXCEPTION 'outbox.enqueue: header "%" value is % bytes, over the limit of % (settings.max_header_value_bytes)',
        entry.key, octet_length(entry.value #>> '{}'), config.max_header_value_bytes
        USING ERRCODE = '22023';
    END IF;
    IF (entry.value #>> '{}') ~ '[\x01-\x1f\x7f]' THEN
      RAISE EXCEPTION 'outbox.enqueue: header "%" value contains a control character', entry.key
        USING ERRCODE = '22023';
    END IF;
    total_bytes := total_bytes + octet_length(entry.key) + octet_length(entry.value #>> '{}');
  END LOOP;
  IF total_bytes > config.max_headers_bytes THEN
    RAISE EXCEPTION 'outbox.enqueue: headers take % bytes (names and values), over the limit of % (settings.max_headers_bytes)',
      total_bytes, config.max_headers_bytes USING ERRCODE = '22023';
  END IF;
  RETURN headers;
END
$$;

-- 5. The one place messages are written now: one copy per target, in the caller's transaction.
--    `targets` NULL: the topic's default targets, else 'default'. Returns the copies' ids in the
--    order of `targets`. With several targets every copy's event_id is the first copy's id.
--    A sequenced stream's counters are taken in target name order, whatever the order given, so
--    that two writers fanning out the same stream to the same targets never deadlock.
CREATE FUNCTION __SCHEMA__.enqueue_messages(
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
  seq bigint;
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
      -- Holds the pair's counter row until commit: the next writer of this (target, stream)
      -- waits here. The id is made greater than the pair's previous one, so ids of one
      -- (target, stream) sort in stream_seq order (claims and batches are ordered by id).
      UPDATE __SCHEMA__.target_streams s
         SET last_seq = s.last_seq + 1,
             last_id = greatest(__SCHEMA__.uuid_v7(), __SCHEMA__.uuid_successor(s.last_id))
       WHERE s.target = targets[i] AND s.stream_key = enqueue_messages.stream_key
      RETURNING s.last_seq, s.last_id INTO seq, new_id;
      IF NOT FOUND THEN
        INSERT INTO __SCHEMA__.target_streams AS s (target, stream_key, last_seq, last_id)
        SELECT targets[i], enqueue_messages.stream_key, coalesce(legacy.last_seq, 0) + 1,
               greatest(__SCHEMA__.uuid_v7(), __SCHEMA__.uuid_successor(legacy.last_id))
          FROM (VALUES (1)) AS one(row)
          LEFT JOIN __SCHEMA__.streams legacy ON legacy.stream_key = enqueue_messages.stream_key
        ON CONFLICT ON CONSTRAINT target_streams_pkey DO UPDATE
          SET last_seq = s.last_seq + 1,
              last_id = greatest(__SCHEMA__.uuid_v7(), __SCHEMA__.uuid_successor(s.last_id))
        RETURNING s.last_seq, s.last_id INTO seq, new_id;
      END IF;
      seqs[i] := seq;
      ids[i] := new_id;
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

-- The single-target form, as before: `target` NULL means the topic's default targets, and then
-- the first copy's id (the event id) is returned.
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
LANGUAGE sql VOLATILE AS $$
  SELECT (__SCHEMA__.enqueue_messages(topic, payload, content_type, stream_key, type, headers,
    CASE WHEN target IS NULL THEN NULL ELSE ARRAY[target] END, sequenced))[1]
$$;

-- 6. enqueue without `target` now goes to the topic's default targets (still 'default' when the
--    topic has none); `target => 'x'` still writes one message to x. The forms with `targets`
--    write one message per target and return all their ids, in the order given:
--      SELECT outbox.enqueue(topic => 'orders', payload => '{"id": 42}', stream_key => 'order-42',
--                            targets => ARRAY['default', 'partner']);
--    `targets` has no default, which keeps every call unambiguous: a call that names it can only
--    mean these forms, one that does not only the forms without it.
CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload json,
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  target text DEFAULT NULL,
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
  SELECT (__SCHEMA__.enqueue_messages(topic, convert_to(payload::text, 'UTF8'), 'application/json',
    stream_key, type, __SCHEMA__.build_headers(headers, correlation_id, causation_id),
    CASE WHEN target IS NULL THEN NULL ELSE ARRAY[target] END, sequenced))[1]
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload jsonb,
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  target text DEFAULT NULL,
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
  SELECT (__SCHEMA__.enqueue_messages(topic, convert_to(payload::text, 'UTF8'), 'application/json',
    stream_key, type, __SCHEMA__.build_headers(headers, correlation_id, causation_id),
    CASE WHEN target IS NULL THEN NULL ELSE ARRAY[target] END, sequenced))[1]
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload text,
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  target text DEFAULT NULL,
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
  SELECT (__SCHEMA__.enqueue_messages(topic, convert_to(payload::json::text, 'UTF8'),
    'application/json', stream_key, type,
    __SCHEMA__.build_headers(headers, correlation_id, causation_id),
    CASE WHEN target IS NULL THEN NULL ELSE ARRAY[target] END, sequenced))[1]
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload bytea,
  content_type text DEFAULT 'application/octet-stream',
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  target text DEFAULT NULL,
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
  SELECT (__SCHEMA__.enqueue_messages(topic, payload, content_type, stream_key, type,
    __SCHEMA__.build_headers(headers, correlation_id, causation_id),
    CASE WHEN target IS NULL THEN NULL ELSE ARRAY[target] END, sequenced))[1]
$$;

CREATE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload json,
  targets text[],
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid[]
LANGUAGE sql VOLATILE AS $$
  SELECT __SCHEMA__.enqueue_messages(topic, convert_to(payload::text, 'UTF8'), 'application/json',
    stream_key, type, __SCHEMA__.build_headers(headers, correlation_id, causation_id),
    coalesce(targets, '{}'), sequenced)
$$;

CREATE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload jsonb,
  targets text[],
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid[]
LANGUAGE sql VOLATILE AS $$
  SELECT __SCHEMA__.enqueue_messages(topic, convert_to(payload::text, 'UTF8'), 'application/json',
    stream_key, type, __SCHEMA__.build_headers(headers, correlation_id, causation_id),
    coalesce(targets, '{}'), sequenced)
$$;

CREATE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload text,
  targets text[],
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid[]
LANGUAGE sql VOLATILE AS $$
  SELECT __SCHEMA__.enqueue_messages(topic, convert_to(payload::json::text, 'UTF8'),
    'application/json', stream_key, type,
    __SCHEMA__.build_headers(headers, correlation_id, causation_id), coalesce(targets, '{}'),
    sequenced)
$$;

CREATE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload bytea,
  targets text[],
  content_type text DEFAULT 'application/octet-stream',
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid[]
LANGUAGE sql VOLATILE AS $$
  SELECT __SCHEMA__.enqueue_messages(topic, payload, content_type, stream_key, type,
    __SCHEMA__.build_headers(headers, correlation_id, causation_id), coalesce(targets, '{}'),
    sequenced)
$$;

-- 7. The batch form takes "targets" (a JSON array of names) besides "target"; a message with
--    several targets gives several rows, one per copy in the order of its targets, all with the
--    message's ordinal.
--      SELECT * FROM outbox.enqueue_batch('[{"topic": "orders", "payload": {"id": 1},
--                                            "targets": ["default", "partner"]}]');
CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue_batch(messages jsonb)
RETURNS TABLE (ordinal bigint, id uuid)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  message jsonb;
  position bigint;
  unknown text;
  targets text[];
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
     WHERE k NOT IN ('topic', 'payload', 'stream_key', 'type', 'headers', 'target', 'targets',
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
    targets := NULL;
    IF message ? 'targets' THEN
      IF message ? 'target' THEN
        RAISE EXCEPTION 'outbox.enqueue_batch: element %: give "target" or "targets", not both',
          position USING ERRCODE = '22023';
      END IF;
      IF jsonb_typeof(message -> 'targets') IS DISTINCT FROM 'array' OR EXISTS (
          SELECT 1 FROM jsonb_array_elements(message -> 'targets') AS t(value)
          WHERE jsonb_typeof(t.value) <> 'string') THEN
        RAISE EXCEPTION 'outbox.enqueue_batch: element %: targets must be a JSON array of strings',
          position USING ERRCODE = '22023';
      END IF;
      -- Checked by enqueue_messages, like every caller's.
      targets := ARRAY(SELECT jsonb_array_elements_text(message -> 'targets'));
    ELSIF message ? 'target' AND jsonb_typeof(message -> 'target') <> 'null' THEN
      targets := ARRAY[message ->> 'target'];
    END IF;
    ordinal := position;
    FOR id IN SELECT unnest(__SCHEMA__.enqueue_messages(
      message ->> 'topic', convert_to((message -> 'payload')::text, 'UTF8'), 'application/json',
      message ->> 'stream_key', message ->> 'type',
      __SCHEMA__.build_headers(coalesce(message -> 'headers', '{}'), message ->> 'correlation_id',
                             message ->> 'causation_id'),
      targets, (message ->> 'sequenced')::boolean)) LOOP
      RETURN NEXT;
    END LOOP;
  END LOOP;
END
$$;
