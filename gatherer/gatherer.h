// One round's collection rules at the aggregator (design section 3, steps 4
// to 7): who may submit, which results count, when the round is over, and the
// best-so-far record after it.
//
// Pure logic. The class never reads a clock, sleeps, starts a thread or
// touches the network: every call that depends on time takes `now` from the
// caller, and NextDeadline() tells the caller when to call back without a new
// event, so it can arm one timer instead of polling.
//
// NOT thread-safe. The caller owns the clock and the mutex and serializes all
// calls, including the aggregator's accept of a result and the matching
// CompleteResult(), so that a result is either both in the aggregate and
// counted here, or neither. `now` should not go backwards; an earlier value
// never reopens a closed round.
//
// A result goes through two phases so that a round only ever closes on
// results the aggregator fully accepted:
//
//   RequestToSubmit()  -> OK takes a submission slot (a permission)
//   BeginResult()      when the result's header arrives
//   CompleteResult()   after the aggregator fully accepted the result: counts
//                      it, releases the slot
//   FailResult()       instead, when the upload or its aggregation failed or
//                      the trainer marked its result failed: releases the
//                      slot, counts nothing; the trainer may ask again while
//                      the round is open
//
// Every call that takes `now` first applies the closing rules at `now` (so a
// request after the timeout is refused even if the caller's timer has not
// fired yet), except CompleteResult(), which counts first and applies them
// after: a result finished while the gatherer was still open always counts.
//
// The caller's obligations:
// - Every BeginResult() that answers kAccepted or kLate is followed by
//   exactly one CompleteResult() or FailResult() for that trainer.
// - A result enters the aggregate only together with a CompleteResult() that
//   answers ok(). Simplest: if closed() is false, let the aggregator accept
//   the result and call CompleteResult() in the same critical section; for
//   an upload still in progress (not failed, trainer not dropped) it then
//   answers ok(). If closed() is true, discard the result.
// - After every call, if closed() turned true, finish the round in the same
//   critical section: finalize the aggregate and cancel the uploads listed in
//   RoundReport::uploads_cut_off (their slots are already freed, and a later
//   CompleteResult() for them answers kRejected).
//
// Rules worth knowing (see also the comments on each method):
// - The expected trainers are the ones that acknowledged this round's learn
//   task; only they may submit. DropTrainer() removes one that is known dead,
//   so the round does not wait for it.
// - A result for an earlier round (a slow trainer) while this round is open is
//   late: it gets a slot like any other and is accepted with a warning, to be
//   aggregated into this round, but it does not count towards this round's
//   responses and its metric is left out of this round's score.
// - A permission that is granted but not used (no BeginResult) within
//   `permission_lease` expires, so a trainer that died after asking does not
//   hold its slot until the timeout.
#ifndef SWARM_GATHERER_GATHERER_H_
#define SWARM_GATHERER_GATHERER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gatherer/metric_comparator.h"
#include "proto/swarm.pb.h"

