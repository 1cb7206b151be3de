#include "writer_contract.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "outbox/core/error.h"
#include "outbox/core/partition.h"
#include "outbox/store/store.h"
#include "support/header_limits.h"

namespace outbox::testing {
namespace {

using std::chrono::milliseconds;

// A window in which a writer that should wait is seen still waiting. (That something does not
// happen can only be watched for a while.)
constexpr milliseconds kWaitWindow{300};

EnqueueCall Keyed(std::string stream_key, std::string topic = "t") {
  EnqueueCall call;
  call.topic = std::move(topic);
  call.stream_key = std::move(stream_key);
  return call;
}

// The database's message for `call`, or "<no error>".
std::string ErrorOf(WriterSession& session, const EnqueueCall& call) {
  try {
    session.Enqueue(call);
  } catch (const EnqueueError& e) {
    return e.what();
  }
  return "<no error>";
}

std::string BatchErrorOf(WriterSession& session, const std::string& json) {
  try {
    session.EnqueueBatch(json);
  } catch (const EnqueueError& e) {
    return e.what();
  }
  return "<no error>";
}

// A JSON object of `headers`, whose names and values need no escaping.
std::string Json(const Headers& headers) {
  std::string text;
  for (const auto& [name, value] : headers) {
    text += (text.empty() ? "{\"" : ", \"") + name + "\": \"" + value + "\"";
  }
  return text.empty() ? "{}" : text + "}";
}

// "<target><seq>" of every message, in id order (or `order` applied to the rows first).
std::string TargetSeqs(const std::vector<StoredMessage>& rows) {
  std::string out;
  for (const auto& row : rows) {
    if (!out.empty()) out += ',';
    out += row.target + (row.stream_seq ? std::to_string(*row.stream_seq) : "-");
  }
  return out;
}

std::string Seqs(const std::vector<StoredMessage>& rows) {
  std::string out;
  for (const auto& row : rows) {
    if (!out.empty()) out += ',';
    out += (row.stream_key ? *row.stream_key : "") +
           (row.stream_seq ? std::to_string(*row.stream_seq) : "-");
  }
  return out;
}

NewMessage Message(std::string topic, std::optional<std::string> stream_key = std::nullopt,
                   std::string payload = R"({"n":1})") {
  NewMessage message;
  message.topic = std::move(topic);
  message.stream_key = std::move(stream_key);
  message.payload = std::move(payload);
  return message;
}

TEST_P(WriterContractTest, EnqueueFillsEveryColumn) {
  auto session = harness().Connect();
  EnqueueCall call = Keyed("order-42", "orders");
  call.payload = R"({"id": 42})";
  call.type = "OrderPlaced";
  call.headers = R"({"traceparent": "00-abc-def-01"})";
  call.correlation_id = "c-1";
  call.causation_id = "k-1";
  call.target = "kafka";
  const auto ids = session->Enqueue(call);
  ASSERT_EQ(ids.size(), 1U);
  EXPECT_EQ(ids[0].version(), 7);
  EXPECT_TRUE(ids[0].HasRfcVariant());
  const auto rows = harness().Messages();
  ASSERT_EQ(rows.size(), 1U);
  const StoredMessage& row = rows[0];
  EXPECT_EQ(row.id, ids[0]);
  EXPECT_FALSE(row.event_id.has_value());
  EXPECT_EQ(row.topic, "orders");
  EXPECT_EQ(row.stream_key, "order-42");
  EXPECT_EQ(row.stream_seq, 1);
  EXPECT_EQ(row.partition, PartitionOf("order-42", 64));
  EXPECT_EQ(row.target, "kafka");
  EXPECT_EQ(row.type, "OrderPlaced");
  EXPECT_EQ(row.payload, R"({"id": 42})");  // the JSON text as written, not re-rendered
  EXPECT_EQ(row.content_type, "application/json");
  EXPECT_EQ(row.headers, (Headers{{"traceparent", "00-abc-def-01"},
                                  {"causation_id", "k-1"},
                                  {"correlation_id", "c-1"}}));
  EXPECT_EQ(row.status, "pending");
  EXPECT_EQ(row.attempts, 0);
}

TEST_P(WriterContractTest, MinimalAndBinaryEnqueue) {
  auto session = harness().Connect();
  EnqueueCall minimal;
  minimal.payload = "[]";
  EXPECT_EQ(session->Enqueue(minimal).at(0).version(), 7);
  EnqueueCall blob;
  blob.topic = "blobs";
  blob.bytes = true;
  blob.payload = std::string{"\x00\xff\x27\x5c\x22", 5};  // NUL, 0xff, quote, backslash
  blob.content_type = "application/x-raw";
  const MessageId blob_id = session->Enqueue(blob).at(0);
  blob.content_type.reset();
  blob.payload = "\x01";
  const MessageId untyped_id = session->Enqueue(blob).at(0);
  std::map<MessageId, StoredMessage> rows;
  for (auto& row : harness().Messages()) rows[row.id] = row;
  EXPECT_EQ(rows.at(blob_id).payload, std::string("\x00\xff\x27\x5c\x22", 5));
  EXPECT_EQ(rows.at(blob_id).content_type, "application/x-raw");
  EXPECT_EQ(rows.at(untyped_id).content_type, "application/octet-stream");
}

// partition = Fnv1a32(stream key, or the id's text when unkeyed) mod settings.partition_count, as
// the C++ core's PartitionFor: every store and relay agree on it.
TEST_P(WriterContractTest, PartitionsFollowTheCoreHash) {
  harness().SetSetting("partition_count", 16);  // only while the outbox is empty
  auto session = harness().Connect();
  const std::string umlauts =
      "Gr\xc3\xbc\xc3\x9f"
      "e";
  for (const std::string& key :
       {std::string{"order-42"}, std::string{"customer/7"}, umlauts, std::string(255, 'k')}) {
    session->Enqueue(Keyed(key));
  }
  std::vector<MessageId> unkeyed;
  for (int i = 0; i < 20; ++i) unkeyed.push_back(session->Enqueue(EnqueueCall{}).at(0));
  std::map<std::string, int> partitions;
  for (const auto& row : harness().Messages()) {
    partitions[row.stream_key.value_or(row.id.ToString())] = row.partition;
  }
  EXPECT_EQ(partitions.at("order-42"), 4);
  EXPECT_EQ(partitions.at("customer/7"), PartitionOf("customer/7", 16));
  EXPECT_EQ(partitions.at(umlauts), PartitionOf(umlauts, 16));
  EXPECT_EQ(partitions.at(std::string(255, 'k')), PartitionOf(std::string(255, 'k'), 16));
  // Unkeyed messages are placed by the text of their id, as PartitionFor does.
  for (const MessageId& id : unkeyed) {
    EXPECT_EQ(partitions.at(id.ToString()), PartitionFor(std::nullopt, id, 16)) << id.ToString();
  }
}

TEST_P(WriterContractTest, BadInputGetsClearErrors) {
  auto session = harness().Connect();
  const auto error = [&](auto&& change) {
    EnqueueCall call;
    change(call);
    return ErrorOf(*session, call);
  };
  EXPECT_EQ(error([](EnqueueCall& c) { c.topic = ""; }), "outbox.enqueue: topic must not be empty");
  EXPECT_EQ(error([](EnqueueCall& c) { c.null_topic = true; }),
            "outbox.enqueue: topic must not be empty");
  EXPECT_EQ(error([](EnqueueCall& c) { c.topic = "a\nb"; }),
            "outbox.enqueue: topic contains a control character");
  EXPECT_EQ(error([](EnqueueCall& c) { c.topic = std::string(256, 't'); }),
            "outbox.enqueue: topic is 256 bytes, over the limit of 255");
  EXPECT_EQ(error([](EnqueueCall& c) { c.null_payload = true; }),
            "outbox.enqueue: payload must not be null");
  EXPECT_EQ(error([](EnqueueCall& c) {
              c.bytes = true;
              c.null_payload = true;
            }),
            "outbox.enqueue: payload must not be null");
  EXPECT_EQ(error([](EnqueueCall& c) { c.headers = "[1]"; }),
            "outbox.enqueue: headers must be a JSON object, got array");
  EXPECT_EQ(error([](EnqueueCall& c) { c.headers = "\"x\""; }),
            "outbox.enqueue: headers must be a JSON object, got string");
  EXPECT_EQ(error([](EnqueueCall& c) { c.headers = R"({"a\u0001": "v"})"; }),
            "outbox.enqueue: header name contains a control character");
  EXPECT_EQ(error([](EnqueueCall& c) { c.headers = R"({"a": "line\nbreak"})"; }),
            "outbox.enqueue: header \"a\" value contains a control character");
  EXPECT_EQ(error([](EnqueueCall& c) { c.headers = R"({"": "v"})"; }),
            "outbox.enqueue: header name must not be empty");
  EXPECT_EQ(error([](EnqueueCall& c) { c.headers = R"({"a": 1})"; }),
            "outbox.enqueue: header \"a\" must be a string, got number");
  EXPECT_EQ(error([](EnqueueCall& c) { c.headers = R"({"a": null})"; }),
            "outbox.enqueue: header \"a\" must be a string, got null");
  for (const char* reserved : {"Message_Id", "event_id", "outbox-stream-seq"}) {
    EXPECT_EQ(
        error([&](EnqueueCall& c) { c.headers = std::string{"{\""} + reserved + "\": \"x\"}"; }),
        std::string{"outbox.enqueue: header \""} + reserved +
            "\" is reserved (message_id, event_id and names starting with \"outbox-\" are "
            "set by the outbox)");
  }
  EXPECT_EQ(error([](EnqueueCall& c) { c.stream_key = ""; }),
            "outbox.enqueue: stream_key must not be empty");
  EXPECT_EQ(error([](EnqueueCall& c) { c.stream_key = std::string(256, 'k'); }),
            "outbox.enqueue: stream_key is 256 bytes, over the limit of 255");
  EXPECT_EQ(error([](EnqueueCall& c) { c.type = ""; }), "outbox.enqueue: type must not be empty");
  EXPECT_EQ(error([](EnqueueCall& c) { c.target = ""; }),
            "outbox.enqueue: target must not be empty");
  EXPECT_EQ(error([](EnqueueCall& c) {
              c.bytes = true;
              c.payload = std::string{"\0", 1};
              c.content_type = "";
            }),
            "outbox.enqueue: content_type must not be empty");
  harness().SetSetting("max_payload_bytes", 10);
  EXPECT_EQ(
      error([](EnqueueCall& c) { c.payload = "\"0123456789\""; }),
      "outbox.enqueue: payload is 12 bytes, over the limit of 10 (settings.max_payload_bytes)");
  EXPECT_TRUE(harness().Messages().empty());
}

TEST_P(WriterContractTest, BatchFormReturnsIdsInOrderAndRejectsBadElements) {
  auto session = harness().Connect();
  const auto rows = session->EnqueueBatch(
      R"([{"topic": "a", "payload": {"n": 1}}, {"topic": "b", "payload": [2], "stream_key": "k"}])");
  ASSERT_EQ(rows.size(), 2U);
  EXPECT_EQ(rows[0].first, 1);
  EXPECT_EQ(rows[1].first, 2);
  EXPECT_LT(rows[0].second, rows[1].second) << "ids follow the order of the batch";
  const auto stored = harness().Messages();
  ASSERT_EQ(stored.size(), 2U);
  EXPECT_EQ(stored[0].id, rows[0].second);
  EXPECT_EQ(stored[0].topic, "a");
  EXPECT_EQ(stored[1].topic, "b");
  EXPECT_EQ(stored[1].stream_seq, 1);
  EXPECT_EQ(stored[1].payload, "[2]");
  EXPECT_EQ(BatchErrorOf(*session, "{}"), "outbox.enqueue_batch: messages must be a JSON array");
  EXPECT_EQ(BatchErrorOf(*session, "[1]"), "outbox.enqueue_batch: element 1 must be a JSON object");
  EXPECT_EQ(BatchErrorOf(*session, R"([{"topic": "a", "payload": 1}, {"topic": "a", "pay": 1}])"),
            "outbox.enqueue_batch: element 2: unknown key \"pay\"");
  EXPECT_EQ(BatchErrorOf(*session, R"([{"topic": "a"}])"),
            "outbox.enqueue_batch: element 1: payload is missing");
  EXPECT_EQ(BatchErrorOf(*session, R"([{"topic": "", "payload": 1}])"),
            "outbox.enqueue: topic must not be empty");
  // A batch is all or nothing: the good first element of the refused batches is not there.
  EXPECT_EQ(harness().Messages().size(), 2U);
}

TEST_P(WriterContractTest, HeaderLimitsAreSettingsWithTheCoreDefaults) {
  const MessageLimits limits;
  EXPECT_EQ(harness().Setting("max_header_count"), limits.max_header_count);
  EXPECT_EQ(harness().Setting("max_header_name_bytes"), limits.max_header_name_bytes);
  EXPECT_EQ(harness().Setting("max_header_value_bytes"), limits.max_header_value_bytes);
  EXPECT_EQ(harness().Setting("max_headers_bytes"), limits.max_headers_bytes);
  EXPECT_EQ(harness().Setting("max_payload_bytes"), limits.max_payload_bytes);
}

// Headers at the default limits are taken by every form of enqueue; one header or byte more is
// refused, naming the setting.
TEST_P(WriterContractTest, HeadersAtTheLimitsAreTakenAndOneMoreIsRefusedNamingTheSetting) {
  auto session = harness().Connect();
  const Headers at_limits = HeadersAtTheLimits();
  const std::string longest(128, 'n');
  EnqueueCall call;
  call.headers = Json(at_limits);
  session->Enqueue(call);
  ASSERT_EQ(harness().Messages().size(), 1U);
  EXPECT_EQ(harness().Messages()[0].headers, at_limits);

  const auto error_with = [&](const Headers& headers) {
    EnqueueCall bad;
    bad.headers = Json(headers);
    return ErrorOf(*session, bad);
  };
  Headers more = at_limits;
  more["x-one-more"] = "";
  EXPECT_EQ(error_with(more),
            "outbox.enqueue: 65 headers, over the limit of 64 (settings.max_header_count)");
  more = at_limits;
  more.at("x-010") += 'h';
  const std::string over_total =
      "outbox.enqueue: headers take 8193 bytes (names and values), over the limit of 8192 "
      "(settings.max_headers_bytes)";
  EXPECT_EQ(error_with(more), over_total);
  more = at_limits;
  more.erase(longest);
  more[longest + 'n'] = std::string(4095, 'v');
  EXPECT_EQ(error_with(more),
            "outbox.enqueue: header name is 129 bytes, over the limit of 128 "
            "(settings.max_header_name_bytes)");
  more = at_limits;
  more.at(longest) += 'v';
  more.at("x-010").pop_back();
  EXPECT_EQ(error_with(more), "outbox.enqueue: header \"" + longest +
                                  "\" value is 4097 bytes, over the limit of 4096 "
                                  "(settings.max_header_value_bytes)");

  // correlation_id and causation_id count with the headers.
  Headers without = at_limits;
  const std::string correlation_id = without.at("correlation_id");
  without.erase("correlation_id");
  EnqueueCall with_ids;
  with_ids.headers = Json(without);
  with_ids.correlation_id = correlation_id;
  EXPECT_NO_THROW(session->Enqueue(with_ids));
  with_ids.correlation_id = correlation_id + "h";
  EXPECT_EQ(ErrorOf(*session, with_ids), over_total);
  with_ids.correlation_id = "c";
  with_ids.causation_id = "c";
  EXPECT_EQ(ErrorOf(*session, with_ids),
            "outbox.enqueue: 65 headers, over the limit of 64 (settings.max_header_count)");

  // Every form goes through the same check.
  more = at_limits;
  more.at("x-010") += 'h';
  EnqueueCall bytes;
  bytes.bytes = true;
  bytes.payload = std::string{"\0", 1};
  bytes.headers = Json(more);
  EXPECT_EQ(ErrorOf(*session, bytes), over_total);
  EXPECT_EQ(
      BatchErrorOf(*session, R"([{"topic": "t", "payload": 1, "headers": )" + Json(more) + "}]"),
      over_total);
  EXPECT_EQ(harness().Messages().size(), 2U);

  // An operator whose sinks all carry more may raise the limits.
  harness().SetSetting("max_headers_bytes", 8193);
  EXPECT_NO_THROW(session->Enqueue(bytes));
}

TEST_P(WriterContractTest, StreamSeqCanBeSwitchedOffPerCallAndPerTopic) {
  auto session = harness().Connect();
  session->Enqueue(Keyed("k"));
  EnqueueCall unsequenced = Keyed("k");
  unsequenced.sequenced = false;
  session->Enqueue(unsequenced);
  harness().SetTopic("fast", false, std::nullopt);
  session->Enqueue(Keyed("k", "fast"));
  EnqueueCall forced = Keyed("k", "fast");
  forced.sequenced = true;
  session->Enqueue(forced);
  session->Enqueue(Keyed("k"));
  harness().SetSetting("sequenced_by_default", 0);
  session->Enqueue(Keyed("k"));
  EXPECT_EQ(Seqs(harness().Messages()), "k1,k-,k-,k2,k3,k-");
}

TEST_P(WriterContractTest, WritersOfOneStreamSerializeUntilCommit) {
  auto first = harness().Connect();
  auto second = harness().Connect();
  first->Begin();
  first->Enqueue(Keyed("s"));
  std::atomic<bool> second_done{false};
  auto waiting = std::async(std::launch::async, [&] {
    second->Begin();
    const auto ids = second->Enqueue(Keyed("s"));
    second_done = true;
    second->Commit();
    return ids.at(0);
  });
  EXPECT_EQ(waiting.wait_for(kWaitWindow), std::future_status::timeout)
      << "the second writer did not wait for the first to commit";
  EXPECT_FALSE(second_done.load());
  first->Commit();
  const MessageId second_id = waiting.get();
  const auto rows = harness().Messages();
  ASSERT_EQ(rows.size(), 2U);
  EXPECT_EQ(rows[1].id, second_id);
  EXPECT_EQ(Seqs(rows), "s1,s2");
}

TEST_P(WriterContractTest, IdsOfAStreamSortInSeqOrderEvenIfTheClockGoesBack) {
  auto session = harness().Connect();
  session->Enqueue(Keyed("k"));
  // Pretend the previous message of the stream got an id from a clock an hour ahead.
  harness().SetStreamLastId("default", "k", *Uuid::Parse("ffff0000-0000-7000-8000-000000000000"));
  EXPECT_EQ(session->Enqueue(Keyed("k")).at(0).ToString(), "ffff0000-0000-7000-8000-000000000001");
  EXPECT_EQ(Seqs(harness().Messages()), "k1,k2");
  // Unsequenced messages take the clock as it is.
  EnqueueCall unsequenced = Keyed("k");
  unsequenced.sequenced = false;
  EXPECT_LT(session->Enqueue(unsequenced).at(0).ToString(), std::string{"ffff"});
}

TEST_P(WriterContractTest, StreamSeqIsGapFreeAndInIdOrderUnderEightWriters) {
  constexpr int kWriters = 8;
  constexpr int kPerWriter = 50;
  std::vector<std::thread> writers;
  std::atomic<int> committed{0};
  std::vector<std::unique_ptr<WriterSession>> sessions;
  for (int w = 0; w < kWriters; ++w) sessions.push_back(harness().Connect());
  std::vector<std::string> failures(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      WriterSession& session = *sessions[static_cast<std::size_t>(w)];
      try {
        for (int i = 0; i < kPerWriter; ++i) {
          session.Begin();
          try {
            session.Enqueue(Keyed("hot"));
          } catch (const EnqueueError& e) {
            // MariaDB: when the first writer of a new stream rolls back while two others wait for
            // its row, InnoDB may make one of them a deadlock victim. Run again, as any writer.
            if (!e.retry()) throw;
            session.Rollback();
            continue;
          }
          if ((i + w) % 5 == 0) {
            session.Rollback();  // 20 % roll back: their numbers are reused, no gaps
          } else {
            session.Commit();
            ++committed;
          }
        }
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(w)] = e.what();
      }
    });
  }
  for (auto& writer : writers) writer.join();
  for (const std::string& failure : failures) EXPECT_EQ(failure, "");
  // Gap-free: exactly 1..committed; ordered: sorting by id gives the same order as by seq.
  const auto rows = harness().Messages();
  ASSERT_EQ(rows.size(), static_cast<std::size_t>(committed.load()));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].stream_seq, static_cast<std::int64_t>(i + 1)) << "at id rank " << i;
  }
}

