// The NATS sink's pieces that need no server: its URL reader and masking, subject syntax, and the
// classification of libnats' answers (classify.h), one test per row of the table in sink/nats.h.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "classify.h"
#include "outbox/sink/nats.h"

namespace outbox::nats {
namespace {

std::string ParseError(const std::string& url) {
  try {
    ParseUrl(url);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  ADD_FAILURE() << "no error for " << url;
  return {};
}

TEST(NatsUrlTest, ReadsServersUserInfoAndTls) {
  const Servers one = ParseUrl("nats://127.0.0.1:4222");
  ASSERT_EQ(one.addresses.size(), 1U);
  EXPECT_EQ(one.addresses[0].host, "127.0.0.1");
  EXPECT_EQ(one.addresses[0].port, 4222);
  EXPECT_FALSE(one.tls);
  EXPECT_TRUE(one.user.empty() && one.password.empty() && one.token.empty());
  EXPECT_EQ(one.Describe(), "nats://127.0.0.1:4222");

  const Servers several = ParseUrl("nats://relay:p%40ss%2Cword@n1, nats://n2:4223,nats://[::1]/");
  ASSERT_EQ(several.addresses.size(), 3U);
  EXPECT_EQ(several.addresses[0].port, 4222);  // the default
  EXPECT_EQ(several.addresses[1].host, "n2");
  EXPECT_EQ(several.addresses[1].port, 4223);
  EXPECT_EQ(several.addresses[2].host, "::1");
  EXPECT_EQ(several.user, "relay");
  EXPECT_EQ(several.password, "p@ss,word");
  EXPECT_EQ(several.Describe(), "nats://n1:4222,nats://n2:4223,nats://[::1]:4222");

  const Servers token = ParseUrl("tls://s3cr3t@nats.example:4443,tls://s3cr3t@nats2.example");
  EXPECT_TRUE(token.tls);
  EXPECT_EQ(token.token, "s3cr3t");
  EXPECT_TRUE(token.user.empty());
  EXPECT_EQ(token.Describe(), "tls://nats.example:4443,tls://nats2.example:4222");
}

TEST(NatsUrlTest, RefusesWhatIsNoNatsUrlWithoutQuotingSecrets) {
  EXPECT_NE(ParseError("").find("empty"), std::string::npos);
  EXPECT_NE(ParseError("127.0.0.1:4222").find("no scheme"), std::string::npos);
  EXPECT_NE(ParseError("ws://h:80").find("scheme"), std::string::npos);
  EXPECT_NE(ParseError("nats://a,tls://b").find("mixes"), std::string::npos);
  EXPECT_NE(ParseError("nats://h:0").find("port"), std::string::npos);
  EXPECT_NE(ParseError("nats://h:99999").find("port"), std::string::npos);
  EXPECT_NE(ParseError("nats://h:4222/path").find("path"), std::string::npos);
  EXPECT_NE(ParseError("nats://h,,nats://g").find("server 2 is empty"), std::string::npos);
  EXPECT_NE(ParseError("nats://:x@h").find("empty user"), std::string::npos);
  EXPECT_NE(ParseError("nats://u:a@h,nats://u:b@g").find("different"), std::string::npos);
  EXPECT_NE(ParseError("nats://u:%zz@h").find("'%'"), std::string::npos);
  // A password with a raw ',' splits the list: the message quotes no part of it.
  const std::string message = ParseError("nats://u:hunter2,more@h");
  EXPECT_EQ(message.find("hunter2"), std::string::npos) << message;
  EXPECT_EQ(message.find("more"), std::string::npos) << message;
}

TEST(NatsUrlTest, MasksPasswordsAndTokens) {
  EXPECT_EQ(MaskUrl("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
  EXPECT_EQ(MaskUrl("nats://relay:s3cret@h:4222"), "nats://relay:***@h:4222");
  EXPECT_EQ(MaskUrl("nats://t0ken@h"), "nats://***@h");
  EXPECT_EQ(MaskUrl("nats://a,nats://u:p@b,tls://tok@c"), "nats://a,nats://u:***@b,tls://***@c");
  // Not valid URLs, masked all the same.
  EXPECT_EQ(MaskUrl("nats://u:p@ss,w@rd@h"), "nats://u:***@h");
  EXPECT_EQ(MaskUrl("bogus://x:y@z"), "bogus://x:***@z");
  EXPECT_EQ(MaskUrl("no url at all"), "no url at all");
}

TEST(NatsSubjectTest, OnlyPublishableSubjects) {
  EXPECT_EQ(SubjectProblem("orders"), "");
  EXPECT_EQ(SubjectProblem("orders.created.eu-1"), "");
  EXPECT_NE(SubjectProblem(""), "");
  EXPECT_NE(SubjectProblem("orders created"), "");
  EXPECT_NE(SubjectProblem("orders\ncreated"), "");
  EXPECT_NE(SubjectProblem("orders..created"), "");
  EXPECT_NE(SubjectProblem(".orders"), "");
  EXPECT_NE(SubjectProblem("orders."), "");
  EXPECT_NE(SubjectProblem("orders.*"), "");
  EXPECT_NE(SubjectProblem("orders.>"), "");
  EXPECT_EQ(SubjectProblem("orders.a*b"), "");  // not a wildcard token
}

// ---- Classification: one test per row ----

FailureKind KindOfAck(natsStatus status, int code = 0, std::string_view text = "text") {
  const auto failure = ClassifyAck(status, static_cast<jsErrCode>(code), text, "orders.eu");
  if (!failure) {
    ADD_FAILURE() << "published";
    return FailureKind::kLeaseLost;
  }
  EXPECT_FALSE(failure->reason.empty());
  return failure->kind;
}

TEST(NatsClassifyTest, APubAckIsPublished) {
  EXPECT_FALSE(ClassifyAck(NATS_OK, static_cast<jsErrCode>(0), "", "orders").has_value());
}

TEST(NatsClassifyTest, NoRespondersIsRejectedNamingTheSubject) {
  const auto failure = ClassifyAck(NATS_NO_RESPONDERS, static_cast<jsErrCode>(0),
                                   "No responders available for request", "orders.eu");
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind, FailureKind::kRejected);
  EXPECT_NE(failure->reason.find("orders.eu"), std::string::npos) << failure->reason;
  EXPECT_NE(failure->reason.find("no responders"), std::string::npos) << failure->reason;
}

TEST(NatsClassifyTest, AnAckTimeoutIsOutcomeUnknown) {
  EXPECT_EQ(KindOfAck(NATS_TIMEOUT), FailureKind::kOutcomeUnknown);
}

TEST(NatsClassifyTest, JetStreamErrorAcksAreRejectedWithTheServersText) {
  const auto failure =
      ClassifyAck(NATS_ERR, JSStreamNotMatchErr, "expected stream does not match", "orders.eu");
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind, FailureKind::kRejected);
  EXPECT_NE(failure->reason.find("expected stream does not match"), std::string::npos);
  EXPECT_NE(failure->reason.find("10060"), std::string::npos) << failure->reason;
  EXPECT_EQ(KindOfAck(NATS_ERR, JSStreamSealedErr), FailureKind::kRejected);
  EXPECT_EQ(KindOfAck(NATS_ERR, JSStreamStoreFailedErr), FailureKind::kRejected);
  EXPECT_EQ(KindOfAck(NATS_ERR, JSAccountResourcesExceededErr), FailureKind::kRejected);
  EXPECT_EQ(KindOfAck(NATS_ERR, 0, "some error"), FailureKind::kRejected);
}

TEST(NatsClassifyTest, OverTheStreamsMaxMsgSizeIsPermanent) {
  EXPECT_EQ(KindOfAck(NATS_ERR, JSStreamMessageExceedsMaximumErr), FailureKind::kPermanent);
}

TEST(NatsClassifyTest, JetStreamOutOfResourcesIsUnavailable) {
  for (const int code :
       {JSInsufficientResourcesErr, JSStorageResourcesExceededErr, JSMemoryResourcesExceededErr,
        JSClusterNotAvailErr, JSStreamOfflineErr, JSNotEnabledErr}) {
    EXPECT_EQ(KindOfAck(NATS_ERR, code), FailureKind::kUnavailable) << code;
  }
}

TEST(NatsClassifyTest, AnAckThatCannotBeReadIsOutcomeUnknown) {
  EXPECT_EQ(KindOfAck(NATS_PROTOCOL_ERROR), FailureKind::kOutcomeUnknown);
}

TEST(NatsClassifyTest, RefusedPublishes) {
  EXPECT_EQ(ClassifyPublishError(NATS_MAX_PAYLOAD, "x").kind, FailureKind::kPermanent);
  EXPECT_EQ(ClassifyPublishError(NATS_INVALID_SUBJECT, "x").kind, FailureKind::kPermanent);
  EXPECT_EQ(ClassifyPublishError(NATS_NO_SERVER_SUPPORT, "x").kind, FailureKind::kRejected);
  EXPECT_EQ(ClassifyPublishError(NATS_CONNECTION_CLOSED, "x").kind, FailureKind::kUnavailable);
  EXPECT_EQ(ClassifyPublishError(NATS_TIMEOUT, "stalled").kind, FailureKind::kUnavailable);
  EXPECT_EQ(ClassifyPublishError(NATS_IO_ERROR, "x").kind, FailureKind::kOutcomeUnknown);
  EXPECT_FALSE(ClassifyPublishError(NATS_IO_ERROR, "broken pipe").reason.empty());
  EXPECT_TRUE(IsConnectionLost(NATS_CONNECTION_CLOSED));
  EXPECT_TRUE(IsConnectionLost(NATS_IO_ERROR));
  EXPECT_FALSE(IsConnectionLost(NATS_MAX_PAYLOAD));
}

}  // namespace
}  // namespace outbox::nats
