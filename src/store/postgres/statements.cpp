#include "statements.h"

#include "connection.h"

namespace outbox::postgres {
namespace {

// Only rows still leased by this owner under the epoch they were claimed with. A row has a
// lease_owner only while it is 'processing' (every statement that moves it on clears the owner),
// so the status is not tested here: with it, the planner may walk the partial index of processing
// rows instead of probing the ids, and under an old snapshot that index holds an entry for every
// message claimed since (a settle took 1.2 s and 500k buffers in the held-snapshot benchmark,
// bench/RESULTS.md).
// The rows are found by their ids (`m.id = ANY`: one probe of the primary key each), and the owner
// is compared as a column of the list, not as a constant: analyzed while no row was leased, or
// before this relay's owner name existed, the statistics say no row has that owner, and the
// planner, expecting one row, joined by comparing every row with every entry of the list (a settle
// of 500 took 70 ms of a claim's 84 in a drain of 20,000, bench/RESULTS.md) or scanned the table.
constexpr const char* kFenced = R"(
  AS c(id, epoch, owner)
  WHERE m.id = ANY (__FENCE_IDS__) AND m.id = c.id AND m.lease_epoch = c.epoch
    AND m.lease_owner = c.owner)";

// The list of ids and epochs that kFenced reads as `c`, with the owner repeated on every entry.
constexpr const char* kFencedList =
    "unnest(__FENCE_IDS__, __FENCE_EPOCHS__, "
    "array_fill(__FENCE_OWNER__::text, ARRAY[cardinality(__FENCE_IDS__)]))";

// Due is judged by clock_timestamp(), read after the snapshot, not now(): now() is this
// statement's transaction start, which can precede the start (= available_at) of a writer that
// still committed in time to be visible, so the stream's message would be skipped while its
// successor, written by a transaction that began earlier, was claimed (seen under load).
// Oldest first, from two indexes (see sql/004_claim_cursor.sql): fresh messages from the cursor
// $6 on (see claim_cursor.h), returned ones whole. SKIP LOCKED lets claimers pass each other.
// A keyed message waits while an earlier message of its stream and target waits for its retry, or
// (without partition leases) is leased by another owner: head-of-line per (target, stream), the
// unit stream_seq counts in (sql/010_fan_out.sql), so that a failing or paused target holds back
// only its own messages. The messages of a paused target ($7, the targets whose sink is
// unavailable) are not claimed at all. On leased partitions no
// other owner's lease can be there: a partition's messages were given back or voided when it
// changed hands. Behind the caller's own leases a message may be claimed: the caller publishes its
// batches in order and holds back what follows a failure (see Relay), which keeps a busy stream
// pipelined. A returned message sorts before its stream's later fresh ones, so both branches,
// merged by id, keep a stream in order.
// With partition leases ($2 partitions, $5 their epochs), only partitions still held by the caller
// under those epochs: FOR KEY SHARE conflicts with the FOR UPDATE a takeover takes first, so the
// claim either commits before the takeover (which then voids its leases) or waits and, rechecking
// the lease row, finds it taken and claims nothing there. Without ($2 null) every partition.
// One row comes back even when nothing is claimed: its last four columns tell the cursor where
// the next claim may start (the first fresh message at or after $6 in the partitions asked for
// that is not for a paused target, the transaction's start, the oldest running transaction id,
// this transaction's id). The cursor thus passes a paused target's backlog once instead of
// walking it on every claim; it starts from the oldest again when the target resumes
// (claim_cursor.h).
// An abandoned message that holds its stream (on_abandon = 'hold', sql/016_hold_on_abandon.sql)
// blocks its (target, stream) like a head waiting for its retry, until an operator replays or
// skips it; while no row holds one, that costs one probe per claim (the InitPlan), else one probe
// of the small index of held rows per keyed candidate.
// The clock is read once per claim (the `clock` CTE): read per row, a stream's failed head that
// became due during a long claim was "not due" where it was scanned and "due" (so no longer
// blocking) where its successor was checked, and the successor went out alone, ahead of it.
constexpr const char* kHeadOfLine = R"(
    AND (m.stream_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM __TABLE__ e
      WHERE e.stream_key = m.stream_key AND e.target = m.target AND e.id < m.id
        AND e.status = 'failed' AND e.available_at > (SELECT now FROM clock)))
    AND (m.stream_key IS NULL OR $2::integer[] IS NOT NULL OR NOT EXISTS (
      SELECT 1 FROM __TABLE__ e
      WHERE e.stream_key = m.stream_key AND e.target = m.target AND e.id < m.id
        AND e.status = 'processing' AND e.lease_owner <> $3))
    AND (m.stream_key IS NULL
      OR NOT (SELECT EXISTS (SELECT 1 FROM __TABLE__ WHERE status = 'abandoned' AND holds_stream))
      OR NOT EXISTS (
      SELECT 1 FROM __TABLE__ e
      WHERE e.stream_key = m.stream_key AND e.target = m.target AND e.id < m.id
        AND e.status = 'abandoned' AND e.holds_stream))
    AND m.target <> ALL ($7::text[]))";

