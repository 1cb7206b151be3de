#include "sink_contract.h"

#include <algorithm>
#include <deque>
#include <initializer_list>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "outbox/inbox/headers.h"

namespace outbox::testing {

ArrivedMessage ArrivedThroughInbox(
    const std::function<std::optional<std::string>(const std::string& name)>& header,
    std::string_view id_name, std::string payload) {
  std::deque<std::string> values;  // what the views handed to FromHeaders point into
  std::string error;
  const auto delivery = inbox::FromHeaders(
      [&](std::string_view name) -> std::optional<std::string_view> {
        auto value = header(std::string{name});
        if (!value) return std::nullopt;
        return values.emplace_back(std::move(*value));
      },
      id_name, &error);
  ArrivedMessage message{.payload = std::move(payload)};
  if (!delivery) {
    ADD_FAILURE() << "the inbox cannot read a message the sink sent: " << error;
    return message;
  }
  EXPECT_EQ(delivery->malformed, "") << delivery->id.ToString();
  message.id = delivery->id.ToString();
  message.stream_key = delivery->stream_key;
  message.stream_seq = delivery->stream_seq;
  return message;
}

void SinkTestBed::ServerDown() { throw std::logic_error("this test bed cannot stop its server"); }
void SinkTestBed::ServerUp() { throw std::logic_error("this test bed cannot stop its server"); }
std::string SinkTestBed::UnknownTopic() {
  throw std::logic_error("this test bed has no unknown destination");
}
std::size_t SinkTestBed::TooLargePayloadBytes() {
  throw std::logic_error("this test bed has no size limit");
}
void SinkTestBed::HoldReplies() { throw std::logic_error("this test bed cannot hold replies"); }
void SinkTestBed::ReleaseReplies() { throw std::logic_error("this test bed cannot hold replies"); }
void SinkTestBed::Freeze() { throw std::logic_error("this test bed cannot freeze connections"); }
void SinkTestBed::Thaw() { throw std::logic_error("this test bed cannot freeze connections"); }
std::chrono::milliseconds SinkTestBed::SilentConnectionBound() {
  throw std::logic_error("this test bed cannot freeze connections");
}

namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// Generous bounds for a loaded machine; a passing run takes a fraction of them.
constexpr milliseconds kPublishLimit{30000};
constexpr milliseconds kReadLimit{15000};
// How long after its deadline a Publish may return (scheduling, a connection being closed).
constexpr milliseconds kDeadlineMargin{1000};
// A deadline that a silent server makes Publish reach.
constexpr milliseconds kShortDeadline{500};
// Each Publish's deadline while a sink finds its way around a frozen connection.
constexpr milliseconds kRetryDeadline{1000};
// How long Close() or destruction may take with the sink's connection frozen.
constexpr milliseconds kFrozenCloseLimit{5000};

constexpr std::string_view kBinary = "application/octet-stream";

// Skips the test, naming why, when the sink cannot produce `fault`.
#define OUTBOX_REQUIRE_FAULT(fault)                           \
  do {                                                        \
    if (const auto outbox_lacks = GetParam()->Lacks(fault)) { \
      GTEST_SKIP() << *outbox_lacks;                          \
    }                                                         \
  } while (false)

Deadline In(milliseconds duration) { return SteadyClock::now() + duration; }

milliseconds Since(SteadyClock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start);
}

Envelope Make(const std::string& topic, std::string payload,
              std::string_view content_type = kJsonContentType) {
  return Envelope{.id = NewUuidV7(),
                  .topic = topic,
                  .payload = std::move(payload),
                  .content_type = std::string{content_type},
                  .created_at = std::chrono::system_clock::now()};
}

// `count` messages, payloads {"n":0}, {"n":1}, ..., over `streams` streams interleaved
// irregularly (each stream numbered 1, 2, ...), or without a stream when `streams` is 0.
std::vector<Envelope> MakeStreams(const std::string& topic, std::size_t count,
                                  std::size_t streams) {
  std::mt19937 random{16};
  std::uniform_int_distribution<std::size_t> pick(0, streams == 0 ? 0 : streams - 1);
  std::vector<std::int64_t> next_seq(streams, 1);
  std::vector<Envelope> batch;
  batch.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    batch.push_back(Make(topic, R"({"n":)" + std::to_string(i) + "}"));
    if (streams == 0) continue;
    const std::size_t stream = pick(random);
    batch.back().stream_key = "stream-" + std::to_string(stream);
    batch.back().stream_seq = next_seq[stream]++;
    batch.back().partition = static_cast<int>(stream);
  }
  return batch;
}

