-- outbox schema, version 5: a message id is read from the clock only once its transaction has a
-- transaction id.
--
-- The claim cursor (sql/004, claim_cursor.h) moves past the time T of a claim once every
-- transaction with an id older than that claim's own has ended. A writer whose first write was
-- the enqueue read the clock for the message id before its INSERT gave it a transaction id; a
-- claim could start in between, and the writer's message then had an id older than T while its
-- transaction id was newer than the claim's: the cursor passed it before it committed (seen once
-- under load, a stream's first message published after its eleventh). Taking the transaction id
-- first closes that gap: a later transaction id means a later clock reading.
CREATE OR REPLACE FUNCTION __SCHEMA__.uuid_v7() RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  micros bigint;
BEGIN
  PERFORM pg_current_xact_id();  -- assigns this transaction's id if it has none yet
  micros := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
  RETURN encode(
    set_byte(set_byte(
      overlay(uuid_send(gen_random_uuid()) PLACING substring(int8send(micros / 1000) FROM 3) FROM 1),
      6, (112 | (((micros % 1000) * 4096 / 1000) >> 8))::int),
      7, (((micros % 1000) * 4096 / 1000) & 255)::int),
    'hex')::uuid;
END
$$;
