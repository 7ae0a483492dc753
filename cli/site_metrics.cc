#include "cli/site_metrics.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace swarm {
namespace {

// Seconds: 10 ms .. 1 h, for phases of a test job and of a day-long job.
const std::vector<double>& DurationBuckets() {
  static const auto* buckets = new std::vector<double>{
      0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,    2.5,  5,
      10,   30,    60,   120, 300,  600, 1800, 3600, 7200};
  return *buckets;
}

bool IsTerminal(v1::SiteState state) {
  return state == v1::SITE_STATE_DONE || state == v1::SITE_STATE_FAILED ||
         state == v1::SITE_STATE_ABORTED;
}

// "training" for SITE_STATE_TRAINING.
std::string StateLabel(v1::SiteState state) {
  return absl::AsciiStrToLower(
      absl::StripPrefix(v1::SiteState_Name(state), "SITE_STATE_"));
}

template <typename T>
T* Child(Family<T>* family, const std::vector<std::string>& labels) {
  // The label count is fixed by the code below, so this cannot fail.
  return *family->WithLabels(labels);
}

// Adds metric families to a registry, none after the first that fails;
// status() is that failure.
class FamilyAdder {
 public:
  explicit FamilyAdder(MetricsRegistry* registry) : registry_(registry) {}

  void AddCounter(CounterFamily** out, const char* name, const char* help,
                  std::vector<std::string> labels) {
    if (!status_.ok()) return;
    absl::StatusOr<CounterFamily*> added =
        registry_->AddCounter(name, help, labels);
    if (added.ok()) *out = *added;
    status_ = added.status();
  }
  void AddGauge(GaugeFamily** out, const char* name, const char* help,
                std::vector<std::string> labels) {
    if (!status_.ok()) return;
    absl::StatusOr<GaugeFamily*> added =
        registry_->AddGauge(name, help, labels);
    if (added.ok()) *out = *added;
    status_ = added.status();
  }
  void AddHistogram(HistogramFamily** out, const char* name, const char* help,
                    std::vector<std::string> labels) {
    if (!status_.ok()) return;
    absl::StatusOr<HistogramFamily*> added =
        registry_->AddHistogram(name, help, labels, DurationBuckets());
    if (added.ok()) *out = *added;
    status_ = added.status();
  }
  const absl::Status& status() const { return status_; }

 private:
  MetricsRegistry* const registry_;
  absl::Status status_;
};

}  // namespace

struct SiteMetrics::Families {
  HistogramFamily* round_seconds = nullptr;
  HistogramFamily* phase_seconds = nullptr;
  CounterFamily* rounds_completed = nullptr;
  CounterFamily* rounds_trained = nullptr;
  CounterFamily* results_accepted = nullptr;
  CounterFamily* results_rejected = nullptr;
  CounterFamily* permissions_granted = nullptr;
  CounterFamily* permission_retries = nullptr;
  CounterFamily* permissions_expired = nullptr;
  CounterFamily* results_late = nullptr;
  CounterFamily* results_failed = nullptr;
  CounterFamily* failovers = nullptr;
  CounterFamily* rounds_taken_over = nullptr;
  CounterFamily* discarded_aggregates = nullptr;
  CounterFamily* trainers_dropped = nullptr;
  CounterFamily* rejoins = nullptr;
  CounterFamily* jobs_ended = nullptr;
  CounterFamily* status_changes = nullptr;
  GaugeFamily* round = nullptr;
  GaugeFamily* state = nullptr;
  GaugeFamily* aggregator = nullptr;
  GaugeFamily* best_metric = nullptr;
  GaugeFamily* best_round = nullptr;
  GaugeFamily* validation = nullptr;
  GaugeFamily* in_flight = nullptr;
  GaugeFamily* max_in_flight = nullptr;
  GaugeFamily* job_info = nullptr;
  GaugeFamily* last_error = nullptr;
  GaugeFamily* privacy_epsilon = nullptr;
  GaugeFamily* privacy_budget = nullptr;
  GaugeFamily* privacy_exhausted = nullptr;

