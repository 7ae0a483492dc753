#include "gatherer/gatherer.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace swarm {
namespace {

absl::Duration NonNegative(absl::Duration d) {
  return d < absl::ZeroDuration() ? absl::ZeroDuration() : d;
}

std::string MetricNameOrDefault(std::string name) {
  return name.empty() ? std::string("accuracy") : std::move(name);
}

PermissionDecision Permission(v1::Outcome outcome, PermissionCode code,
                              std::string message) {
  return PermissionDecision{outcome, code, std::move(message)};
}

ResultDecision Result(ResultCode code, std::string message) {
  return ResultDecision{code, std::move(message)};
}

}  // namespace

absl::string_view PermissionCodeName(PermissionCode code) {
  switch (code) {
    case PermissionCode::kGranted:
      return "granted";
    case PermissionCode::kAlreadyHeld:
      return "already_held";
    case PermissionCode::kSlotsBusy:
      return "slots_busy";
    case PermissionCode::kRoundNotOpen:
      return "round_not_open";
    case PermissionCode::kNotTrainer:
      return "not_trainer";
    case PermissionCode::kRoundClosed:
      return "round_closed";
    case PermissionCode::kInPartialSum:
      return "in_partial_sum";
    case PermissionCode::kAlreadySubmitted:
      return "already_submitted";
  }
  return "unknown";
}

absl::string_view ResultCodeName(ResultCode code) {
  switch (code) {
    case ResultCode::kAccepted:
      return "accepted";
    case ResultCode::kLate:
      return "late";
    case ResultCode::kDuplicate:
      return "duplicate";
    case ResultCode::kRejected:
      return "rejected";
    case ResultCode::kError:
      return "error";
  }
  return "unknown";
}

absl::string_view DoneReasonName(DoneReason reason) {
  switch (reason) {
    case DoneReason::kNotDone:
      return "not_done";
    case DoneReason::kAllResponded:
      return "all_responded";
    case DoneReason::kGraceAfterMinimum:
      return "grace_after_minimum";
    case DoneReason::kTimeout:
      return "timeout";
    case DoneReason::kNoTrainers:
      return "no_trainers";
  }
  return "unknown";
}

v1::Outcome ResultDecision::outcome() const {
  switch (code) {
    case ResultCode::kAccepted:
    case ResultCode::kLate:
      return v1::OUTCOME_OK;
    case ResultCode::kDuplicate:
    case ResultCode::kRejected:
      return v1::OUTCOME_REJECTED;
    case ResultCode::kError:
      break;
  }
  return v1::OUTCOME_BAD_REQUEST;
}

Gatherer::Gatherer(GathererOptions options, MetricComparator comparator)
    : round_(options.round),
      min_required_(options.min_responses_required),
      wait_after_min_(NonNegative(options.wait_after_min_responses)),
      round_timeout_(NonNegative(options.round_timeout)),
      max_concurrent_(static_cast<int>(
          std::max<uint32_t>(options.max_concurrent_submissions, 1))),
      lease_(NonNegative(options.permission_lease)),
      best_so_far_(std::move(options.best_so_far)),
      self_(std::move(options.self)),
      metric_name_(MetricNameOrDefault(std::move(options.metric_name))),
      open_time_(options.open_time),
      comparator_(comparator),
      score_(options.score),
      score_trim_fraction_(options.score_trim_fraction),
      max_claimed_samples_(options.max_claimed_samples),
      equal_weights_(options.equal_weights) {
  for (std::string& name : options.expected_trainers) {
    trainers_.try_emplace(std::move(name));
  }
  active_ = static_cast<int>(trainers_.size());
  SWARM_LOG_INFO(
      "round %d: gathering from %d trainer(s), minimum %d, grace %s, "
      "timeout %s, %d concurrent submission(s)",
      round_, trainers_.size(), min_responses_required(),
      absl::FormatDuration(wait_after_min_),
      absl::FormatDuration(round_timeout_), max_concurrent_);
  Evaluate(open_time_);
}

int Gatherer::min_responses_required() const {
  if (min_required_ == 0 || min_required_ > static_cast<uint32_t>(active_)) {
    return active_;
  }
  return static_cast<int>(min_required_);
}