constexpr const char* kInHeld = R"(
    AND ($2::integer[] IS NULL OR m.partition IN (SELECT partition FROM held)))";

// The partitions asked for ($2), whether or not their leases are still valid: the frontier's. A
// claim whose partition leases had expired (an outage longer than the lease) claims nothing
// there, but the cursor must not pass their messages: renewed under the same epochs, the same
// partitions are not "gained" (claim_cursor.h), so nothing would walk back to them (a stream's
// message was left unclaimed until the net's walk, a minute later).
constexpr const char* kInAsked = R"(
    AND ($2::integer[] IS NULL OR m.partition = ANY ($2::integer[])))";

// The partitions $2 (with epochs __EPOCHS__) that owner $3 still holds under those epochs, their
// lease rows share-locked until the statement ends (see kClaim).
constexpr const char* kHeld = R"(
held AS (
  SELECT p.partition FROM __SCHEMA__.partition_leases p
  JOIN unnest($2::integer[], __EPOCHS__::bigint[]) AS h(partition, epoch)
    ON p.partition = h.partition AND p.epoch = h.epoch
  WHERE p.owner = $3 AND p.lease_until > clock_timestamp()
  FOR KEY SHARE OF p))";

// The stream_prev_seq of a claimed message c (Envelope::stream_prev_seq): only when the message
// just before it in its (target, stream) is abandoned, the seq just below the run of abandoned
// messages that ends there (0 when the run starts at the stream's first message). Every earlier
// message of the stream is published or abandoned by now (head-of-line; the caller's own leases
// aside, which it publishes in order and holds back after a failure), so that is the latest
// earlier message not abandoned. Every lookup is one probe of the small index of abandoned rows
// (sql/008_inbox_skipped.sql): one per claim while no message at all is abandoned (the InitPlan),
// else one per claimed message, and one more per message of the run when its predecessor is
// abandoned. OFFSET 0 keeps each EXISTS a probe: pulled up into a join, the planner scanned a
// stream's abandoned rows once per row of the run (40 s for a run of 20,000), or hashed every
// abandoned row of the table on each claim.
constexpr const char* kPrevSeq = R"(
       CASE WHEN (SELECT EXISTS (SELECT 1 FROM __TABLE__ WHERE status = 'abandoned'))
         AND EXISTS (
         SELECT 1 FROM __TABLE__ a
         WHERE a.status = 'abandoned' AND a.stream_key = c.stream_key AND a.target = c.target
           AND a.stream_seq = c.stream_seq - 1
         OFFSET 0)
       THEN (
         SELECT a.stream_seq - 1 FROM __TABLE__ a
         WHERE a.status = 'abandoned' AND a.stream_key = c.stream_key AND a.target = c.target
           AND a.stream_seq < c.stream_seq
           AND NOT EXISTS (
             SELECT 1 FROM __TABLE__ b
             WHERE b.status = 'abandoned' AND b.stream_key = a.stream_key AND b.target = a.target
               AND b.stream_seq = a.stream_seq - 1
             OFFSET 0)
         ORDER BY a.stream_seq DESC
         LIMIT 1)
       END)";

// The claim settles the caller's last batch first ($8 ids, $9 epochs; `settled`, the complete
// statement with the claim's owner $3): one statement per round instead of two. The rows it
// deletes are the caller's own leases, which no branch below claims or waits for, so reading them
// from the statement's snapshot changes nothing. Three more columns: how many were settled, the
// ids that were not (lease lost; only when some were not), and, when nothing was claimed, the
// milliseconds until the first failed message of a held partition and a target not paused is due
// (a retry's backoff): an idle relay sleeps until then instead of looking every second.
constexpr const char* kClaim = R"(
WITH settled AS (__SETTLE__),
__HELD__,
clock AS MATERIALIZED (SELECT clock_timestamp() AS now),
frontier AS (
  SELECT m.id FROM __TABLE__ m
  WHERE m.status = 'pending' AND m.lease_epoch = 0 AND m.id >= $6::uuid __IN_ASKED__
    AND m.target <> ALL ($7::text[])
  ORDER BY m.id
  LIMIT 1),
