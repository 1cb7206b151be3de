// The file sink: JSON lines appended to a file or standard output (include/outbox/sink/file.h).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "file_descriptor.h"
#include "json_line.h"
#include "outbox/core/error.h"
#include "outbox/sink/cloudevents.h"
#include "outbox/sink/file.h"
#include "outbox/sink/sink_base.h"

namespace outbox::file {
namespace {

constexpr std::string_view kStdoutPath = "-";

bool IsStdout(const SinkOptions& options) { return options.path == kStdoutPath; }

std::string DisplayName(const SinkOptions& options) {
  return IsStdout(options) ? std::string{"standard output"} : "'" + options.path + "'";
}

// An opened output and what kind of file it is.
struct Output {
  FileDescriptor fd;
  bool regular_file = false;  // fsync-able, and writes never wait for a reader
};

struct OpenResult {
  std::optional<Output> output;
  std::string error;  // why it could not be opened, when output is empty
};

OpenResult OpenOutput(const SinkOptions& options) {
  if (options.path.empty()) return {std::nullopt, "must not be empty (\"-\" is standard output)"};
  FileDescriptor fd;
  if (IsStdout(options)) {
    fd = FileDescriptor::Borrow(STDOUT_FILENO);
  } else {
    // O_NONBLOCK only so that opening a FIFO without a reader fails (ENXIO) instead of hanging.
    const int raw = ::open(options.path.c_str(),
                           O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0644);
    if (raw < 0) {
      const int error = errno;
      std::string message = "cannot open '" + options.path + "' for appending: " + ErrnoText(error);
      if (error == ENXIO) message += " (a FIFO without a reader?)";
      return {std::nullopt, std::move(message)};
    }
    fd = FileDescriptor::Own(raw);
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) < 0) {
      return {std::nullopt, "cannot configure '" + options.path + "': " + ErrnoText(errno)};
    }
  }
  struct stat status {};
  if (::fstat(fd.get(), &status) != 0) {
    return {std::nullopt, "cannot use " + DisplayName(options) + ": " + ErrnoText(errno)};
  }
  if (IsStdout(options) && (::fcntl(fd.get(), F_GETFL) & O_ACCMODE) == O_RDONLY) {
    return {std::nullopt, "standard output is not open for writing"};
  }
  return {Output{std::move(fd), S_ISREG(status.st_mode)}, {}};
}

// fsync(2) of the directory holding `path`, so that a file created there survives a crash.
int SyncParentDirectory(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  const std::string directory =
      slash == std::string::npos ? std::string{"."} : (slash == 0 ? "/" : path.substr(0, slash));
  const int raw = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (raw < 0) return errno;
  FileDescriptor fd = FileDescriptor::Own(raw);
  if (::fsync(fd.get()) != 0 && errno != EINVAL) return errno;
  return fd.Close();
}

// The output is opened again on the first call after it was closed, at once (no backoff: an open
// costs nothing, and a persistent error is reported again each time).
class FileSink final : public SinkBase {
 public:
  FileSink(SinkOptions options, Output output)
      : SinkBase(Backoff{std::chrono::milliseconds{0}, std::chrono::milliseconds{0}}),
        options_(std::move(options)),
        output_(std::move(output)) {
    if (options_.envelope == EnvelopeStyle::kCloudEvents)
      cloudevents_.emplace(options_.cloudevents);
  }

  [[nodiscard]] std::string_view Name() const override { return "file"; }

  void Close() override {
    if (output_) output_->fd.Close();
    output_.reset();
  }

 private:
  bool Connected(Deadline /*deadline*/) override { return output_.has_value(); }

  std::optional<std::string> Connect(Deadline /*deadline*/) override {
    OpenResult opened = OpenOutput(options_);
    if (!opened.output) return std::move(opened.error);
    output_ = std::move(opened.output);
    parent_synced_ = false;
    return std::nullopt;
  }