std::vector<Envelope> MakeBatch(const std::string& topic, std::size_t count) {
  return MakeStreams(topic, count, 0);
}

std::string Describe(const PublishOutcome& outcome) {
  return outcome.published() ? "published" : outcome.failure->Describe();
}

std::vector<std::string> Ids(std::span<const Envelope> batch) {
  std::vector<std::string> ids;
  ids.reserve(batch.size());
  for (const Envelope& envelope : batch) ids.push_back(envelope.id.ToString());
  return ids;
}

std::vector<std::string> Ids(const std::vector<ArrivedMessage>& arrived) {
  std::vector<std::string> ids;
  ids.reserve(arrived.size());
  for (const ArrivedMessage& message : arrived) ids.push_back(message.id);
  return ids;
}

std::vector<std::string> Concat(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> all;
  for (const auto& part : parts) all.insert(all.end(), part.begin(), part.end());
  return all;
}

std::map<std::string, int> CountById(const std::vector<ArrivedMessage>& arrived) {
  std::map<std::string, int> counts;
  for (const ArrivedMessage& message : arrived) ++counts[message.id];
  return counts;
}

// Each of `ids` arrived once, or twice when it was published again after an unknown outcome
// (the inbox removes the duplicate).
void ExpectArrivedOnceOrTwice(const std::map<std::string, int>& counts,
                              const std::vector<std::string>& ids) {
  for (const auto& id : ids) {
    const int count = counts.contains(id) ? counts.at(id) : 0;
    EXPECT_TRUE(count == 1 || count == 2) << id << " arrived " << count << " times";
  }
}

// Exactly one outcome per message, in batch order.
void ExpectOneOutcomeEachInBatchOrder(const std::vector<PublishOutcome>& outcomes,
                                      std::span<const Envelope> batch) {
  ASSERT_EQ(outcomes.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(outcomes[i].id, batch[i].id) << "outcome " << i << " is not in batch order";
  }
}

void ExpectAllPublished(const std::vector<PublishOutcome>& outcomes,
                        std::span<const Envelope> batch) {
  ExpectOneOutcomeEachInBatchOrder(outcomes, batch);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_TRUE(outcomes[i].published()) << "message " << i << ": " << Describe(outcomes[i]);
  }
}

void ExpectAllFailedWith(const std::vector<PublishOutcome>& outcomes,
                         std::span<const Envelope> batch, std::set<FailureKind> kinds) {
  ExpectOneOutcomeEachInBatchOrder(outcomes, batch);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    ASSERT_FALSE(outcomes[i].published()) << "message " << i << " published";
    EXPECT_TRUE(kinds.contains(outcomes[i].failure->kind))
        << "message " << i << ": " << outcomes[i].failure->Describe();
    EXPECT_FALSE(outcomes[i].failure->reason.empty()) << "message " << i << ": no reason";
  }
}

// The messages of `batch` at the indexes of `failures` failed with the kind given there, with a
// reason; every other one was published. Returns the ids of the published ones, in batch order.
std::vector<std::string> ExpectFailuresAtOthersPublished(
    const std::vector<PublishOutcome>& outcomes, std::span<const Envelope> batch,
    const std::map<std::size_t, FailureKind>& failures) {
  ExpectOneOutcomeEachInBatchOrder(outcomes, batch);
  std::vector<std::string> published;
  for (std::size_t i = 0; i < outcomes.size() && i < batch.size(); ++i) {
    if (const auto it = failures.find(i); it != failures.end()) {
      if (outcomes[i].published()) {
        ADD_FAILURE() << "message " << i << " published, expected " << NameOf(it->second);
        continue;
      }
      EXPECT_EQ(outcomes[i].failure->kind, it->second) << i << ": " << Describe(outcomes[i]);
      EXPECT_NE(outcomes[i].failure->reason, "") << "message " << i << ": no reason";
    } else {
      EXPECT_TRUE(outcomes[i].published()) << i << ": " << Describe(outcomes[i]);
      published.push_back(batch[i].id.ToString());
    }
  }
  return published;
}

