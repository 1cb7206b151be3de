-- outbox schema for MariaDB, version 2: enqueue, in the caller's transaction. __SCHEMA__ is
-- replaced by the backquoted database name.
--
-- The procedures an application calls (positional arguments: MariaDB routines have neither
-- overloading nor defaults; pass NULL for "the default"). The arguments are PostgreSQL's
-- outbox.enqueue's, in the same order (src/store/postgres/sql/010_fan_out.sql):
--
--   CALL outbox.enqueue(topic, payload, stream_key, type, headers, target, correlation_id,
--                       causation_id, sequenced);
--     payload: JSON text, stored as written, content type application/json.
--   CALL outbox.enqueue_bytes(topic, payload, content_type, stream_key, type, headers, target,
--                             correlation_id, causation_id, sequenced);
--     payload: bytes, stored exactly; content_type NULL: application/octet-stream.
--   CALL outbox.enqueue_batch(messages);
--     a JSON array of objects with PostgreSQL's enqueue_batch keys (topic, payload, stream_key,
--     type, headers, target or targets, correlation_id, causation_id, sequenced); besides, a
--     binary payload may be given as "payload_base64" with "content_type" (what the C++ Writer
--     sends). Writing to several targets (fan-out) from SQL goes through this form.
--
--   headers: a JSON object of strings (NULL: none); target NULL: the topic's default targets
--   (topic_settings.targets), else 'default'; sequenced NULL: topic_settings.sequenced, else
--   settings.sequenced_by_default.
--
-- Each returns one result set: enqueue and enqueue_bytes one row, `id`, the message's event id
-- (its first copy's id) as UUID text; enqueue_batch one row per copy, `ordinal` (the message's
-- position, from 1) and `id`, in the order of the messages and of each message's targets.
--
-- Ids: UUIDv7 made here from UTC_TIMESTAMP(6) and RANDOM_BYTES (whatever the session's
-- time_zone); within a (target, stream) each id is greater than the one before (last_id), and
-- within a CALL each id is greater than the one before, so that a batch's ids follow its order.
--
-- Errors: a message the limits refuse gets SQLSTATE 22023 (PostgreSQL's invalid_parameter_value)
-- and a message worded as PostgreSQL's ("outbox.enqueue: topic must not be empty"). The server's
-- own refusals keep theirs (22007 bad UTF-8, 22001 too long, 23000 a CHECK): the C++ Writer turns
-- every 22xxx and 23xxx into InvalidMessage. A CALL is all or nothing: on an error it rolls back
-- what it wrote (to a savepoint, or its own transaction when called with autocommit outside one),
-- except a deadlock (1213), which InnoDB ends by rolling back the whole transaction: run it again.
--
-- Locks: writers of one sequenced (target, stream) take turns on its target_streams row until
-- they commit (INSERT ... ON DUPLICATE KEY UPDATE on the primary key: a record lock, no gap
-- lock, in READ COMMITTED and REPEATABLE READ alike), which makes stream_seq gap-free and in
-- commit order. Writers of different streams take no lock in common. A message fanned out to
-- several targets takes its counters in target name order, so that two such writers wait for
-- each other instead of deadlocking. One deadlock InnoDB itself makes: when the first writer of a
-- new (target, stream) rolls back while two or more others wait for its new row, their waits
-- become gap locks and one of them may be chosen as a deadlock victim (1213; rare, seen under 8
-- writers of one new stream with 20 % rollbacks); it runs its transaction again, as any MariaDB
-- writer must on 1213. Once the row is committed, writers of the stream only wait.
--
-- Replication: ids come from RANDOM_BYTES and the clock, which statement-based binary logging
-- cannot replay; binlog_format MIXED (MariaDB's default) or ROW logs these writes as rows.
--
-- The helpers are procedures, not functions: creating a stored function needs SUPER (or
-- log_bin_trust_function_creators) on a server with a binary log. Strings are compared as
-- binary (utf8mb4_bin), as PostgreSQL compares text. No backslash escapes below, so that the
-- file reads the same whatever the migrator's sql_mode.

-- Raises 22023 with `message`. (SIGNAL takes a variable, not an expression.)
DROP PROCEDURE IF EXISTS __SCHEMA__.enqueue_fail;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.enqueue_fail(message VARCHAR(512) CHARACTER SET utf8mb4)
  NO SQL
BEGIN
  SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = message;
END //
DELIMITER ;

-- Refuses NULL or empty text, text over `max_bytes` bytes and text with a control character
-- (0x00-0x1f, 0x7f): "outbox.enqueue: <argument> ...".
DROP PROCEDURE IF EXISTS __SCHEMA__.enqueue_check_text;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.enqueue_check_text(
  argument VARCHAR(64),
  value LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  max_bytes INT)
  NO SQL
BEGIN
  IF value IS NULL OR value = '' THEN
    CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: ', argument, ' must not be empty'));
  END IF;
  IF OCTET_LENGTH(value) > max_bytes THEN
    CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: ', argument, ' is ',
                                        OCTET_LENGTH(value), ' bytes, over the limit of ',
                                        max_bytes));
  END IF;
  IF value REGEXP CONCAT('[', CHAR(1), '-', CHAR(31), CHAR(127), ']')
     OR LOCATE(CHAR(0), value) > 0 THEN
    CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: ', argument,
                                        ' contains a control character'));
  END IF;