fresh AS (
  SELECT m.id FROM __TABLE__ m
  WHERE m.status = 'pending' AND m.lease_epoch = 0 AND m.id >= $6::uuid
    AND m.available_at <= (SELECT now FROM clock) __IN_HELD__ __HEAD_OF_LINE__
  ORDER BY m.id
  LIMIT $1::integer),
returned AS (
  SELECT m.id FROM __TABLE__ m
  WHERE m.status IN ('pending', 'failed') AND m.lease_epoch > 0
    AND m.available_at <= (SELECT now FROM clock) __IN_HELD__ __HEAD_OF_LINE__
  ORDER BY m.id
  LIMIT $1::integer),
claimable AS (
  SELECT m.id FROM __TABLE__ m
  WHERE m.id = ANY (ARRAY(
      SELECT c.id FROM (SELECT id FROM fresh UNION ALL SELECT id FROM returned) c
      ORDER BY c.id LIMIT $1::integer))
    AND m.status IN ('pending', 'failed')
  FOR UPDATE SKIP LOCKED),
claimed AS (
  UPDATE __TABLE__ m
  SET status = 'processing', lease_owner = $3,
      lease_until = now() + $4::bigint * interval '1 millisecond',
      lease_epoch = m.lease_epoch + 1
  WHERE m.id = ANY (ARRAY(SELECT id FROM claimable))
  RETURNING m.id, m.topic, m.stream_key, m.stream_seq, m.partition, m.target, m.type, m.payload,
            m.content_type, m.headers, m.attempts, m.created_at, m.lease_epoch, m.event_id)
SELECT c.id, c.topic, c.stream_key, c.stream_seq, c.partition, c.target, c.type, c.payload,
       c.content_type, c.headers, c.attempts, c.created_at, c.lease_epoch, c.event_id,
       (SELECT id FROM frontier), now(), pg_snapshot_xmin(pg_current_snapshot()),
       pg_current_xact_id_if_assigned(), __PREV_SEQ__,
       (SELECT count(*) FROM settled),
       CASE WHEN (SELECT count(*) FROM settled) < cardinality($8::uuid[]) THEN array_to_string(
         ARRAY(SELECT u.id FROM unnest($8::uuid[]) AS u(id) EXCEPT SELECT s.id FROM settled s),
         ',') END,
       CASE WHEN NOT EXISTS (SELECT 1 FROM claimed) THEN (
         SELECT ceil(extract(epoch FROM min(m.available_at) - (SELECT now FROM clock)) * 1000)::bigint
         FROM __TABLE__ m
         WHERE m.status = 'failed' AND m.available_at > (SELECT now FROM clock)
           AND m.target <> ALL ($7::text[]) __IN_HELD__) END
FROM (VALUES (1)) AS one(row) LEFT JOIN claimed c ON true)";

constexpr const char* kDelete = R"(
DELETE FROM __TABLE__ m USING __FENCED_LIST__ __FENCED__ RETURNING m.id)";

constexpr const char* kMarkPublished = R"(
UPDATE __TABLE__ m SET status = 'published', published_at = now(), lease_owner = NULL,
                       lease_until = NULL
FROM __FENCED_LIST__ __FENCED__ RETURNING m.id)";

constexpr const char* kRenew = R"(
UPDATE __TABLE__ m SET lease_until = now() + $4::bigint * interval '1 millisecond'
FROM __FENCED_LIST__ __FENCED__ RETURNING m.id)";

constexpr const char* kRelease = R"(
UPDATE __TABLE__ m SET status = 'pending', lease_owner = NULL, lease_until = NULL
FROM __FENCED_LIST__ __FENCED__ RETURNING m.id)";