namespace swarm {

// Values as resolved from the job config (the config's "0 means default" is
// resolved by the caller before this point).
struct GathererOptions {
  // The round this gatherer collects.
  uint32_t round = 0;
  // The trainers that acknowledged this round's learn task. Repeated names
  // count once. Empty: the round is done as soon as it opens.
  std::vector<std::string> expected_trainers;
  // Results needed before the grace wait starts. 0, or more than there are
  // expected trainers, means all of them (the grace wait then never matters:
  // the round closes on the last result).
  uint32_t min_responses_required = 0;
  // Grace time after `min_responses_required` results arrived. Negative counts
  // as zero; absl::InfiniteDuration() disables this rule.
  absl::Duration wait_after_min_responses = absl::Seconds(10);
  // The round closes at the latest at open_time + round_timeout. Negative
  // counts as zero (closed at once); absl::InfiniteDuration() disables it.
  absl::Duration round_timeout = absl::Hours(1);
  // Submissions in flight at once. 0 counts as 1.
  uint32_t max_concurrent_submissions = 1;
  // How long a granted permission stays valid until BeginResult() uses it.
  // Asking again renews it. Negative counts as zero; absl::InfiniteDuration()
  // never expires permissions.
  absl::Duration permission_lease = absl::Minutes(1);
  // The best-so-far record that came with this round's learn task.
  v1::BestRecord best_so_far;
  // This site's name (the aggregator); the `site` of a new best record.
  std::string self;
  // The validation metric that ranks global models. Empty means "accuracy".
  std::string metric_name = "accuracy";
  // When the round opened (the learn task was scattered).
  absl::Time open_time = absl::UnixEpoch();
  // How the round's score is made of the trainers' validation metrics
  // (design section 11): the weighted mean, the median, or the trimmed mean
  // (dropping floor(score_trim_fraction * n) at each end). SCORE_DEFAULT
  // counts as the weighted mean here (SetScoreOptions resolves it).
  v1::ScoreStatistic score = v1::SCORE_WEIGHTED_MEAN;
  double score_trim_fraction = 0.1;
  // The weighted mean's weight of a trainer: its claimed sample count capped
  // at max_claimed_samples (0: no cap), or 1 each with equal_weights.
  uint64_t max_claimed_samples = 0;
  bool equal_weights = false;
};

// Sets the score options from the job: best_score, SCORE_DEFAULT resolved
// to the median with a robust aggregation method (anything but FedAvg) and
// to the weighted mean with FedAvg; trim_fraction (0: 0.1);
// max_claimed_samples and equal_weights.
void SetScoreOptions(const v1::JobConfig& config, GathererOptions* options);

// Answer to RequestToSubmit().
enum class PermissionCode {
  kGranted,           // OK: a slot was taken.
  kAlreadyHeld,       // OK: this trainer already holds a slot; no second one.
  kSlotsBusy,         // RETRY: max_concurrent_submissions slots are taken.
  kInPartialSum,      // RETRY: its result is arriving in a partial sum.
  kRoundNotOpen,      // RETRY: a round ahead of this one (a fast trainer).
  kNotTrainer,        // REJECTED: not an expected trainer of this round.
  kRoundClosed,       // REJECTED: this gatherer has closed.
  kAlreadySubmitted,  // REJECTED: this trainer's result for that round is in.
};
absl::string_view PermissionCodeName(PermissionCode code);

struct PermissionDecision {
  v1::Outcome outcome;  // OUTCOME_OK, OUTCOME_RETRY or OUTCOME_REJECTED.
  PermissionCode code;
  std::string message;  // Human-readable; says which case it was.
};

// Answer to BeginResult() and CompleteResult().
enum class ResultCode {
  kAccepted,   // This round's result: go on (Begin) / counted (Complete).
  kLate,       // An earlier round's result: accepted with a warning, to be
               // aggregated, but not counted as a response of this round.
  kDuplicate,  // This trainer's result for that round is already in.
  kRejected,   // The round is closed; the result must not be aggregated.
  kError,      // A round ahead, not a trainer, no permission, no upload in
               // progress, or an upload already in progress.
};
absl::string_view ResultCodeName(ResultCode code);

struct ResultDecision {
  ResultCode code;
  std::string message;

  // kAccepted or kLate: the result may go on / into the aggregate.
  bool ok() const {
    return code == ResultCode::kAccepted || code == ResultCode::kLate;
  }
  // The wire outcome: OK, REJECTED (duplicate, closed) or BAD_REQUEST.
  v1::Outcome outcome() const;
};

enum class DoneReason {
  kNotDone,
  kAllResponded,       // Every expected trainer's result is in.
  kGraceAfterMinimum,  // wait_after_min_responses after the minimum.
  kTimeout,            // round_timeout after the round opened.
  kNoTrainers,         // No expected trainer (none acknowledged, or all
                       // were dropped).
};
absl::string_view DoneReasonName(DoneReason reason);

struct RoundReport {
  bool done = false;
  DoneReason reason = DoneReason::kNotDone;
  // When the round closed: the event time for kAllResponded / kNoTrainers,
  // the deadline itself for kGraceAfterMinimum / kTimeout (even when the
  // caller noticed later). absl::InfiniteFuture() while open.
  absl::Time closed_at = absl::InfiniteFuture();
  // Results of this round counted, and how many trainers were expected
  // (dropped ones excluded).
  int responded = 0;
  int expected = 0;
  // Expected trainers (including dropped ones) without a counted result for
  // this round, sorted by name. While open: those still outstanding.
  std::vector<std::string> missing;
  // Trainers removed with DropTrainer(), sorted (also listed in `missing`).
  std::vector<std::string> dropped;
  // Uploads that were in progress when the round closed (sorted): the caller
  // cancels their streams and keeps them out of the aggregate.
  std::vector<std::string> uploads_cut_off;
};

// Counters for status pages.
struct GathererCounters {
  uint64_t permissions_granted = 0;  // Slots handed out (not re-asks).
  uint64_t permission_retries = 0;   // RETRY answers.
  uint64_t in_flight = 0;            // Slots held now (granted or uploading).
  uint64_t max_in_flight = 0;        // The most slots ever held at once.
  uint64_t accepted = 0;             // This round's results counted.
  uint64_t late_accepted = 0;        // Earlier rounds' results completed.
  uint64_t failed = 0;               // Slots released by FailResult().
  uint64_t expired = 0;              // Permissions whose lease ran out.
  // REJECTED permission answers plus refused results (kDuplicate, kRejected,
  // kError) from BeginResult() and CompleteResult().
  uint64_t rejected = 0;
};

class Gatherer {
 public:
  Gatherer(GathererOptions options, MetricComparator comparator);
  Gatherer(const Gatherer&) = delete;
  Gatherer& operator=(const Gatherer&) = delete;

