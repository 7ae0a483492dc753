// One round this site aggregates (design section 3, steps 4 to 7): the
// round's collection rules (Gatherer), its running aggregate (Aggregator),
// the round's base model, and the round's submission counters, the one
// source of the counters a site reports.
//
// Every call that can change whether the round is over returns the round's
// report, so a caller cannot forget to look: when `report.done` turns true,
// the caller stops feeding the round and finishes it (Close()).
//
// NOT thread-safe and never blocks on the network: the caller serializes all
// calls (its mutex) and passes the time. The costly work (folding a result
// into the aggregate, a pass over the model; the aggregate itself) is handed
// out as AddJob and Aggregate() for the caller to run outside its lock.
//
// Caller's obligations (the Gatherer's, restated for this pairing):
// - Every BeginResult() that returns a sink (or a header-only acceptance) is
//   followed by exactly one CompleteResult(), or by one ReceiveResult() and,
//   when that returns an AddJob, one FinishResult() with the job's status.
// - AddJobs of one round, and then its Aggregate(), run one at a time, in
//   the order they were handed out (one worker per site does).
// - Once a report says done and no add is pending (pending_adds()), close
//   the round (Judge, Aggregate) and drop it.
#ifndef SWARM_CONTROLLER_AGGREGATION_ROUND_H_
#define SWARM_CONTROLLER_AGGREGATION_ROUND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "controller/job_view.h"
#include "gatherer/aggregator.h"
#include "gatherer/gatherer.h"
#include "gatherer/server_optimizer.h"
#include "model/model.h"
#include "model/tensor_sink.h"
#include "proto/swarm.pb.h"

namespace swarm {

// What a round counted (summed over rounds for the site's status).
struct RoundCounters {
  uint64_t granted = 0;    // Permissions handed out.
  uint64_t accepted = 0;   // Results in the aggregate (late ones included).
  uint64_t rejected = 0;   // Results refused (header, body or aggregation).
  uint64_t in_flight = 0;  // Slots held now (permission or upload).
  uint64_t max_in_flight = 0;
  uint64_t retries = 0;  // RETRY answers to requests to submit.
  uint64_t late = 0;     // Of `accepted`, earlier rounds' results.
  uint64_t failed = 0;   // Uploads that failed or broke.
  uint64_t expired = 0;  // Permissions whose lease ran out.
  // Sample counts cut to the job's max_claimed_samples.
  uint64_t claims_clipped = 0;

  // Adds `other` (max_in_flight as a maximum).
  void Add(const RoundCounters& other);
  void CopyTo(v1::SiteCounters* counters) const;
};

// A partial sum's header (chain reduction) holds together: contributors
// named once each, positive sample counts adding up to `sample_count`, a
// usable `partial_scale`. InvalidArgument naming the field otherwise.
absl::Status CheckPartialSumHeader(const v1::ModelHeader& header);

class AggregationRound {
 public:
  // Opens the round of `learn_task` (this site is its aggregator) over
  // `base`, at `now`. `offload_dir`: where results go when the job offloads
  // them to disk (the job's disk_offload, or a median / trimmed mean).
  static absl::StatusOr<std::unique_ptr<AggregationRound>> Open(
      const JobView& job, const std::string& self,
      const v1::ModelHeader& learn_task, std::shared_ptr<const Model> base,
      const std::string& offload_dir, absl::Time now);

  AggregationRound(const AggregationRound&) = delete;
  AggregationRound& operator=(const AggregationRound&) = delete;

  uint32_t round() const { return gatherer_.round(); }
  // The round's global model as trainers train it: without the server
  // optimizer's state (results are laid out like it; its digest is the one
  // BEST records).
  const Model& base() const { return *trainable_; }
  bool closed() const { return gatherer_.closed(); }
  // When to call Check() without a new event (InfiniteFuture: never).
  absl::Time NextDeadline() const { return gatherer_.NextDeadline(); }

  struct Permission {
    PermissionDecision decision;
    RoundReport report;
  };
  Permission RequestToSubmit(absl::string_view trainer, uint32_t round,
                             absl::Time now);

  // Chain reduction: may `trainer` join a chain (Gatherer::CanJoinChain)?
  bool CanJoinChain(absl::string_view trainer, uint32_t round, absl::Time now) {
    return gatherer_.CanJoinChain(trainer, round, now);
  }
  std::vector<std::string> IdleTrainers() const {
    return gatherer_.IdleTrainers();
  }

  struct ResultStart {
    // Not OK: the result is refused (INVALID_ARGUMENT for a protocol error,
    // FAILED_PRECONDITION for a closed round or a duplicate).
    absl::Status refused;
    // A failed result (header.failed()): noted, its trainer no longer
    // waited for; there is no body.
    bool header_only = false;
    // Otherwise the sink to stream the body into (it checks the tensors
    // against the base model as they arrive).
    std::unique_ptr<TensorSink> sink;
    RoundReport report;
  };
  //
  // A MODEL_KIND_PARTIAL_SUM (chain reduction) counts as one result of each
  // of its contributors, all or none: each must be an expected trainer whose
  // result is not in and not on its way (no permission needed), and the
  // contributions' sample counts must add up to the header's.
  ResultStart BeginResult(const v1::ModelHeader& header, absl::Time now);