// Writers of different streams never wait for each other, in READ COMMITTED and in REPEATABLE
// READ (the default of MariaDB and MySQL), on streams new and old, before and after the held
// stream in key order (a gap lock would catch those).
TEST_P(WriterContractTest, AnOpenTransactionDelaysNoWriterOfAnotherStream) {
  auto setup = harness().Connect();
  for (const char* key : {"B", "D", "F"}) setup->Enqueue(Keyed(key));
  for (const Isolation isolation : {Isolation::kReadCommitted, Isolation::kRepeatableRead}) {
    auto slow = harness().Connect();
    slow->Begin(isolation);
    slow->Enqueue(Keyed("D"));
    slow->Enqueue(Keyed("N" + std::to_string(static_cast<int>(isolation))));
    auto other = harness().Connect(milliseconds{1000});
    for (const char* key : {"A", "B", "C", "E", "F", "G", "M", "Z"}) {
      other->Begin(isolation);
      // Times out (an EnqueueError that fails the test) if it waits for `slow`.
      other->Enqueue(Keyed(std::string{key} + std::to_string(static_cast<int>(isolation))));
      other->Enqueue(Keyed(key));
      other->Enqueue(EnqueueCall{});
      other->Commit();
    }
    slow->Commit();
  }
  EXPECT_EQ(harness().Messages().size(), 3U + 2 * (2 + 8 * 3));
}

