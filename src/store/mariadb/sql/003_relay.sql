-- outbox schema for MariaDB, version 3: the relay's side. __SCHEMA__ is replaced by the backquoted
-- database name. The relay's store (store.cpp), partition leases (partition_leases.cpp) and
-- wake-up (wakeup.cpp) call these routines, one CALL per round trip; the rules are PostgreSQL's
-- (src/store/postgres/statements.cpp, sql/003_partitions.sql), and the comments there say why.
--
-- Every procedure that changes rows runs its own transaction (START TRANSACTION ... COMMIT): a
-- CALL in autocommit mode would otherwise commit statement by statement (so these are not for a
-- caller's open transaction, which START TRANSACTION would commit). On any error it rolls back
-- and re-raises. The transactions are READ COMMITTED whatever the session's level (the relay's
-- sessions are so anyway, connection.cpp): each statement reads the latest committed rows without
-- locking them, and a locking read (FOR UPDATE, LOCK IN SHARE MODE) the latest version of the
-- rows it locks. Under REPEATABLE READ, INSERT ... SELECT would share-lock what it reads and wait
-- for every writer's uncommitted row.
--
-- Lists travel as JSON (read with JSON_TABLE): ids as 32 hex digits, [[id, epoch], ...] for
-- leases, [[partition, epoch], ...] for partitions held, ["name", ...] for targets.
--
-- A locking statement that joins a list to messages (or partition_leases) names the join order
-- and the key (STRAIGHT_JOIN, FORCE INDEX (PRIMARY)): on a small or fresh table the optimizer
-- would otherwise scan it, and a locking scan waits for every row a writer has inserted and not
-- yet committed (a claim stalled behind an open transaction until its deadline).
-- The claim's probes of a stream's earlier rows name messages_streams for the same reason of
-- another kind: with their ORs, the optimizer merged two status indexes instead, and walked every
-- processing row for each candidate (120 ms for a claim of 500 on a 20k backlog, 12 ms after).

-- The numbers 0..9999 (settings.partition_count is at most 4096), made from digits: a recursive
-- CTE stops at max_recursive_iterations, 1000 by default.
CREATE OR REPLACE VIEW __SCHEMA__.partition_numbers AS
WITH digits (d) AS (
  SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
  UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)
SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS n
FROM digits a CROSS JOIN digits b CROSS JOIN digits c CROSS JOIN digits e;

-- One lease row per partition (store/partitions.h), as many as settings.partition_count.
INSERT IGNORE INTO __SCHEMA__.partition_leases (partition_no)
SELECT n.n FROM __SCHEMA__.partition_numbers n
WHERE n.n < (SELECT partition_count FROM __SCHEMA__.settings);

-- The partition count is part of every message (partition_no) and of every lease: it can change
-- only while the outbox is empty and no relay is live; the lease rows follow it.
DROP TRIGGER IF EXISTS __SCHEMA__.settings_partition_count_guard;
DELIMITER //
CREATE TRIGGER __SCHEMA__.settings_partition_count_guard BEFORE UPDATE ON __SCHEMA__.settings
FOR EACH ROW
BEGIN
  DECLARE v_message VARCHAR(512);
  IF NEW.partition_count <> OLD.partition_count THEN
    IF EXISTS (SELECT 1 FROM __SCHEMA__.messages) OR
       EXISTS (SELECT 1 FROM __SCHEMA__.relay_instances WHERE expires_at > UTC_TIMESTAMP(6)) THEN
      SET v_message = CONCAT('outbox: settings.partition_count can change only while the outbox ',
                             'holds no messages and no relay is running (it is ',
                             OLD.partition_count, ', asked ', NEW.partition_count, ')');
      SIGNAL SQLSTATE '55000' SET MESSAGE_TEXT = v_message;
    END IF;
    DELETE FROM __SCHEMA__.partition_leases WHERE partition_no >= NEW.partition_count;
    INSERT IGNORE INTO __SCHEMA__.partition_leases (partition_no)
    SELECT n.n FROM __SCHEMA__.partition_numbers n WHERE n.n < NEW.partition_count;
  END IF;
END //
DELIMITER ;

-- The partitions of `p_partitions` ([[partition, epoch], ...]) that `p_owner` still holds under
-- those epochs, as a comma-separated list (NULL: none), their lease rows share-locked until the
-- caller's transaction ends: a takeover locks the row FOR UPDATE first, so a claim is either
-- wholly before it (the takeover then voids what it leased) or waits and finds it taken.
-- Internal: called inside the callers' transactions.
DROP PROCEDURE IF EXISTS __SCHEMA__.relay_held_partitions;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.relay_held_partitions(
  IN p_owner VARCHAR(255) CHARACTER SET utf8mb4, IN p_partitions LONGTEXT CHARACTER SET utf8mb4,
  OUT o_held LONGTEXT CHARACTER SET utf8mb4)