// Publishes what has not been published yet, as a relay retries, until all of it is or `limit`
// has passed (a sink may back off between connection attempts). The last outcome of each.
// `sends`, when given, counts the Publish calls each message was given to.
std::vector<PublishOutcome> PublishUntilAllPublished(Sink& sink, std::span<const Envelope> batch,
                                                     milliseconds limit = kReadLimit,
                                                     milliseconds per_call = milliseconds{5000},
                                                     std::vector<int>* sends = nullptr) {
  if (sends != nullptr) sends->assign(batch.size(), 0);
  std::vector<PublishOutcome> outcomes(batch.size());
  std::vector<std::size_t> todo(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) todo[i] = i;
  const auto until = SteadyClock::now() + limit;
  for (;;) {
    std::vector<Envelope> retry;
    retry.reserve(todo.size());
    for (const std::size_t i : todo) {
      retry.push_back(batch[i]);
      if (sends != nullptr) ++(*sends)[i];
    }
    const auto got = sink.Publish(retry, In(per_call));
    if (got.size() != retry.size()) throw std::runtime_error("wrong number of outcomes");
    std::vector<std::size_t> failed;
    for (std::size_t k = 0; k < todo.size(); ++k) {
      outcomes[todo[k]] = got[k];
      if (!got[k].published()) failed.push_back(todo[k]);
    }
    todo = std::move(failed);
    if (todo.empty() || SteadyClock::now() >= until) return outcomes;
    std::this_thread::sleep_for(milliseconds{50});
  }
}

// A sink that is connected: it has published `warmup` (count messages without a stream).
struct WarmSink {
  std::unique_ptr<Sink> sink;
  std::vector<Envelope> warmup;
};

WarmSink OpenWarm(SinkTestBed& bed, std::size_t count = 1) {
  WarmSink warm{.sink = bed.OpenSink(), .warmup = MakeBatch(bed.Topic(), count)};
  ExpectAllPublished(warm.sink->Publish(warm.warmup, In(milliseconds{5000})), warm.warmup);
  return warm;
}

// Publish with a deadline `timeout` from now, which it must keep (within kDeadlineMargin).
std::vector<PublishOutcome> PublishWithin(Sink& sink, std::span<const Envelope> batch,
                                          milliseconds timeout) {
  const auto started = SteadyClock::now();
  auto outcomes = sink.Publish(batch, In(timeout));
  EXPECT_LT(Since(started), timeout + kDeadlineMargin) << "Publish overran its deadline";
  return outcomes;
}

// Every message of `batch` arrived exactly once, with its stream key, sequence and payload, and
// each stream's messages arrived in their sequence order.
void ExpectStreamsArrivedInOrder(const std::vector<ArrivedMessage>& arrived,
                                 std::span<const Envelope> batch) {
  std::map<std::string, const Envelope*> sent;
  for (const Envelope& envelope : batch) sent.emplace(envelope.id.ToString(), &envelope);
  EXPECT_EQ(arrived.size(), batch.size());
  std::set<std::string> seen;
  std::map<std::string, std::int64_t> last_seq;
  std::size_t out_of_order = 0;
  for (const ArrivedMessage& message : arrived) {
    const auto it = sent.find(message.id);
    if (it == sent.end()) {
      ADD_FAILURE() << "arrived but never sent: " << message.id;
      continue;
    }
    if (!seen.insert(message.id).second) {
      ADD_FAILURE() << "arrived twice: " << message.id;
      continue;
    }
    const Envelope& envelope = *it->second;
    EXPECT_EQ(message.stream_key, envelope.stream_key) << message.id;
    EXPECT_EQ(message.stream_seq, envelope.stream_seq) << message.id;
    EXPECT_EQ(message.payload, envelope.payload) << message.id;
    if (!envelope.stream_key || !envelope.stream_seq) continue;
    std::int64_t& last = last_seq[*envelope.stream_key];
    if (*envelope.stream_seq != last + 1 && ++out_of_order <= 10) {
      ADD_FAILURE() << "stream " << *envelope.stream_key << ": seq " << *envelope.stream_seq
                    << " arrived after seq " << last;
    }
    last = *envelope.stream_seq;
  }
  EXPECT_EQ(out_of_order, 0U) << "messages out of their stream's order";
}

TEST_P(SinkContractTest, EmptyBatchIsANoOp) {
  auto sink = bed_->OpenSink();
  EXPECT_TRUE(sink->Publish({}, In(milliseconds{5000})).empty());
  EXPECT_TRUE(bed_->ReadBack(0, kReadLimit).empty());
}