// Two writers that take their streams in the same order cannot deadlock: only one waits.
TEST_P(WriterContractTest, WritersTakingStreamsInOrderDoNotDeadlock) {
  auto t1 = harness().Connect();
  auto t2 = harness().Connect(milliseconds{5000});
  t1->Begin();
  t1->Enqueue(Keyed("a"));
  t2->Begin();
  t2->Enqueue(Keyed("b"));
  // T1 now waits for T2's stream b; T2 commits and T1 goes on.
  auto waiting = std::async(std::launch::async, [&] { return t1->Enqueue(Keyed("b")); });
  EXPECT_EQ(waiting.wait_for(milliseconds{100}), std::future_status::timeout);
  t2->Commit();
  EXPECT_NO_THROW(waiting.get());
  t1->Commit();
  EXPECT_EQ(Seqs(harness().Messages()), "a1,b1,b2");
}

// Writers of the same two streams in opposite orders deadlock: one of them is told to run its
// transaction again (a retryable error), the other goes on, and the retry then succeeds. Nothing
// of the victim's is left.
TEST_P(WriterContractTest, WritersOfTwoStreamsInOppositeOrdersGetARetryableDeadlock) {
  auto t1 = harness().Connect();
  auto t2 = harness().Connect();
  t1->Begin();
  t1->Enqueue(Keyed("a"));
  t2->Begin();
  t2->Enqueue(Keyed("b"));
  auto first = std::async(std::launch::async, [&]() -> std::optional<EnqueueError> {
    try {
      t1->Enqueue(Keyed("b"));
    } catch (const EnqueueError& e) {
      return e;
    }
    return std::nullopt;
  });
  ASSERT_EQ(first.wait_for(milliseconds{200}), std::future_status::timeout) << "t1 waits for b";
  std::optional<EnqueueError> second;
  try {
    t2->Enqueue(Keyed("a"));
  } catch (const EnqueueError& e) {
    second = e;
  }
  if (second) {  // t2 was chosen: t1 goes on
    EXPECT_TRUE(second->retry()) << second->what();
    t2->Rollback();
    const auto t1_error = first.get();
    EXPECT_FALSE(t1_error.has_value()) << t1_error->what();
    t1->Commit();
    t2->Begin();
    t2->Enqueue(Keyed("b"));
    t2->Enqueue(Keyed("a"));
    t2->Commit();
  } else {  // t1 was chosen
    const auto t1_error = first.get();
    ASSERT_TRUE(t1_error.has_value()) << "neither writer got the deadlock";
    EXPECT_TRUE(t1_error->retry()) << t1_error->what();
    t1->Rollback();
    t2->Commit();
    t1->Begin();
    t1->Enqueue(Keyed("a"));
    t1->Enqueue(Keyed("b"));
    t1->Commit();
  }
  std::multiset<std::string> seqs;
  for (const auto& row : harness().Messages()) {
    seqs.insert(*row.stream_key + std::to_string(*row.stream_seq));
  }
  EXPECT_EQ(seqs, (std::multiset<std::string>{"a1", "a2", "b1", "b2"}));
}

