-- outbox schema for MariaDB, version 1: the tables. __SCHEMA__ is replaced by the backquoted
-- database name the outbox lives in (default `outbox`), beside the application's own database on
-- the same server, so that one transaction writes both.
-- MariaDB commits each DDL statement at once: every statement here can run again (IF NOT EXISTS,
-- INSERT IGNORE), so that a migration cut short is finished by the next run.
-- Times are DATETIME(6) in UTC, always taken with UTC_TIMESTAMP(6): the writer's session may have
-- any time_zone. Text is utf8mb4 with binary collation (compared as PostgreSQL compares text).

-- One row of settings that the procedures read, so that every writer in every language gets the
-- same limits and partitioning.
CREATE TABLE IF NOT EXISTS __SCHEMA__.settings (
  singleton TINYINT NOT NULL DEFAULT 1 PRIMARY KEY CHECK (singleton = 1),
  partition_count INT NOT NULL DEFAULT 64 CHECK (partition_count BETWEEN 1 AND 4096),
  max_payload_bytes INT NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes > 0),
  -- Whether keyed messages get a gap-free stream_seq when neither the call nor topic_settings say.
  sequenced_by_default BOOLEAN NOT NULL DEFAULT TRUE,
  max_header_count INT NOT NULL DEFAULT 64 CHECK (max_header_count >= 0),
  max_header_name_bytes INT NOT NULL DEFAULT 128 CHECK (max_header_name_bytes > 0),
  max_header_value_bytes INT NOT NULL DEFAULT 4096 CHECK (max_header_value_bytes >= 0),
  max_headers_bytes INT NOT NULL DEFAULT 8192 CHECK (max_headers_bytes >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT IGNORE INTO __SCHEMA__.settings (singleton) VALUES (1);

-- Per-topic settings: whether its keyed messages are sequenced, its default targets (a JSON array
-- of names, NULL: "default"), and what an abandoned message does to its stream ('continue' or
-- 'hold'; NULL: the sink's setting).
CREATE TABLE IF NOT EXISTS __SCHEMA__.topic_settings (
  topic VARCHAR(255) NOT NULL PRIMARY KEY,
  sequenced BOOLEAN NULL,
  targets LONGTEXT NULL CHECK (targets IS NULL OR JSON_VALID(targets)),
  on_abandon VARCHAR(16) NULL CHECK (on_abandon IN ('continue', 'hold'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The per-(target, stream) counter behind stream_seq. Writers of one stream take turns on its row
-- until they commit, which makes stream_seq gap-free and in commit order.
CREATE TABLE IF NOT EXISTS __SCHEMA__.target_streams (
  target VARCHAR(255) NOT NULL,
  stream_key VARCHAR(255) NOT NULL,
  last_seq BIGINT NOT NULL,
  -- The id of the stream's last message: the next one's id is made greater, so that within a
  -- stream id order is stream_seq order whatever the writers' clocks do.
  last_id BINARY(16) NOT NULL,
  PRIMARY KEY (target, stream_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS __SCHEMA__.messages (
  id BINARY(16) NOT NULL PRIMARY KEY,  -- UUIDv7: byte order is creation order
  -- The id of the message's first copy when it went to several targets; NULL for one target.
  event_id BINARY(16) NULL,
  topic VARCHAR(255) NOT NULL,
  stream_key VARCHAR(255) NULL,
  stream_seq BIGINT NULL,
  partition_no INT NOT NULL,  -- PARTITION is a reserved word in MariaDB
  target VARCHAR(255) NOT NULL,
  type VARCHAR(255) NULL,
  payload LONGBLOB NOT NULL,  -- stored as given, never re-rendered
  content_type VARCHAR(255) NOT NULL,
  headers LONGTEXT NOT NULL DEFAULT '{}' CHECK (JSON_VALID(headers)),
  status ENUM('pending', 'processing', 'failed', 'published', 'abandoned') NOT NULL
    DEFAULT 'pending',
  attempts INT NOT NULL DEFAULT 0,
  available_at DATETIME(6) NOT NULL,
  last_error TEXT NULL,
  lease_owner VARCHAR(255) NULL,
  lease_until DATETIME(6) NULL,
  lease_epoch BIGINT NOT NULL DEFAULT 0,
  created_at DATETIME(6) NOT NULL,
  published_at DATETIME(6) NULL,
  abandoned_at DATETIME(6) NULL,
  -- Abandoned under on_abandon = 'hold': its (target, stream) publishes nothing after it until an
  -- operator replays or skips it.
  holds_stream BOOLEAN NOT NULL DEFAULT FALSE,
  -- The claim walks the due messages of a status in id order.
  KEY messages_claimable (status, id),
  -- Head-of-line per (target, stream) and the stream's abandoned runs: the claim probes a
  -- stream's earlier failed, processing and abandoned rows by status, never walking its
  -- published ones (kept under a published retention).
  KEY messages_streams (target, stream_key, status, id),
  KEY messages_event (event_id),
  KEY messages_lease (lease_owner),
  KEY messages_published (status, published_at),
  KEY messages_abandoned (status, abandoned_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Relays sharing the database's partitions (store/partitions.h).
CREATE TABLE IF NOT EXISTS __SCHEMA__.relay_instances (
  owner VARCHAR(255) NOT NULL PRIMARY KEY,
  started_at DATETIME(6) NOT NULL,
  heartbeat_at DATETIME(6) NOT NULL,
  expires_at DATETIME(6) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS __SCHEMA__.partition_leases (
  partition_no INT NOT NULL PRIMARY KEY,
  owner VARCHAR(255) NULL,
  epoch BIGINT NOT NULL DEFAULT 0,
  lease_until DATETIME(6) NULL,
  acquired_at DATETIME(6) NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