  struct ResultEnd {
    v1::Reply reply;
    // Set when the result was refused after its body arrived (for the log).
    absl::Status refused;
    RoundReport report;
  };
  // Folding one result (or a chain's partial sum) into the round's
  // aggregate: a pass over the model, for the caller to run outside its
  // lock. `aggregator` is shared with the round; see the obligations above.
  struct AddJob {
    std::shared_ptr<Aggregator> aggregator;
    std::shared_ptr<const Model> model;
    int64_t sample_count = 0;
    v1::PayloadKind kind = v1::PAYLOAD_KIND_FULL_WEIGHTS;
    // A partial sum: `model` is `scale` times the weighted sum of `terms`.
    bool partial = false;
    double scale = 1;
    std::vector<Aggregator::PartialTerm> terms;
    // On any error the aggregate is unchanged.
    absl::Status Run() const;
  };
  // The body of a result BeginResult() let in: `model` is what the sink
  // assembled, or why assembly failed. Either the result ends now (refused,
  // or the round closed), or it is to be added: run the job, then call
  // FinishResult with its status.
  std::variant<AddJob, ResultEnd> ReceiveResult(
      const v1::ModelHeader& header,
      const absl::StatusOr<std::shared_ptr<const Model>>& model,
      absl::Time now);
  ResultEnd FinishResult(const v1::ModelHeader& header,
                         const absl::Status& added, absl::Time now);
  // Adds handed out and not finished.
  int pending_adds() const { return pending_adds_; }
  // ReceiveResult, the job and FinishResult at once, in the caller's thread.
  ResultEnd CompleteResult(
      const v1::ModelHeader& header,
      const absl::StatusOr<std::shared_ptr<const Model>>& model,
      absl::Time now);

  // Applies the closing rules at `now`.
  RoundReport Check(absl::Time now) { return gatherer_.CheckDone(now); }

  // Stops waiting for `trainer` (known down, or silent after a handoff);
  // see Gatherer::DropTrainer. Returns whether it was dropped.
  bool DropTrainer(absl::string_view trainer, absl::string_view reason,
                   absl::Time now) {
    return gatherer_.DropTrainer(trainer, reason, now);
  }

  // The round's verdict on its base model. REQUIRES: closed(). Cheap.
  struct Verdict {
    // The best record after this round.
    v1::BestRecord best;
    // The base model's score beat the record: this site holds the best
    // model now.
    bool base_is_new_best = false;
    // The trainers' mean validation metric of the base model, if any.
    std::optional<double> input_score;
    // Results in the aggregate.
    size_t results = 0;
  };
  Verdict Judge() const;

  // The next global model: the aggregate, stepped by the job's server
  // optimizer when it has one (its state after the model's tensors), or the
  // base (state included) when no result arrived. REQUIRES: closed(); call once. Costly (a pass over every result
  // for the coordinate methods): the caller runs it outside its lock, once
  // it has taken the round out of its shared state.
  absl::StatusOr<std::shared_ptr<const Model>> Aggregate();

  // The base as the learn task carried it (optimizer state included).
  std::shared_ptr<const Model> shared_base() const { return base_; }
  // base(), shared: what BEST keeps when the base is the new best.
  std::shared_ptr<const Model> shared_trainable() const { return trainable_; }
  // Slots from the gatherer, results from this round.
  RoundCounters counters() const;

 private:
  ResultStart BeginPartialSum(const v1::ModelHeader& header, absl::Time now);
  // The gatherer's part of a result's end, once added (or not).
  ResultEnd Conclude(const v1::ModelHeader& header, const absl::Status& added,
                     absl::Time now);
  ResultEnd ConcludePartialSum(const v1::ModelHeader& header,
                               const absl::Status& added, absl::Time now);

  AggregationRound(GathererOptions options, MetricComparator comparator,
                   std::shared_ptr<const Model> base,
                   std::unique_ptr<Aggregator> aggregator,
                   ServerOptimizerOptions optimizer, std::string scratch_dir);

  Gatherer gatherer_;
  std::shared_ptr<const Model> base_;
  std::shared_ptr<const Model> trainable_;  // TrainableView(base_).
  ServerOptimizerOptions optimizer_;
  // Where the stepped model goes when results go to disk ("" = memory).
  std::string scratch_dir_;
  // Shared with the AddJobs handed out (which may outlive the round).
  std::shared_ptr<Aggregator> aggregator_;
  int pending_adds_ = 0;
  // Results in the aggregate, and refused.
  uint64_t accepted_ = 0;
  uint64_t rejected_ = 0;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_AGGREGATION_ROUND_H_