// A message that must wait (a retry's backoff, or a destination's Retry-After with no attempt
// spent) is 'failed' until it is due, so that the later messages of its stream wait behind it
// (kHeadOfLine); with no delay it is 'pending' at once. Fenced as kFenced is (no status test).
// An abandoned keyed message holds its stream when its topic's on_abandon says 'hold', or the
// topic says nothing and its target is among $8 (the targets whose default is 'hold',
// RetryPolicy::hold_targets): the topic's setting wins (sql/016_hold_on_abandon.sql).
constexpr const char* kFail = R"(
UPDATE __TABLE__ m SET
  status = CASE WHEN c.abandon THEN 'abandoned' WHEN c.spend OR c.delay_ms > 0 THEN 'failed' ELSE 'pending' END,
  holds_stream = CASE WHEN c.abandon AND m.stream_key IS NOT NULL THEN coalesce(
    (SELECT t.on_abandon FROM __SCHEMA__.topic_settings t WHERE t.topic = m.topic),
    CASE WHEN m.target = ANY ($8::text[]) THEN 'hold' ELSE 'continue' END) = 'hold'
    ELSE false END,
  attempts = m.attempts + CASE WHEN c.spend THEN 1 ELSE 0 END,
  available_at = now() + c.delay_ms * interval '1 millisecond',
  abandoned_at = CASE WHEN c.abandon THEN now() END,
  last_error = c.error, lease_owner = NULL, lease_until = NULL
FROM unnest($2::uuid[], $3::bigint[], $4::boolean[], $5::boolean[], $6::bigint[], $7::text[],
            array_fill($1::text, ARRAY[cardinality($2::uuid[])]))
  AS c(id, epoch, abandon, spend, delay_ms, error, owner)
WHERE m.id = ANY ($2::uuid[]) AND m.id = c.id AND m.lease_epoch = c.epoch
  AND m.lease_owner = c.owner
RETURNING m.id)";

// Expired message leases back to pending, except the ids $1 (the caller's batches in flight).
// With partitions ($2, epochs $4, owner $3) only in those the caller still holds: there a lease
// can only be the caller's own, left behind when recording an outcome failed or a claim's reply
// was lost; another relay's partitions are not touched, however slow its batches. With $5, also
// the caller's own leases that have not expired (after a claim whose reply was lost).
// Expired leases in the partitions held; and with $5 (own_unexpired) every lease of owner $3 (a
// relay's run: nobody else's), wherever it is: after an outage longer than the lease, the relay's
// partition leases have expired too, and its own message leases must go back all the same before
// it claims again (its heartbeat renews the partitions under the same epochs, and a claim in a
// held partition goes behind the caller's own leases).
constexpr const char* kReclaimExpired = R"(
WITH __HELD__
UPDATE __TABLE__ m SET status = 'pending', lease_owner = NULL, lease_until = NULL
WHERE m.status = 'processing' AND m.id <> ALL ($1::uuid[])
  AND ((m.lease_until < now() __IN_HELD__) OR ($5::boolean AND m.lease_owner = $3)))";

// A message that holds its stream is never purged: that would release the stream behind the
// operator's back; it waits for a replay or a skip.
constexpr const char* kPurge = R"(
DELETE FROM __TABLE__ WHERE id IN (
  SELECT id FROM (
    (SELECT id FROM __TABLE__ WHERE status = 'published'
       AND published_at < now() - $1::bigint * interval '1 second' LIMIT $3::integer)
    UNION ALL
    (SELECT id FROM __TABLE__ WHERE status = 'abandoned' AND NOT holds_stream
       AND abandoned_at < now() - $2::bigint * interval '1 second' LIMIT $3::integer)
  ) doomed LIMIT $3::integer))";

// Every stream_seq number with a successor, but a pair's first row (sql/011_stream_seq_log.sql).
constexpr const char* kPurgeStreamSeqs = R"(
DELETE FROM __SCHEMA__.stream_seqs WHERE taken AND NOT first)";

// Exact counts up to $1 rows per status (a capped index scan each), then the planner's estimate
// from pg_stats' most-common-values of `status` times the table's row estimate.
constexpr const char* kStats = R"(
WITH estimate AS (
  SELECT v.status, (v.freq * c.reltuples)::bigint AS rows
  FROM pg_class c, pg_stats s,
       unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(status, freq)
  WHERE c.oid = '__TABLE__'::regclass AND s.schemaname = '__SCHEMA_NAME__'
    AND s.tablename = 'messages' AND s.attname = 'status')