  // Register the histogram and counter families; the gauge families. The
  // registry's error on a clash.
  absl::Status AddHistogramsAndCounters(MetricsRegistry* registry);
  absl::Status AddGauges(MetricsRegistry* registry);
};

absl::Status SiteMetrics::Families::AddHistogramsAndCounters(
    MetricsRegistry* registry) {
  FamilyAdder add(registry);
  add.AddHistogram(
      &round_seconds, "swarm_round_duration_seconds",
      "Time this site spent in a round: from the first status of the "
      "round to the next round's (or the end of the job).",
      {"site"});
  add.AddHistogram(
      &phase_seconds, "swarm_phase_seconds",
      "Time this site spent in one phase of a round (a state of the "
      "site: waiting_for_task, training, waiting_for_permission, "
      "submitting, gathering, aggregating, distributing).",
      {"site", "phase"});
  add.AddCounter(&rounds_completed, "swarm_rounds_completed_total",
                 "Rounds this site aggregated (closed and judged).", {"site"});
  add.AddCounter(
      &rounds_trained, "swarm_rounds_trained_total",
      "Results this site's learner produced (one per round trained).",
      {"site"});
  add.AddCounter(&results_accepted, "swarm_results_accepted_total",
                 "Results this site accepted as a round's aggregator.",
                 {"site"});
  add.AddCounter(&results_rejected, "swarm_results_rejected_total",
                 "Results this site refused as a round's aggregator.",
                 {"site"});
  add.AddCounter(
      &permissions_granted, "swarm_permissions_granted_total",
      "Requests to submit this site granted as a round's aggregator.",
      {"site"});
  add.AddCounter(
      &permission_retries, "swarm_permission_retries_total",
      "RETRY answers this site gave to requests to submit as a round's "
      "aggregator (slots busy, round not open yet).",
      {"site"});
  add.AddCounter(&permissions_expired, "swarm_permissions_expired_total",
                 "Permissions this site granted whose lease ran out unused.",
                 {"site"});
  add.AddCounter(
      &results_late, "swarm_results_late_total",
      "Of the results accepted, those of an earlier round (counted late, "
      "into the round open then).",
      {"site"});
  add.AddCounter(
      &results_failed, "swarm_results_failed_total",
      "Uploads of results to this site that failed or broke before their "
      "end (their slot freed).",
      {"site"});
  add.AddCounter(
      &failovers, "swarm_failovers_total",
      "Rounds this site handed to a backup aggregator (it could not reach "
      "the round's aggregator).",
      {"site"});
  add.AddCounter(&rounds_taken_over, "swarm_rounds_taken_over_total",
                 "Rounds this site took over as a backup aggregator.",
                 {"site"});
  add.AddCounter(&discarded_aggregates, "swarm_discarded_aggregates_total",
                 "Aggregates of a losing chain this site dropped.", {"site"});
  add.AddCounter(
      &trainers_dropped, "swarm_trainers_dropped_total",
      "Expected trainers this site stopped waiting for as aggregator "
      "(down or silent).",
      {"site"});
  add.AddCounter(
      &rejoins, "swarm_rejoins_total",
      "Learn tasks this site accepted after its daemon reloaded the job "
      "on a restart.",
      {"site"});
  add.AddCounter(&jobs_ended, "swarm_jobs_ended_total",
                 "Jobs that ended at this site while it ran, by outcome (done, "
                 "failed, aborted).",
                 {"site", "outcome"});
  add.AddCounter(&status_changes, "swarm_status_changes_total",
                 "Status changes the metrics watcher saw.", {"site"});
  return add.status();
}