TEST_P(WriterContractTest, ARolledBackEnqueueLeavesNothing) {
  auto session = harness().Connect();
  session->Begin();
  session->Enqueue(Keyed("k"));
  EnqueueCall fan_out = Keyed("k");
  fan_out.targets = std::vector<std::string>{"a", "b"};
  session->Enqueue(fan_out);
  session->EnqueueBatch(R"([{"topic": "t", "payload": 1, "stream_key": "k"}])");
  session->Rollback();
  EXPECT_TRUE(harness().Messages().empty());
  session->Enqueue(Keyed("k"));
  session->Enqueue(fan_out);
  EXPECT_EQ(TargetSeqs(harness().Messages()), "default1,a1,b1");
}

// targets write one message per target and return their ids in the order given; each copy has
// its own stream_seq per (target, stream), and all share the first copy's id as event_id. A
// message for one target has none (its event id is its own id).
TEST_P(WriterContractTest, EnqueueWithTargetsWritesOneMessagePerTarget) {
  auto session = harness().Connect();
  EnqueueCall first = Keyed("o-1", "orders");
  first.payload = R"({"n": 1})";
  first.type = "Placed";
  first.headers = R"({"x": "y"})";
  first.correlation_id = "c-1";
  first.targets = std::vector<std::string>{"partner", "default"};
  const auto ids = session->Enqueue(first);
  ASSERT_EQ(ids.size(), 2U);
  EnqueueCall second = Keyed("o-1", "orders");
  second.payload = R"({"n": 2})";
  second.targets = std::vector<std::string>{"default", "partner"};
  session->Enqueue(second);
  EnqueueCall third = Keyed("o-1", "orders");
  third.bytes = true;
  third.payload = "\x01\x02";
  third.target = "partner";
  session->Enqueue(third);
  const auto rows = harness().Messages();
  ASSERT_EQ(rows.size(), 5U);
  std::map<MessageId, StoredMessage> by_id;
  for (const auto& row : rows) by_id[row.id] = row;
  EXPECT_EQ(by_id.at(ids[0]).target, "partner");
  EXPECT_EQ(by_id.at(ids[0]).event_id, ids[0]);
  EXPECT_EQ(by_id.at(ids[1]).target, "default");
  EXPECT_EQ(by_id.at(ids[1]).event_id, ids[0]);
  for (const MessageId& id : ids) {
    const StoredMessage& copy = by_id.at(id);
    EXPECT_EQ(copy.stream_seq, 1);
    EXPECT_EQ(copy.type, "Placed");
    EXPECT_EQ(copy.payload, R"({"n": 1})");
    EXPECT_EQ(copy.headers, (Headers{{"x", "y"}, {"correlation_id", "c-1"}}));
  }
  std::multiset<std::string> seqs;
  int without_event = 0;
  for (const auto& row : rows) {
    seqs.insert(row.target + std::to_string(*row.stream_seq));
    if (!row.event_id) ++without_event;
  }
  EXPECT_EQ(seqs, (std::multiset<std::string>{"partner1", "default1", "default2", "partner2",
                                              "partner3"}));
  EXPECT_EQ(without_event, 1);
  EnqueueCall bytes;
  bytes.bytes = true;
  bytes.payload = "\x00";
  bytes.targets = std::vector<std::string>{"a"};
  EXPECT_EQ(session->Enqueue(bytes).size(), 1U);
}