TEST_P(SinkContractTest, PublishedMessagesArriveByteForByte) {
  const std::string topic = bed_->Topic();
  std::string every_byte;
  for (int round = 0; round < 4; ++round) {
    for (int byte = 0; byte < 256; ++byte) every_byte.push_back(static_cast<char>(byte));
  }
  std::vector<Envelope> batch{
      Make(topic, R"({"order":42})"),
      Make(topic, "h\xc3\xa9llo \"w\xc3\xb6rld\"\n\t\\ \xe2\x82\xac", "text/plain; charset=utf-8"),
      Make(topic, std::string("\x00\x01\xff\xfe\x80 not utf-8 \x00", 17), kBinary),
      Make(topic, "", kBinary),
      Make(topic, every_byte, kBinary),
      Make(topic, "\xc3\x28 broken \xed\xa0\x80 surrogate \xf8\x88\x80\x80\x80", "text/plain"),
  };
  batch[0].stream_key = "order-42";
  batch[0].stream_seq = 1;
  batch[4].stream_key = "order-42";
  batch[4].stream_seq = 2;
  auto sink = bed_->OpenSink();
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{10000})), batch);

  const auto arrived = bed_->ReadBack(batch.size(), kReadLimit);
  ASSERT_EQ(arrived.size(), batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(arrived[i].id, batch[i].id.ToString()) << i;
    EXPECT_EQ(arrived[i].stream_key, batch[i].stream_key) << i;
    EXPECT_EQ(arrived[i].stream_seq, batch[i].stream_seq) << i;
    EXPECT_EQ(arrived[i].payload, batch[i].payload) << i << ": payload bytes differ";
  }
}

// Identical payloads: only the id tells the messages apart, and each arrives with its own.
TEST_P(SinkContractTest, MessageIdReachesTheConsumer) {
  std::vector<Envelope> batch;
  for (int i = 0; i < 100; ++i) batch.push_back(Make(bed_->Topic(), R"({"same":1})"));
  auto sink = bed_->OpenSink();
  ExpectAllPublished(sink->Publish(batch, In(milliseconds{10000})), batch);
  const auto arrived = bed_->ReadBack(batch.size(), kReadLimit);
  EXPECT_EQ(Ids(arrived), Ids(batch));
}

TEST_P(SinkContractTest, StreamOrderHoldsWithManyMessagesInFlightInOneBatch) {
  const auto batch = MakeStreams(bed_->Topic(), 2000, 20);
  auto sink = bed_->OpenSink();
  const auto started = SteadyClock::now();
  ExpectAllPublished(sink->Publish(batch, In(kPublishLimit)), batch);
  RecordProperty("publish_ms", std::to_string(Since(started).count()));
  ExpectStreamsArrivedInOrder(bed_->ReadBack(batch.size(), kReadLimit), batch);
}

TEST_P(SinkContractTest, StreamOrderHoldsOverSeveralBatches) {
  const auto all = MakeStreams(bed_->Topic(), 2000, 20);
  auto sink = bed_->OpenSink();
  const std::span<const Envelope> span{all};
  for (std::size_t first = 0; first < all.size(); first += 200) {
    const auto batch = span.subspan(first, 200);
    ExpectAllPublished(sink->Publish(batch, In(kPublishLimit)), batch);
  }
  ExpectStreamsArrivedInOrder(bed_->ReadBack(all.size(), kReadLimit), all);
}

// Outcomes of a batch mixing every per-message failure the sink can produce: one each, in batch
// order, and exactly the published ones arrive, in batch order.
TEST_P(SinkContractTest, ExactlyOneOutcomePerMessageInBatchOrder) {
  std::vector<Envelope> batch = MakeStreams(bed_->Topic(), 30, 3);
  std::map<std::size_t, FailureKind> expected;
  if (!GetParam()->Lacks(SinkFault::kTooLarge)) {
    for (const std::size_t i : {5U, 17U}) {
      batch[i].payload.assign(bed_->TooLargePayloadBytes(), 'x');
      batch[i].content_type = kBinary;
      expected[i] = FailureKind::kPermanent;
    }
  }
  if (!GetParam()->Lacks(SinkFault::kUnknownDestination)) {
    for (const std::size_t i : {11U, 23U}) {
      batch[i].topic = bed_->UnknownTopic();
      expected[i] = FailureKind::kRejected;
    }
  }
  if (GetParam()->HoldsStreamAfterFailure()) {
    // After a message that is tried again, the rest of its stream waits for it.
    std::set<std::string> held;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const std::string& stream = batch[i].stream_key.value();
      const auto failed = expected.find(i);
      if (failed == expected.end() && held.contains(stream)) {
        expected[i] = FailureKind::kOutcomeUnknown;
      } else if (failed != expected.end() && failed->second != FailureKind::kPermanent) {
        held.insert(stream);
      }
    }
  }
  auto sink = bed_->OpenSink();
  const auto published = ExpectFailuresAtOthersPublished(
      sink->Publish(batch, In(milliseconds{10000})), batch, expected);
  EXPECT_EQ(Ids(bed_->ReadBack(published.size(), kReadLimit)), published);
}

