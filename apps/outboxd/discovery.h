#pragma once
// outboxd's [discovery]: every interval, the catalog's query names the databases to serve; with
// [[databases]]' static list they are handed to the relays (TenantRelays::Serve), which start the
// new ones and drain the ones gone. A row a store type refuses (a bad name, url or schema) is
// left out and logged (once while it stays so); a catalog that cannot be read leaves the set as
// it was and is tried again at the next interval.

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "outbox/core/log.h"
#include "outbox/relay/tenant_relays.h"
#include "outbox/store/catalog.h"

namespace outbox::outboxd {

class Discovery {
 public:
  // `catalog` null: only [[databases]]' list, served once by Start.
  Discovery(const Config& config, std::unique_ptr<Catalog> catalog, TenantRelays& relays,
            LogFn log);
  ~Discovery();
  Discovery(const Discovery&) = delete;
  Discovery& operator=(const Discovery&) = delete;

  // Serves the static list at once, then reads the catalog on a thread of its own.
  void Start();
  void Stop();

  // The settings of the database served under `name`, or null.
  [[nodiscard]] std::shared_ptr<const StoreSettings> Find(const std::string& name) const;
  // What went wrong with the last read of the catalog; nullopt when it worked.
  [[nodiscard]] std::optional<std::string> Problem() const;

 private:
  void Loop();
  // Reads the catalog and serves what it names with the static list.
  void Refresh();
  void Log(LogLevel level, const std::string& message) const {
    if (log_) log_(level, message);
  }

  const Config& config_;
  std::unique_ptr<Catalog> catalog_;
  TenantRelays& relays_;
  LogFn log_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;                                               // guarded by mutex_
  std::map<std::string, std::shared_ptr<const StoreSettings>> served_;  // guarded by mutex_
  std::optional<std::string> problem_;                                  // guarded by mutex_
  std::map<std::string, std::string> refused_;  // row name -> why; the discovery thread's
  std::thread thread_;
};

}  // namespace outbox::outboxd