TEST_P(WriterContractTest, BadTargetsGetClearErrors) {
  auto session = harness().Connect();
  const auto error = [&](std::vector<std::string> targets) {
    EnqueueCall call;
    call.targets = std::move(targets);
    return ErrorOf(*session, call);
  };
  EXPECT_EQ(error({"a", "a"}), "outbox.enqueue: targets: \"a\" is named twice");
  EXPECT_EQ(error({}), "outbox.enqueue: targets must name at least one target");
  EXPECT_EQ(error({"a", ""}), "outbox.enqueue: target must not be empty");
  EXPECT_EQ(error({"a", "b\n"}), "outbox.enqueue: target contains a control character");
  EXPECT_EQ(error({"a", std::string(256, 'b')}),
            "outbox.enqueue: target is 256 bytes, over the limit of 255");
  std::vector<std::string> many;
  for (int i = 1; i <= 33; ++i) many.push_back("t" + std::to_string(i));
  EXPECT_EQ(error(many), "outbox.enqueue: targets: 33 targets, over the limit of 32");
  many.pop_back();
  EXPECT_EQ(session->Enqueue(EnqueueCall{.targets = many}).size(), 32U);
  try {
    harness().SetTopic("t", std::nullopt, std::vector<std::string>{});
    ADD_FAILURE() << "empty topic targets were taken";
  } catch (const EnqueueError& e) {
    EXPECT_EQ(std::string{e.what()}, "outbox.enqueue: targets must name at least one target");
  }
  EXPECT_EQ(
      BatchErrorOf(*session, R"([{"topic": "t", "payload": 1, "targets": ["a"], "target": "b"}])"),
      "outbox.enqueue_batch: element 1: give \"target\" or \"targets\", not both");
  EXPECT_EQ(BatchErrorOf(*session, R"([{"topic": "t", "payload": 1, "targets": ["a", 2]}])"),
            "outbox.enqueue_batch: element 1: targets must be a JSON array of strings");
  EXPECT_EQ(harness().Messages().size(), 32U);
}

