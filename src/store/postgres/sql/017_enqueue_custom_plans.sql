-- outbox schema, version 17: the enqueue plans each of its statements for the values of each call.
-- __SCHEMA__ is replaced by the quoted schema name.
--
-- plpgsql caches a generic plan of each statement of a function after its fifth call in a session,
-- costed with the statistics of that moment. Once stream_seqs had been analyzed while (nearly)
-- empty, the generic plan of the lookup of a stream's latest number (`... ORDER BY s.seq DESC
-- LIMIT 1`) was a sequential scan, kept for the rest of the session while the table grew: in one
-- transaction of many keyed messages each enqueue read every row the transaction had added before
-- it (quadratic: 20,000 messages took 29 s instead of 1.2 s, 1,000,000 did not finish in 12
-- minutes; bench/RESULTS.md). A custom plan sees the table's current size and probes the primary
-- key. Planning each statement at each call cost nothing measurable against the generic plans
-- (bench/RESULTS.md, "The enqueue's plans"). The other enqueue functions call this one.
ALTER FUNCTION __SCHEMA__.enqueue_messages(text, bytea, text, text, text, jsonb, text[], boolean)
  SET plan_cache_mode = force_custom_plan;
