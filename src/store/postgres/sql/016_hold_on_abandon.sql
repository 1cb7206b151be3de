-- outbox schema, version 16: dead letters that keep order (issue #43). __SCHEMA__ is replaced by
-- the quoted schema name.
--
-- Under the policy on_abandon = 'hold' an abandoned keyed message holds its (target, stream):
-- the claim passes none of the stream's later messages (head-of-line, statements.cpp) until an
-- operator replays it (back to pending) or skips it (Admin::Skip: holds_stream goes false and it
-- is an ordinary abandoned row; the next message carries outbox-stream-prev-seq as before).
-- 'continue' (the default) is the behaviour of versions 8 to 15: the stream goes on past it.

-- 1. Whether an abandoned row holds its stream. false for every row written before: adding a
--    column with a constant default rewrites nothing.
ALTER TABLE __SCHEMA__.messages ADD COLUMN holds_stream boolean NOT NULL DEFAULT false;
-- The claim probes it once per keyed candidate while any row holds (and once per claim when none
-- does), and the operator lists the held streams from it; it holds only the held rows.
CREATE INDEX messages_held_streams ON __SCHEMA__.messages (target, stream_key, id)
  WHERE status = 'abandoned' AND holds_stream;

-- 2. A topic's policy, written by the application next to its data. NULL: the target's default
--    (the sink's on_abandon in outboxd's configuration), else 'continue'. The topic's setting wins
--    over the target's default: whether later messages may overtake a dead one is a property of
--    the data (does the consumer need every step of the stream?), which the topic knows.
ALTER TABLE __SCHEMA__.topic_settings ADD COLUMN on_abandon text
  CONSTRAINT topic_settings_on_abandon CHECK (on_abandon IN ('continue', 'hold'));
