#include "wal_numbers.h"

#include <algorithm>
#include <map>
#include <utility>

namespace outbox::relay {

void WalStreamNumbers::Forget() {
  seqs_.clear();
  floors_.clear();
}

void WalStreamNumbers::Assign(std::vector<Item>& items, WalCommit& commit,
                              const std::vector<std::size_t>& switches, WalLedger& ledger) {
  const std::size_t first_switch = switches.empty() ? items.size() : switches.front();
  std::vector<WalStream> unread;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    if (!item.sequenced || !item.envelope.stream_key) continue;
    WalStream stream{item.envelope.target, *item.envelope.stream_key};
    if ((i >= first_switch || !seqs_.contains(stream)) &&
        std::find(unread.begin(), unread.end(), stream) == unread.end()) {
      unread.push_back(std::move(stream));
    }
  }
  std::map<WalStream, std::int64_t> read;
  if (!unread.empty()) {
    const auto latest = ledger.Seqs(unread);
    for (std::size_t i = 0; i < unread.size(); ++i) read[unread[i]] = latest[i];
  }
  const auto forget = [this] {
    for (const auto& [stream, seq] : seqs_) {
      auto& floor = floors_[stream];
      floor = std::max(floor, seq);
    }
    seqs_.clear();
  };
  auto next_switch = switches.begin();
  std::map<WalStream, std::int64_t> changed;
  for (std::size_t i = 0; i < items.size(); ++i) {
    for (; next_switch != switches.end() && *next_switch <= i; ++next_switch) forget();
    Item& item = items[i];
    if (!item.sequenced || !item.envelope.stream_key) continue;
    WalStream stream{item.envelope.target, *item.envelope.stream_key};
    auto cached = seqs_.find(stream);
    if (cached == seqs_.end()) {
      std::int64_t latest = read.at(stream);
      if (const auto floor = floors_.find(stream); floor != floors_.end()) {
        latest = std::max(latest, floor->second);
        floors_.erase(floor);
      }
      cached = seqs_.emplace(stream, latest).first;
    }
    const std::int64_t seq = ++cached->second;
    item.envelope.stream_seq = seq;
    changed[stream] = seq;
  }
  if (next_switch != switches.end()) forget();  // a switch after the batch's last message
  commit.seqs.assign(changed.begin(), changed.end());
}

}  // namespace outbox::relay