TEST_P(SinkContractTest, CloseThenPublishAgain) {
  const auto first = MakeBatch(bed_->Topic(), 3);
  const auto second = MakeBatch(bed_->Topic(), 3);
  auto sink = bed_->OpenSink();
  ExpectAllPublished(sink->Publish(first, In(milliseconds{5000})), first);
  sink->Close();
  sink->Close();  // twice is harmless
  ExpectAllPublished(sink->Publish(second, In(milliseconds{5000})), second);
  sink->Close();
  EXPECT_EQ(Ids(bed_->ReadBack(6, kReadLimit)), Concat({Ids(first), Ids(second)}));
}

// Server down: every message kUnavailable (no attempt spent), nothing partial arrives, whether
// the sink was connected or had never connected.
TEST_P(SinkContractTest, ServerDownIsUnavailableForTheWholeBatchAndNothingArrives) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kServerDown);
  auto [sink, warmup] = OpenWarm(*bed_, 3);

  bed_->ServerDown();
  const auto batch = MakeStreams(bed_->Topic(), 50, 5);
  auto outcomes = PublishWithin(*sink, batch, milliseconds{3000});
  ExpectAllFailedWith(outcomes, batch, {FailureKind::kUnavailable});
  for (const auto& outcome : outcomes) {
    if (!outcome.published()) {
      EXPECT_FALSE(outcome.failure->treatment().spends_attempt);
    }
  }

  auto fresh = bed_->OpenSink();
  outcomes = PublishWithin(*fresh, batch, milliseconds{3000});
  ExpectAllFailedWith(outcomes, batch, {FailureKind::kUnavailable});

  EXPECT_EQ(Ids(bed_->ReadBack(0, kReadLimit)), Ids(warmup)) << "something partial arrived";
  bed_->ServerUp();
}

// The server comes back: the same sink reconnects on its own, and what was unavailable is
// published exactly once when published again.
TEST_P(SinkContractTest, ReconnectsWhenTheServerComesBack) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kServerDown);
  auto [sink, warmup] = OpenWarm(*bed_, 3);

  bed_->ServerDown();
  const auto batch = MakeStreams(bed_->Topic(), 50, 5);
  ExpectAllFailedWith(sink->Publish(batch, In(milliseconds{3000})), batch,
                      {FailureKind::kUnavailable});
  bed_->ServerUp();
  const auto started = SteadyClock::now();
  ExpectAllPublished(PublishUntilAllPublished(*sink, batch), batch);
  RecordProperty("reconnect_ms", std::to_string(Since(started).count()));
  const auto after = MakeBatch(bed_->Topic(), 3);
  ExpectAllPublished(sink->Publish(after, In(milliseconds{5000})), after);

  const auto expected = Concat({Ids(warmup), Ids(batch), Ids(after)});
  EXPECT_EQ(Ids(bed_->ReadBack(expected.size(), kReadLimit)), expected);
}

TEST_P(SinkContractTest, UnknownDestinationIsRejectedForThatMessageOnly) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kUnknownDestination);
  std::vector<Envelope> batch = MakeBatch(bed_->Topic(), 6);
  batch[2].topic = bed_->UnknownTopic();
  batch[4].topic = batch[2].topic;
  auto sink = bed_->OpenSink();
  const auto published =
      ExpectFailuresAtOthersPublished(sink->Publish(batch, In(milliseconds{10000})), batch,
                                      {{2, FailureKind::kRejected}, {4, FailureKind::kRejected}});
  // The sink goes on publishing to the destinations that exist.
  const auto next = MakeBatch(bed_->Topic(), 3);
  ExpectAllPublished(sink->Publish(next, In(milliseconds{5000})), next);
  EXPECT_EQ(Ids(bed_->ReadBack(7, kReadLimit)), Concat({published, Ids(next)}));
}

TEST_P(SinkContractTest, TooLargeIsPermanentForThatMessageOnly) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kTooLarge);
  std::vector<Envelope> batch = MakeBatch(bed_->Topic(), 5);
  for (const std::size_t i : {1U, 3U}) {
    batch[i].payload.assign(bed_->TooLargePayloadBytes(), 'x');
    batch[i].content_type = kBinary;
  }
  auto sink = bed_->OpenSink();
  const auto outcomes = sink->Publish(batch, In(milliseconds{10000}));
  const auto published = ExpectFailuresAtOthersPublished(
      outcomes, batch, {{1, FailureKind::kPermanent}, {3, FailureKind::kPermanent}});
  ASSERT_EQ(outcomes.size(), batch.size());
  for (const std::size_t i : {1U, 3U}) {
    if (!outcomes[i].published()) {
      EXPECT_TRUE(outcomes[i].failure->treatment().abandon_now);
    }
  }
  EXPECT_EQ(Ids(bed_->ReadBack(published.size(), kReadLimit)), published);
}