// A topic's default targets apply when the call names none; a named target still means that one
// alone. The batch form gives one row per copy, with the message's ordinal.
TEST_P(WriterContractTest, ATopicsDefaultTargetsApplyWhenTheCallNamesNone) {
  auto session = harness().Connect();
  harness().SetTopic("evt", std::nullopt, std::vector<std::string>{"default", "partner"});
  const MessageId event = session->Enqueue(Keyed("k", "evt")).at(0);
  EnqueueCall named = Keyed("k", "evt");
  named.target = "default";
  session->Enqueue(named);
  const auto rows = harness().Messages();
  EXPECT_EQ(TargetSeqs(rows), "default1,partner1,default2");
  EXPECT_EQ(std::count_if(rows.begin(), rows.end(),
                          [&](const StoredMessage& row) { return row.event_id == event; }),
            2)
      << "the single-target form returns the event id";
  const auto batch = session->EnqueueBatch(
      R"([{"topic": "evt", "payload": 1}, {"topic": "evt", "payload": 2, "target": "a"},
          {"topic": "o", "payload": 3, "targets": ["a", "b", "c"]}])");
  std::string ordinals;
  for (const auto& [ordinal, id] : batch) ordinals += std::to_string(ordinal);
  EXPECT_EQ(ordinals, "112333");
}

