#pragma once
// Metrics (STYLE.md point 9): components write counters, gauges and histograms into a Registry;
// the Registry alone renders them, as Prometheus text (exposition format 0.0.4) and as JSON.
//
// Cardinality is bounded by construction: every series (a metric name plus one fixed set of label
// values) is registered when a component starts, and the component keeps the returned reference.
// A family holds at most kMaxSeriesPerFamily series, or what AllowSeries grants a family whose
// series follow the configuration (one per target: SeriesPerTarget); registering more throws.
// Hot paths then
// touch atomics only: no lookup, allocation or lock per event (Counter::Increment is one atomic
// add, Histogram::Observe a bucket search over its fixed bounds and three atomic adds).
//
// Threading: every member is thread-safe. Registration, RecordError and rendering take the
// registry's mutex; updating a series never does. A rendering is not an atomic snapshot of all
// series, but each histogram is rendered self-consistent (its _count equals its +Inf bucket).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace outbox::observe {

// Label names and values of one series, in the order given at registration.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A monotonically increasing count.
class Counter {
 public:
  void Increment(std::uint64_t by = 1) { value_.fetch_add(by, std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  [[nodiscard]] double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into fixed buckets: bucket i counts values <= bounds[i]; one more bucket
// (+Inf) counts the rest.
class Histogram {
 public:
  // `bounds`: finite, strictly increasing, at most 64 of them; throws std::invalid_argument.
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);

  struct Snapshot {
    std::vector<std::uint64_t> cumulative;  // per bound, then +Inf (= count)
    double sum = 0.0;
    std::uint64_t count = 0;
  };
  [[nodiscard]] Snapshot Read() const;
  [[nodiscard]] const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> buckets_;  // bounds_.size() + 1, not cumulative
  std::atomic<double> sum_{0.0};
};

// Bucket bounds for durations in seconds: 1 ms to 5 min.
std::vector<double> LatencyBuckets();
// Bucket bounds for batch sizes: 1 to 10000.
std::vector<double> SizeBuckets();

// The one rule for a family whose series follow the configuration, one series per configured
// target (sink) of each database (outbox_relay_target_paused{target}, outbox_sink_reachable{sink};
// with several databases, a database label too): databases x targets, and never less than
// Registry::kMaxSeriesPerFamily. The configuration bounds such a family, not a constant: give the
// result to Registry::AllowSeries before registering the family's series.
std::size_t SeriesPerTarget(std::size_t databases, std::size_t targets);

// One entry of the recent-errors sample.
struct ErrorSample {
  std::chrono::system_clock::time_point time;
  std::string kind;     // a fixed word, e.g. a FailureKind name ("rejected") or "store"
  std::string message;  // human-readable; must not hold secrets (callers mask them)
};

class Registry {
 public:
  static constexpr std::size_t kMaxSeriesPerFamily = 64;
  static constexpr std::size_t kMaxRecentErrors = 20;
  static constexpr std::size_t kMaxErrorMessageBytes = 512;

  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers the series `name`{labels} and returns it; registering the same series again returns
  // the same object. Throws std::invalid_argument for a malformed metric or label name, a label
  // set whose names differ from the family's, a name already registered as another type (or a
  // histogram with other bounds), and std::length_error past the family's limit of series
  // (kMaxSeriesPerFamily unless AllowSeries granted more).
  // `help` is taken from the first registration of a family.
  //
  // AllowSeries lets the family `name` hold up to `limit` series (never fewer than
  // kMaxSeriesPerFamily; the largest limit granted holds), for families whose series the
  // configuration decides: pass SeriesPerTarget(...). Call it before registering them; a family
  // need not exist yet.
  void AllowSeries(std::string_view name, std::size_t limit);
  Counter& AddCounter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& AddGauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Histogram& AddHistogram(std::string_view name, std::string_view help, std::vector<double> bounds,
                          const Labels& labels = {});

  // A gauge family whose series are all replaced at once, for values read from elsewhere (e.g.
  // counts grouped by label in a database): the family `name` then has exactly `series`, in that
  // order. The family is created on first use and must not also be registered with AddGauge
  // (nobody may hold a reference to one of its series). Cardinality stays bounded: the caller caps
  // `series` (it throws std::length_error past the family's limit). Throws std::invalid_argument
  // like AddGauge, and when the series' label names differ from each other's or the family's.
  // An empty `series` leaves the family with HELP and TYPE only.
  void ReplaceGauges(std::string_view name, std::string_view help,
                     const std::vector<std::pair<Labels, double>>& series);

  // Keeps the last kMaxRecentErrors errors (messages cut to kMaxErrorMessageBytes). For failures,
  // not for every message: it takes the registry's mutex.
  void RecordError(std::string_view kind, std::string_view message);
  [[nodiscard]] std::vector<ErrorSample> RecentErrors() const;

  // Every family in registration order, each series in registration order:
  //   # HELP <name> <help>
  //   # TYPE <name> counter|gauge|histogram
  //   <name>{<label>="<value>",...} <value>
  // with histograms as <name>_bucket{...,le="<bound>"} (cumulative, ending with le="+Inf"),
  // <name>_sum and <name>_count. Label values escape \ " and newline; help escapes \ and newline.
  [[nodiscard]] std::string RenderPrometheus() const;

  // The same data as one JSON object:
  //   {"metrics": {"<name>": {"type": "counter", "help": "...",
  //                           "series": [{"labels": {"reason": "rejected"}, "value": 3}]},
  //                "<histogram>": {"type": "histogram", "help": "...",
  //                                "series": [{"labels": {}, "buckets": [{"le": 0.005,
  //                                "count": 1}, ..., {"le": "+Inf", "count": 9}], "sum": 0.42,
  //                                "count": 9}]}},
  //    "recent_errors": [{"time": "2024-05-01T12:00:00.123Z", "kind": "rejected",
  //                       "message": "..."}]}   (oldest first)
  // Non-finite gauge values are null; invalid UTF-8 in strings becomes U+FFFD.
  [[nodiscard]] std::string RenderJson() const;

 private:
  struct Family;
  struct Series;
  Series& Add(std::string_view name, std::string_view help, int type, const Labels& labels,
              const std::vector<double>* bounds);
  // The family `name` (created when new), checked to be of `type`; mutex_ must be held.
  Family& FindOrCreate(std::string_view name, std::string_view help, int type,
                       const std::vector<double>* bounds, bool replaced);
  // The most series the family `name` may hold; mutex_ must be held.
  [[nodiscard]] std::size_t SeriesLimit(std::string_view name) const;

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Family>> families_;  // guarded by mutex_
  std::deque<ErrorSample> errors_;                 // guarded by mutex_
  // AllowSeries' grants, by family name.
  std::vector<std::pair<std::string, std::size_t>> series_limits_;  // guarded by mutex_
};

// A registry seen by one of several components of a kind, each with labels of its own first
// (the relay of each database of a process: {database="a"}): every series registered through it
// carries `labels` before its own. With labels, each family it registers may hold `series_limit`
// series (Registry::AllowSeries): the owner of the components bounds how many there are.
class Scope {
 public:
  // NOLINTNEXTLINE(google-explicit-constructor): a registry is the scope without labels
  Scope(Registry& registry) : registry_(registry) {}
  Scope(Registry& registry, Labels labels, std::size_t series_limit)
      : registry_(registry), labels_(std::move(labels)), series_limit_(series_limit) {}

  Counter& AddCounter(std::string_view name, std::string_view help,
                      const Labels& labels = {}) const;
  Gauge& AddGauge(std::string_view name, std::string_view help, const Labels& labels = {}) const;
  Histogram& AddHistogram(std::string_view name, std::string_view help, std::vector<double> bounds,
                          const Labels& labels = {}) const;
  [[nodiscard]] Registry& registry() const { return registry_; }
  [[nodiscard]] const Labels& labels() const { return labels_; }

 private:
  // `labels` after the scope's; grants the family its limit when the scope has labels.
  [[nodiscard]] Labels Prefixed(std::string_view name, const Labels& labels) const;

  Registry& registry_;
  Labels labels_;
  std::size_t series_limit_ = 0;
};

}  // namespace outbox::observe
