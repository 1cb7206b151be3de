#include <fstream>
#include <sstream>
#include <utility>

#include "outbox/core/error.h"
#include "outbox/core/secrets.h"
#include "outbox/sink/claim_check_type.h"
#include "outbox/sink/readable_file.h"

namespace outbox::claim_check {
namespace {

using config::Fail;
using std::chrono::milliseconds;

constexpr std::int64_t kMaxThreshold = std::int64_t{5} * 1024 * 1024 * 1024;  // S3's one PUT

class Settings final : public SinkSettings {
 public:
  Settings(std::unique_ptr<const SinkSettings> inner, std::string name, Options options)
      : inner_(std::move(inner)), name_(std::move(name)), options_(std::move(options)) {}

  void Describe(config::TomlWriter& out) const override {
    inner_->Describe(out);
    out.Header("sinks." + config::TomlKey(name_) + "." + std::string{kTableKey});
    DescribeOptions(out, options_);
  }
  [[nodiscard]] std::unique_ptr<Sink> Open(const SinkContext& context) const override {
    return WrapSink(inner_->Open(context), options_, context.log);
  }
  [[nodiscard]] std::optional<SinkEndpoint> Endpoint() const override { return inner_->Endpoint(); }
  [[nodiscard]] std::vector<std::string> Secrets() const override {
    std::vector<std::string> secrets = inner_->Secrets();
    for (const std::string* secret :
         {&options_.store.secret_access_key, &options_.store.session_token}) {
      if (!secret->empty()) secrets.push_back(*secret);
    }
    return secrets;
  }

 private:
  std::unique_ptr<const SinkSettings> inner_;
  std::string name_;
  Options options_;
};

// The file's text without trailing white space.
std::string ReadSecretFile(const config::Section& table, std::string_view key,
                           const std::string& path) {
  if (!IsReadableFile(path)) {
    Fail(table.Key(key), "cannot read " + config::Quoted(path), table.Find(key));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  std::string secret = text.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r' ||
                             secret.back() == ' ' || secret.back() == '\t')) {
    secret.pop_back();
  }
  if (secret.empty()) Fail(table.Key(key), config::Quoted(path) + " is empty", table.Find(key));
  return secret;
}

}  // namespace

std::optional<Options> ReadOptions(const config::Section& table, std::string_view sink_name,
                                   const config::GetenvFn& getenv,
                                   const std::optional<Options>& defaults) {
  // OUTBOX_SINK_<NAME>_CLAIM_CHECK_<KEY>, or OUTBOX_CLAIM_CHECK_<KEY> for the global table.
  const auto env = [sink_name](std::string_view key) {
    if (!sink_name.empty()) return SinkSecretEnv(sink_name, "claim_check_" + std::string{key});
    std::string name = "OUTBOX_CLAIM_CHECK_";
    for (const char c : key) name += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
    return name;
  };
  table.AllowOnly({"enabled", "endpoint", "bucket", "region", "url_style", "prefix", "threshold",
                   "retention", "access_key_id", "secret_access_key", "secret_access_key_file",
                   "session_token", "ca_file", "connect_timeout", "request_timeout"});
  bool enabled = true;
  table.Read("enabled", enabled);
  if (!enabled) return std::nullopt;
  Options options = defaults.value_or(Options{});
  StoreOptions& store = options.store;
  table.Read("endpoint", store.endpoint);
  table.Read("bucket", store.bucket);
  table.Read("region", store.region);
  std::string style;
  if (table.ReadChoice("url_style", {"path", "virtual"}, style)) {
    store.url_style = style == "virtual" ? UrlStyle::kVirtualHost : UrlStyle::kPath;
  }
  table.Read("prefix", options.prefix);
  table.ReadInteger("threshold", 1, kMaxThreshold, options.threshold);
  table.ReadDuration("retention", milliseconds{0}, std::chrono::hours{24 * 365 * 10},
                     options.retention);
  table.Read("access_key_id", store.access_key_id);
  config::ValueSource secret = table.ReadSecret("secret_access_key", env("secret_access_key"),
                                                getenv, store.secret_access_key);
  secret.shown = store.secret_access_key.empty() ? "" : std::string{kRedactedSecret};
  std::string secret_file;
  if (table.Read("secret_access_key_file", secret_file)) {
    if (!store.secret_access_key.empty()) {
      Fail(table.Key("secret_access_key_file"),
           "is set, and so is secret_access_key" + secret.Origin() + ": use one of them",
           table.Find("secret_access_key_file"));
    }
    store.secret_access_key = ReadSecretFile(table, "secret_access_key_file", secret_file);
  }
  table.ReadSecret("session_token", env("session_token"), getenv, store.session_token);
  if (store.access_key_id.empty() && store.secret_access_key.empty()) {
    // The AWS tools' own variables, all three from one place.
    store.access_key_id = config::Env(getenv, "AWS_ACCESS_KEY_ID").value_or("");
    store.secret_access_key = config::Env(getenv, "AWS_SECRET_ACCESS_KEY").value_or("");
    if (store.session_token.empty()) {
      store.session_token = config::Env(getenv, "AWS_SESSION_TOKEN").value_or("");
    }
  }
  if (!store.access_key_id.empty() && store.secret_access_key.empty()) {
    Fail(table.Key("secret_access_key"),
         "is required with access_key_id: in the file, in " + env("secret_access_key") +
             " or through secret_access_key_file (or leave both out for AWS_ACCESS_KEY_ID and "
             "AWS_SECRET_ACCESS_KEY)",
         table.Find("access_key_id"));
  }
  if (table.Read("ca_file", store.ca_file) && !IsReadableFile(store.ca_file)) {
    Fail(table.Key("ca_file"), "cannot read " + config::Quoted(store.ca_file),
         table.Find("ca_file"));
  }
  table.ReadDuration("connect_timeout", milliseconds{1}, std::chrono::minutes{10},
                     store.connect_timeout);
  table.ReadDuration("request_timeout", milliseconds{1}, std::chrono::hours{1},
                     store.request_timeout);
  table.Check([&options] { ValidateOptions(options); }, {&secret});
  return options;
}

void DescribeOptions(config::TomlWriter& out, const Options& options) {
  const StoreOptions& store = options.store;
  out.String("endpoint", store.endpoint);
  out.String("bucket", store.bucket);
  out.String("region", store.region);
  out.String("url_style", store.url_style == UrlStyle::kVirtualHost ? "virtual" : "path");
  out.String("prefix", options.prefix);
  out.Integer("threshold", static_cast<std::int64_t>(options.threshold));
  out.Duration("retention", options.retention);
  out.String("access_key_id", store.access_key_id);
  out.String("secret_access_key", kRedactedSecret);
  if (!store.session_token.empty()) out.String("session_token", kRedactedSecret);
  out.String("ca_file", store.ca_file);
  out.Duration("connect_timeout", store.connect_timeout);
  out.Duration("request_timeout", store.request_timeout);
}

std::unique_ptr<const SinkSettings> WithClaimCheck(std::unique_ptr<const SinkSettings> inner,
                                                   std::string sink_name, Options options) {
  return std::make_unique<const Settings>(std::move(inner), std::move(sink_name),
                                          std::move(options));
}

}  // namespace outbox::claim_check