// Sent, but the confirmations do not come back by the deadline: kOutcomeUnknown, by the
// deadline; once the server answers again, publishing the same messages again publishes them
// (the destination may hold them twice: the inbox removes the duplicate).
TEST_P(SinkContractTest, LostConfirmationIsOutcomeUnknownAndPublishedAgain) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kLostConfirmation);
  auto [sink, warmup] = OpenWarm(*bed_);

  bed_->HoldReplies();
  const auto batch = MakeStreams(bed_->Topic(), 20, 4);
  const auto outcomes = PublishWithin(*sink, batch, kShortDeadline);
  ExpectAllFailedWith(outcomes, batch, {FailureKind::kOutcomeUnknown});
  for (const auto& outcome : outcomes) {
    if (outcome.published()) continue;
    EXPECT_TRUE(outcome.failure->treatment().retry);
    EXPECT_FALSE(outcome.failure->treatment().spends_attempt);
  }

  bed_->ReleaseReplies();
  ExpectAllPublished(PublishUntilAllPublished(*sink, batch), batch);
  const auto next = MakeBatch(bed_->Topic(), 3);
  ExpectAllPublished(sink->Publish(next, In(milliseconds{5000})), next);

  const auto counts = CountById(bed_->ReadBack(1 + batch.size() + next.size(), kReadLimit));
  for (const auto& id : Concat({Ids(warmup), Ids(next)})) {
    EXPECT_EQ(counts.contains(id) ? counts.at(id) : 0, 1) << id;
  }
  ExpectArrivedOnceOrTwice(counts, Ids(batch));
}

// The connection breaks while confirmations are outstanding: Publish returns at once (not at its
// deadline) with kOutcomeUnknown for what was sent; the sink reconnects and publishes it again.
TEST_P(SinkContractTest, ConnectionCutWithConfirmationsOutstandingIsOutcomeUnknown) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kLostConfirmation);
  OUTBOX_REQUIRE_FAULT(SinkFault::kServerDown);
  WarmSink warm = OpenWarm(*bed_);  // no structured binding: a lambda below uses the sink
  std::unique_ptr<Sink>& sink = warm.sink;
  const std::vector<Envelope>& warmup = warm.warmup;

  bed_->HoldReplies();
  const auto batch = MakeBatch(bed_->Topic(), 5);
  std::vector<PublishOutcome> outcomes;
  std::thread publisher([&] { outcomes = sink->Publish(batch, In(milliseconds{20000})); });
  struct Join {
    std::thread& thread;
    ~Join() {
      if (thread.joinable()) thread.join();
    }
  } join{publisher};
  // Cut once the server has the messages (sent, unconfirmed).
  const auto arrived = bed_->ReadBack(1 + batch.size(), kReadLimit);
  const auto cut = SteadyClock::now();
  bed_->ServerDown();
  publisher.join();
  EXPECT_LT(Since(cut), milliseconds{5000}) << "Publish waited for its deadline";
  EXPECT_EQ(Ids(arrived), Concat({Ids(warmup), Ids(batch)}));
  ExpectAllFailedWith(outcomes, batch, {FailureKind::kOutcomeUnknown});

  bed_->ServerUp();
  bed_->ReleaseReplies();
  ExpectAllPublished(PublishUntilAllPublished(*sink, batch), batch);
  const auto counts = CountById(bed_->ReadBack(1 + batch.size(), kReadLimit));
  ExpectArrivedOnceOrTwice(counts, Ids(batch));
}

// A server that stops answering: Publish returns by its deadline, whether the sink was connected
// or connects now, and nothing is reported published.
TEST_P(SinkContractTest, PublishReturnsByTheDeadlineWhenTheServerIsSilent) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kLostConfirmation);
  auto sink = OpenWarm(*bed_).sink;  // connected before the server goes silent

  bed_->HoldReplies();
  const auto batch = MakeStreams(bed_->Topic(), 200, 10);
  auto outcomes = PublishWithin(*sink, batch, kShortDeadline);
  ExpectAllFailedWith(outcomes, batch, {FailureKind::kOutcomeUnknown, FailureKind::kUnavailable});

  auto fresh = bed_->OpenSink();  // its connection handshake gets no answer
  const auto other = MakeBatch(bed_->Topic(), 5);
  outcomes = PublishWithin(*fresh, other, kShortDeadline);
  ExpectAllFailedWith(outcomes, other, {FailureKind::kOutcomeUnknown, FailureKind::kUnavailable});

  bed_->ReleaseReplies();
  ExpectAllPublished(PublishUntilAllPublished(*fresh, other), other);
  ExpectAllPublished(PublishUntilAllPublished(*sink, batch), batch);
}