Gatherer::TrainerState* Gatherer::FindActive(absl::string_view trainer) {
  auto it = trainers_.find(trainer);
  if (it == trainers_.end() || it->second.dropped) return nullptr;
  return &it->second;
}

bool Gatherer::HasResult(const TrainerState& state, uint32_t round,
                         uint32_t this_round) {
  if (round == this_round) return state.responded;
  return state.late_rounds_done.count(round) > 0;
}

void Gatherer::BodyReceived(absl::string_view trainer) {
  TrainerState* state = FindActive(trainer);
  if (state != nullptr && state->slot == Slot::kUploading && !report_.done) {
    state->body_in = true;
  }
}

void Gatherer::ReleaseSlot(TrainerState& state) {
  if (state.slot == Slot::kNone) return;
  state.slot = Slot::kNone;
  state.body_in = false;
  if (state.in_partial_sum) {
    state.in_partial_sum = false;
    return;
  }
  --counters_.in_flight;
}

void Gatherer::ExpireLeases(absl::Time now) {
  for (auto& [name, state] : trainers_) {
    if (state.slot == Slot::kGranted && now >= state.granted_at + lease_) {
      SWARM_LOG_INFO("round %d: permission of %s expired unused", round_, name);
      ReleaseSlot(state);
      ++counters_.expired;
    }
  }
}

void Gatherer::Evaluate(absl::Time now) {
  if (report_.done) return;
  if (active_ == 0) {
    Close(DoneReason::kNoTrainers, now);
    return;
  }
  if (responded_ >= active_) {
    Close(DoneReason::kAllResponded, now);
    return;
  }
  if (!min_reached_at_.has_value() && responded_ >= min_responses_required()) {
    min_reached_at_ = now;
  }
  // The earliest time rule that has come due wins; on a tie the grace rule
  // is named (the minimum was reached, which says more than "timed out").
  const absl::Time timeout_at = open_time_ + round_timeout_;
  const absl::Time grace_at = min_reached_at_.has_value()
                                  ? *min_reached_at_ + wait_after_min_
                                  : absl::InfiniteFuture();
  if (grace_at <= timeout_at && now >= grace_at) {
    Close(DoneReason::kGraceAfterMinimum, grace_at);
    return;
  }
  if (now >= timeout_at) {
    Close(DoneReason::kTimeout, timeout_at);
    return;
  }
  ExpireLeases(now);
}

void Gatherer::FillOutstanding(RoundReport& report) const {
  report.responded = responded_;
  report.expected = active_;
  report.missing.clear();
  report.dropped.clear();
  for (const auto& [name, state] : trainers_) {
    if (!state.responded) report.missing.push_back(name);
    if (state.dropped) report.dropped.push_back(name);
  }
}

void Gatherer::Close(DoneReason reason, absl::Time at) {
  report_.done = true;
  report_.reason = reason;
  report_.closed_at = at;
  for (auto& [name, state] : trainers_) {
    // A whole body being added keeps its slot: its completion counts.
    if (state.slot == Slot::kUploading && state.body_in) continue;
    if (state.slot == Slot::kUploading) report_.uploads_cut_off.push_back(name);
    ReleaseSlot(state);
  }
  FillOutstanding(report_);
  if (report_.missing.empty()) {
    SWARM_LOG_INFO("round %d closed (%s): %d of %d result(s)", round_,
                   DoneReasonName(reason), report_.responded, report_.expected);
  } else {
    SWARM_LOG_WARNING("round %d closed (%s): %d of %d result(s); missing: %s",
                      round_, DoneReasonName(reason), report_.responded,
                      report_.expected, absl::StrJoin(report_.missing, ", "));
  }
  if (!report_.uploads_cut_off.empty()) {
    SWARM_LOG_WARNING("round %d: uploads cut off by the close: %s", round_,
                      absl::StrJoin(report_.uploads_cut_off, ", "));
  }
}

