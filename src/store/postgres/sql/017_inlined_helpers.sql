-- outbox schema, version 17: the enqueue's SQL helpers are inlined (issue #48). __SCHEMA__ is
-- replaced by the quoted schema name.
--
-- partition_of (every enqueue) and wal_text (six calls per WAL-mode enqueue) were declared
-- IMMUTABLE while their bodies call convert_to, which is STABLE. PostgreSQL inlines a SQL
-- function into the expression that calls it only when the body is no more volatile than the
-- declaration says, so neither was inlined: each call ran as a SQL function of its own, whose
-- parsed and planned body is kept only until the calling transaction ends. A transaction that
-- enqueues one message therefore parsed and planned all of them again: 115 us of a WAL-mode
-- enqueue's server time and 80 us of a table-mode one, against 50 us and 59 us inlined
-- (pg_stat_statements, track = all, one writer; bench/RESULTS.md). STABLE says what the bodies
-- are; no index, constraint or default depends on either function.
ALTER FUNCTION __SCHEMA__.partition_of(text, integer) STABLE;
ALTER FUNCTION __SCHEMA__.wal_text(text) STABLE;
