#pragma once
// The file sink: appends each message as one JSON line to a file or to standard output. Useful
// for development, for piping into other tools, and as an audit trail.
//
// Each line is a JSON object with the keys, in this order:
//   id, event_id (Envelope::EventId(): the same for every copy of a message written to several
//   targets, else the id), topic, stream_key, stream_seq, stream_prev_seq (only when set: the
//   messages just before this one in its stream were abandoned, see Envelope), partition, target,
//   database (only when e.database is not empty: the relay serves several databases), type,
//   content_type, headers (a user header named message_id or event_id or starting with
//   "outbox-", in any case, is left out), attempts, created_at (RFC 3339 UTC with milliseconds,
//   e.g. "2024-05-01T12:34:56.789Z"), and then
//   payload: the payload embedded as JSON when content_type is application/json (parameters
//            such as "; charset=utf-8" allowed) and the payload parses as JSON; otherwise the
//            payload as a string when it is valid UTF-8;
//   payload_base64 (instead of payload): the payload bytes in standard base64 otherwise.
// Absent optional fields (stream_key, stream_seq, type) are null.
// With `envelope` kExternal the outbox's internal keys are left out (topic, stream_key,
// stream_seq, stream_prev_seq, partition, target, database, attempts): id, event_id, type,
// content_type, headers, created_at and the payload remain. With `envelope` kCloudEvents each
// line is instead one structured-mode CloudEvent in the JSON event format (sink/cloudevents.h,
// docs/cloudevents.md): the attributes, then data or data_base64.
//
// Publish writes the whole batch, then fsyncs it when asked, and only then reports the messages
// published. A message is published once its whole line reached the file (and, with fsync, the
// disk). Errors are outcomes, never exceptions:
//   - a message whose line was not completely written (write error, or the deadline passed while
//     a pipe or terminal would not take more) is kUnavailable, with the errno text;
//   - a message that was written but whose fsync failed is kOutcomeUnknown (it may be in the
//     file; publishing it again may duplicate it, which the inbox removes).
// After a write stopped in the middle of a line, the next batch starts with a newline so that the
// broken line stays on its own and later lines are intact.
//
// Threading: one thread calls Publish at a time (the Sink contract). Writing to a pipe that was
// closed by its reader raises SIGPIPE: a program using this sink on stdout or a FIFO should
// ignore SIGPIPE, after which the write fails with EPIPE and is reported as kUnavailable.

#include <memory>
#include <string>

#include "outbox/sink/cloudevents.h"
#include "outbox/sink/envelope_style.h"
#include "outbox/sink/sink.h"

namespace outbox::file {

struct SinkOptions {
  // "-" is standard output (never closed by the sink); anything else is a path opened for
  // appending and created (mode 0644, less the umask) when missing.
  std::string path = "-";
  // fsync after each batch before reporting it published. Ignored where the output cannot be
  // synced (a pipe or terminal).
  bool fsync = false;
  // Which of the outbox's metadata each line carries (see above and sink/envelope_style.h).
  EnvelopeStyle envelope = EnvelopeStyle::kFull;
  // With envelope kCloudEvents: the source template; the mode must be kStructured (each line is
  // one structured CloudEvent, the JSON event format: sink/cloudevents.h).
  cloudevents::Options cloudevents{.mode = cloudevents::Mode::kStructured,
                                   .source = std::string{cloudevents::kDefaultSource}};
};

// Throws ConfigError for a CloudEvents mode other than structured or a bad source template.
void ValidateOptions(const SinkOptions& options);

// Opens the output. Throws ConfigError("path", ...) when it cannot be opened for appending (a
// directory, a missing parent directory, no permission, a FIFO without a reader, an empty path).
// After Close(), the next Publish opens it again.
std::unique_ptr<Sink> OpenSink(SinkOptions options);

}  // namespace outbox::file