PermissionDecision Gatherer::RequestToSubmit(absl::string_view trainer,
                                             uint32_t round, absl::Time now) {
  Evaluate(now);
  if (round > round_) {
    ++counters_.permission_retries;
    return Permission(
        v1::OUTCOME_RETRY, PermissionCode::kRoundNotOpen,
        absl::StrFormat("round %d is not open yet (gathering round %d)", round,
                        round_));
  }
  TrainerState* state = FindActive(trainer);
  if (state == nullptr) {
    ++counters_.rejected;
    return Permission(
        v1::OUTCOME_REJECTED, PermissionCode::kNotTrainer,
        absl::StrFormat("%s is not an expected trainer of round %d", trainer,
                        round_));
  }
  if (report_.done) {
    ++counters_.rejected;
    return Permission(v1::OUTCOME_REJECTED, PermissionCode::kRoundClosed,
                      absl::StrFormat("round %d is closed (%s)", round_,
                                      DoneReasonName(report_.reason)));
  }
  if (HasResult(*state, round, round_)) {
    ++counters_.rejected;
    return Permission(
        v1::OUTCOME_REJECTED, PermissionCode::kAlreadySubmitted,
        absl::StrFormat("the result of %s for round %d is already in", trainer,
                        round));
  }
  const std::string late_note =
      round < round_
          ? absl::StrFormat(" (late: round %d < open round %d)", round, round_)
          : std::string();
  if (state->slot == Slot::kUploading && state->in_partial_sum) {
    ++counters_.permission_retries;
    return Permission(v1::OUTCOME_RETRY, PermissionCode::kInPartialSum,
                      absl::StrCat("the result of ", trainer,
                                   " is arriving in a partial sum; ask again"));
  }
  if (state->slot != Slot::kNone) {
    if (state->slot == Slot::kGranted) state->granted_at = now;
    return Permission(
        v1::OUTCOME_OK, PermissionCode::kAlreadyHeld,
        absl::StrCat(trainer, " already holds permission", late_note));
  }
  if (counters_.in_flight >= static_cast<uint64_t>(max_concurrent_)) {
    ++counters_.permission_retries;
    return Permission(v1::OUTCOME_RETRY, PermissionCode::kSlotsBusy,
                      absl::StrFormat("%d of %d submission slot(s) busy",
                                      counters_.in_flight, max_concurrent_));
  }
  state->slot = Slot::kGranted;
  state->granted_at = now;
  ++counters_.in_flight;
  counters_.max_in_flight =
      std::max(counters_.max_in_flight, counters_.in_flight);
  ++counters_.permissions_granted;
  return Permission(v1::OUTCOME_OK, PermissionCode::kGranted,
                    absl::StrCat("permission granted to ", trainer, late_note));
}

bool Gatherer::CanJoinChain(absl::string_view trainer, uint32_t round,
                            absl::Time now) {
  Evaluate(now);
  const TrainerState* state = FindActive(trainer);
  return round == round_ && state != nullptr && !report_.done &&
         !HasResult(*state, round, round_) && state->slot == Slot::kNone;
}

std::vector<std::string> Gatherer::IdleTrainers() const {
  std::vector<std::string> idle;
  if (report_.done) return idle;
  for (const auto& [name, state] : trainers_) {
    if (!state.dropped && !state.responded && state.slot == Slot::kNone) {
      idle.push_back(name);
    }
  }
  return idle;
}