END //
DELIMITER ;

-- Validates `headers` (a JSON object of string values within the settings' limits, no control
-- characters, no reserved names) and folds the correlation and causation ids into them, as
-- PostgreSQL's build_headers. Returns the headers compacted.
DROP PROCEDURE IF EXISTS __SCHEMA__.enqueue_build_headers;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.enqueue_build_headers(
  INOUT headers LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  correlation_id LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  causation_id LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
  READS SQL DATA
BEGIN
  DECLARE header_count, name_limit, value_limit, total_limit, i INT;
  DECLARE total_bytes BIGINT DEFAULT 0;
  DECLARE header_names, value LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
  DECLARE name, text_value LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
  DECLARE kind VARCHAR(32);
  SET headers = COALESCE(headers, '{}');
  IF NOT JSON_VALID(headers) THEN
    CALL __SCHEMA__.enqueue_fail('outbox.enqueue: headers must be a JSON object, got invalid JSON');
  END IF;
  IF JSON_TYPE(headers) <> 'OBJECT' THEN
    SET kind = LOWER(JSON_TYPE(headers));
    CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: headers must be a JSON object, got ',
      CASE WHEN kind IN ('integer', 'double') THEN 'number' ELSE kind END));
  END IF;
  IF correlation_id IS NOT NULL THEN
    SET headers = JSON_SET(headers, '$.correlation_id', correlation_id);
  END IF;
  IF causation_id IS NOT NULL THEN
    SET headers = JSON_SET(headers, '$.causation_id', causation_id);
  END IF;
  SET header_count = JSON_LENGTH(headers);
  IF header_count = 0 THEN
    SET headers = '{}';
  ELSE
    SELECT max_header_count, max_header_name_bytes, max_header_value_bytes, max_headers_bytes
      INTO i, name_limit, value_limit, total_limit FROM __SCHEMA__.settings;
    IF header_count > i THEN
      CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: ', header_count,
        ' headers, over the limit of ', i, ' (settings.max_header_count)'));
    END IF;
    SET header_names = JSON_KEYS(headers);
    SET i = 0;
    WHILE i < header_count DO
      SET name = JSON_VALUE(header_names, CONCAT('$[', i, ']'));
      IF OCTET_LENGTH(name) > name_limit THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: header name is ',
          OCTET_LENGTH(name), ' bytes, over the limit of ', name_limit,
          ' (settings.max_header_name_bytes)'));
      END IF;
      CALL __SCHEMA__.enqueue_check_text('header name', name, name_limit);
      IF LOWER(name) IN ('message_id', 'event_id') OR LOWER(name) LIKE 'outbox-%' THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: header "', name,
          '" is reserved (message_id, event_id and names starting with "outbox-" are set by the outbox)'));
      END IF;
      SET value = JSON_EXTRACT(headers, CONCAT('$.', JSON_QUOTE(name)));
      IF JSON_TYPE(value) <> 'STRING' THEN
        SET kind = LOWER(JSON_TYPE(value));
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: header "', name,
          '" must be a string, got ',
          CASE WHEN kind IN ('integer', 'double') THEN 'number' ELSE kind END));
      END IF;
      SET text_value = JSON_UNQUOTE(value);
      IF OCTET_LENGTH(text_value) > value_limit THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: header "', name, '" value is ',
          OCTET_LENGTH(text_value), ' bytes, over the limit of ', value_limit,
          ' (settings.max_header_value_bytes)'));
      END IF;
      IF text_value REGEXP CONCAT('[', CHAR(1), '-', CHAR(31), CHAR(127), ']')
         OR LOCATE(CHAR(0), text_value) > 0 THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: header "', name,
          '" value contains a control character'));
      END IF;
      SET total_bytes = total_bytes + OCTET_LENGTH(name) + OCTET_LENGTH(text_value);
      SET i = i + 1;
    END WHILE;
    IF total_bytes > total_limit THEN
      CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: headers take ', total_bytes,
        ' bytes (names and values), over the limit of ', total_limit,
        ' (settings.max_headers_bytes)'));
    END IF;
    SET headers = JSON_COMPACT(headers);
  END IF;
END //
DELIMITER ;