  void Send(Batch& batch, Deadline deadline) override {
    // The whole batch in one buffer, so that a regular file gets it in one write(2) (appends of
    // other writers do not interleave with it) and we know where each message's line ends.
    std::string buffer;
    if (mid_line_) buffer.push_back('\n');
    std::vector<std::size_t> line_ends;
    line_ends.reserve(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (cloudevents_) {
        // One structured CloudEvent per line; a message that cannot be one gets no line, and its
        // permanent verdict comes first (the later one is ignored).
        std::string line;
        if (auto error = cloudevents_->StructuredJson(batch[i], line)) {
          batch.Fail(i, FailureKind::kPermanent, std::move(*error));
        } else {
          buffer += line;
          buffer += '\n';
        }
      } else {
        AppendJsonLine(batch[i], buffer, options_.envelope);
      }
      line_ends.push_back(buffer.size());
    }

    const WriteResult result =
        WriteAll(output_->fd.get(), buffer, !output_->regular_file, deadline);
    if (result.written > 0) mid_line_ = buffer[result.written - 1] != '\n';
    std::size_t complete = 0;
    while (complete < line_ends.size() && line_ends[complete] <= result.written) ++complete;

    std::optional<Failure> sync_failure;
    if (complete > 0 && options_.fsync && output_->regular_file) {
      if (const int error = Sync(); error != 0) {
        sync_failure = Failure{FailureKind::kOutcomeUnknown, "fsync of " + DisplayName(options_) +
                                                                 " failed: " + ErrnoText(error)};
      }
    }
    std::optional<Failure> write_failure;
    if (!result.complete(buffer)) {
      write_failure = Failure{FailureKind::kUnavailable, WriteFailureReason(result, buffer)};
      // Open the output again on the next call: that clears a broken descriptor, and a
      // persistent error (a full disk) is reported again then.
      if (!result.timed_out) Close();
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      batch.Settle(i, i < complete ? sync_failure : write_failure);
    }
  }

  [[nodiscard]] std::string WriteFailureReason(const WriteResult& result,
                                               const std::string& buffer) const {
    const std::string progress = " (" + std::to_string(result.written) + " of " +
                                 std::to_string(buffer.size()) + " bytes of the batch written)";
    if (result.timed_out) {
      return "deadline passed while " + DisplayName(options_) + " would not take more" + progress;
    }
    return "write to " + DisplayName(options_) + " failed: " + ErrnoText(result.error) + progress;
  }

  // fdatasync of the output (enough for appended data: it includes the new size), and once per
  // opened file an fsync of its directory, in case the open created it.
  int Sync() {
    if (::fdatasync(output_->fd.get()) != 0 && errno != EINVAL) return errno;
    if (!parent_synced_ && !IsStdout(options_)) {
      if (const int error = SyncParentDirectory(options_.path); error != 0) return error;
      parent_synced_ = true;
    }
    return 0;
  }

  SinkOptions options_;
  std::optional<cloudevents::Mapper> cloudevents_;  // with envelope = "cloudevents"
  std::optional<Output> output_;                    // empty after Close() or a write error
  bool parent_synced_ = false;
  // The output ends inside a line that a failed write left unfinished: the next batch begins
  // with a newline to finish it.
  bool mid_line_ = false;
};

}  // namespace

void ValidateOptions(const SinkOptions& options) {
  if (options.envelope != EnvelopeStyle::kCloudEvents) return;
  if (options.cloudevents.mode != cloudevents::Mode::kStructured) {
    throw ConfigError(std::string{cloudevents::kModeKey},
                      "the file sink writes structured CloudEvents only (one JSON event per line)");
  }
  cloudevents::ValidateOptions(options.cloudevents);
}

std::unique_ptr<Sink> OpenSink(SinkOptions options) {
  ValidateOptions(options);
  OpenResult opened = OpenOutput(options);
  if (!opened.output) throw ConfigError("path", opened.error);
  return std::make_unique<FileSink>(std::move(options), std::move(*opened.output));
}

}  // namespace outbox::file
