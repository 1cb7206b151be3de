// libFuzzer target for outboxd's HTTP request path: the bytes a client sends, through the
// listener's parser and limits, the token check and every route (Operations::AnswerRaw), the
// admin API included, against a real (empty) SQLite store in a temporary file.
// A finding is a crash, a sanitizer report, a hang, or an answer that is not a valid status.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "config.h"
#include "operations.h"
#include "outbox/observe/metrics.h"
#include "outbox/relay/relay.h"

namespace {

struct Fixture {
  std::string path = "/tmp/outbox-http-fuzz-" + std::to_string(::getpid()) + ".db";
  outbox::outboxd::Config config;
  outbox::observe::Registry registry;
  outbox::RelayCounters counters;
  std::unique_ptr<outbox::outboxd::Operations> operations;

  Fixture() {
    std::remove(path.c_str());
    config = outbox::outboxd::ParseConfig(
        "[database]\ntype = \"sqlite\"\npath = \"" + path +
            "\"\n[http]\nlisten = \"\"\ntoken = \"fuzz-token\"\n"
            "[sinks.default]\ntype = \"file\"\npath = \"/dev/null\"\n",
        "fuzz.toml", [](const char*) -> const char* { return nullptr; });
    config.database->Prepare();
    operations = std::make_unique<outbox::outboxd::Operations>(
        config, registry, outbox::outboxd::Operations::TotalsOf(counters), outbox::LogFn{});
  }
  ~Fixture() { std::remove(path.c_str()); }
  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture fixture;
  const std::string_view bytes{reinterpret_cast<const char*>(data), size};
  const auto answer = fixture.operations->AnswerRaw(bytes);
  if (answer && (answer->status < 100 || answer->status > 599)) std::abort();
  return 0;
}