BEGIN
  -- The listed rows only, by key: a scan would wait for the locks of other relays' takeovers.
  SELECT GROUP_CONCAT(p.partition_no ORDER BY p.partition_no) INTO o_held
  FROM JSON_TABLE(p_partitions, '$[*]' COLUMNS (n INT PATH '$[0]', epoch BIGINT PATH '$[1]')) h
  STRAIGHT_JOIN __SCHEMA__.partition_leases p FORCE INDEX (PRIMARY)
    ON p.partition_no = h.n AND p.epoch = h.epoch
  WHERE p.owner = p_owner AND p.lease_until > UTC_TIMESTAMP(6)
  LOCK IN SHARE MODE;
END //
DELIMITER ;

-- Settles leased messages of `p_owner` (p_items: [[id, epoch, ...], ...]), fenced: only rows
-- still leased by the owner under the given epoch are touched. p_action:
--   complete: published (deleted, or kept with published_at when p_keep_published);
--   renew:    lease_until = now + p_lease_ms;
--   release:  back to pending, no attempt spent;
--   fail:     items [id, epoch, abandon 0/1, spend 0/1, delay_ms, error]: abandoned, or failed
--             until now + delay_ms (so that the stream's later messages wait behind it), or
--             pending at once; an abandoned keyed message holds its stream when its topic's
--             on_abandon says 'hold', or the topic says nothing and its target is among
--             p_hold_targets (RetryPolicy::hold_targets).
-- o_settled: how many were settled; o_lost: the ids (hex, comma-separated) that were not, NULL
-- when all were. Internal: called inside the callers' transactions.
DROP PROCEDURE IF EXISTS __SCHEMA__.relay_settle_leases;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.relay_settle_leases(
  IN p_action VARCHAR(16), IN p_owner VARCHAR(255) CHARACTER SET utf8mb4,
  IN p_items LONGTEXT CHARACTER SET utf8mb4, IN p_lease_ms BIGINT, IN p_keep_published BOOLEAN,
  IN p_hold_targets LONGTEXT CHARACTER SET utf8mb4, OUT o_settled BIGINT,
  OUT o_lost LONGTEXT CHARACTER SET utf8mb4)
settle: BEGIN
  DECLARE v_now DATETIME(6);
  SET o_settled = 0, o_lost = NULL;
  IF p_items IS NULL OR JSON_LENGTH(p_items) = 0 THEN
    LEAVE settle;
  END IF;
  -- Lock the rows still ours first: they then stay ours, and a row that is not cannot become
  -- ours again (a new lease has a new epoch), so the list of lost ids below is exact.
  SELECT COUNT(*) INTO o_settled
  FROM JSON_TABLE(p_items, '$[*]' COLUMNS (hex CHAR(32) PATH '$[0]', epoch BIGINT PATH '$[1]')) c
  STRAIGHT_JOIN __SCHEMA__.messages m FORCE INDEX (PRIMARY) ON m.id = UNHEX(c.hex)
  WHERE m.lease_epoch = c.epoch AND m.lease_owner = p_owner
  FOR UPDATE;
  IF o_settled < JSON_LENGTH(p_items) THEN
    SELECT GROUP_CONCAT(c.hex) INTO o_lost
    FROM JSON_TABLE(p_items, '$[*]' COLUMNS (hex CHAR(32) PATH '$[0]', epoch BIGINT PATH '$[1]')) c
    WHERE NOT EXISTS (SELECT 1 FROM __SCHEMA__.messages m
                      WHERE m.id = UNHEX(c.hex) AND m.lease_epoch = c.epoch
                        AND m.lease_owner = p_owner);
  END IF;
  IF o_settled = 0 THEN
    LEAVE settle;
  END IF;
  SET v_now = UTC_TIMESTAMP(6);
  IF p_action = 'complete' AND NOT p_keep_published THEN
    DELETE m
    FROM JSON_TABLE(p_items, '$[*]' COLUMNS (hex CHAR(32) PATH '$[0]', epoch BIGINT PATH '$[1]')) c
    STRAIGHT_JOIN __SCHEMA__.messages m FORCE INDEX (PRIMARY) ON m.id = UNHEX(c.hex)
    WHERE m.lease_epoch = c.epoch AND m.lease_owner = p_owner;
  ELSEIF p_action = 'complete' THEN
    UPDATE
      JSON_TABLE(p_items, '$[*]' COLUMNS (hex CHAR(32) PATH '$[0]', epoch BIGINT PATH '$[1]')) c
    STRAIGHT_JOIN __SCHEMA__.messages m FORCE INDEX (PRIMARY) ON m.id = UNHEX(c.hex)
    SET m.status = 'published', m.published_at = v_now, m.lease_owner = NULL, m.lease_until = NULL
    WHERE m.lease_epoch = c.epoch AND m.lease_owner = p_owner;
  ELSEIF p_action = 'renew' THEN
    UPDATE
      JSON_TABLE(p_items, '$[*]' COLUMNS (hex CHAR(32) PATH '$[0]', epoch BIGINT PATH '$[1]')) c
    STRAIGHT_JOIN __SCHEMA__.messages m FORCE INDEX (PRIMARY) ON m.id = UNHEX(c.hex)
    SET m.lease_until = v_now + INTERVAL p_lease_ms * 1000 MICROSECOND
    WHERE m.lease_epoch = c.epoch AND m.lease_owner = p_owner;
  ELSEIF p_action = 'release' THEN
    UPDATE
      JSON_TABLE(p_items, '$[*]' COLUMNS (hex CHAR(32) PATH '$[0]', epoch BIGINT PATH '$[1]')) c
    STRAIGHT_JOIN __SCHEMA__.messages m FORCE INDEX (PRIMARY) ON m.id = UNHEX(c.hex)
    SET m.status = 'pending', m.lease_owner = NULL, m.lease_until = NULL
    WHERE m.lease_epoch = c.epoch AND m.lease_owner = p_owner;
  ELSEIF p_action = 'fail' THEN
    -- MariaDB assigns left to right, each assignment seeing the ones before: holds_stream and
    -- attempts read only columns not assigned before them.
    UPDATE JSON_TABLE(p_items, '$[*]' COLUMNS (
        hex CHAR(32) PATH '$[0]', epoch BIGINT PATH '$[1]', abandon INT PATH '$[2]',
        spend INT PATH '$[3]', delay_ms BIGINT PATH '$[4]',
        reason TEXT CHARACTER SET utf8mb4 PATH '$[5]')) c
    STRAIGHT_JOIN __SCHEMA__.messages m FORCE INDEX (PRIMARY) ON m.id = UNHEX(c.hex)
    SET m.holds_stream = c.abandon = 1 AND m.stream_key IS NOT NULL AND COALESCE(
          (SELECT t.on_abandon FROM __SCHEMA__.topic_settings t WHERE t.topic = m.topic),
          IF(JSON_CONTAINS(COALESCE(p_hold_targets, '[]'), JSON_QUOTE(m.target)), 'hold',
             'continue')) = 'hold',
        m.status = CASE WHEN c.abandon = 1 THEN 'abandoned'
                        WHEN c.spend = 1 OR c.delay_ms > 0 THEN 'failed' ELSE 'pending' END,
        m.attempts = m.attempts + c.spend,
        m.available_at = v_now + INTERVAL c.delay_ms * 1000 MICROSECOND,
        m.abandoned_at = IF(c.abandon = 1, v_now, NULL),
        m.last_error = c.reason, m.lease_owner = NULL, m.lease_until = NULL
    WHERE m.lease_epoch = c.epoch AND m.lease_owner = p_owner;
  ELSE
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'outbox.relay_settle: unknown action';
  END IF;
END //
DELIMITER ;

-- Settles leased messages (see relay_settle_leases) in a transaction of its own; returns one row:
-- settled, lease_lost (hex ids, comma-separated; NULL when none was lost).
DROP PROCEDURE IF EXISTS __SCHEMA__.relay_settle;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.relay_settle(
  IN p_action VARCHAR(16), IN p_owner VARCHAR(255) CHARACTER SET utf8mb4,
  IN p_items LONGTEXT CHARACTER SET utf8mb4, IN p_lease_ms BIGINT, IN p_keep_published BOOLEAN,
  IN p_hold_targets LONGTEXT CHARACTER SET utf8mb4)
BEGIN
  DECLARE v_settled BIGINT DEFAULT 0;
  DECLARE v_lost LONGTEXT CHARACTER SET utf8mb4 DEFAULT NULL;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  IF p_owner IS NULL OR p_owner = '' THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'outbox.relay_settle: owner must not be empty';
  END IF;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  CALL __SCHEMA__.relay_settle_leases(p_action, p_owner, p_items, p_lease_ms, p_keep_published,
                                      p_hold_targets, v_settled, v_lost);
  COMMIT;
  SELECT v_settled AS settled, v_lost AS lease_lost;
END //
DELIMITER ;

-- One claim round of relay `p_owner` (Store::ClaimRound), in one transaction:
--  1. settles p_complete ([[id, epoch], ...]) as relay_settle's 'complete' would;
--  2. with p_partitions ([[partition, epoch], ...]; NULL: every partition), keeps only those still
--     held under those epochs, share-locking their lease rows (relay_held_partitions);
--  3. picks up to p_limit due messages (pending, or failed whose available_at has come), oldest
--     first, not of a paused target (p_paused: ["target", ...]), and not behind an earlier
--     message of their (target, stream) that waits for its retry, is leased by another owner
--     (without partition leases; on leased partitions no other owner's lease can be there), or
--     is abandoned holding its stream (on_abandon = 'hold'). Behind the caller's own leases a
--     message may be claimed (the caller publishes in order and holds back what follows a
--     failure). The pick reads without locking, from two ordered index walks (pending, failed):
--     one walk over both statuses could not come out in id order without sorting the backlog;
--  4. locks the oldest p_limit picked rows FOR UPDATE SKIP LOCKED, rechecking that they are still
--     due on their latest version (so that claimers pass each other and a row is never claimed
--     twice); a picked row it could not lock holds back the rest of its stream (another claimer
--     is taking it); and leases them: status processing, lease_owner, lease_until = now +
--     p_lease_ms, a new epoch. A claimer whose whole pick another claimer has locked gets nothing
--     that round, as on PostgreSQL (with partition leases, picks never meet).
-- Returns two result sets: one row (settled, lease_lost, next_due_ms: when nothing was claimed,
-- the milliseconds until the first failed message of a held partition and a target not paused is
-- due), then the claimed messages in id order, with stream_prev_seq (Envelope::stream_prev_seq).
DROP PROCEDURE IF EXISTS __SCHEMA__.relay_claim;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.relay_claim(
  IN p_owner VARCHAR(255) CHARACTER SET utf8mb4, IN p_limit INT, IN p_lease_ms BIGINT,
  IN p_partitions LONGTEXT CHARACTER SET utf8mb4, IN p_paused LONGTEXT CHARACTER SET utf8mb4,
  IN p_complete LONGTEXT CHARACTER SET utf8mb4, IN p_keep_published BOOLEAN)
BEGIN
  DECLARE v_now DATETIME(6);
  DECLARE v_held LONGTEXT CHARACTER SET utf8mb4 DEFAULT NULL;
  DECLARE v_paused LONGTEXT CHARACTER SET utf8mb4 DEFAULT COALESCE(p_paused, '[]');
  DECLARE v_settled BIGINT DEFAULT 0;
  DECLARE v_lost LONGTEXT CHARACTER SET utf8mb4 DEFAULT NULL;
  DECLARE v_claimed BIGINT DEFAULT 0;
  DECLARE v_next_due BIGINT DEFAULT NULL;
  DECLARE v_any_abandoned BOOLEAN DEFAULT FALSE;
  DECLARE v_picked BIGINT DEFAULT 0;
  DECLARE v_extra BIGINT DEFAULT 0;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  IF p_owner IS NULL OR p_owner = '' THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'outbox.relay_claim: owner must not be empty';
  END IF;
  IF p_limit IS NULL OR p_limit < 1 OR p_lease_ms IS NULL OR p_lease_ms < 1 THEN
    SIGNAL SQLSTATE '22023'
      SET MESSAGE_TEXT = 'outbox.relay_claim: limit and lease_ms must be positive';
  END IF;
  -- The session's scratch lists (a MEMORY table costs no disk; created once per session, so a
  -- later version that changes one's shape must give it a new name).
  CREATE TEMPORARY TABLE IF NOT EXISTS outbox_v3_claim_picked (id BINARY(16) NOT NULL PRIMARY KEY)
    ENGINE = MEMORY;
  CREATE TEMPORARY TABLE IF NOT EXISTS outbox_v3_claim_leased (
    id BINARY(16) NOT NULL PRIMARY KEY,
    target VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    stream_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL) ENGINE = MEMORY;
  CREATE TEMPORARY TABLE IF NOT EXISTS outbox_v3_claim_passed (
    target VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    stream_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    id BINARY(16) NOT NULL) ENGINE = MEMORY;
  DELETE FROM outbox_v3_claim_picked;
  DELETE FROM outbox_v3_claim_leased;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  CALL __SCHEMA__.relay_settle_leases('complete', p_owner, p_complete, 0, p_keep_published, NULL,
                                      v_settled, v_lost);
  IF p_partitions IS NOT NULL THEN
    CALL __SCHEMA__.relay_held_partitions(p_owner, p_partitions, v_held);
  END IF;
  -- The clock is read once: read per row, a stream's failed head that became due during the
  -- claim could be "not due" where it was scanned and "due" where its successor was checked.
  SET v_now = UTC_TIMESTAMP(6);
  IF p_partitions IS NULL OR v_held IS NOT NULL THEN
    INSERT INTO outbox_v3_claim_picked (id)
    SELECT m.id FROM __SCHEMA__.messages m FORCE INDEX (messages_claimable)
    WHERE m.status = 'pending' AND m.available_at <= v_now
      AND (v_held IS NULL OR FIND_IN_SET(m.partition_no, v_held) > 0)
      AND NOT JSON_CONTAINS(v_paused, JSON_QUOTE(m.target))
      AND (m.stream_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM __SCHEMA__.messages e FORCE INDEX (messages_streams)
        WHERE e.target = m.target AND e.stream_key = m.stream_key
          AND e.status IN ('failed', 'processing', 'abandoned') AND e.id < m.id
          AND ((e.status = 'failed' AND e.available_at > v_now)
            OR (e.status = 'processing' AND p_partitions IS NULL AND e.lease_owner <> p_owner)
            OR (e.status = 'abandoned' AND e.holds_stream))))
    ORDER BY m.id
    LIMIT p_limit;
    INSERT INTO outbox_v3_claim_picked (id)
    SELECT m.id FROM __SCHEMA__.messages m FORCE INDEX (messages_claimable)
    WHERE m.status = 'failed' AND m.available_at <= v_now
      AND (v_held IS NULL OR FIND_IN_SET(m.partition_no, v_held) > 0)
      AND NOT JSON_CONTAINS(v_paused, JSON_QUOTE(m.target))
      AND (m.stream_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM __SCHEMA__.messages e FORCE INDEX (messages_streams)
        WHERE e.target = m.target AND e.stream_key = m.stream_key
          AND e.status IN ('failed', 'processing', 'abandoned') AND e.id < m.id
          AND ((e.status = 'failed' AND e.available_at > v_now)
            OR (e.status = 'processing' AND p_partitions IS NULL AND e.lease_owner <> p_owner)
            OR (e.status = 'abandoned' AND e.holds_stream))))
    ORDER BY m.id
    LIMIT p_limit;
    -- The oldest p_limit of both walks (a locking read locks every row it reads, sorted or not).
    SELECT COUNT(*) INTO v_picked FROM outbox_v3_claim_picked;
    IF v_picked > p_limit THEN
      SET v_extra = v_picked - p_limit;
      DELETE FROM outbox_v3_claim_picked ORDER BY id DESC LIMIT v_extra;
      SET v_picked = p_limit;
    END IF;
    INSERT INTO outbox_v3_claim_leased (id, target, stream_key)
    SELECT m.id, m.target, m.stream_key
    FROM outbox_v3_claim_picked c STRAIGHT_JOIN __SCHEMA__.messages m FORCE INDEX (PRIMARY)
      ON m.id = c.id
    WHERE m.status IN ('pending', 'failed') AND m.available_at <= v_now
    FOR UPDATE SKIP LOCKED;
    -- A picked row that could not be leased (another claimer has it locked, or took it since the
    -- pick) holds back the later rows of its (target, stream): they are not leased either, so that
    -- two claimers at once never split a stream between them. (Read without locking, and the
    -- rows dropped from the scratch list only: a locking read here waited for the other
    -- claimers' rows while they waited for ours, a deadlock.)
    IF ROW_COUNT() < v_picked THEN
      DELETE FROM outbox_v3_claim_passed;
      INSERT INTO outbox_v3_claim_passed (target, stream_key, id)
      SELECT m.target, m.stream_key, MIN(m.id)
      FROM outbox_v3_claim_picked c STRAIGHT_JOIN __SCHEMA__.messages m FORCE INDEX (PRIMARY)
        ON m.id = c.id
      WHERE m.stream_key IS NOT NULL AND c.id NOT IN (SELECT l.id FROM outbox_v3_claim_leased l)
      GROUP BY m.target, m.stream_key;
      DELETE l FROM outbox_v3_claim_leased l JOIN outbox_v3_claim_passed p
        ON p.target = l.target AND p.stream_key = l.stream_key AND l.id > p.id;
    END IF;
    UPDATE outbox_v3_claim_leased c
    STRAIGHT_JOIN __SCHEMA__.messages m FORCE INDEX (PRIMARY) ON m.id = c.id
    SET m.status = 'processing', m.lease_owner = p_owner,
        m.lease_until = v_now + INTERVAL p_lease_ms * 1000 MICROSECOND,
        m.lease_epoch = m.lease_epoch + 1;
    SET v_claimed = ROW_COUNT();
    IF v_claimed = 0 THEN
      SELECT CEILING(TIMESTAMPDIFF(MICROSECOND, v_now, MIN(m.available_at)) / 1000) INTO v_next_due
      FROM __SCHEMA__.messages m
      WHERE m.status = 'failed' AND m.available_at > v_now
        AND (v_held IS NULL OR FIND_IN_SET(m.partition_no, v_held) > 0)
        AND NOT JSON_CONTAINS(v_paused, JSON_QUOTE(m.target));
    END IF;
  END IF;
  SELECT v_settled AS settled, v_lost AS lease_lost, v_next_due AS next_due_ms;
  -- stream_prev_seq: only when the message just before it in its (target, stream) is abandoned,
  -- the seq just below the run of abandoned messages that ends there (0 when the run starts at
  -- the stream's first message). Every earlier message of the stream is settled by now
  -- (head-of-line), so that is the latest earlier message not abandoned. One probe per claim
  -- while no message at all is abandoned.
  SET v_any_abandoned = v_claimed > 0 AND EXISTS (
    SELECT 1 FROM __SCHEMA__.messages WHERE status = 'abandoned');
  SELECT m.id, m.topic, m.stream_key, m.stream_seq, m.partition_no, m.target, m.type, m.payload,
         m.content_type, m.headers, m.attempts, m.created_at, m.lease_epoch, m.event_id,
         CASE WHEN v_any_abandoned AND m.stream_seq IS NOT NULL AND EXISTS (
           SELECT 1 FROM __SCHEMA__.messages a FORCE INDEX (messages_streams)
           WHERE a.target = m.target AND a.stream_key = m.stream_key AND a.status = 'abandoned'
             AND a.id < m.id AND a.stream_seq = m.stream_seq - 1)
         THEN (
           SELECT a.stream_seq - 1 FROM __SCHEMA__.messages a FORCE INDEX (messages_streams)
           WHERE a.target = m.target AND a.stream_key = m.stream_key AND a.status = 'abandoned'
             AND a.id < m.id AND a.stream_seq < m.stream_seq
             AND NOT EXISTS (
               SELECT 1 FROM __SCHEMA__.messages b FORCE INDEX (messages_streams)
               WHERE b.target = a.target AND b.stream_key = a.stream_key
                 AND b.status = 'abandoned' AND b.id < a.id AND b.stream_seq = a.stream_seq - 1)
           ORDER BY a.stream_seq DESC
           LIMIT 1)
         END AS stream_prev_seq
  FROM __SCHEMA__.messages m JOIN outbox_v3_claim_leased c ON m.id = c.id
  ORDER BY m.id;
  COMMIT;
END //
DELIMITER ;

-- Store::ReclaimExpired: expired message leases (and, with p_own_unexpired, p_owner's own) back to
-- pending, except p_in_flight (["id hex", ...]: the caller's batches in flight). With p_partitions
-- only in those p_owner still holds: there a lease can only be the caller's own. Returns one row:
-- how many.
DROP PROCEDURE IF EXISTS __SCHEMA__.relay_reclaim;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.relay_reclaim(
  IN p_owner VARCHAR(255) CHARACTER SET utf8mb4, IN p_partitions LONGTEXT CHARACTER SET utf8mb4,
  IN p_in_flight LONGTEXT CHARACTER SET utf8mb4, IN p_own_unexpired BOOLEAN)
BEGIN
  DECLARE v_held LONGTEXT CHARACTER SET utf8mb4 DEFAULT NULL;
  DECLARE v_reclaimed BIGINT DEFAULT 0;
  DECLARE v_now DATETIME(6);
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  -- The ids in flight, looked up by key (a JSON_TABLE in NOT IN would be scanned per row).
  CREATE TEMPORARY TABLE IF NOT EXISTS outbox_v3_reclaim_in_flight (
    id BINARY(16) NOT NULL PRIMARY KEY) ENGINE = MEMORY;
  DELETE FROM outbox_v3_reclaim_in_flight;
  INSERT IGNORE INTO outbox_v3_reclaim_in_flight (id)
  SELECT UNHEX(f.hex) FROM JSON_TABLE(COALESCE(p_in_flight, '[]'),
                                      '$[*]' COLUMNS (hex CHAR(32) PATH '$')) f;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  IF p_partitions IS NOT NULL THEN
    CALL __SCHEMA__.relay_held_partitions(p_owner, p_partitions, v_held);
  END IF;
  SET v_now = UTC_TIMESTAMP(6);
  -- p_owner's own leases go back wherever they are: after an outage longer than the lease its
  -- partition leases have expired too (none held), and a claim must not go ahead of them.
  IF p_partitions IS NULL OR v_held IS NOT NULL OR p_own_unexpired THEN
    UPDATE __SCHEMA__.messages m
    SET m.status = 'pending', m.lease_owner = NULL, m.lease_until = NULL
    WHERE m.status = 'processing'
      AND ((m.lease_until < v_now
            AND (p_partitions IS NULL OR FIND_IN_SET(m.partition_no, v_held) > 0))
           OR (p_own_unexpired AND m.lease_owner = p_owner))
      AND m.id NOT IN (SELECT f.id FROM outbox_v3_reclaim_in_flight f);
    SET v_reclaimed = ROW_COUNT();
  END IF;
  COMMIT;
  SELECT v_reclaimed AS reclaimed;
END //
DELIMITER ;

-- Gives messages leased by anyone but `p_keeper` in the partitions `p_partitions` (a
-- comma-separated list) back: claimable again at once, no attempt spent. Taking a partition does
-- this, which voids the old owner's message leases (its completions no longer match: the fence).
DROP PROCEDURE IF EXISTS __SCHEMA__.relay_void_message_leases;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.relay_void_message_leases(
  IN p_partitions LONGTEXT CHARACTER SET utf8mb4, IN p_keeper VARCHAR(255) CHARACTER SET utf8mb4)
BEGIN
  UPDATE __SCHEMA__.messages m
  SET m.status = 'pending', m.lease_owner = NULL, m.lease_until = NULL
  WHERE m.status = 'processing' AND FIND_IN_SET(m.partition_no, p_partitions) > 0
    AND NOT (m.lease_owner <=> p_keeper);
END //
DELIMITER ;

-- One heartbeat of relay `p_relay` (one transaction, the database's clock): register or renew it,
-- hand back `p_release` (a JSON array of partitions), renew the rest of its leases, take free or
-- expired partitions up to its fair share. Fair share: the live relays ordered by owner get
-- ceil(partitions / live) (the first partitions % live of them) or floor. Returns one row: owned
-- ([[partition, epoch], ...] ascending; the last owned - fair_share of them are the surplus),
-- live_instances, fair_share, partition_count, acquired, taken_over, released, next_heartbeat_ms.
DROP PROCEDURE IF EXISTS __SCHEMA__.relay_heartbeat;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.relay_heartbeat(
  IN p_relay VARCHAR(255) CHARACTER SET utf8mb4, IN p_lease_ms BIGINT,
  IN p_release LONGTEXT CHARACTER SET utf8mb4)
BEGIN
  DECLARE v_now DATETIME(6);
  DECLARE v_until DATETIME(6);
  DECLARE v_count INT;
  DECLARE v_live INT;
  DECLARE v_rank INT;
  DECLARE v_share INT;
  DECLARE v_held INT;
  DECLARE v_wanted INT;
  DECLARE v_released INT DEFAULT 0;
  DECLARE v_released_list LONGTEXT CHARACTER SET utf8mb4 DEFAULT NULL;
  DECLARE v_acquired INT DEFAULT 0;
  DECLARE v_taken_over INT DEFAULT 0;
  DECLARE v_taken LONGTEXT CHARACTER SET utf8mb4 DEFAULT NULL;
  DECLARE v_next BIGINT DEFAULT NULL;
  DECLARE v_partition INT;
  DECLARE v_was_held BOOLEAN;
  DECLARE v_done BOOLEAN DEFAULT FALSE;
  DECLARE v_message VARCHAR(255);
  -- Free partitions first, then expired ones. FOR UPDATE conflicts with the share lock a claim
  -- takes on the leases it claims under, so a claim is either wholly before this takeover or sees
  -- its result; SKIP LOCKED: relays heartbeating at once take different partitions, and none
  -- waits for a claim.
  DECLARE v_candidates CURSOR FOR
    SELECT p.partition_no, p.owner IS NOT NULL FROM __SCHEMA__.partition_leases p
    WHERE p.owner IS NULL OR p.lease_until IS NULL OR p.lease_until < v_now
    ORDER BY p.owner IS NOT NULL, p.partition_no
    LIMIT v_wanted
    FOR UPDATE SKIP LOCKED;
  DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  IF p_relay IS NULL OR p_relay = '' THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'outbox.relay_heartbeat: relay must not be empty';
  END IF;
  IF p_lease_ms IS NULL OR p_lease_ms < 1 THEN
    SET v_message = CONCAT('outbox.relay_heartbeat: lease_ms must be positive, got ',
                           COALESCE(p_lease_ms, 'NULL'));
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = v_message;
  END IF;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  SET v_now = UTC_TIMESTAMP(6);
  SET v_until = v_now + INTERVAL p_lease_ms * 1000 MICROSECOND;
  SELECT s.partition_count INTO v_count FROM __SCHEMA__.settings s;

  INSERT INTO __SCHEMA__.relay_instances (owner, started_at, heartbeat_at, expires_at)
  VALUES (p_relay, v_now, v_now, v_until)
  ON DUPLICATE KEY UPDATE heartbeat_at = v_now, expires_at = v_until;
  DELETE FROM __SCHEMA__.relay_instances WHERE expires_at < v_now;

  IF p_release IS NOT NULL AND JSON_LENGTH(p_release) > 0 THEN
    SELECT GROUP_CONCAT(p.partition_no) INTO v_released_list
    FROM JSON_TABLE(p_release, '$[*]' COLUMNS (n INT PATH '$')) r
    STRAIGHT_JOIN __SCHEMA__.partition_leases p FORCE INDEX (PRIMARY) ON p.partition_no = r.n
    WHERE p.owner = p_relay
    FOR UPDATE;
    IF v_released_list IS NOT NULL THEN
      UPDATE __SCHEMA__.partition_leases SET owner = NULL, lease_until = NULL
      WHERE owner = p_relay AND FIND_IN_SET(partition_no, v_released_list) > 0;
      SET v_released = ROW_COUNT();
      -- What the relay still had leased there goes back unpublished.
      UPDATE __SCHEMA__.messages SET status = 'pending', lease_owner = NULL, lease_until = NULL
      WHERE status = 'processing' AND lease_owner = p_relay
        AND FIND_IN_SET(partition_no, v_released_list) > 0;
    END IF;
  END IF;

  -- Renew only what is still ours (a lease taken over meanwhile has another owner).
  UPDATE __SCHEMA__.partition_leases SET lease_until = v_until WHERE owner = p_relay;

  SELECT COUNT(*), COALESCE(SUM(owner < p_relay), 0) INTO v_live, v_rank
  FROM __SCHEMA__.relay_instances WHERE expires_at > v_now;
  SET v_share = v_count DIV v_live + IF(v_rank < v_count MOD v_live, 1, 0);
  SELECT COUNT(*) INTO v_held FROM __SCHEMA__.partition_leases WHERE owner = p_relay;

  IF v_held < v_share THEN
    SET v_wanted = v_share - v_held;
    OPEN v_candidates;
    take: LOOP
      FETCH v_candidates INTO v_partition, v_was_held;
      IF v_done THEN
        LEAVE take;
      END IF;
      UPDATE __SCHEMA__.partition_leases
      SET owner = p_relay, epoch = epoch + 1, lease_until = v_until, acquired_at = v_now
      WHERE partition_no = v_partition;
      SET v_acquired = v_acquired + 1, v_taken_over = v_taken_over + IF(v_was_held, 1, 0),
          v_taken = CONCAT_WS(',', v_taken, v_partition);
    END LOOP;
    CLOSE v_candidates;
    IF v_acquired > 0 THEN
      CALL __SCHEMA__.relay_void_message_leases(v_taken, p_relay);
    END IF;
  END IF;

  -- Call again after a third of the lease, or just after the next lease of another relay expires
  -- (a relay that died: its partitions are then taken over at once).
  SELECT TIMESTAMPDIFF(MICROSECOND, v_now, MIN(lease_until)) DIV 1000 + 20 INTO v_next
  FROM __SCHEMA__.partition_leases
  WHERE owner IS NOT NULL AND owner <> p_relay AND lease_until > v_now;
  COMMIT;

  SELECT
    (SELECT COALESCE(JSON_ARRAYAGG(JSON_ARRAY(partition_no, epoch) ORDER BY partition_no), '[]')
     FROM __SCHEMA__.partition_leases WHERE owner = p_relay) AS owned,
    v_live AS live_instances, v_share AS fair_share, v_count AS partition_count,
    v_acquired AS acquired, v_taken_over AS taken_over, v_released AS released,
    LEAST(p_lease_ms DIV 3, COALESCE(v_next, p_lease_ms)) AS next_heartbeat_ms;
END //
DELIMITER ;

-- Clean shutdown of relay `p_relay`: its partitions become free at once (the others take them at
-- their next heartbeat), what it still had leased goes back unpublished, and it is deregistered.
DROP PROCEDURE IF EXISTS __SCHEMA__.relay_leave;
DELIMITER //
CREATE PROCEDURE __SCHEMA__.relay_leave(IN p_relay VARCHAR(255) CHARACTER SET utf8mb4)
BEGIN
  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
  IF p_relay IS NULL OR p_relay = '' THEN
    SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'outbox.relay_leave: relay must not be empty';
  END IF;
  SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
  START TRANSACTION;
  UPDATE __SCHEMA__.partition_leases SET owner = NULL, lease_until = NULL WHERE owner = p_relay;
  UPDATE __SCHEMA__.messages SET status = 'pending', lease_owner = NULL, lease_until = NULL
  WHERE status = 'processing' AND lease_owner = p_relay;
  DELETE FROM __SCHEMA__.relay_instances WHERE owner = p_relay;
  COMMIT;
END //
DELIMITER ;