// Close() with publishes unconfirmed returns (bounded, no exception), and Publish after it
// reconnects and publishes them again.
TEST_P(SinkContractTest, CloseWithConfirmationsOutstandingThenPublishAgain) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kLostConfirmation);
  auto sink = OpenWarm(*bed_).sink;  // connected before the server goes silent

  bed_->HoldReplies();
  const auto batch = MakeBatch(bed_->Topic(), 20);
  ExpectAllFailedWith(sink->Publish(batch, In(kShortDeadline)), batch,
                      {FailureKind::kOutcomeUnknown});
  const auto started = SteadyClock::now();
  sink->Close();
  RecordProperty("close_ms", std::to_string(Since(started).count()));
  EXPECT_LT(Since(started), milliseconds{10000}) << "Close() with a silent server";

  bed_->ReleaseReplies();
  ExpectAllPublished(PublishUntilAllPublished(*sink, batch), batch);
  const auto counts = CountById(bed_->ReadBack(1 + batch.size(), kReadLimit));
  ExpectArrivedOnceOrTwice(counts, Ids(batch));
}

// With the connection frozen, a message is published (it arrived: checked by the caller) or has
// no verdict: kOutcomeUnknown (sent) or kUnavailable (not sent), with a reason. Returns the
// messages of `batch` not published, in batch order.
std::vector<Envelope> ExpectPublishedOrNoVerdict(const std::vector<PublishOutcome>& outcomes,
                                                 std::span<const Envelope> batch) {
  ExpectOneOutcomeEachInBatchOrder(outcomes, batch);
  std::vector<Envelope> rest;
  for (std::size_t i = 0; i < outcomes.size() && i < batch.size(); ++i) {
    if (outcomes[i].published()) continue;
    rest.push_back(batch[i]);
    const FailureKind kind = outcomes[i].failure->kind;
    EXPECT_TRUE(kind == FailureKind::kOutcomeUnknown || kind == FailureKind::kUnavailable)
        << "message " << i << ": " << outcomes[i].failure->Describe();
    EXPECT_FALSE(outcomes[i].failure->reason.empty()) << "message " << i << ": no reason";
  }
  return rest;
}