SELECT
  least($1, (SELECT count(*) FROM (SELECT 1 FROM __TABLE__
                                    WHERE status = 'pending' AND lease_epoch = 0 LIMIT $1) x) +
            (SELECT count(*) FROM (SELECT 1 FROM __TABLE__
                                    WHERE status = 'pending' AND lease_epoch > 0 LIMIT $1) x)),
  (SELECT count(*) FROM (SELECT 1 FROM __TABLE__ WHERE status = 'processing' LIMIT $1) x),
  (SELECT count(*) FROM (SELECT 1 FROM __TABLE__ WHERE status = 'failed' LIMIT $1) x),
  (SELECT count(*) FROM (SELECT 1 FROM __TABLE__ WHERE status = 'abandoned' LIMIT $1) x),
  (SELECT count(*) FROM (SELECT 1 FROM __TABLE__ WHERE status = 'published' LIMIT $1) x),
  (SELECT (extract(epoch FROM now() - created_at) * 1000)::bigint FROM __TABLE__
    WHERE id = least(
      (SELECT id FROM __TABLE__ WHERE status = 'pending' AND lease_epoch = 0 ORDER BY id LIMIT 1),
      (SELECT id FROM __TABLE__ WHERE status IN ('pending', 'failed') AND lease_epoch > 0
        ORDER BY id LIMIT 1))),
  (SELECT count(DISTINCT lease_owner) FROM __TABLE__
    WHERE status = 'processing' AND lease_until > now()),
  (SELECT rows FROM estimate WHERE status = 'pending'),
  (SELECT rows FROM estimate WHERE status = 'processing'),
  (SELECT rows FROM estimate WHERE status = 'failed'),
  (SELECT rows FROM estimate WHERE status = 'abandoned'),
  (SELECT rows FROM estimate WHERE status = 'published'),
  (SELECT count(*) FROM __SCHEMA__.relay_instances WHERE expires_at > now()),
  (SELECT CASE WHEN EXISTS (SELECT 1 FROM __SCHEMA__.relay_instances WHERE expires_at > now())
          THEN count(*) ELSE 0 END
   FROM __SCHEMA__.partition_leases WHERE owner IS NULL OR lease_until <= now()),
  (SELECT count(*) FROM (SELECT DISTINCT target, stream_key FROM __TABLE__
                          WHERE status = 'abandoned' AND holds_stream LIMIT $1) x))";

}  // namespace

std::string PrevSeqSql(const std::string& table) {
  return ReplaceAll(kPrevSeq, "__TABLE__", table);
}

Statements::Statements(const std::string& schema, bool keep_published) {
  const std::string quoted = QuoteSchema(schema);
  const std::string table = quoted + ".messages";
  const auto build = [&](std::string text) {
    for (const auto& [from, to] :
         {std::pair{"__HELD__", kHeld}, std::pair{"__IN_HELD__", kInHeld},
          std::pair{"__IN_ASKED__", kInAsked}, std::pair{"__HEAD_OF_LINE__", kHeadOfLine},
          std::pair{"__PREV_SEQ__", kPrevSeq}}) {
      text = ReplaceAll(text, from, to);
    }
    return ReplaceAll(ReplaceAll(ReplaceAll(text, "__TABLE__", table), "__SCHEMA_NAME__", schema),
                      "__SCHEMA__", quoted);
  };
  // A fenced statement on its parameters: the ids, their epochs and the owner.
  const auto fence = [](std::string text, const char* ids, const char* epochs, const char* owner) {
    text = ReplaceAll(ReplaceAll(text, "__FENCED_LIST__", kFencedList), "__FENCED__", kFenced);
    return ReplaceAll(
        ReplaceAll(ReplaceAll(text, "__FENCE_IDS__", ids), "__FENCE_EPOCHS__", epochs),
        "__FENCE_OWNER__", owner);
  };
  const auto fenced = [&](const char* text) {
    return build(fence(text, "$2::uuid[]", "$3::bigint[]", "$1"));
  };
  const char* settle = keep_published ? kMarkPublished : kDelete;
  complete = fenced(settle);
  // The same settling statement inside the claim, on its parameters: owner $3, ids $8, epochs $9.
  const std::string settle_in_claim = fence(settle, "$8::uuid[]", "$9::bigint[]", "$3");
  claim = ReplaceAll(build(ReplaceAll(kClaim, "__SETTLE__", settle_in_claim)), "__EPOCHS__", "$5");
  renew = fenced(kRenew);
  release = fenced(kRelease);
  fail = build(kFail);
  reclaim_expired = ReplaceAll(build(kReclaimExpired), "__EPOCHS__", "$4");
  purge = build(kPurge);
  purge_stream_seqs = build(kPurgeStreamSeqs);
  stats = build(kStats);
}

}  // namespace outbox::postgres
