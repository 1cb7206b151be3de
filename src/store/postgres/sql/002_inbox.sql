-- outbox schema, version 2: the consumer-side inbox (see include/outbox/inbox/inbox.h).
-- __SCHEMA__ is replaced by the quoted schema name.

-- Messages processed by each consumer, for messages without a stream_seq. Rows older than the
-- consumer's retention window are deleted in chunks by Inbox::Cleanup; a duplicate arriving
-- after that window would be processed again, so choose the window longer than any redelivery.
CREATE TABLE __SCHEMA__.inbox_messages (
  consumer text NOT NULL,
  message_id uuid NOT NULL,
  processed_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, message_id)
);
CREATE INDEX inbox_messages_processed_at ON __SCHEMA__.inbox_messages (consumer, processed_at);

-- For ordered streams: the highest stream_seq each consumer has processed. Constant space per
-- (consumer, stream), no age-based eviction: anything at or below the mark is a duplicate.
CREATE TABLE __SCHEMA__.inbox_streams (
  consumer text NOT NULL,
  stream_key text NOT NULL,
  last_seq bigint NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (consumer, stream_key)
);
