#include "outbox/observe/metrics.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <ctime>
#include <limits>
#include <stdexcept>
#include <variant>

#include "outbox/core/clock.h"
#include "outbox/core/secrets.h"

namespace outbox::observe {
namespace {

enum Type : int { kCounter = 0, kGauge = 1, kHistogram = 2 };

constexpr std::array<std::string_view, 3> kTypeNames{"counter", "gauge", "histogram"};
constexpr std::size_t kMaxBuckets = 64;

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool ValidMetricName(std::string_view name) {
  if (name.empty() || (!IsNameStart(name[0]) && name[0] != ':')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return IsNameStart(c) || IsDigit(c) || c == ':'; });
}

// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved by Prometheus).
bool ValidLabelName(std::string_view name) {
  if (name.empty() || !IsNameStart(name[0]) || name.starts_with("__")) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return IsNameStart(c) || IsDigit(c); });
}

// Shortest text that reads back as `value`; Prometheus spellings for the non-finite ones.
std::string FormatNumber(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  std::array<char, 32> text{};
  const auto result = std::to_chars(text.data(), text.data() + text.size(), value);
  return {text.data(), result.ptr};
}

// JSON has no NaN or Inf.
std::string JsonNumber(double value) { return std::isfinite(value) ? FormatNumber(value) : "null"; }

void AppendEscapedHelp(std::string& out, std::string_view text) {
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

void AppendEscapedLabelValue(std::string& out, std::string_view text) {
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

// Length of the valid UTF-8 sequence starting at text[at], or 0 when it is not one.
std::size_t Utf8SequenceLength(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  std::size_t length = 0;
  unsigned min_second = 0x80;
  unsigned max_second = 0xBF;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) min_second = 0xA0;  // overlong
    if (lead == 0xED) max_second = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) min_second = 0x90;
    if (lead == 0xF4) max_second = 0x8F;
  } else {
    return 0;
  }
  if (at + length > text.size()) return 0;
  if (byte(at + 1) < min_second || byte(at + 1) > max_second) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if ((byte(at + i) & 0xC0U) != 0x80U) return 0;
  }
  return length;
}

void AppendJsonString(std::string& out, std::string_view text) {
  out += '"';
  for (std::size_t at = 0; at < text.size();) {
    const char c = text[at];
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7F) {
      static constexpr std::string_view kHex = "0123456789abcdef";
      out += "\\u00";
      out += kHex[byte >> 4U];
      out += kHex[byte & 0xFU];
    } else if (byte >= 0x80) {
      const std::size_t length = Utf8SequenceLength(text, at);
      if (length == 0) {
        out += "\\ufffd";
        ++at;
      } else {
        out.append(text.substr(at, length));
        at += length;
      }
      continue;
    } else {
      out += c;
    }
    ++at;
  }
  out += '"';
}

// Cuts `text` to at most `limit` bytes without splitting a UTF-8 sequence.
std::string_view Truncate(std::string_view text, std::size_t limit) {
  if (text.size() <= limit) return text;
  std::size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0U) == 0x80U) --end;
  return text.substr(0, end);
}

}  // namespace

// ---- Histogram ----

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  if (bounds_.size() > kMaxBuckets) throw std::invalid_argument("histogram: too many buckets");
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      throw std::invalid_argument("histogram: bounds must be finite and strictly increasing");
    }
  }
  buckets_ = std::make_unique<std::atomic<std::uint64_t>[]>(bounds_.size() + 1);
}

void Histogram::Observe(double value) {
  // NaN lands in +Inf (every comparison is false), which keeps _count equal to the +Inf bucket.
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  buckets_[static_cast<std::size_t>(bucket)].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.cumulative.reserve(bounds_.size() + 1);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    snapshot.cumulative.push_back(total);
  }
  snapshot.count = total;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
          0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0, 300.0};
}

std::vector<double> SizeBuckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000};
}

std::size_t SeriesPerTarget(std::size_t databases, std::size_t targets) {
  constexpr std::size_t kMost = std::numeric_limits<std::size_t>::max();
  if (targets != 0 && databases > kMost / targets) return kMost;
  return std::max(databases * targets, Registry::kMaxSeriesPerFamily);
}

