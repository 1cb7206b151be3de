#include "wal_files.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <stdexcept>
#include <utility>

namespace outbox::postgres {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::uint64_t Number(std::string_view text, std::string_view what) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || text.empty()) {
    throw std::invalid_argument(std::string{what} + " is not a number: '" + std::string{text} +
                                "'");
  }
  return value;
}

}  // namespace

std::optional<std::string> MessagePayload(std::string_view description, std::string_view prefix) {
  const std::string head = "transactional, prefix \"" + std::string{prefix} + "\"; payload (";
  if (!description.starts_with(head)) return std::nullopt;
  std::string_view rest = description.substr(head.size());
  const auto bytes_end = rest.find(" bytes)");
  if (bytes_end == std::string_view::npos) {
    throw std::invalid_argument("a logical message's description has no payload length");
  }
  const std::uint64_t size = Number(rest.substr(0, bytes_end), "the payload length");
  rest.remove_prefix(bytes_end + 7);
  // ": " then the bytes as "HH", one space between them.
  if (!rest.starts_with(": ")) throw std::invalid_argument("no ': ' after the payload length");
  rest.remove_prefix(2);
  std::string payload;
  payload.reserve(size);
  while (!rest.empty()) {
    if (!payload.empty()) {
      if (rest[0] != ' ') throw std::invalid_argument("payload bytes not separated by a space");
      rest.remove_prefix(1);
    }
    if (rest.size() < 2) throw std::invalid_argument("a payload byte is cut");
    const int high = HexDigit(rest[0]);
    const int low = HexDigit(rest[1]);
    if (high < 0 || low < 0) throw std::invalid_argument("a payload byte is not hexadecimal");
    payload.push_back(static_cast<char>(high * 16 + low));
    rest.remove_prefix(2);
  }
  if (payload.size() != size) {
    throw std::invalid_argument("the payload has " + std::to_string(payload.size()) +
                                " bytes, its description says " + std::to_string(size));
  }
  return payload;
}

std::vector<std::uint64_t> Subxacts(std::string_view description) {
  std::vector<std::uint64_t> ids;
  const auto at = description.find("subxacts:");
  if (at == std::string_view::npos) return ids;
  std::string_view rest = description.substr(at + 9);
  rest = rest.substr(0, rest.find(';'));
  while (!rest.empty()) {
    while (rest.starts_with(' ')) rest.remove_prefix(1);
    if (rest.empty()) break;
    const auto end = rest.find(' ');
    ids.push_back(Number(rest.substr(0, end), "a subtransaction id"));
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end);
  }
  return ids;
}

WalFileCommits CommitsAfter(const std::vector<WalFileRecord>& records, std::string_view prefix,
                            Lsn after) {
  // The records of each (sub)transaction, in WAL order, until its end is read.
  std::map<std::uint64_t, std::vector<std::pair<Lsn, std::string>>> open;
  WalFileCommits result;
  for (const WalFileRecord& record : records) {
    if (record.resource_manager == "LogicalMessage") {
      if (auto payload = MessagePayload(record.description, prefix)) {
        open[record.xid].emplace_back(record.start, std::move(*payload));
      }
      continue;
    }
    if (record.resource_manager != "Transaction") continue;
    const bool commit = record.record_type == "COMMIT" || record.record_type == "COMMIT_PREPARED";
    const bool abort = record.record_type == "ABORT" || record.record_type == "ABORT_PREPARED";
    if (!commit && !abort) continue;
    std::vector<std::uint64_t> xids = Subxacts(record.description);
    xids.push_back(record.xid);
    std::vector<std::pair<Lsn, std::string>> contents;
    for (const std::uint64_t xid : xids) {
      const auto found = open.find(xid);
      if (found == open.end()) continue;
      for (auto& content : found->second) contents.push_back(std::move(content));
      open.erase(found);
    }
    if (!commit || contents.empty() || record.end <= after) continue;
    std::sort(contents.begin(), contents.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    WalFileCommit done{.end_lsn = record.end, .contents = {}};
    for (auto& [lsn, content] : contents) done.contents.push_back(std::move(content));
    result.commits.push_back(std::move(done));
  }
  for (const auto& [xid, contents] : open) result.open_records += contents.size();
  return result;
}

}  // namespace outbox::postgres