-- Refuses `targets` unless it is a JSON array of 1 to 32 distinct valid target names (the C++
-- core has the same rule: ValidateTargets, kMaxTargets).
DROP PROCEDURE IF EXISTS __SCHEMA__.enqueue_check_targets;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.enqueue_check_targets(
  targets LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
  NO SQL
BEGIN
  DECLARE copies, i, j INT;
  DECLARE target, other LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
  IF targets IS NULL OR NOT JSON_VALID(targets) OR JSON_TYPE(targets) <> 'ARRAY' THEN
    CALL __SCHEMA__.enqueue_fail('outbox.enqueue: targets must be a JSON array of strings');
  END IF;
  SET copies = JSON_LENGTH(targets);
  IF copies = 0 THEN
    CALL __SCHEMA__.enqueue_fail('outbox.enqueue: targets must name at least one target');
  END IF;
  IF copies > 32 THEN
    CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: targets: ', copies,
                                        ' targets, over the limit of 32'));
  END IF;
  SET i = 0;
  WHILE i < copies DO
    SET target = JSON_EXTRACT(targets, CONCAT('$[', i, ']'));
    IF JSON_TYPE(target) = 'NULL' THEN
      SET target = NULL;
    ELSEIF JSON_TYPE(target) <> 'STRING' THEN
      CALL __SCHEMA__.enqueue_fail('outbox.enqueue: targets must be a JSON array of strings');
    ELSE
      SET target = JSON_UNQUOTE(target);
    END IF;
    CALL __SCHEMA__.enqueue_check_text('target', target, 255);
    SET j = 0;
    WHILE j < i DO
      SET other = JSON_VALUE(targets, CONCAT('$[', j, ']'));
      IF other = target THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: targets: "', target,
                                            '" is named twice'));
      END IF;
      SET j = j + 1;
    END WHILE;
    SET i = i + 1;
  END WHILE;
END //
DELIMITER ;

-- topic_settings.targets is checked as a call's targets are.
DROP TRIGGER IF EXISTS __SCHEMA__.topic_settings_insert_check;
DELIMITER //
CREATE TRIGGER __SCHEMA__.topic_settings_insert_check BEFORE INSERT ON __SCHEMA__.topic_settings
FOR EACH ROW
BEGIN
  IF NEW.targets IS NOT NULL THEN
    CALL __SCHEMA__.enqueue_check_targets(NEW.targets);
  END IF;
END //
DELIMITER ;
DROP TRIGGER IF EXISTS __SCHEMA__.topic_settings_update_check;
DELIMITER //
CREATE TRIGGER __SCHEMA__.topic_settings_update_check BEFORE UPDATE ON __SCHEMA__.topic_settings
FOR EACH ROW
BEGIN
  IF NEW.targets IS NOT NULL THEN
    CALL __SCHEMA__.enqueue_check_targets(NEW.targets);
  END IF;
END //
DELIMITER ;

-- A new UUIDv7 (RFC 9562) from the database clock, greater than `after` when given: 48-bit Unix
-- milliseconds, the sub-millisecond fraction in the 12 bits of rand_a (method 3), then the
-- variant and 62 random bits. `after` + 1 is `after` with its last 8 bytes plus one (a carry into
-- the variant bits would need 62 one-bits in a row).
DROP PROCEDURE IF EXISTS __SCHEMA__.enqueue_new_id;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.enqueue_new_id(after BINARY(16), OUT id BINARY(16))
  NO SQL
BEGIN
  DECLARE micros BIGINT UNSIGNED
    DEFAULT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6));
  DECLARE noise BINARY(8) DEFAULT RANDOM_BYTES(8);
  SET id = UNHEX(CONCAT(LPAD(HEX(micros DIV 1000), 12, '0'), '7',
                        LPAD(HEX((micros MOD 1000) * 4096 DIV 1000), 3, '0'),
                        LPAD(HEX((ASCII(noise) & 63) | 128), 2, '0'),
                        HEX(SUBSTRING(noise, 2))));
  IF after IS NOT NULL THEN
    SET id = GREATEST(id, CONCAT(LEFT(after, 8), UNHEX(LPAD(HEX(
               CAST(CONV(HEX(SUBSTRING(after, 9)), 16, 10) AS UNSIGNED) + 1), 16, '0'))));
  END IF;
END //
DELIMITER ;