// ---- Registry ----

struct Registry::Series {
  template <typename Metric, typename... Args>
  Series(Labels series_labels, std::in_place_type_t<Metric> metric_type, Args&&... args)
      : labels(std::move(series_labels)), metric(metric_type, std::forward<Args>(args)...) {}

  Labels labels;
  std::variant<Counter, Gauge, Histogram> metric;
};

struct Registry::Family {
  std::string name;
  std::string help;
  int type = kCounter;
  std::vector<double> bounds;  // histograms
  std::deque<Series> series;   // a deque: registered series never move
  bool replaced = false;       // its series are set by ReplaceGauges, never by AddGauge
};

namespace {

void CheckLabels(std::string_view name, int type, const Labels& labels) {
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const std::string& label = labels[i].first;
    if (!ValidLabelName(label) || (type == kHistogram && label == "le")) {
      throw std::invalid_argument("label name '" + label + "' of " + std::string{name} +
                                  " is not valid");
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (labels[j].first == label) {
        throw std::invalid_argument("label '" + label + "' repeated in " + std::string{name});
      }
    }
  }
}

std::string TooManySeries(std::string_view name, std::size_t limit) {
  return "metric " + std::string{name} + " has too many series (at most " + std::to_string(limit) +
         ")";
}

bool SameLabelNames(const Labels& a, const Labels& b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(),
                    [](const auto& x, const auto& y) { return x.first == y.first; });
}

}  // namespace

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Series& Registry::Add(std::string_view name, std::string_view help, int type,
                                const Labels& labels, const std::vector<double>* bounds) {
  CheckLabels(name, type, labels);
  std::lock_guard lock(mutex_);
  Family* family = &FindOrCreate(name, help, type, bounds, /*replaced=*/false);
  for (Series& series : family->series) {
    if (series.labels == labels) return series;
  }
  if (!family->series.empty() && !SameLabelNames(family->series.front().labels, labels)) {
    throw std::invalid_argument("metric " + std::string{name} +
                                ": every series must have the same label names");
  }
  if (family->series.size() >= SeriesLimit(name)) {
    throw std::length_error(TooManySeries(name, SeriesLimit(name)));
  }
  switch (type) {
    case kCounter:
      return family->series.emplace_back(labels, std::in_place_type<Counter>);
    case kGauge:
      return family->series.emplace_back(labels, std::in_place_type<Gauge>);
    default:
      return family->series.emplace_back(labels, std::in_place_type<Histogram>, *bounds);
  }
}

Registry::Family& Registry::FindOrCreate(std::string_view name, std::string_view help, int type,
                                         const std::vector<double>* bounds, bool replaced) {
  if (!ValidMetricName(name)) {
    throw std::invalid_argument("metric name '" + std::string{name} + "' is not valid");
  }
  auto found = std::find_if(families_.begin(), families_.end(),
                            [&](const auto& family) { return family->name == name; });
  if (found == families_.end()) {
    auto created = std::make_unique<Family>();
    created->name = std::string{name};
    created->help = std::string{help};
    created->type = type;
    created->replaced = replaced;
    if (bounds != nullptr) created->bounds = *bounds;
    families_.push_back(std::move(created));
    return *families_.back();
  }
  Family& family = **found;
  if (family.type != type || (bounds != nullptr && family.bounds != *bounds)) {
    throw std::invalid_argument("metric " + std::string{name} +
                                " is already registered as another type or with other buckets");
  }
  if (family.replaced != replaced) {
    throw std::invalid_argument("metric " + std::string{name} +
                                " mixes AddGauge and ReplaceGauges");
  }
  return family;
}

std::size_t Registry::SeriesLimit(std::string_view name) const {
  for (const auto& [family, limit] : series_limits_) {
    if (family == name) return limit;
  }
  return kMaxSeriesPerFamily;
}

