#include "discovery.h"

#include <utility>

#include "outbox/core/error.h"

namespace outbox::outboxd {

Discovery::Discovery(const Config& config, std::unique_ptr<Catalog> catalog, TenantRelays& relays,
                     LogFn log)
    : config_(config), catalog_(std::move(catalog)), relays_(relays), log_(std::move(log)) {}

Discovery::~Discovery() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

void Discovery::Start() {
  {
    std::lock_guard lock(mutex_);
    for (const NamedDatabase& database : config_.databases) {
      served_[database.name] = database.settings;
    }
  }
  relays_.Serve(config_.databases);
  if (catalog_) thread_ = std::thread([this] { Loop(); });
}

void Discovery::Stop() {
  std::lock_guard lock(mutex_);
  stopping_ = true;
  wake_.notify_all();
}

std::shared_ptr<const StoreSettings> Discovery::Find(const std::string& name) const {
  std::lock_guard lock(mutex_);
  const auto found = served_.find(name);
  return found == served_.end() ? nullptr : found->second;
}

std::optional<std::string> Discovery::Problem() const {
  std::lock_guard lock(mutex_);
  return problem_;
}

void Discovery::Loop() {
  for (;;) {
    Refresh();
    std::unique_lock lock(mutex_);
    if (wake_.wait_for(lock, config_.discovery->interval, [this] { return stopping_; })) return;
  }
}

void Discovery::Refresh() {
  apps::CatalogDatabases read;
  try {
    read = apps::ReadCatalog(*catalog_, *config_.discovery, config_.databases);
  } catch (const std::exception& error) {
    const std::string why = std::string{"the catalog could not be read: "} + error.what();
    bool changed = false;
    {
      std::lock_guard lock(mutex_);
      changed = problem_ != why;
      problem_ = why;
    }
    // Logged when it changes: a catalog down for an hour is one line, not one per interval.
    if (changed) {
      Log(LogLevel::kWarn, "discovery: " + why + "; the databases served stay as they are");
    }
    return;
  }
  std::map<std::string, std::string> refused;
  for (auto& [name, why] : read.refused) {
    const auto before = refused_.find(name);
    if (before == refused_.end() || before->second != why) {
      Log(LogLevel::kWarn,
          "discovery: catalog row " + name.substr(0, 64) + " is not served: " + why);
    }
    refused.emplace(std::move(name), std::move(why));
  }
  refused_ = std::move(refused);
  {
    std::lock_guard lock(mutex_);
    if (problem_) Log(LogLevel::kInfo, "discovery: the catalog is read again");
    problem_.reset();
    served_.clear();
    for (const NamedDatabase& database : read.databases) served_[database.name] = database.settings;
  }
  relays_.Serve(read.databases);
}

}  // namespace outbox::outboxd
