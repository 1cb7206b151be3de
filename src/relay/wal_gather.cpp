#include "wal_gather.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace outbox::relay {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// While a batch publishes, how long one read ahead waits before it looks whether the publish is
// done.
constexpr milliseconds kReadAheadWait{1};

}  // namespace

WalGatherer::WalGatherer(WalSource& source, int batch_size, milliseconds linger)
    : source_(source), batch_size_(batch_size), linger_(linger, batch_size) {}

// The slot's next transaction, counted for the linger's arrival rate.
std::optional<WalTransaction> WalGatherer::Read(milliseconds timeout) {
  auto transaction = source_.Next(timeout);
  if (transaction) linger_.Observe(SteadyClock::now(), transaction->messages.size());
  return transaction;
}

// One transaction: what was read ahead first, then the slot. `read_at`: when it was read.
std::optional<WalTransaction> WalGatherer::NextTransaction(milliseconds timeout,
                                                           SteadyClock::time_point& read_at) {
  if (read_ahead_.empty()) {
    auto transaction = Read(timeout);
    read_at = SteadyClock::now();
    return transaction;
  }
  WalTransaction transaction = std::move(read_ahead_.front().transaction);
  read_at = read_ahead_.front().read_at;
  read_ahead_.pop_front();
  return transaction;
}

// Whole transactions, until batch_size messages or the linger after the first was read. As the
// table relay's linger: only as long as the arrival rate makes worth it (adaptive_linger.h); a
// lone transaction at a low rate goes at once with whatever is already read. The linger counts
// from when the first was read, not from now: one read ahead while the last batch published has
// waited that long already (counting from now added the publish time to every such message's
// wait: issue #49's WAL p99).
std::vector<WalTransaction> WalGatherer::Gather(milliseconds first_wait) {
  std::vector<WalTransaction> batch;
  SteadyClock::time_point first_read_at;
  auto first = NextTransaction(first_wait, first_read_at);
  if (!first) return batch;
  std::size_t messages = first->messages.size();
  batch.push_back(std::move(*first));
  const auto now = SteadyClock::now();
  const auto until = first_read_at + linger_.Wait(now);
  while (messages < static_cast<std::size_t>(batch_size_)) {
    const auto left = std::chrono::duration_cast<milliseconds>(until - SteadyClock::now());
    SteadyClock::time_point read_at;
    auto next = NextTransaction(std::max(left, milliseconds{0}), read_at);
    if (!next) break;
    messages += next->messages.size();
    batch.push_back(std::move(*next));
  }
  return batch;
}

// While `publishing` publishes: the next batch, if a whole one arrives meanwhile (a backlog).
// Otherwise what was read stays for Gather, which lingers as usual: the pipeline is for a
// backlog, and a steady trickle keeps its few statements per message.
std::vector<WalTransaction> WalGatherer::ReadAhead(
    const std::future<std::vector<PublishOutcome>>& publishing) {
  std::size_t messages = 0;
  for (const ReadTransaction& read : read_ahead_) messages += read.transaction.messages.size();
  const auto wanted = static_cast<std::size_t>(batch_size_);
  while (messages < wanted) {
    const bool published = publishing.wait_for(milliseconds{0}) == std::future_status::ready;
    auto next = Read(published ? milliseconds{0} : kReadAheadWait);
    if (!next) {
      if (published) break;
      continue;
    }
    messages += next->messages.size();
    read_ahead_.push_back({SteadyClock::now(), std::move(*next)});
  }
  if (messages < wanted) return {};
  std::vector<WalTransaction> batch;
  batch.reserve(read_ahead_.size());
  for (ReadTransaction& read : read_ahead_) batch.push_back(std::move(read.transaction));
  read_ahead_.clear();
  return batch;
}

}  // namespace outbox::relay