void Registry::AllowSeries(std::string_view name, std::size_t limit) {
  std::lock_guard lock(mutex_);
  for (auto& [family, granted] : series_limits_) {
    if (family != name) continue;
    granted = std::max(granted, limit);
    return;
  }
  series_limits_.emplace_back(std::string{name}, std::max(limit, kMaxSeriesPerFamily));
}

void Registry::ReplaceGauges(std::string_view name, std::string_view help,
                             const std::vector<std::pair<Labels, double>>& series) {
  {
    std::lock_guard lock(mutex_);
    if (series.size() > SeriesLimit(name)) {
      throw std::length_error(TooManySeries(name, SeriesLimit(name)));
    }
  }
  for (const auto& [labels, value] : series) {
    CheckLabels(name, kGauge, labels);
    if (!SameLabelNames(series.front().first, labels)) {
      throw std::invalid_argument("metric " + std::string{name} +
                                  ": every series must have the same label names");
    }
  }
  std::deque<Series> replacement;
  for (const auto& [labels, value] : series) {
    std::get<Gauge>(replacement.emplace_back(labels, std::in_place_type<Gauge>).metric).Set(value);
  }
  std::lock_guard lock(mutex_);
  Family& family = FindOrCreate(name, help, kGauge, nullptr, /*replaced=*/true);
  family.series.swap(replacement);
}

Counter& Registry::AddCounter(std::string_view name, std::string_view help, const Labels& labels) {
  return std::get<Counter>(Add(name, help, kCounter, labels, nullptr).metric);
}

Gauge& Registry::AddGauge(std::string_view name, std::string_view help, const Labels& labels) {
  return std::get<Gauge>(Add(name, help, kGauge, labels, nullptr).metric);
}

Histogram& Registry::AddHistogram(std::string_view name, std::string_view help,
                                  std::vector<double> bounds, const Labels& labels) {
  const Histogram check{bounds};  // validates the bounds before anything is registered
  return std::get<Histogram>(Add(name, help, kHistogram, labels, &check.bounds()).metric);
}

void Registry::RecordError(std::string_view kind, std::string_view message) {
  // Known secrets out before the cut (core/secrets.h): /api/outbox shows these.
  ErrorSample sample{std::chrono::system_clock::now(), std::string{Truncate(kind, 64)},
                     std::string{Truncate(RedactKnownSecrets(message), kMaxErrorMessageBytes)}};
  std::lock_guard lock(mutex_);
  if (errors_.size() >= kMaxRecentErrors) errors_.pop_front();
  errors_.push_back(std::move(sample));
}

std::vector<ErrorSample> Registry::RecentErrors() const {
  std::lock_guard lock(mutex_);
  return {errors_.begin(), errors_.end()};
}

namespace {

// {a="b",c="d"} with an optional extra label (le) last; "" for no labels at all.
std::string PrometheusLabels(const Labels& labels, std::string_view extra_name = {},
                             std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return {};
  std::string out = "{";
  bool first = true;
  const auto append = [&](std::string_view name, std::string_view value) {
    if (!first) out += ',';
    first = false;
    out += name;
    out += "=\"";
    AppendEscapedLabelValue(out, value);
    out += '"';
  };
  for (const auto& [name, value] : labels) append(name, value);
  if (!extra_name.empty()) append(extra_name, extra_value);
  return out + "}";
}

std::string JsonLabels(const Labels& labels) {
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out += ',';
    first = false;
    AppendJsonString(out, name);
    out += ':';
    AppendJsonString(out, value);
  }
  return out + "}";
}

}  // namespace

