#pragma once
// The writers of the end-to-end tests: transactions that each enqueue one message, on several
// connections at once, some rolled back, with the ids recorded either way, so that a test can
// check what reached the broker against what was committed (0 lost, 0 phantom).

#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/pg_test_support.h"

namespace outbox::testing {

struct Written {
  std::set<std::string> committed;
  std::set<std::string> rolled_back;
  std::set<std::string> committed_keys;  // the stream keys of the committed messages
};

// `total` transactions by `writers` threads, each enqueueing one message of `topic` (payload
// {"n":N}) on one of `streams` streams ("stream-<k>"), through `schema`.enqueue; every fifth is
// rolled back.
inline Written WriteConcurrently(const std::string& schema, const std::string& topic, int total,
                                 int writers, int streams) {
  Written written;
  std::mutex mutex;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(writers));
  for (int writer = 0; writer < writers; ++writer) {
    threads.emplace_back([&, writer] {
      const PgConn conn = Connect();
      std::minstd_rand pick(static_cast<unsigned>(writer) + 1);
      Written mine;
      for (int n = writer; n < total; n += writers) {
        const bool roll_back = n % 5 == 4;
        const std::string stream =
            "stream-" + std::to_string(pick() % static_cast<unsigned>(streams));
        Sql(conn.get(), "BEGIN");
        const std::string id = Scalar(conn.get(), "SELECT " + schema + ".enqueue('" + topic +
                                                      "', '{\"n\":" + std::to_string(n) +
                                                      "}'::jsonb, stream_key => '" + stream + "')");
        Sql(conn.get(), roll_back ? "ROLLBACK" : "COMMIT");
        (roll_back ? mine.rolled_back : mine.committed).insert(id);
        if (!roll_back) mine.committed_keys.insert(stream);
      }
      const std::lock_guard lock(mutex);
      written.committed.merge(mine.committed);
      written.rolled_back.merge(mine.rolled_back);
      written.committed_keys.merge(mine.committed_keys);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return written;
}

}  // namespace outbox::testing
