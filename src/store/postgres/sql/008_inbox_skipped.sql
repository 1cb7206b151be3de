-- outbox schema, version 8: consumers are no longer stuck behind abandoned messages (issue #13).
-- __SCHEMA__ is replaced by the quoted schema name.

-- The claim tells the consumer when the messages just before one were abandoned
-- (Envelope::stream_prev_seq, RabbitMQ header outbox-stream-prev-seq): for each claimed message it
-- looks for its stream's abandoned predecessor here (see kPrevSeq in statements.cpp). Only
-- abandoned rows are in it, so it stays small, a probe costs next to nothing, and the hot path
-- (enqueue, claim, delete) never writes to it. Building it reads the table once, holding off
-- writers meanwhile.
CREATE INDEX messages_abandoned_streams ON __SCHEMA__.messages (stream_key, stream_seq)
  WHERE status = 'abandoned';

-- The seqs a consumer's stream mark (inbox_streams) moved past because the relay said they were
-- abandoned: one row per such gap, first_seq .. last_seq. An operator may replay one of them
-- later; it then arrives below the mark, and the inbox processes it once and takes it out of its
-- row instead of dropping it as a duplicate (include/outbox/inbox/inbox.h). Rows stay until their
-- seqs are replayed; there is one per gap, so they stay few.
CREATE TABLE __SCHEMA__.inbox_skipped (
  consumer text NOT NULL,
  stream_key text NOT NULL,
  first_seq bigint NOT NULL,
  last_seq bigint NOT NULL,
  skipped_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, stream_key, first_seq),
  CHECK (first_seq >= 1 AND last_seq >= first_seq)
);