  // May `trainer` submit its result for `round`? Checked in this order:
  //   round > this round           RETRY kRoundNotOpen (checked first: this
  //                                gatherer cannot judge who trains a later
  //                                round)
  //   not an expected trainer      REJECTED kNotTrainer (dropped ones too)
  //   this gatherer closed         REJECTED kRoundClosed
  //   result already in            REJECTED kAlreadySubmitted
  //   its result arrives in a partial sum (chain reduction)
  //                                RETRY kInPartialSum
  //   trainer holds a slot         OK kAlreadyHeld (renews the lease)
  //   all slots taken              RETRY kSlotsBusy
  //   otherwise                    OK kGranted
  // A round < this round while open is granted like this round (the result
  // will be late; the message says so).
  PermissionDecision RequestToSubmit(absl::string_view trainer, uint32_t round,
                                     absl::Time now);

  // A result's header arrived. Checked in this order: a round ahead (kError),
  // not an expected trainer (kError), closed (kRejected), result already in
  // (kDuplicate), no permission or lease expired (kError), an upload from
  // this trainer already in progress (kError). Otherwise the slot becomes an
  // upload in progress: kAccepted for this round, kLate for an earlier one
  // (logged as a warning).
  //
  // `permission_needed` false: a contributor to a partial sum (chain
  // reduction), whose result comes without a permission; its upload takes
  // no submission slot (not counted in in_flight).
  ResultDecision BeginResult(absl::string_view trainer, uint32_t round,
                             absl::Time now, bool permission_needed = true);

  // Chain reduction: may `trainer` be put into a chain for `round`? True
  // when it is an expected trainer of this open round (not late), its result
  // is not in and it holds no slot. Takes nothing.
  bool CanJoinChain(absl::string_view trainer, uint32_t round, absl::Time now);
  // Expected trainers (not dropped) of this open round whose result is not
  // in and who hold no slot, sorted. Empty once closed.
  std::vector<std::string> IdleTrainers() const;

  // The body of the upload BeginResult() started for `trainer` is whole;
  // the caller folds it into the aggregate outside its lock and then calls
  // CompleteResult (or FailResult), which counts it even if a deadline
  // closed the round meanwhile: it was whole while the round was open.
  // REQUIRES: the round is not done.
  void BodyReceived(absl::string_view trainer);
  // The aggregator fully accepted the result whose upload BeginResult()
  // started. Releases the slot. This round's result: counted, with its reply
  // time, `sample_count` and `metrics[metric_name]` kept for the round's
  // score (kAccepted); may close the round. An earlier round's: kLate, not
  // counted. kRejected if the gatherer was already closed when called and
  // the body was not received before (keep the result out of the
  // aggregate); kError if no upload of this trainer is
  // in progress. Time rules are applied after counting, never before.
  ResultDecision CompleteResult(
      absl::string_view trainer, uint64_t sample_count,
      const google::protobuf::Map<std::string, double>& metrics,
      absl::Time now);

  // The upload or its aggregation failed, or the trainer marked its result
  // failed. Releases the trainer's slot (granted or uploading) so a failed
  // upload never blocks the others; counts nothing. Returns whether a slot
  // was released. The trainer may ask again while the round is open.
  bool FailResult(absl::string_view trainer, absl::string_view reason,
                  absl::Time now);