absl::Status SiteMetrics::Families::AddGauges(MetricsRegistry* registry) {
  FamilyAdder add(registry);
  add.AddGauge(&round, "swarm_round", "The round this site is in (last task).",
               {"site"});
  add.AddGauge(&state, "swarm_state",
               "1 for the site's current state, 0 for the others.",
               {"site", "state"});
  add.AddGauge(&aggregator, "swarm_is_aggregator",
               "1 while this site aggregates the current round.", {"site"});
  add.AddGauge(&best_metric, "swarm_best_metric",
               "Validation metric of the best global model so far.", {"site"});
  add.AddGauge(&best_round, "swarm_best_metric_round",
               "Round whose global model is the best so far.", {"site"});
  add.AddGauge(&validation, "swarm_validation_metric",
               "This site's latest validation metrics (of the global model it "
               "last received), by metric name.",
               {"site", "metric"});
  add.AddGauge(&in_flight, "swarm_submissions_in_flight",
               "Submissions streaming to this site now (as aggregator).",
               {"site"});
  add.AddGauge(&max_in_flight, "swarm_submissions_in_flight_max",
               "Most submissions ever in flight at once at this site.",
               {"site"});
  add.AddGauge(&job_info, "swarm_job_info",
               "1 for the job this site runs (label job), 0 for earlier jobs.",
               {"site", "job"});
  add.AddGauge(&last_error, "swarm_last_error_timestamp_seconds",
               "Unix time of this site's last reported error (0: none).",
               {"site"});
  add.AddGauge(&privacy_epsilon, "swarm_privacy_epsilon",
               "Differential privacy spent on this site's training data in the "
               "current job: epsilon for the site's delta (label delta).",
               {"site", "delta"});
  add.AddGauge(&privacy_budget, "swarm_privacy_budget_epsilon",
               "The site's privacy budget (max_epsilon; 0: none).", {"site"});
  add.AddGauge(&privacy_exhausted, "swarm_privacy_budget_exhausted",
               "1 once the site stopped training for the job at its privacy "
               "budget.",
               {"site"});
  return add.status();
}

absl::StatusOr<std::unique_ptr<SiteMetrics>> SiteMetrics::Create(
    MetricsRegistry* registry, std::string site) {
  auto families = std::make_unique<Families>();
  if (absl::Status added = families->AddHistogramsAndCounters(registry);
      !added.ok()) {
    return added;
  }
  if (absl::Status added = families->AddGauges(registry); !added.ok()) {
    return added;
  }
  return std::unique_ptr<SiteMetrics>(
      new SiteMetrics(std::move(site), std::move(families)));
}

SiteMetrics::SiteMetrics(std::string site, std::unique_ptr<Families> families)
    : site_(std::move(site)), families_(std::move(families)) {
  // Every state's gauge exists from the start (0), so that a query for the
  // current state has no gaps.
  for (int s = v1::SiteState_MIN; s <= v1::SiteState_MAX; ++s) {
    if (!v1::SiteState_IsValid(s)) continue;
    Child(families_->state, {site_, StateLabel(static_cast<v1::SiteState>(s))})
        ->Set(s == v1::SITE_STATE_IDLE ? 1 : 0);
  }
  // The counters and the round histogram show 0 before the first job.
  for (CounterFamily* family :
       {families_->rounds_completed, families_->rounds_trained,
        families_->results_accepted, families_->results_rejected,
        families_->permissions_granted, families_->status_changes,
        families_->permission_retries, families_->permissions_expired,
        families_->results_late, families_->results_failed,
        families_->failovers, families_->rounds_taken_over,
        families_->discarded_aggregates, families_->trainers_dropped,
        families_->rejoins}) {
    Child(family, {site_});
  }
  Child(families_->round_seconds, {site_});
}

SiteMetrics::~SiteMetrics() = default;

void SiteMetrics::Count(CounterFamily* family, uint64_t value, uint64_t* last) {
  // Less than last time: the counters started again (a new job).
  const uint64_t delta = value >= *last ? value - *last : value;
  *last = value;
  if (delta > 0) {
    Child(family, {site_})->Inc(static_cast<double>(delta)).IgnoreError();
  }
}

