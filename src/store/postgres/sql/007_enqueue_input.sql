-- outbox schema, version 7: what enqueue takes in. __SCHEMA__ is replaced by the quoted schema
-- name.
--
-- 1. Header limits, in settings, enforced by build_headers (every enqueue overload, enqueue_batch
--    and the C++ Writer go through it), so that a message no sink could carry is refused when it
--    is written instead of being abandoned by the relay. The defaults are what every planned sink
--    carries with its own defaults, with room left for the outbox's own metadata (message_id,
--    outbox-topic, outbox-stream-key, outbox-stream-seq, outbox-partition, outbox-attempts, type
--    and content type: up to about 1.5 KiB) and for the transport's own headers:
--      max_header_name_bytes 128   AMQP 0-9-1 field names are at most 128 characters, and the
--                                  RabbitMQ sink refuses longer ones (Kafka, NATS, Redis and
--                                  HTTP allow more).
--      max_header_value_bytes 4096 one HTTP header line ("name: value") stays well under the
--                                  8 KiB that common servers allow per line (nginx, Apache).
--      max_headers_bytes 8192      names and values of all headers together, correlation_id and
--                                  causation_id included. HTTP servers cap a request's headers
--                                  at 16 KiB (Node.js) to 32 KiB (nginx): 8 KiB of user headers,
--                                  4 bytes of framing each, the outbox's and HTTP's own still
--                                  fit in 16 KiB. RabbitMQ: the whole content header must fit in
--                                  one frame (frame_max, 131072 by default and asked for by the
--                                  sink); at every maximum (64 headers, 8 KiB, 255-byte topic,
--                                  stream key, type, content type and correlation_id) the frame
--                                  is 10037 bytes. Kafka (message.max.bytes, 1 MB) and NATS
--                                  (max_payload, 1 MB) count headers with the payload; Redis
--                                  stream fields have no practical limit.
--      max_header_count 64         Apache takes at most 100 request header fields; 64 leaves
--                                  room for the outbox's and HTTP's own.
--    Raise them only if every sink of the outbox carries more; the C++ MessageLimits
--    (outbox/core/message.h) has the same defaults, and a test keeps the two equal.
ALTER TABLE __SCHEMA__.settings
  ADD COLUMN max_header_count integer NOT NULL DEFAULT 64 CHECK (max_header_count >= 0),
  ADD COLUMN max_header_name_bytes integer NOT NULL DEFAULT 128
    CHECK (max_header_name_bytes > 0),
  ADD COLUMN max_header_value_bytes integer NOT NULL DEFAULT 4096
    CHECK (max_header_value_bytes >= 0),
  ADD COLUMN max_headers_bytes integer NOT NULL DEFAULT 8192 CHECK (max_headers_bytes >= 0);

-- Validates headers (a JSON object of string values within the settings' limits, no control
-- characters, no reserved names) and folds the correlation and causation ids into them. Reads
-- settings only when there are headers.
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
    IF lower(entry.key) = 'message_id' OR lower(entry.key) LIKE 'outbox-%' THEN
      RAISE EXCEPTION 'outbox.enqueue: header "%" is reserved (message_id and names starting with "outbox-" are set by the outbox)',
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

-- 2. Payloads. enqueue took json, and bytea with a content type; it now also takes jsonb, text,
--    and bytea without one. PostgreSQL picks the overload from the argument types, and that rule
--    decides what an untyped argument (a literal like '{"a": 1}', or a parameter a driver sends
--    without a type) means: it goes to the candidate whose type is in the string category if
--    there is one ("Type Conversion", Functions, step 4.e). json, jsonb and bytea are not, so
--    with json and jsonb alone `payload => '{"a": 1}'` would be ambiguous.
--    * text is that string candidate, and it means what an untyped payload always meant: JSON
--      text, checked, stored as written, content type application/json. Other text goes as bytea
--      with its content type: payload => convert_to(body, 'UTF8'), content_type => 'text/plain'.
--    * text takes no content_type: with one, an untyped payload given with a content_type (a
--      driver sending a byte buffer untyped, or preparing with untyped parameters) would be read
--      as text instead of bytea, as it has been.
--    * jsonb is stored in jsonb's text form (keys sorted, spaces normalized), application/json.
--    * bytea without a content type is application/octet-stream.

-- Enqueue a JSON document given as jsonb, e.g. to_jsonb(NEW) in a trigger.
CREATE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload jsonb,
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

-- Enqueue JSON given as text (what an untyped literal or a driver's string parameter resolves
-- to); it must parse as JSON and is stored as written.
CREATE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload text,
  stream_key text DEFAULT NULL,
  type text DEFAULT NULL,
  headers jsonb DEFAULT '{}',
  target text DEFAULT 'default',
  correlation_id text DEFAULT NULL,
  causation_id text DEFAULT NULL,
  sequenced boolean DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
  SELECT __SCHEMA__.enqueue_message(topic, convert_to(payload::json::text, 'UTF8'),
    'application/json', stream_key, type,
    __SCHEMA__.build_headers(headers, correlation_id, causation_id), target, sequenced)
$$;

-- Enqueue opaque bytes; content_type defaults to application/octet-stream.
CREATE OR REPLACE FUNCTION __SCHEMA__.enqueue(
  topic text,
  payload bytea,
  content_type text DEFAULT 'application/octet-stream',
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
