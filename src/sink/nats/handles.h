#pragma once
// One deleter and one owning alias per libnats handle type (STYLE.md point 3), for the sink and
// for the tests' own clients. libnats' header stays under src/.

#include <nats/nats.h>

#include <memory>
#include <string>
#include <string_view>

namespace outbox::nats {

struct OptionsDeleter {
  void operator()(natsOptions* options) const { natsOptions_Destroy(options); }
};
// Connection options; natsConnection_Connect copies them.
using OptionsPtr = std::unique_ptr<natsOptions, OptionsDeleter>;

struct ConnectionDeleter {
  void operator()(natsConnection* connection) const { natsConnection_Destroy(connection); }
};
// A connection; destroying it closes it first when it is still open.
using ConnectionPtr = std::unique_ptr<natsConnection, ConnectionDeleter>;

struct JetStreamDeleter {
  void operator()(jsCtx* context) const { jsCtx_Destroy(context); }
};
// A JetStream context; it must be destroyed before its connection. Destroying it drops the
// asynchronous publishes still awaiting an ack (their handler is not called).
using JetStreamPtr = std::unique_ptr<jsCtx, JetStreamDeleter>;

struct MsgDeleter {
  void operator()(natsMsg* message) const { natsMsg_Destroy(message); }
};
// A message not handed to the library, or handed back (a sync subscription, an ack handler).
using MsgPtr = std::unique_ptr<natsMsg, MsgDeleter>;

struct SubscriptionDeleter {
  void operator()(natsSubscription* subscription) const { natsSubscription_Destroy(subscription); }
};
// A subscription (unsubscribes when destroyed, if still subscribed).
using SubscriptionPtr = std::unique_ptr<natsSubscription, SubscriptionDeleter>;

struct StreamInfoDeleter {
  void operator()(jsStreamInfo* info) const { jsStreamInfo_Destroy(info); }
};
// What js_GetStreamInfo / js_AddStream return.
using StreamInfoPtr = std::unique_ptr<jsStreamInfo, StreamInfoDeleter>;

struct MetaDataDeleter {
  void operator()(jsMsgMetaData* meta) const { jsMsgMetaData_Destroy(meta); }
};
// A JetStream message's metadata (natsMsg_GetMetaData).
using MetaDataPtr = std::unique_ptr<jsMsgMetaData, MetaDataDeleter>;

// `text` without the "(conn.c:1905): " that libnats puts before its messages.
inline std::string WithoutSourceLocation(std::string_view text) {
  if (text.starts_with('(')) {
    const std::size_t end = text.find("): ");
    if (end != std::string_view::npos &&
        text.substr(0, end).find(".c:") != std::string_view::npos) {
      text.remove_prefix(end + 3);
    }
  }
  return std::string{text};
}

// The text of libnats' last error on this thread, or of `status` when it recorded none.
inline std::string LastError(natsStatus status) {
  natsStatus last = NATS_OK;
  const char* text = nats_GetLastError(&last);
  if (text != nullptr && text[0] != '\0' && last == status) return WithoutSourceLocation(text);
  return natsStatus_GetText(status);
}

}  // namespace outbox::nats