// The connection freezes in the middle of a batch (open, silent both ways, while new connections
// go through: a broker failed over behind a virtual IP, a dropped route, a frozen VM). Publish
// returns by its deadline and reports published only what arrived; then, with the connection
// still frozen, the sink gives it up within its documented bound and publishes everything over a
// new one, as a relay publishes again what had no verdict.
TEST_P(SinkContractTest, FrozenConnectionIsGivenUpWithinTheBound) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kFreeze);
  WarmSink warm = OpenWarm(*bed_);  // no structured binding: a lambda below uses the sink
  std::unique_ptr<Sink>& sink = warm.sink;
  const std::vector<Envelope>& warmup = warm.warmup;
  const milliseconds bound = bed_->SilentConnectionBound();

  constexpr milliseconds kBatchDeadline{2000};
  const auto batch = MakeStreams(bed_->Topic(), 2000, 10);
  std::vector<PublishOutcome> outcomes;
  SteadyClock::time_point returned_at;
  const auto started = SteadyClock::now();
  std::thread publisher([&] {
    outcomes = sink->Publish(batch, In(kBatchDeadline));
    returned_at = SteadyClock::now();
  });
  struct Join {
    std::thread& thread;
    ~Join() {
      if (thread.joinable()) thread.join();
    }
  } join{publisher};
  // Frozen while the batch goes out (or, on a fast sink, after it: the next Publish meets it).
  std::this_thread::sleep_for(milliseconds{20});
  const auto frozen_at = SteadyClock::now();
  bed_->Freeze();
  publisher.join();
  EXPECT_LT(returned_at - started, kBatchDeadline + kDeadlineMargin)
      << "Publish overran its deadline";
  std::vector<Envelope> rest = ExpectPublishedOrNoVerdict(outcomes, batch);
  RecordProperty("unpublished_at_freeze", std::to_string(rest.size()));
  const auto after = MakeStreams(bed_->Topic(), 20, 4);
  rest.insert(rest.end(), after.begin(), after.end());

  // Not thawed: a Publish that starts `bound` after the freeze goes over a new connection (the
  // first one after it may still wait for its deadline on the frozen one).
  std::vector<int> sends;
  ExpectAllPublished(PublishUntilAllPublished(*sink, rest, bound + kBatchDeadline + kReadLimit,
                                              kRetryDeadline, &sends),
                     rest);
  const auto recovered_at = SteadyClock::now();
  RecordProperty("recover_ms", std::to_string(Since(frozen_at).count()));
  EXPECT_LE(recovered_at,
            std::max(frozen_at + bound, returned_at) + 2 * kRetryDeadline + kDeadlineMargin)
      << "the sink went on with its frozen connection for "
      << std::chrono::duration_cast<milliseconds>(recovered_at - frozen_at).count()
      << " ms (its bound: " << bound.count() << " ms)";
  const auto next = MakeBatch(bed_->Topic(), 3);
  ExpectAllPublished(sink->Publish(next, In(milliseconds{5000})), next);

  // Published means arrived: once (nothing published was sent again); what had no verdict
  // arrived at least once and at most once per Publish it was given to (the frozen one included:
  // a client library may send it again itself once it has a new connection), nothing else.
  std::vector<std::string> published;
  for (std::size_t i = 0; i < outcomes.size() && i < batch.size(); ++i) {
    if (outcomes[i].published()) published.push_back(batch[i].id.ToString());
  }
  const auto arrived =
      bed_->ReadBack(warmup.size() + batch.size() + after.size() + next.size(), kReadLimit);
  const auto counts = CountById(arrived);
  for (const auto& id : Concat({Ids(warmup), published, Ids(next)})) {
    EXPECT_EQ(counts.contains(id) ? counts.at(id) : 0, 1) << id;
  }
  for (std::size_t i = 0; i < rest.size() && i < sends.size(); ++i) {
    const std::string id = rest[i].id.ToString();
    const int count = counts.contains(id) ? counts.at(id) : 0;
    EXPECT_TRUE(count >= 1 && count <= sends[i] + 1)
        << id << " arrived " << count << " times, given to Publish " << sends[i] + 1 << " times";
  }
  std::set<std::string> sent;
  for (const auto& id : Concat({Ids(warmup), Ids(batch), Ids(after), Ids(next)})) sent.insert(id);
  for (const auto& [id, count] : counts) EXPECT_TRUE(sent.contains(id)) << "never sent: " << id;
}

// Close() and destruction of a sink whose connection is frozen return within a bound, and the
// first Publish after Close() publishes over a new connection.
TEST_P(SinkContractTest, CloseAndDestructionReturnWithTheConnectionFrozen) {
  OUTBOX_REQUIRE_FAULT(SinkFault::kFreeze);
  auto closed = OpenWarm(*bed_);
  auto destroyed = OpenWarm(*bed_);

  bed_->Freeze();
  const auto batch = MakeBatch(bed_->Topic(), 20);
  auto first = PublishWithin(*closed.sink, batch, kShortDeadline);
  auto rest = ExpectPublishedOrNoVerdict(first, batch);
  const auto other = MakeBatch(bed_->Topic(), 20);
  ExpectPublishedOrNoVerdict(PublishWithin(*destroyed.sink, other, kShortDeadline), other);

  auto started = SteadyClock::now();
  closed.sink->Close();
  RecordProperty("close_ms", std::to_string(Since(started).count()));
  EXPECT_LT(Since(started), kFrozenCloseLimit) << "Close() with the connection frozen";
  started = SteadyClock::now();
  destroyed.sink.reset();
  RecordProperty("destroy_ms", std::to_string(Since(started).count()));
  EXPECT_LT(Since(started), kFrozenCloseLimit) << "destruction with the connection frozen";

  // Close() gave the frozen connection up: the next Publish goes over a new one.
  ExpectAllPublished(closed.sink->Publish(rest, In(milliseconds{5000})), rest);
  std::vector<std::string> published;
  for (std::size_t i = 0; i < first.size() && i < batch.size(); ++i) {
    if (first[i].published()) published.push_back(batch[i].id.ToString());
  }
  const auto counts = CountById(bed_->ReadBack(2 + batch.size(), kReadLimit));
  for (const auto& id : published) EXPECT_EQ(counts.contains(id) ? counts.at(id) : 0, 1) << id;
  ExpectArrivedOnceOrTwice(counts, Ids(rest));
}

}  // namespace
}  // namespace outbox::testing
