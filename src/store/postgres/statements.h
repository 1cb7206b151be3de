#pragma once
// Every statement the relay-side store runs, in one place, so that benchmarks and EXPLAIN tests
// look at exactly the SQL the store sends.

#include <string>

namespace outbox::postgres {

struct Statements {
  // $1 limit, $2 partitions (integer[] or NULL), $3 owner, $4 lease milliseconds, $5 the
  // partitions' epochs, $6 the cursor (uuid): the claimed rows, then where the cursor may go,
  // then each row's stream_prev_seq.
  std::string claim;
  // Fenced statements over $1 owner, $2 ids (uuid[]), $3 epochs (bigint[]); RETURNING the ids.
  std::string complete;  // DELETE, or mark published when published retention > 0
  std::string renew;     // $4 lease milliseconds
  std::string release;
  std::string fail;               // $4 abandon[], $5 spend[], $6 delay_ms[], $7 error[]
  std::string reclaim_expired;    // $1 ids in flight, $2 partitions or NULL, $3 owner, $4 epochs
  std::string purge;              // $1 published seconds, $2 abandoned seconds, $3 max rows
  std::string purge_stream_seqs;  // no parameters
  std::string stats;              // $1 exact count limit

  Statements(const std::string& schema, bool keep_published);
};

// The expression giving a message's stream_prev_seq (statements.cpp, kPrevSeq): NULL unless the
// message just before it in its stream is abandoned, else the seq below that run of abandoned
// messages. It reads the message as `c` (columns target, stream_key, stream_seq) from `table`
// (the quoted messages table). The claim and the WAL ledger's stream states both use it.
std::string PrevSeqSql(const std::string& table);

}  // namespace outbox::postgres