std::string Registry::RenderPrometheus() const {
  std::string out;
  std::lock_guard lock(mutex_);
  for (const auto& family : families_) {
    const std::string& name = family->name;
    out += "# HELP " + name + " ";
    AppendEscapedHelp(out, family->help);
    out += "\n# TYPE " + name + " ";
    out += kTypeNames[static_cast<std::size_t>(family->type)];
    out += '\n';
    for (const Series& series : family->series) {
      if (const auto* counter = std::get_if<Counter>(&series.metric)) {
        out +=
            name + PrometheusLabels(series.labels) + " " + std::to_string(counter->value()) + "\n";
      } else if (const auto* gauge = std::get_if<Gauge>(&series.metric)) {
        out += name + PrometheusLabels(series.labels) + " " + FormatNumber(gauge->value()) + "\n";
      } else {
        const auto& histogram = std::get<Histogram>(series.metric);
        const Histogram::Snapshot snapshot = histogram.Read();
        for (std::size_t i = 0; i < snapshot.cumulative.size(); ++i) {
          const std::string le =
              i < family->bounds.size() ? FormatNumber(family->bounds[i]) : "+Inf";
          out += name + "_bucket" + PrometheusLabels(series.labels, "le", le) + " " +
                 std::to_string(snapshot.cumulative[i]) + "\n";
        }
        out += name + "_sum" + PrometheusLabels(series.labels) + " " + FormatNumber(snapshot.sum) +
               "\n";
        out += name + "_count" + PrometheusLabels(series.labels) + " " +
               std::to_string(snapshot.count) + "\n";
      }
    }
  }
  return out;
}

std::string Registry::RenderJson() const {
  std::string out = "{\"metrics\":{";
  std::lock_guard lock(mutex_);
  bool first_family = true;
  for (const auto& family : families_) {
    if (!first_family) out += ',';
    first_family = false;
    AppendJsonString(out, family->name);
    out += ":{\"type\":\"";
    out += kTypeNames[static_cast<std::size_t>(family->type)];
    out += "\",\"help\":";
    AppendJsonString(out, family->help);
    out += ",\"series\":[";
    bool first_series = true;
    for (const Series& series : family->series) {
      if (!first_series) out += ',';
      first_series = false;
      out += "{\"labels\":" + JsonLabels(series.labels);
      if (const auto* counter = std::get_if<Counter>(&series.metric)) {
        out += ",\"value\":" + std::to_string(counter->value());
      } else if (const auto* gauge = std::get_if<Gauge>(&series.metric)) {
        out += ",\"value\":" + JsonNumber(gauge->value());
      } else {
        const Histogram::Snapshot snapshot = std::get<Histogram>(series.metric).Read();
        out += ",\"buckets\":[";
        for (std::size_t i = 0; i < snapshot.cumulative.size(); ++i) {
          if (i > 0) out += ',';
          out += "{\"le\":";
          out += i < family->bounds.size() ? FormatNumber(family->bounds[i]) : "\"+Inf\"";
          out += ",\"count\":" + std::to_string(snapshot.cumulative[i]) + "}";
        }
        out += "],\"sum\":" + JsonNumber(snapshot.sum) +
               ",\"count\":" + std::to_string(snapshot.count);
      }
      out += '}';
    }
    out += "]}";
  }
  out += "},\"recent_errors\":[";
  bool first_error = true;
  for (const ErrorSample& error : errors_) {
    if (!first_error) out += ',';
    first_error = false;
    out += "{\"time\":\"" + FormatRfc3339(error.time, 3) + "\",\"kind\":";
    AppendJsonString(out, error.kind);
    out += ",\"message\":";
    AppendJsonString(out, error.message);
    out += '}';
  }
  out += "]}";
  return out;
}

Labels Scope::Prefixed(std::string_view name, const Labels& labels) const {
  if (labels_.empty()) return labels;
  registry_.AllowSeries(name, series_limit_);
  Labels all = labels_;
  all.insert(all.end(), labels.begin(), labels.end());
  return all;
}

Counter& Scope::AddCounter(std::string_view name, std::string_view help,
                           const Labels& labels) const {
  return registry_.AddCounter(name, help, Prefixed(name, labels));
}

Gauge& Scope::AddGauge(std::string_view name, std::string_view help, const Labels& labels) const {
  return registry_.AddGauge(name, help, Prefixed(name, labels));
}

Histogram& Scope::AddHistogram(std::string_view name, std::string_view help,
                               std::vector<double> bounds, const Labels& labels) const {
  return registry_.AddHistogram(name, help, std::move(bounds), Prefixed(name, labels));
}

}  // namespace outbox::observe