ResultDecision Gatherer::BeginResult(absl::string_view trainer, uint32_t round,
                                     absl::Time now, bool permission_needed) {
  Evaluate(now);
  if (round > round_) {
    ++counters_.rejected;
    SWARM_LOG_WARNING("round %d: %s sent a result for round %d, ahead of it",
                      round_, trainer, round);
    return Result(ResultCode::kError,
                  absl::StrFormat("result for round %d is ahead of round %d",
                                  round, round_));
  }
  TrainerState* state = FindActive(trainer);
  if (state == nullptr) {
    ++counters_.rejected;
    return Result(ResultCode::kError,
                  absl::StrFormat("%s is not an expected trainer of round %d",
                                  trainer, round_));
  }
  if (report_.done) {
    ++counters_.rejected;
    return Result(ResultCode::kRejected,
                  absl::StrFormat("round %d is closed (%s); result dropped",
                                  round_, DoneReasonName(report_.reason)));
  }
  if (HasResult(*state, round, round_)) {
    ++counters_.rejected;
    return Result(
        ResultCode::kDuplicate,
        absl::StrFormat("the result of %s for round %d is already in; "
                        "not counted twice",
                        trainer, round));
  }
  if (state->slot == Slot::kNone && permission_needed) {
    ++counters_.rejected;
    return Result(ResultCode::kError,
                  absl::StrFormat("%s holds no submission permission (never "
                                  "granted, released or expired); ask first",
                                  trainer));
  }
  if (state->slot == Slot::kUploading) {
    ++counters_.rejected;
    return Result(
        ResultCode::kError,
        absl::StrFormat("an upload from %s for round %d is already in progress",
                        trainer, state->upload_round));
  }
  // A partial sum's contributor takes no submission slot: the sum comes
  // as one upload, and must not hold back the trainers outside its chain
  // (the aggregator's own result, say) while it passes along the chain.
  state->in_partial_sum = state->slot == Slot::kNone && !permission_needed;
  state->slot = Slot::kUploading;
  state->upload_round = round;
  if (round < round_) {
    SWARM_LOG_WARNING(
        "round %d: late result from %s for round %d; accepted, but it does "
        "not count for this round",
        round_, trainer, round);
    return Result(ResultCode::kLate,
                  absl::StrFormat("late result for round %d accepted while "
                                  "round %d is open",
                                  round, round_));
  }
  return Result(ResultCode::kAccepted, "accepted");
}

ResultDecision Gatherer::CompleteResult(
    absl::string_view trainer, uint64_t sample_count,
    const google::protobuf::Map<std::string, double>& metrics, absl::Time now) {
  // No Evaluate(now) first: a result the aggregator accepted while this
  // gatherer was open counts, even if a deadline passed before the caller's
  // timer closed the round.
  TrainerState* state = FindActive(trainer);
  if (state == nullptr) {
    ++counters_.rejected;
    return Result(ResultCode::kError,
                  absl::StrFormat("%s is not an expected trainer of round %d",
                                  trainer, round_));
  }
  if (report_.done && !(state->slot == Slot::kUploading && state->body_in)) {
    ++counters_.rejected;
    return Result(
        ResultCode::kRejected,
        absl::StrFormat("round %d closed (%s) before the result of "
                        "%s was complete; keep it out",
                        round_, DoneReasonName(report_.reason), trainer));
  }
  if (state->slot != Slot::kUploading) {
    ++counters_.rejected;
    return Result(ResultCode::kError,
                  absl::StrFormat("no upload from %s is in progress", trainer));
  }
  const uint32_t round = state->upload_round;
  ReleaseSlot(*state);
  if (round < round_) {
    state->late_rounds_done.insert(round);
    ++counters_.late_accepted;
    Evaluate(now);
    return Result(ResultCode::kLate,
                  absl::StrFormat("late result for round %d aggregated into "
                                  "round %d; not counted as a response",
                                  round, round_));
  }
  state->responded = true;
  state->reply_time = now;
  state->sample_count = sample_count;
  auto it = metrics.find(metric_name_);
  if (it != metrics.end()) state->metric = it->second;
  ++responded_;
  ++counters_.accepted;
  Evaluate(now);
  // Counted after the close (its body was whole before): the report says so.
  if (report_.done) FillOutstanding(report_);
  return Result(ResultCode::kAccepted, "counted");
}

bool Gatherer::FailResult(absl::string_view trainer, absl::string_view reason,
                          absl::Time now) {
  Evaluate(now);
  TrainerState* state = FindActive(trainer);
  if (state == nullptr || state->slot == Slot::kNone) return false;
  SWARM_LOG_WARNING("round %d: submission of %s failed: %s; slot released",
                    round_, trainer, reason);
  ReleaseSlot(*state);
  ++counters_.failed;
  return true;
}