void SiteMetrics::ObserveCounters(const v1::SiteCounters& counters) {
  Count(families_->permissions_granted, counters.submissions_granted(),
        &last_granted_);
  Count(families_->results_accepted, counters.results_accepted(),
        &last_accepted_);
  Count(families_->results_rejected, counters.results_rejected(),
        &last_rejected_);
  Count(families_->rounds_completed, counters.rounds_completed(),
        &last_completed_);
  Count(families_->rounds_trained, counters.rounds_trained(), &last_trained_);
  Count(families_->failovers, counters.failovers(), &last_failovers_);
  Count(families_->rounds_taken_over, counters.rounds_taken_over(),
        &last_taken_over_);
  Count(families_->discarded_aggregates, counters.discarded_aggregates(),
        &last_discarded_);
  Count(families_->trainers_dropped, counters.trainers_dropped(),
        &last_dropped_);
  Count(families_->rejoins, counters.rejoins(), &last_rejoins_);
  Count(families_->permission_retries, counters.permission_retries(),
        &last_retries_);
  Count(families_->permissions_expired, counters.permissions_expired(),
        &last_expired_);
  Count(families_->results_late, counters.results_late(), &last_late_);
  Count(families_->results_failed, counters.results_failed(), &last_failed_);
}

void SiteMetrics::ObserveGauges(const v1::SiteStatus& status) {
  Families& f = *families_;
  Child(f.round, {site_})->Set(status.round());
  for (int s = v1::SiteState_MIN; s <= v1::SiteState_MAX; ++s) {
    if (!v1::SiteState_IsValid(s)) continue;
    Child(f.state, {site_, StateLabel(static_cast<v1::SiteState>(s))})
        ->Set(s == status.state() ? 1 : 0);
  }
  Child(f.aggregator, {site_})->Set(status.role().aggregator() ? 1 : 0);
  if (status.best().present()) {
    Child(f.best_metric, {site_})->Set(status.best().metric());
    Child(f.best_round, {site_})->Set(status.best().round());
  }
  for (const auto& [name, value] : status.metrics()) {
    Child(f.validation, {site_, name})->Set(value);
  }
  Child(f.in_flight, {site_})
      ->Set(static_cast<double>(status.counters().submissions_in_flight()));
  Child(f.max_in_flight, {site_})
      ->Set(static_cast<double>(status.counters().max_submissions_in_flight()));
  if (status.has_privacy()) {
    const v1::PrivacySpent& privacy = status.privacy();
    Child(f.privacy_epsilon, {site_, absl::StrFormat("%g", privacy.delta())})
        ->Set(privacy.epsilon());
    Child(f.privacy_budget, {site_})->Set(privacy.max_epsilon());
    Child(f.privacy_exhausted, {site_})
        ->Set(privacy.budget_exhausted() ? 1 : 0);
  }
  if (status.last_error_time_ms() != last_error_time_ms_) {
    last_error_time_ms_ = status.last_error_time_ms();
    Child(f.last_error, {site_})->Set(status.last_error_time_ms() / 1000.0);
  }
}

void SiteMetrics::ObservePhases(const v1::SiteStatus& status, absl::Time now) {
  Families& f = *families_;
  const v1::SiteState state = status.state();
  // The phase that just ended, if any.
  if (seen_ && (state != state_ || status.round() != state_round_)) {
    if (const char* phase = report::PhaseOf(state_, job_running_)) {
      Child(f.phase_seconds, {site_, phase})
          ->Observe(absl::ToDoubleSeconds(now - state_since_));
    }
  }
  if (!seen_ || state != state_ || status.round() != state_round_) {
    state_ = state;
    state_round_ = status.round();
    state_since_ = now;
    seen_ = true;
  }
  const bool in_round =
      state != v1::SITE_STATE_IDLE && report::PhaseOf(state, true) != nullptr;
  if (in_round) job_running_ = true;
  // The round: from the first status in it to the next round or the end.
  if (in_round && round_ != status.round()) {
    if (round_.has_value()) {
      Child(f.round_seconds, {site_})
          ->Observe(absl::ToDoubleSeconds(now - round_since_));
    }
    round_ = status.round();
    round_since_ = now;
  } else if (!in_round && state != v1::SITE_STATE_IDLE && round_.has_value()) {
    // Done: the last round ended here. Failed or aborted: it did not end.
    if (state == v1::SITE_STATE_DONE) {
      Child(f.round_seconds, {site_})
          ->Observe(absl::ToDoubleSeconds(now - round_since_));
    }
    round_.reset();
  }
}