  // The caller learned that `trainer` is dead (e.g. its peer is unreachable):
  // removes it from the expected set so the round does not wait for it,
  // releases its slot (the caller cancels its upload, if any), and lowers the
  // minimum if it now exceeds the trainers left. Returns false if it is
  // unknown, already dropped, its result for this round is already in, or the
  // round is closed.
  bool DropTrainer(absl::string_view trainer, absl::string_view reason,
                   absl::Time now);

  // Is the round over? Applies the rules at `now` and closes the gatherer the
  // first time the answer is yes; after that the report never changes.
  RoundReport CheckDone(absl::Time now);

  // The earliest time at which an answer could change without a new event:
  // the round timeout, the end of the grace wait once the minimum is in, or
  // the expiry of an unused permission (a slot frees: offer it to a waiting
  // request). May be in the past: call CheckDone() at once.
  // absl::InfiniteFuture() once closed, or if nothing is pending.
  absl::Time NextDeadline() const;

  // This round's score: by default the sample-weighted mean of its counted
  // results' validation metric (weights capped, or equal, as the options
  // say), or their median or trimmed mean (unweighted); results without a
  // finite metric, or with zero samples, are left out. nullopt if there is
  // none. Late results are left out on purpose:
  // their metric scores an older global model than this round's.
  std::optional<double> RoundScore() const;

  // Whether RoundScore() beats the best-so-far record.
  bool ScoreBeatsBest() const;

  // The best record after this round (design step 7): {self, score, round}
  // if ScoreBeatsBest(), else the best-so-far record unchanged. Meant to be
  // called once the round is closed.
  v1::BestRecord BestAfterRound() const;

  uint32_t round() const { return round_; }
  bool closed() const { return report_.done; }
  absl::Time open_time() const { return open_time_; }
  // After clamping.
  int min_responses_required() const;
  int max_concurrent_submissions() const { return max_concurrent_; }
  const GathererCounters& counters() const { return counters_; }

 private:
  enum class Slot { kNone, kGranted, kUploading };

  struct TrainerState {
    bool dropped = false;
    Slot slot = Slot::kNone;
    absl::Time granted_at;      // Lease start, while kGranted.
    uint32_t upload_round = 0;  // While kUploading.
    // While kUploading: as a partial sum's contributor (chain reduction).
    bool in_partial_sum = false;
    // While kUploading: the body is in and being added (BodyReceived).
    bool body_in = false;
    // This round's result, once counted.
    bool responded = false;
    absl::Time reply_time;
    uint64_t sample_count = 0;
    std::optional<double> metric;
    // Earlier rounds whose late result this gatherer completed.
    std::set<uint32_t> late_rounds_done;
  };

  // Null if not an expected trainer or dropped.
  TrainerState* FindActive(absl::string_view trainer);
  static bool HasResult(const TrainerState& state, uint32_t round,
                        uint32_t this_round);
  void ReleaseSlot(TrainerState& state);
  void ExpireLeases(absl::Time now);
  // Applies the closing rules at `now` (no-op once closed).
  void Evaluate(absl::Time now);
  void Close(DoneReason reason, absl::Time at);
  void FillOutstanding(RoundReport& report) const;

  const uint32_t round_;
  const uint32_t min_required_;  // As configured; 0 means all.
  const absl::Duration wait_after_min_;
  const absl::Duration round_timeout_;
  const int max_concurrent_;
  const absl::Duration lease_;
  const v1::BestRecord best_so_far_;
  const std::string self_;
  const std::string metric_name_;
  const absl::Time open_time_;
  const MetricComparator comparator_;
  const v1::ScoreStatistic score_;
  const double score_trim_fraction_;
  const uint64_t max_claimed_samples_;
  const bool equal_weights_;

  // Sorted by name, so reports are deterministic.
  std::map<std::string, TrainerState, std::less<>> trainers_;
  int active_ = 0;     // Expected trainers not dropped.
  int responded_ = 0;  // This round's results counted.
  int slots_held_ = 0;
  // When the minimum was reached (the grace wait started).
  std::optional<absl::Time> min_reached_at_;
  RoundReport report_;  // Final once report_.done.
  GathererCounters counters_;
};

}  // namespace swarm

#endif  // SWARM_GATHERER_GATHERER_H_