// Writers fanning one stream out to the same targets, named in opposite orders, take the counters
// in one order (target name) and so wait for each other instead of deadlocking.
TEST_P(WriterContractTest, WritersFanningOutOneStreamInOppositeOrdersDoNotDeadlock) {
  auto t1 = harness().Connect();
  auto t2 = harness().Connect();
  EnqueueCall ab = Keyed("s");
  ab.targets = std::vector<std::string>{"a", "b"};
  EnqueueCall ba = Keyed("s");
  ba.targets = std::vector<std::string>{"b", "a"};
  t1->Begin();
  t1->Enqueue(ab);
  t2->Begin();
  auto waiting = std::async(std::launch::async, [&] { return t2->Enqueue(ba); });
  EXPECT_EQ(waiting.wait_for(kWaitWindow), std::future_status::timeout);
  t1->Commit();
  EXPECT_NO_THROW(waiting.get());
  t2->Commit();
  std::multiset<std::string> seqs;
  for (const auto& row : harness().Messages())
    seqs.insert(row.target + std::to_string(*row.stream_seq));
  EXPECT_EQ(seqs, (std::multiset<std::string>{"a1", "b1", "a2", "b2"}));
}

// The C++ Writer: a batch in the caller's transaction, ids in order, payload bytes exact.
TEST_P(WriterContractTest, TheWriterStoresABatchExactlyAndReturnsItsIdsInOrder) {
  auto session = harness().Connect();
  std::vector<NewMessage> messages;
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte += static_cast<char>(b);
  for (int i = 0; i < 20; ++i) {
    NewMessage message =
        Message("orders", i % 2 == 0 ? std::optional<std::string>{"k"} : std::nullopt,
                every_byte + std::to_string(i));
    message.content_type = "application/octet-stream";
    message.type = "T\xc3\xa9";
    message.headers = {{"correlation_id", "c-" + std::to_string(i)},
                       {"x-quote", "\"\\'"},
                       {"x-utf8", "\xe2\x82\xac\xf0\x9f\x98\x80"}};
    messages.push_back(std::move(message));
  }
  messages[3].targets = {"b", "a"};
  session->Begin();
  const auto copies = session->WriterEnqueue(messages);
  session->Commit();
  ASSERT_EQ(copies.size(), messages.size());
  ASSERT_EQ(copies[3].size(), 2U);
  std::map<MessageId, StoredMessage> by_id;
  for (const auto& row : harness().Messages()) by_id[row.id] = row;
  EXPECT_EQ(by_id.size(), messages.size() + 1);
  for (std::size_t i = 0; i < messages.size(); ++i) {
    ASSERT_FALSE(copies[i].empty());
    if (i > 0) {
      EXPECT_LT(*std::max_element(copies[i - 1].begin(), copies[i - 1].end()),
                *std::min_element(copies[i].begin(), copies[i].end()))
          << "ids follow the batch";
    }
    for (std::size_t c = 0; c < copies[i].size(); ++c) {
      const StoredMessage& row = by_id.at(copies[i][c]);
      EXPECT_EQ(row.payload, messages[i].payload) << i;
      EXPECT_EQ(row.content_type, "application/octet-stream");
      EXPECT_EQ(row.type, "T\xc3\xa9");
      EXPECT_EQ(row.headers, messages[i].headers);
      EXPECT_EQ(row.stream_key, messages[i].stream_key);
      if (copies[i].size() > 1) {
        EXPECT_EQ(row.target, messages[i].targets[c]);
        EXPECT_EQ(row.event_id, copies[i][0]);
      } else {
        EXPECT_EQ(row.target, "default");
        EXPECT_FALSE(row.event_id.has_value());
      }
    }
  }
  EXPECT_EQ(by_id.at(copies[18][0]).stream_seq, 10) << "k: messages 0, 2, 4, ..., 18";
}

