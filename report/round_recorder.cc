#include "report/round_recorder.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace swarm {
namespace report {
namespace {

bool IsTerminal(v1::SiteState state) {
  return state == v1::SITE_STATE_DONE || state == v1::SITE_STATE_FAILED ||
         state == v1::SITE_STATE_ABORTED;
}

// What `value` grew by since `last` (all of it after a reset).
uint64_t Growth(uint64_t value, uint64_t last) {
  return value >= last ? value - last : value;
}

void AddPhase(v1::RoundRecord* record, const char* phase, absl::Duration time) {
  for (v1::PhaseTime& existing : *record->mutable_phases()) {
    if (existing.phase() == phase) {
      existing.set_seconds(existing.seconds() + absl::ToDoubleSeconds(time));
      return;
    }
  }
  v1::PhaseTime* added = record->add_phases();
  added->set_phase(phase);
  added->set_seconds(absl::ToDoubleSeconds(time));
}

}  // namespace

const char* PhaseOf(v1::SiteState state, bool job_running) {
  switch (state) {
    case v1::SITE_STATE_IDLE:
      return job_running ? "waiting_for_task" : nullptr;
    case v1::SITE_STATE_TRAINING:
      return "training";
    case v1::SITE_STATE_WAITING_FOR_PERMISSION:
      return "waiting_for_permission";
    case v1::SITE_STATE_SUBMITTING:
      return "submitting";
    case v1::SITE_STATE_GATHERING:
      return "gathering";
    case v1::SITE_STATE_AGGREGATING:
      return "aggregating";
    case v1::SITE_STATE_DISTRIBUTING:
      return "distributing";
    default:
      return nullptr;
  }
}

RoundRecorder::RoundRecorder(int max_jobs, int max_rounds)
    : max_jobs_(max_jobs < 1 ? 1 : max_jobs),
      max_rounds_(max_rounds < 1 ? 1 : max_rounds) {}

RoundRecorder::Job* RoundRecorder::JobFor(const std::string& id) {
  for (Job& job : jobs_) {
    if (job.id == id) return &job;
  }
  while (static_cast<int>(jobs_.size()) >= max_jobs_) jobs_.pop_front();
  jobs_.emplace_back();
  jobs_.back().id = id;
  return &jobs_.back();
}

v1::RoundRecord* RoundRecorder::Record(Job* job, uint32_t round) {
  auto [it, added] = job->rounds.try_emplace(round);
  if (added) {
    it->second.set_round(round);
    while (static_cast<int>(job->rounds.size()) > max_rounds_ &&
           job->rounds.begin()->first != round) {
      job->rounds.erase(job->rounds.begin());
    }
  }
  return &it->second;
}

void RoundRecorder::CloseRound(Job* job, v1::RoundRecord* record,
                               absl::Time now, Traffic traffic) {
  record->set_seconds(record->seconds() +
                      absl::ToDoubleSeconds(now - job->round_since));
  record->set_bytes_sent(record->bytes_sent() +
                         Growth(traffic.sent, job->round_traffic.sent));
  record->set_bytes_received(
      record->bytes_received() +
      Growth(traffic.received, job->round_traffic.received));
}

void RoundRecorder::CreditCounters(Job* job, const v1::SiteStatus& s) {
  const v1::SiteCounters& c = s.counters();
  const v1::SiteCounters& before = job->last.counters();
  const uint32_t credit_round = job->seen ? job->last.round() : s.round();
  const uint64_t trained = Growth(c.rounds_trained(), before.rounds_trained());
  const uint64_t completed =
      Growth(c.rounds_completed(), before.rounds_completed());
  const uint64_t accepted =
      Growth(c.results_accepted(), before.results_accepted());
  const uint64_t rejected =
      Growth(c.results_rejected(), before.results_rejected());
  const uint64_t dropped =
      Growth(c.trainers_dropped(), before.trainers_dropped());
  const uint64_t failovers = Growth(c.failovers(), before.failovers());
  const uint64_t taken_over =
      Growth(c.rounds_taken_over(), before.rounds_taken_over());
  const uint64_t discarded =
      Growth(c.discarded_aggregates(), before.discarded_aggregates());
  const uint64_t rejoins = Growth(c.rejoins(), before.rejoins());
  if (trained + completed + accepted + rejected + dropped + failovers +
          taken_over + discarded + rejoins >
      0) {
    v1::RoundRecord* r = Record(job, credit_round);
    if (trained > 0) {
      r->set_trained(true);
      // The learner reports its validation of the round's input model with
      // its result.
      *r->mutable_metrics() = s.metrics();
    }
    if (completed > 0) r->set_aggregated(true);
    r->set_results_accepted(r->results_accepted() + accepted);
    r->set_results_rejected(r->results_rejected() + rejected);
    r->set_trainers_dropped(r->trainers_dropped() + dropped);
    r->set_failovers(r->failovers() + failovers);
    r->set_rounds_taken_over(r->rounds_taken_over() + taken_over);
    r->set_discarded_aggregates(r->discarded_aggregates() + discarded);
    r->set_rejoins(r->rejoins() + rejoins);
  }
}

void RoundRecorder::TrackOpenRound(Job* job, const v1::SiteStatus& s,
                                   bool round_state, absl::Time now,
                                   Traffic traffic) {
  const v1::SiteState state = s.state();
  if (round_state) job->running = true;
  if (round_state && job->open_round != s.round()) {
    if (job->open_round.has_value()) {
      CloseRound(job, Record(job, *job->open_round), now, traffic);
    }
    v1::RoundRecord* r = Record(job, s.round());
    if (r->start_time_ms() == 0) r->set_start_time_ms(absl::ToUnixMillis(now));
    job->open_round = s.round();
    job->round_since = now;
    job->round_traffic = traffic;
  } else if (IsTerminal(state) && job->open_round.has_value()) {
    v1::RoundRecord* r = Record(job, *job->open_round);
    CloseRound(job, r, now, traffic);
    if (state != v1::SITE_STATE_DONE) {
      r->set_outcome(
          absl::StrCat(state == v1::SITE_STATE_FAILED ? "failed" : "aborted",
                       s.end_reason().empty() ? "" : ": ", s.end_reason()));
    }
    job->open_round.reset();
  }
}

void RoundRecorder::Observe(const v1::StatusReply& reply, absl::Time now,
                            Traffic traffic) {
  const v1::SiteStatus& s = reply.status();
  if (s.job_id().empty()) return;
  absl::MutexLock lock(&mu_);
  site_ = s.site();
  Job* job = JobFor(s.job_id());
  const v1::SiteState state = s.state();
  const bool round_state =
      state != v1::SITE_STATE_IDLE && PhaseOf(state, true) != nullptr;
  const bool changed =
      !job->seen || state != job->state || s.round() != job->state_round;

  // The phase that just ended.
  if (job->seen && changed) {
    if (const char* phase = PhaseOf(job->state, job->running)) {
      AddPhase(Record(job, job->state_round), phase, now - job->state_since);
    }
  }
  if (changed) {
    job->state = state;
    job->state_round = s.round();
    job->state_since = now;
  }

  // What the counters grew by, credited to the round of the status before.
  CreditCounters(job, s);
  // The round under way: from its first status to the next round's, or to
  // the end of the job.
  TrackOpenRound(job, s, round_state, now, traffic);

  // What the status says of its round.
  if (round_state || (state == v1::SITE_STATE_IDLE && job->running)) {
    v1::RoundRecord* r = Record(job, s.round());
    r->set_attempt(s.attempt());
    if (!s.aggregator().empty()) r->set_aggregator(s.aggregator());
    if (s.best().present()) *r->mutable_best() = s.best();
    if (r->trained() && !s.metrics().empty())
      *r->mutable_metrics() = s.metrics();
  }
  // The site's privacy spend as it stands at the latest status of the round:
  // at the round's end, what its training up to then cost.
  if (s.has_privacy() && (job->running || round_state)) {
    v1::RoundRecord* r = Record(job, s.round());
    r->set_privacy_epsilon(s.privacy().epsilon());
    r->set_privacy_delta(s.privacy().delta());
  }
  job->last = s;
  job->last_traffic = traffic;
  job->seen = true;
}

v1::HistoryReply RoundRecorder::History(const std::string& job_id,
                                        absl::Time now) const {
  absl::MutexLock lock(&mu_);
  v1::HistoryReply reply;
  reply.set_site(site_);
  const Job* found = nullptr;
  for (const Job& job : jobs_) {
    if (job_id.empty() || job.id == job_id) found = &job;
  }
  if (found == nullptr) {
    reply.set_job_id(job_id);
    return reply;
  }
  const Job& job = *found;
  reply.set_known(true);
  reply.set_job_id(job.id);
  reply.set_state(job.last.state());
  reply.set_end_reason(job.last.end_reason());
  reply.set_last_error(job.last.last_error());
  reply.set_rejoins(job.last.counters().rejoins());
  *reply.mutable_failovers() = job.last.failovers();
  for (const auto& [round, record] : job.rounds) {
    v1::RoundRecord* r = reply.add_rounds();
    *r = record;
    if (job.open_round == round) {
      r->set_seconds(r->seconds() +
                     absl::ToDoubleSeconds(now - job.round_since));
      r->set_bytes_sent(r->bytes_sent() +
                        Growth(job.last_traffic.sent, job.round_traffic.sent));
      r->set_bytes_received(
          r->bytes_received() +
          Growth(job.last_traffic.received, job.round_traffic.received));
      r->set_outcome("running");
    }
  }
  return reply;
}

}  // namespace report
}  // namespace swarm