void SiteMetrics::Observe(const v1::StatusReply& reply, absl::Time now) {
  const v1::SiteStatus& status = reply.status();
  absl::MutexLock lock(&mu_);
  Child(families_->status_changes, {site_})->Inc().IgnoreError();
  if (status.job_id() != job_) {
    // Another job: its counters start from 0; the old one's phase and round
    // are not measured further.
    if (!job_.empty()) Child(families_->job_info, {site_, job_})->Set(0);
    job_ = status.job_id();
    job_running_ = false;
    seen_ = false;
    round_.reset();
    last_granted_ = last_accepted_ = last_rejected_ = last_completed_ =
        last_trained_ = last_failovers_ = last_taken_over_ = last_discarded_ =
            last_dropped_ = last_rejoins_ = 0;
  } else if (seen_ && !IsTerminal(state_) && IsTerminal(status.state())) {
    Child(families_->jobs_ended, {site_, StateLabel(status.state())})
        ->Inc()
        .IgnoreError();
  }
  if (!job_.empty()) Child(families_->job_info, {site_, job_})->Set(1);
  ObserveCounters(status.counters());
  ObserveGauges(status);
  ObservePhases(status, now);
}

StatusWatcher::StatusWatcher(WaitFn wait, ObserveFn observe,
                             absl::Duration poll, absl::Duration min_interval)
    : wait_(std::move(wait)),
      observe_(std::move(observe)),
      poll_(poll),
      min_interval_(min_interval) {}

StatusWatcher::~StatusWatcher() { Stop(); }

void StatusWatcher::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void StatusWatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void StatusWatcher::Loop() {
  while (true) {
    uint64_t known_version = ~uint64_t{0};  // The first look returns at once.
    uint64_t after_change = 0;
    absl::Time deadline = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (last_.has_value()) {
        known_version = last_->version();
        deadline += poll_;
      }
      after_change = last_change_;
    }
    const Watched watched = wait_(known_version, after_change, deadline);
    if (watched.reply.version() == known_version) continue;  // Poll ran out.
    {
      absl::MutexLock lock(&mu_);
      Deliver(watched, absl::Now());
    }
    // Changes until the next look wait in the journal, with their times.
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&stopping_),
                          absl::Now() + min_interval_);
  }
}

void StatusWatcher::LookNow() {
  absl::MutexLock lock(&mu_);
  // Under mu_: the watcher's thread cannot deliver an older look after this
  // one (it skips what was delivered).
  Deliver(wait_(~uint64_t{0}, last_change_, absl::Now()), absl::Now());
}

void StatusWatcher::Deliver(const Watched& watched, absl::Time now) {
  if (last_.has_value() && watched.reply.version() <= last_->version()) {
    return;  // LookNow delivered this or a newer one meanwhile.
  }
  if (last_.has_value()) {
    // Each change as the status it made: this status with the change's
    // state, round, counters and metrics.
    v1::StatusReply step = watched.reply;
    v1::SiteStatus* status = step.mutable_status();
    status->set_state(last_->status().state());
    status->set_round(last_->status().round());
    for (const StateChange& change : watched.changes) {
      if (change.seq <= last_change_) continue;
      if (change.state == status->state() && change.round == status->round()) {
        continue;
      }
      status->set_state(change.state);
      status->set_round(change.round);
      *status->mutable_counters() = change.counters;
      status->mutable_metrics()->clear();
      for (const auto& [name, value] : change.metrics) {
        (*status->mutable_metrics())[name] = value;
      }
      // Times do not go back (nor past the look).
      last_time_ = std::min(std::max(change.at, last_time_), now);
      observe_(step, last_time_);
    }
  }
  if (!watched.changes.empty()) {
    last_change_ = std::max(last_change_, watched.changes.back().seq);
  }
  last_ = watched.reply;
  last_time_ = now;
  observe_(watched.reply, now);
}

}  // namespace swarm