TEST_P(WriterContractTest, TheWriterNeedsAnOpenTransactionAndRefusesBadMessagesFirst) {
  auto session = harness().Connect();
  const NewMessage good = Message("t");
  EXPECT_THROW(session->WriterEnqueue(std::span{&good, 1}), std::logic_error);
  session->Begin();
  std::vector<NewMessage> batch{good, Message("")};
  EXPECT_THROW(session->WriterEnqueue(batch), InvalidMessage);
  batch[1] = good;
  batch[1].targets = {"a", "a"};
  EXPECT_THROW(session->WriterEnqueue(batch), InvalidMessage);
  batch[1] = Message("t", std::string{"\xff"});
  EXPECT_THROW(session->WriterEnqueue(batch), InvalidMessage) << "not UTF-8";
  session->Rollback();  // (PostgreSQL refuses it, which aborts the transaction)
  EXPECT_TRUE(harness().Messages().empty()) << "nothing of a refused batch is written";
  // What only the database knows (its settings) is refused by it, as InvalidMessage too.
  harness().SetSetting("max_payload_bytes", 4);
  session->Begin();
  EXPECT_THROW(session->WriterEnqueue(std::span{&good, 1}), InvalidMessage);
  session->Rollback();
  EXPECT_TRUE(harness().Messages().empty());
}

}  // namespace
}  // namespace outbox::testing