-- The partition of `key` (the stream key, or the id's text for an unkeyed message): 32-bit FNV-1a
-- over its UTF-8 bytes mod partition_count, the hash shared with the C++ core (outbox::Fnv1a32,
-- PartitionFor). Never change it: it decides which relay publishes which stream. Four bytes a
-- statement (the loop is most of its cost).
DROP PROCEDURE IF EXISTS __SCHEMA__.partition_of;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.partition_of(
  key_text LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  partition_count INT,
  OUT partition_no INT)
  NO SQL
BEGIN
  DECLARE key_bytes LONGBLOB DEFAULT CAST(key_text AS BINARY);
  DECLARE bytes INT DEFAULT OCTET_LENGTH(key_bytes);
  DECLARE i INT DEFAULT 1;
  DECLARE hash BIGINT UNSIGNED DEFAULT 2166136261;
  WHILE i + 3 <= bytes DO
    SET hash = ((((((((hash ^ ASCII(SUBSTRING(key_bytes, i, 1))) * 16777619) & 4294967295)
                 ^ ASCII(SUBSTRING(key_bytes, i + 1, 1))) * 16777619) & 4294967295)
                 ^ ASCII(SUBSTRING(key_bytes, i + 2, 1))) * 16777619) & 4294967295;
    SET hash = ((hash ^ ASCII(SUBSTRING(key_bytes, i + 3, 1))) * 16777619) & 4294967295;
    SET i = i + 4;
  END WHILE;
  WHILE i <= bytes DO
    SET hash = ((hash ^ ASCII(SUBSTRING(key_bytes, i, 1))) * 16777619) & 4294967295;
    SET i = i + 1;
  END WHILE;
  SET partition_no = hash MOD partition_count;
END //
DELIMITER ;

-- partition_of for an unkeyed message: the hash of its id's canonical text (36 bytes, lower-case
-- 8-4-4-4-12 hex, as Uuid::ToString and PostgreSQL's uuid text), unrolled: most of a message's
-- cost was this loop's statements.
DROP PROCEDURE IF EXISTS __SCHEMA__.partition_of_id;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.partition_of_id(
  id BINARY(16),
  partition_count INT,
  OUT partition_no INT)
  NO SQL
BEGIN
  DECLARE id_text VARBINARY(36) DEFAULT CAST(LOWER(CONCAT_WS('-', HEX(LEFT(id, 4)),
    HEX(SUBSTRING(id, 5, 2)), HEX(SUBSTRING(id, 7, 2)), HEX(SUBSTRING(id, 9, 2)),
    HEX(SUBSTRING(id, 11)))) AS BINARY);
  DECLARE hash BIGINT UNSIGNED DEFAULT 2166136261;
  SET hash = ((((((((hash ^ ORD(SUBSTRING(id_text, 1, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 2, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 3, 1))) * 16777619) & 4294967295;
  SET hash = ((hash ^ ORD(SUBSTRING(id_text, 4, 1))) * 16777619) & 4294967295;
  SET hash = ((((((((hash ^ ORD(SUBSTRING(id_text, 5, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 6, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 7, 1))) * 16777619) & 4294967295;
  SET hash = ((hash ^ ORD(SUBSTRING(id_text, 8, 1))) * 16777619) & 4294967295;
  SET hash = ((((((((hash ^ ORD(SUBSTRING(id_text, 9, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 10, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 11, 1))) * 16777619) & 4294967295;
  SET hash = ((hash ^ ORD(SUBSTRING(id_text, 12, 1))) * 16777619) & 4294967295;
  SET hash = ((((((((hash ^ ORD(SUBSTRING(id_text, 13, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 14, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 15, 1))) * 16777619) & 4294967295;
  SET hash = ((hash ^ ORD(SUBSTRING(id_text, 16, 1))) * 16777619) & 4294967295;
  SET hash = ((((((((hash ^ ORD(SUBSTRING(id_text, 17, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 18, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 19, 1))) * 16777619) & 4294967295;
  SET hash = ((hash ^ ORD(SUBSTRING(id_text, 20, 1))) * 16777619) & 4294967295;
  SET hash = ((((((((hash ^ ORD(SUBSTRING(id_text, 21, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 22, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 23, 1))) * 16777619) & 4294967295;
  SET hash = ((hash ^ ORD(SUBSTRING(id_text, 24, 1))) * 16777619) & 4294967295;
  SET hash = ((((((((hash ^ ORD(SUBSTRING(id_text, 25, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 26, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 27, 1))) * 16777619) & 4294967295;
  SET hash = ((hash ^ ORD(SUBSTRING(id_text, 28, 1))) * 16777619) & 4294967295;
  SET hash = ((((((((hash ^ ORD(SUBSTRING(id_text, 29, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 30, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 31, 1))) * 16777619) & 4294967295;
  SET hash = ((hash ^ ORD(SUBSTRING(id_text, 32, 1))) * 16777619) & 4294967295;
  SET hash = ((((((((hash ^ ORD(SUBSTRING(id_text, 33, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 34, 1))) * 16777619) & 4294967295)
               ^ ORD(SUBSTRING(id_text, 35, 1))) * 16777619) & 4294967295;
  SET hash = ((hash ^ ORD(SUBSTRING(id_text, 36, 1))) * 16777619) & 4294967295;
  SET partition_no = hash MOD partition_count;
END //
DELIMITER ;

-- One message, one copy per target, in the caller's transaction. `headers` have been through
-- enqueue_build_headers. `targets` (a JSON array) or `target` (one name) or neither: the topic's
-- default targets, else 'default'. `previous_id`: the id written before in this call, which the
-- next ids are made greater than (so that a batch's ids follow its order). Returns the copies'
-- ids, 16 bytes each, in the order of the targets.
DROP PROCEDURE IF EXISTS __SCHEMA__.enqueue_message;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.enqueue_message(
  topic LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  payload LONGBLOB,
  content_type LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  stream_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  type LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  headers LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  targets LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  target LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  sequenced BOOLEAN,
  INOUT previous_id BINARY(16),
  OUT ids LONGBLOB)
  MODIFIES SQL DATA
BEGIN
  DECLARE partition_count, max_payload_bytes, copies, i, position, partition_no INT;
  DECLARE sequenced_by_default, topic_sequenced BOOLEAN;
  DECLARE topic_targets, name, previous_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
  DECLARE fresh_id, new_id, event_id BINARY(16);
  DECLARE seq BIGINT;
  DECLARE seqs LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
  DECLARE texts LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

  SELECT s.partition_count, s.max_payload_bytes, s.sequenced_by_default
    INTO partition_count, max_payload_bytes, sequenced_by_default
    FROM __SCHEMA__.settings s;
  -- The text checks in one test (each CALL costs a few microseconds); the named checks only
  -- when something is wrong, to say what.
  SET texts = CONCAT_WS('', topic, content_type, type, stream_key);
  IF topic IS NULL OR topic = '' OR OCTET_LENGTH(topic) > 255 OR content_type IS NULL
     OR content_type = '' OR OCTET_LENGTH(content_type) > 255 OR type = ''
     OR OCTET_LENGTH(type) > 255 OR texts REGEXP CONCAT('[', CHAR(1), '-', CHAR(31), CHAR(127), ']')
     OR LOCATE(CHAR(0), texts) > 0 THEN
    CALL __SCHEMA__.enqueue_check_text('topic', topic, 255);
    CALL __SCHEMA__.enqueue_check_text('content_type', content_type, 255);
    IF type IS NOT NULL THEN
      CALL __SCHEMA__.enqueue_check_text('type', type, 255);
    END IF;
  END IF;
  IF payload IS NULL THEN
    CALL __SCHEMA__.enqueue_fail('outbox.enqueue: payload must not be null');
  END IF;
  IF OCTET_LENGTH(payload) > max_payload_bytes THEN
    CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue: payload is ', OCTET_LENGTH(payload),
      ' bytes, over the limit of ', max_payload_bytes, ' (settings.max_payload_bytes)'));
  END IF;

  -- The topic's settings, read only when the call leaves something to them.
  IF (targets IS NULL AND target IS NULL) OR (stream_key IS NOT NULL AND sequenced IS NULL) THEN
    -- An aggregate, so that a topic without settings gives a row of NULLs rather than the
    -- NOT FOUND condition (which a caller's cursor handler would take for its own).
    SELECT MAX(t.targets), MAX(t.sequenced) INTO topic_targets, topic_sequenced
      FROM __SCHEMA__.topic_settings t WHERE t.topic = topic;
  END IF;
  IF targets IS NOT NULL THEN
    CALL __SCHEMA__.enqueue_check_targets(targets);
  ELSEIF target IS NOT NULL THEN
    CALL __SCHEMA__.enqueue_check_text('target', target, 255);
    SET targets = JSON_ARRAY(target);
  ELSE
    SET targets = COALESCE(topic_targets, '["default"]');
  END IF;
  SET copies = JSON_LENGTH(targets);

  IF stream_key IS NOT NULL THEN
    IF stream_key = '' OR OCTET_LENGTH(stream_key) > 255
       OR stream_key REGEXP CONCAT('[', CHAR(1), '-', CHAR(31), CHAR(127), ']')
       OR LOCATE(CHAR(0), stream_key) > 0 THEN
      CALL __SCHEMA__.enqueue_check_text('stream_key', stream_key, 255);
    END IF;
    SET sequenced = COALESCE(sequenced, topic_sequenced, sequenced_by_default);
  END IF;

  SET ids = REPEAT(UNHEX('00'), 16 * copies);
  SET seqs = REPEAT(' ', 20 * copies);
  IF stream_key IS NOT NULL AND sequenced THEN
    -- The counters in target name order, whatever the order given.
    SET i = 0;
    WHILE i < copies DO
      IF copies = 1 THEN
        SET name = JSON_VALUE(targets, '$[0]');
        SET position = 1;
      ELSE
        SELECT j.name, j.position INTO name, position
          FROM JSON_TABLE(targets, '$[*]' COLUMNS (
                 position FOR ORDINALITY,
                 name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS j
         WHERE previous_name IS NULL OR j.name > previous_name
         ORDER BY j.name LIMIT 1;
        SET previous_name = name;
      END IF;
      -- Holds the pair's counter row until commit: the next writer of this (target, stream)
      -- waits here. The id is made greater than the pair's previous one, so that ids of one
      -- (target, stream) sort in stream_seq order (the claim walks ids); and greater than the
      -- id written before in this call, so that a batch's ids follow its order.
      CALL __SCHEMA__.enqueue_new_id(previous_id, fresh_id);
      INSERT INTO __SCHEMA__.target_streams (target, stream_key, last_seq, last_id)
      VALUES (name, stream_key, 1, fresh_id)
      ON DUPLICATE KEY UPDATE
        last_seq = target_streams.last_seq + 1,
        last_id = GREATEST(VALUES(last_id), CONCAT(LEFT(target_streams.last_id, 8), UNHEX(LPAD(HEX(
          CAST(CONV(HEX(SUBSTRING(target_streams.last_id, 9)), 16, 10) AS UNSIGNED) + 1), 16,
          '0'))));
      -- This transaction's own row version: what the update above wrote.
      SELECT s.last_seq, s.last_id INTO seq, new_id FROM __SCHEMA__.target_streams s
       WHERE s.target = name AND s.stream_key = stream_key;
      SET ids = INSERT(ids, 16 * (position - 1) + 1, 16, new_id);
      SET seqs = INSERT(seqs, 20 * (position - 1) + 1, 20, LPAD(seq, 20, ' '));
      SET i = i + 1;
    END WHILE;
  ELSE
    SET i = 0;
    WHILE i < copies DO
      CALL __SCHEMA__.enqueue_new_id(previous_id, new_id);
      SET previous_id = new_id;
      SET ids = INSERT(ids, 16 * i + 1, 16, new_id);
      SET i = i + 1;
    END WHILE;
  END IF;

  IF copies > 1 THEN
    SET event_id = LEFT(ids, 16);
  END IF;
  IF stream_key IS NOT NULL THEN
    CALL __SCHEMA__.partition_of(stream_key, partition_count, partition_no);
  END IF;
  SET i = 0;
  WHILE i < copies DO
    SET new_id = SUBSTRING(ids, 16 * i + 1, 16);
    IF stream_key IS NULL THEN
      CALL __SCHEMA__.partition_of_id(new_id, partition_count, partition_no);
    END IF;
    INSERT INTO __SCHEMA__.messages
      (id, event_id, topic, stream_key, stream_seq, partition_no, target, type, payload,
       content_type, headers, available_at, created_at)
    VALUES
      (new_id, event_id, topic, stream_key, NULLIF(TRIM(SUBSTRING(seqs, 20 * i + 1, 20)), ''),
       partition_no, JSON_VALUE(targets, CONCAT('$[', i, ']')), type, payload, content_type,
       headers, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6));
    IF previous_id IS NULL OR new_id > previous_id THEN
      SET previous_id = new_id;
    END IF;
    SET i = i + 1;
  END WHILE;
END //
DELIMITER ;

-- The public procedures. Each is all or nothing (see the top): on an error it rolls back what it
-- wrote, then raises the error again with its SQLSTATE, number and message.
DROP PROCEDURE IF EXISTS __SCHEMA__.enqueue_bytes;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.enqueue_bytes(
  topic LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  payload LONGBLOB,
  content_type LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  stream_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  type LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  headers LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  target LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  correlation_id LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  causation_id LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  sequenced BOOLEAN)
  MODIFIES SQL DATA
BEGIN
  DECLARE own_transaction BOOLEAN DEFAULT @@autocommit = 1 AND @@in_transaction = 0;
  DECLARE previous_id BINARY(16);
  DECLARE ids LONGBLOB;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    DECLARE error_number INT;
    GET DIAGNOSTICS CONDITION 1 error_number = MYSQL_ERRNO;
    IF own_transaction THEN
      ROLLBACK;
    ELSEIF error_number <> 1213 THEN  -- a deadlock has rolled back the transaction already
      BEGIN
        -- The savepoint may be gone with the transaction (innodb_rollback_on_timeout): the
        -- error to report is still the first.
        DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
        ROLLBACK TO SAVEPOINT outbox_enqueue;
      END;
    END IF;
    RESIGNAL;
  END;
  IF own_transaction THEN
    START TRANSACTION;
  ELSE
    SAVEPOINT outbox_enqueue;
  END IF;
  IF (headers IS NULL OR headers = '{}') AND correlation_id IS NULL AND causation_id IS NULL
  THEN
    SET headers = '{}';  -- the common case, without a CALL
  ELSE
    CALL __SCHEMA__.enqueue_build_headers(headers, correlation_id, causation_id);
  END IF;
  CALL __SCHEMA__.enqueue_message(topic, payload,
    COALESCE(content_type, 'application/octet-stream'), stream_key, type, headers, NULL, target,
    sequenced, previous_id, ids);
  IF own_transaction THEN
    COMMIT;
  ELSE
    RELEASE SAVEPOINT outbox_enqueue;
  END IF;
  SELECT LOWER(CONCAT_WS('-', HEX(LEFT(ids, 4)), HEX(SUBSTRING(ids, 5, 2)),
    HEX(SUBSTRING(ids, 7, 2)), HEX(SUBSTRING(ids, 9, 2)), HEX(SUBSTRING(ids, 11, 6))))
    AS id;
END //
DELIMITER ;

DROP PROCEDURE IF EXISTS __SCHEMA__.enqueue;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.enqueue(
  topic LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  payload LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  stream_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  type LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  headers LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  target LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  correlation_id LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  causation_id LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  sequenced BOOLEAN)
  MODIFIES SQL DATA
BEGIN
  IF payload IS NOT NULL AND NOT JSON_VALID(payload) THEN
    CALL __SCHEMA__.enqueue_fail('outbox.enqueue: payload is not valid JSON');
  END IF;
  CALL __SCHEMA__.enqueue_bytes(topic, CAST(payload AS BINARY), 'application/json', stream_key,
                                type, headers, target, correlation_id, causation_id, sequenced);
END //
DELIMITER ;

-- enqueue_batch: see the top. All the messages or none.
DROP PROCEDURE IF EXISTS __SCHEMA__.enqueue_batch;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.enqueue_batch(
  messages LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
  MODIFIES SQL DATA
BEGIN
  DECLARE own_transaction BOOLEAN DEFAULT @@autocommit = 1 AND @@in_transaction = 0;
  DECLARE done BOOLEAN DEFAULT FALSE;
  DECLARE position, copies, i INT;
  DECLARE element, unknown, payload_base64, headers, targets, target
    LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
  DECLARE topic, content_type, stream_key, type, correlation_id, causation_id
    LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
  DECLARE sequenced_json LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
  DECLARE has_payload, has_payload_base64, has_target, has_targets, has_content_type INT;
  DECLARE payload LONGBLOB;
  DECLARE previous_id BINARY(16);
  DECLARE ids, all_ids LONGBLOB DEFAULT '';
  DECLARE ordinals LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT '';
  DECLARE elements CURSOR FOR
    SELECT j.position, j.element FROM JSON_TABLE(messages, '$[*]' COLUMNS (
      position FOR ORDINALITY, element JSON PATH '$')) AS j;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET done = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    DECLARE error_number INT;
    GET DIAGNOSTICS CONDITION 1 error_number = MYSQL_ERRNO;
    IF own_transaction THEN
      ROLLBACK;
    ELSEIF error_number <> 1213 THEN  -- a deadlock has rolled back the transaction already
      BEGIN
        -- The savepoint may be gone with the transaction (innodb_rollback_on_timeout): the
        -- error to report is still the first.
        DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
        ROLLBACK TO SAVEPOINT outbox_enqueue;
      END;
    END IF;
    RESIGNAL;
  END;

  IF own_transaction THEN
    START TRANSACTION;
  ELSE
    SAVEPOINT outbox_enqueue;
  END IF;
  IF messages IS NULL OR NOT JSON_VALID(messages) OR JSON_TYPE(messages) <> 'ARRAY' THEN
    CALL __SCHEMA__.enqueue_fail('outbox.enqueue_batch: messages must be a JSON array');
  END IF;
  OPEN elements;
  read_loop: LOOP
    FETCH elements INTO position, element;
    IF done THEN
      LEAVE read_loop;
    END IF;
    IF element IS NULL OR JSON_TYPE(element) <> 'OBJECT' THEN
      CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
                                          ' must be a JSON object'));
    END IF;
    SET unknown = (
      SELECT k.name FROM JSON_TABLE(JSON_KEYS(element), '$[*]' COLUMNS (
               n FOR ORDINALITY,
               name VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS k
       WHERE k.name NOT IN ('topic', 'payload', 'payload_base64', 'content_type', 'stream_key',
                            'type', 'headers', 'target', 'targets', 'correlation_id',
                            'causation_id', 'sequenced')
       ORDER BY k.n LIMIT 1);
    IF unknown IS NOT NULL THEN
      CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
                                          ': unknown key "', unknown, '"'));
    END IF;
    SET has_payload = JSON_CONTAINS_PATH(element, 'one', '$.payload');
    SET has_payload_base64 = JSON_CONTAINS_PATH(element, 'one', '$.payload_base64');
    SET has_content_type = JSON_CONTAINS_PATH(element, 'one', '$.content_type');
    IF has_payload + has_payload_base64 = 0 THEN
      CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
                                          ': payload is missing'));
    END IF;
    IF has_payload + has_payload_base64 = 2 THEN
      CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
        ': give "payload" or "payload_base64", not both'));
    END IF;
    IF has_payload = 1 AND has_content_type = 1 THEN
      CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
        ': "content_type" goes with "payload_base64" ("payload" is JSON)'));
    END IF;
    IF has_payload = 1 THEN
      SET payload = CAST(JSON_EXTRACT(element, '$.payload') AS BINARY);
      SET content_type = 'application/json';
    ELSE
      SET payload_base64 = JSON_EXTRACT(element, '$.payload_base64');
      IF JSON_TYPE(payload_base64) <> 'STRING' THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
                                            ': payload_base64 must be a string'));
      END IF;
      SET payload = FROM_BASE64(JSON_UNQUOTE(payload_base64));
      IF payload IS NULL THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
                                            ': payload_base64 is not base64'));
      END IF;
      SET content_type = COALESCE(JSON_VALUE(element, '$.content_type'),
                                  'application/octet-stream');
    END IF;
    SET has_target = JSON_CONTAINS_PATH(element, 'one', '$.target');
    SET has_targets = JSON_CONTAINS_PATH(element, 'one', '$.targets');
    SET targets = NULL;
    SET target = NULL;
    IF has_targets = 1 THEN
      IF has_target = 1 THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
                                            ': give "target" or "targets", not both'));
      END IF;
      SET targets = JSON_EXTRACT(element, '$.targets');
      SET i = 0;
      IF JSON_TYPE(targets) = 'ARRAY' THEN
        SET copies = JSON_LENGTH(targets);
        WHILE i < copies AND JSON_TYPE(JSON_EXTRACT(targets, CONCAT('$[', i, ']'))) = 'STRING' DO
          SET i = i + 1;
        END WHILE;
      END IF;
      IF JSON_TYPE(targets) <> 'ARRAY' OR i < copies THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
                                            ': targets must be a JSON array of strings'));
      END IF;
    ELSEIF has_target = 1 THEN
      SET target = JSON_VALUE(element, '$.target');
      IF JSON_TYPE(JSON_EXTRACT(element, '$.target')) NOT IN ('STRING', 'NULL') THEN
        CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
                                            ': target must be a string'));
      END IF;
    END IF;
    SET topic = JSON_VALUE(element, '$.topic');
    SET stream_key = JSON_VALUE(element, '$.stream_key');
    SET type = JSON_VALUE(element, '$.type');
    SET correlation_id = JSON_VALUE(element, '$.correlation_id');
    SET causation_id = JSON_VALUE(element, '$.causation_id');
    SET headers = JSON_EXTRACT(element, '$.headers');
    IF JSON_TYPE(headers) = 'NULL' THEN
      SET headers = NULL;
    END IF;
    SET sequenced_json = JSON_EXTRACT(element, '$.sequenced');
    IF sequenced_json IS NOT NULL AND JSON_TYPE(sequenced_json) NOT IN ('BOOLEAN', 'NULL') THEN
      CALL __SCHEMA__.enqueue_fail(CONCAT('outbox.enqueue_batch: element ', position,
                                          ': sequenced must be true, false or null'));
    END IF;
    IF (headers IS NULL OR headers = '{}') AND correlation_id IS NULL AND causation_id IS NULL
    THEN
      SET headers = '{}';  -- the common case, without a CALL
    ELSE
      CALL __SCHEMA__.enqueue_build_headers(headers, correlation_id, causation_id);
    END IF;
    CALL __SCHEMA__.enqueue_message(topic, payload, content_type, stream_key, type, headers,
      targets, target,
      CASE sequenced_json WHEN 'true' THEN TRUE WHEN 'false' THEN FALSE END, previous_id, ids);
    SET all_ids = CONCAT(all_ids, ids);
    SET ordinals = CONCAT(ordinals, REPEAT(CONCAT(position, ','), OCTET_LENGTH(ids) DIV 16));
  END LOOP;
  CLOSE elements;
  IF own_transaction THEN
    COMMIT;
  ELSE
    RELEASE SAVEPOINT outbox_enqueue;
  END IF;
  -- One row per copy: the n-th id with the n-th ordinal.
  SELECT CAST(j.ordinal AS SIGNED) AS ordinal, LOWER(CONCAT_WS('-',
           HEX(SUBSTRING(all_ids, 16 * j.n - 15, 4)), HEX(SUBSTRING(all_ids, 16 * j.n - 11, 2)),
           HEX(SUBSTRING(all_ids, 16 * j.n - 9, 2)), HEX(SUBSTRING(all_ids, 16 * j.n - 7, 2)),
           HEX(SUBSTRING(all_ids, 16 * j.n - 5, 6)))) AS id
    FROM JSON_TABLE(CONCAT('[', TRIM(TRAILING ',' FROM ordinals), ']'), '$[*]' COLUMNS (
           n FOR ORDINALITY, ordinal BIGINT PATH '$')) AS j
   ORDER BY j.n;
END //
DELIMITER ;