bool Gatherer::DropTrainer(absl::string_view trainer, absl::string_view reason,
                           absl::Time now) {
  Evaluate(now);
  TrainerState* state = FindActive(trainer);
  if (report_.done || state == nullptr || state->responded) return false;
  // Its whole result is being added: it is heard from, not to be dropped.
  if (state->slot == Slot::kUploading && state->body_in) return false;
  SWARM_LOG_WARNING("round %d: no longer waiting for %s: %s", round_, trainer,
                    reason);
  ReleaseSlot(*state);
  state->dropped = true;
  --active_;
  Evaluate(now);
  return true;
}

RoundReport Gatherer::CheckDone(absl::Time now) {
  Evaluate(now);
  if (report_.done) return report_;
  RoundReport open;
  FillOutstanding(open);
  return open;
}

absl::Time Gatherer::NextDeadline() const {
  if (report_.done) return absl::InfiniteFuture();
  absl::Time next = open_time_ + round_timeout_;
  if (min_reached_at_.has_value()) {
    next = std::min(next, *min_reached_at_ + wait_after_min_);
  }
  for (const auto& [name, state] : trainers_) {
    if (state.slot == Slot::kGranted) {
      next = std::min(next, state.granted_at + lease_);
    }
  }
  return next;
}

std::optional<double> Gatherer::RoundScore() const {
  // Late results are not in `responded` state: their metric was measured on
  // an older global model than this round's, so it must not score this one.
  std::vector<std::pair<double, long double>> scored;  // {metric, weight}
  for (const auto& [name, state] : trainers_) {
    if (!state.responded || state.sample_count == 0 ||
        !MetricComparator::IsUsable(state.metric)) {
      continue;
    }
    uint64_t weight = state.sample_count;
    if (max_claimed_samples_ > 0) {
      weight = std::min(weight, max_claimed_samples_);
    }
    if (equal_weights_) weight = 1;
    scored.emplace_back(*state.metric, static_cast<long double>(weight));
  }
  if (scored.empty()) return std::nullopt;
  double score = 0;
  if (score_ == v1::SCORE_MEDIAN || score_ == v1::SCORE_TRIMMED_MEAN) {
    // Unweighted: a trainer's claimed sample count buys no say here.
    std::sort(scored.begin(), scored.end());
    const size_t n = scored.size();
    size_t trim = 0;
    if (score_ == v1::SCORE_MEDIAN) {
      trim = (n - 1) / 2;  // Keeps the middle one, or the middle two.
    } else {
      trim = static_cast<size_t>(
          std::floor(score_trim_fraction_ * static_cast<double>(n) + 1e-9));
      trim = std::min(trim, (n - 1) / 2);
    }
    long double sum = 0;
    for (size_t i = trim; i < n - trim; ++i) sum += scored[i].first;
    score = static_cast<double>(sum / static_cast<long double>(n - 2 * trim));
  } else {
    long double weighted_sum = 0;
    long double total_weight = 0;
    for (const auto& [metric, weight] : scored) {
      weighted_sum += weight * static_cast<long double>(metric);
      total_weight += weight;
    }
    score = static_cast<double>(weighted_sum / total_weight);
  }
  if (!std::isfinite(score)) return std::nullopt;
  return score;
}

bool Gatherer::ScoreBeatsBest() const {
  return comparator_.BeatsRecord(RoundScore(), best_so_far_);
}

v1::BestRecord Gatherer::BestAfterRound() const {
  const std::optional<double> score = RoundScore();
  if (!comparator_.BeatsRecord(score, best_so_far_)) return best_so_far_;
  v1::BestRecord best;
  best.set_present(true);
  best.set_site(self_);
  best.set_metric(*score);
  best.set_round(round_);
  return best;
}

void SetScoreOptions(const v1::JobConfig& config, GathererOptions* options) {
  options->score = config.best_score();
  if (options->score == v1::SCORE_DEFAULT) {
    options->score = config.aggregation_method() == v1::AGGREGATION_FEDAVG
                         ? v1::SCORE_WEIGHTED_MEAN
                         : v1::SCORE_MEDIAN;
  }
  options->score_trim_fraction =
      config.trim_fraction() == 0 ? 0.1 : config.trim_fraction();
  options->max_claimed_samples = config.max_claimed_samples();
  options->equal_weights = config.equal_weights();
}

}  // namespace swarm
