#include "controller/aggregation_round.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/replies.h"

namespace swarm {
void RoundCounters::Add(const RoundCounters& other) {
  granted += other.granted;
  accepted += other.accepted;
  rejected += other.rejected;
  in_flight += other.in_flight;
  max_in_flight = std::max(max_in_flight, other.max_in_flight);
  retries += other.retries;
  late += other.late;
  failed += other.failed;
  expired += other.expired;
  claims_clipped += other.claims_clipped;
}

void RoundCounters::CopyTo(v1::SiteCounters* counters) const {
  counters->set_submissions_granted(granted);
  counters->set_results_accepted(accepted);
  counters->set_results_rejected(rejected);
  counters->set_submissions_in_flight(in_flight);
  counters->set_max_submissions_in_flight(max_in_flight);
  counters->set_permission_retries(retries);
  counters->set_results_late(late);
  counters->set_results_failed(failed);
  counters->set_permissions_expired(expired);
  counters->set_sample_claims_clipped(claims_clipped);
}

absl::StatusOr<std::unique_ptr<AggregationRound>> AggregationRound::Open(
    const JobView& job, const std::string& self,
    const v1::ModelHeader& learn_task, std::shared_ptr<const Model> base,
    const std::string& offload_dir, absl::Time now) {
  const v1::JobConfig& config = job.config();
  GathererOptions options;
  options.round = learn_task.round();
  options.expected_trainers.assign(learn_task.expected_trainers().begin(),
                                   learn_task.expected_trainers().end());
  options.min_responses_required = config.min_responses_required();
  options.wait_after_min_responses = job.wait_after_min_responses();
  options.round_timeout = job.round_timeout();
  options.max_concurrent_submissions = config.max_concurrent_submissions();
  options.best_so_far = learn_task.best();
  options.self = self;
  options.metric_name = config.metric_name();
  options.open_time = now;
  SetScoreOptions(config, &options);
  // Results go to disk when the job asks for it, and always for the methods
  // that need every result at the end (median, trimmed mean).
  const bool offload = config.disk_offload() ||
                       config.aggregation_method() != v1::AGGREGATION_FEDAVG;
  AggregatorOptions aggregator_options = AggregatorOptions::FromJobConfig(
      config, offload ? offload_dir : std::string());
  // The job's folder holds the offload folder from configure on
  // (persist::Workspace): no I/O here.
  aggregator_options.make_offload_dir = false;
  aggregator_options.bucket_seed =
      config.seed() ^ (uint64_t{learn_task.round()} * 0x9e3779b97f4a7c15ull);
  // Results carry the trainable tensors only; the optimizer's state stays
  // with the base until Aggregate() steps it.
  absl::StatusOr<std::unique_ptr<Aggregator>> aggregator =
      Aggregator::Create(std::move(aggregator_options), TrainableView(base));
  if (!aggregator.ok()) return aggregator.status();
  return std::unique_ptr<AggregationRound>(new AggregationRound(
      std::move(options), MetricComparator(config.metric_direction()),
      std::move(base), std::move(*aggregator),
      ServerOptimizerOptions::FromJobConfig(config),
      config.disk_offload() ? offload_dir : std::string()));
}

AggregationRound::AggregationRound(GathererOptions options,
                                   MetricComparator comparator,
                                   std::shared_ptr<const Model> base,
                                   std::unique_ptr<Aggregator> aggregator,
                                   ServerOptimizerOptions optimizer,
                                   std::string scratch_dir)
    : gatherer_(std::move(options), comparator),
      base_(std::move(base)),
      trainable_(TrainableView(base_)),
      optimizer_(optimizer),
      scratch_dir_(std::move(scratch_dir)),
      aggregator_(std::move(aggregator)) {}

RoundCounters AggregationRound::counters() const {
  const GathererCounters& gathered = gatherer_.counters();
  RoundCounters counters;
  counters.granted = gathered.permissions_granted;
  counters.in_flight = gathered.in_flight;
  counters.max_in_flight = gathered.max_in_flight;
  counters.accepted = accepted_;
  counters.rejected = rejected_;
  counters.retries = gathered.permission_retries;
  counters.late = gathered.late_accepted;
  counters.failed = gathered.failed;
  counters.expired = gathered.expired;
  counters.claims_clipped =
      static_cast<uint64_t>(aggregator_->sample_claims_clipped());
  return counters;
}

AggregationRound::Permission AggregationRound::RequestToSubmit(
    absl::string_view trainer, uint32_t round, absl::Time now) {
  Permission permission{gatherer_.RequestToSubmit(trainer, round, now), {}};
  permission.report = gatherer_.CheckDone(now);
  return permission;
}

absl::Status CheckPartialSumHeader(const v1::ModelHeader& header) {
  if (header.contributions().empty()) {
    return absl::InvalidArgumentError(
        "contributions: a partial sum must name its contributors");
  }
  std::set<std::string> seen;
  uint64_t total = 0;
  for (const v1::Contribution& contribution : header.contributions()) {
    if (!seen.insert(contribution.site()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "contributions: ", contribution.site(), " is named twice"));
    }
    if (contribution.sample_count() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("contributions: the sample count of ",
                       contribution.site(), " is not positive"));
    }
    if (contribution.sample_count() > (uint64_t{1} << 62) - total) {
      return absl::InvalidArgumentError(
          "contributions: the sample counts overflow");
    }
    total += contribution.sample_count();
  }
  if (total != header.sample_count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample_count: ", header.sample_count(),
        " is not the sum of the contributions' sample counts (", total, ")"));
  }
  if (!(header.partial_scale() >= 0) ||
      !std::isfinite(header.partial_scale())) {
    return absl::InvalidArgumentError(
        absl::StrCat("partial_scale: ", header.partial_scale(),
                     " is not a positive number"));
  }
  return absl::OkStatus();
}

AggregationRound::ResultStart AggregationRound::BeginPartialSum(
    const v1::ModelHeader& header, absl::Time now) {
  ResultStart start;
  start.refused = CheckPartialSumHeader(header);
  std::vector<std::string> begun;
  if (start.refused.ok()) {
    for (const v1::Contribution& contribution : header.contributions()) {
      const ResultDecision decision =
          gatherer_.BeginResult(contribution.site(), header.round(), now,
                                /*permission_needed=*/false);
      if (decision.ok()) {
        begun.push_back(contribution.site());
        continue;
      }
      const std::string why =
          absl::StrCat("the partial sum's contributor ", contribution.site(),
                       ": ", decision.message);
      start.refused = decision.code == ResultCode::kError
                          ? absl::InvalidArgumentError(why)
                          : absl::FailedPreconditionError(why);
      break;
    }
  }
  if (start.refused.ok()) {
    absl::StatusOr<std::unique_ptr<TensorSink>> sink =
        aggregator_->NewResultSink();
    if (sink.ok()) {
      start.sink = std::move(*sink);
    } else {
      start.refused = sink.status();
    }
  }
  if (!start.refused.ok()) {
    ++rejected_;
    for (const std::string& site : begun) {
      gatherer_.FailResult(site, start.refused.message(), now);
    }
  }
  start.report = gatherer_.CheckDone(now);
  return start;
}

AggregationRound::ResultEnd AggregationRound::ConcludePartialSum(
    const v1::ModelHeader& header, const absl::Status& added, absl::Time now) {
  ResultEnd end;
  if (!added.ok()) {
    for (const v1::Contribution& contribution : header.contributions()) {
      gatherer_.FailResult(contribution.site(), added.message(), now);
    }
    ++rejected_;
    end.refused = added;
    end.report = gatherer_.CheckDone(now);
    return end;
  }
  int counted = 0;
  for (const v1::Contribution& contribution : header.contributions()) {
    const ResultDecision decision = gatherer_.CompleteResult(
        contribution.site(), contribution.sample_count(),
        contribution.metrics(), now);
    if (decision.ok()) {
      ++accepted_;
      ++counted;
    } else {
      ++rejected_;
    }
  }
  end.reply =
      MakeReply(v1::OUTCOME_OK,
                absl::StrCat("partial sum of ", header.contributions_size(),
                             " result(s) added (", counted,
                             " counted for round ", round(), ")"));
  end.report = gatherer_.CheckDone(now);
  return end;
}

AggregationRound::ResultStart AggregationRound::BeginResult(
    const v1::ModelHeader& header, absl::Time now) {
  if (header.kind() == v1::MODEL_KIND_PARTIAL_SUM) {
    return BeginPartialSum(header, now);
  }
  ResultStart start;
  const ResultDecision decision =
      gatherer_.BeginResult(header.sender(), header.round(), now);
  if (!decision.ok()) {
    ++rejected_;
    start.refused = decision.code == ResultCode::kError
                        ? absl::InvalidArgumentError(decision.message)
                        : absl::FailedPreconditionError(decision.message);
  } else if (header.failed()) {
    const std::string reason =
        absl::StrCat("trainer failed: ", header.failure());
    gatherer_.FailResult(header.sender(), reason, now);
    // It has no result for this round and sends none: do not wait for it.
    if (header.round() == round()) {
      gatherer_.DropTrainer(header.sender(), reason, now);
    }
    start.header_only = true;
  } else {
    absl::StatusOr<std::unique_ptr<TensorSink>> sink =
        aggregator_->NewResultSink();
    if (sink.ok()) {
      start.sink = std::move(*sink);
    } else {
      gatherer_.FailResult(header.sender(), sink.status().message(), now);
      start.refused = sink.status();
    }
  }
  start.report = gatherer_.CheckDone(now);
  return start;
}

absl::Status AggregationRound::AddJob::Run() const {
  if (partial) return aggregator->AddPartialSum(*model, scale, terms);
  return aggregator->Add(*model, sample_count, kind);
}

std::variant<AggregationRound::AddJob, AggregationRound::ResultEnd>
AggregationRound::ReceiveResult(
    const v1::ModelHeader& header,
    const absl::StatusOr<std::shared_ptr<const Model>>& model, absl::Time now) {
  if (gatherer_.closed()) {
    ResultEnd end;
    ++rejected_;
    end.reply =
        MakeReply(v1::OUTCOME_REJECTED,
                  absl::StrCat("round ", header.round(),
                               " closed before the result was complete"));
    end.report = gatherer_.CheckDone(now);
    return end;
  }
  if (!model.ok()) return Conclude(header, model.status(), now);
  if (header.kind() == v1::MODEL_KIND_PARTIAL_SUM) {
    for (const v1::Contribution& contribution : header.contributions()) {
      gatherer_.BodyReceived(contribution.site());
    }
  } else {
    gatherer_.BodyReceived(header.sender());
  }
  AddJob job;
  job.aggregator = aggregator_;
  job.model = *model;
  job.sample_count = static_cast<int64_t>(header.sample_count());
  job.kind = header.payload_kind();
  if (header.kind() == v1::MODEL_KIND_PARTIAL_SUM) {
    job.partial = true;
    job.scale = header.partial_scale() == 0 ? 1 : header.partial_scale();
    for (const v1::Contribution& contribution : header.contributions()) {
      job.terms.push_back({static_cast<int64_t>(contribution.sample_count()),
                           contribution.payload_kind()});
    }
  }
  ++pending_adds_;
  return job;
}

AggregationRound::ResultEnd AggregationRound::FinishResult(
    const v1::ModelHeader& header, const absl::Status& added, absl::Time now) {
  --pending_adds_;
  return Conclude(header, added, now);
}

AggregationRound::ResultEnd AggregationRound::CompleteResult(
    const v1::ModelHeader& header,
    const absl::StatusOr<std::shared_ptr<const Model>>& model, absl::Time now) {
  auto received = ReceiveResult(header, model, now);
  if (auto* end = std::get_if<ResultEnd>(&received)) return std::move(*end);
  const AddJob& job = std::get<AddJob>(received);
  return FinishResult(header, job.Run(), now);
}

AggregationRound::ResultEnd AggregationRound::Conclude(
    const v1::ModelHeader& header, const absl::Status& added, absl::Time now) {
  if (header.kind() == v1::MODEL_KIND_PARTIAL_SUM) {
    return ConcludePartialSum(header, added, now);
  }
  ResultEnd end;
  if (!added.ok()) {
    gatherer_.FailResult(header.sender(), added.message(), now);
    ++rejected_;
    end.refused = added;
  } else {
    const ResultDecision decision = gatherer_.CompleteResult(
        header.sender(), header.sample_count(), header.metrics(), now);
    if (decision.ok()) {
      ++accepted_;
    } else {
      ++rejected_;
    }
    end.reply = MakeReply(decision.outcome(), decision.message);
  }
  end.report = gatherer_.CheckDone(now);
  return end;
}

AggregationRound::Verdict AggregationRound::Judge() const {
  Verdict verdict;
  verdict.best = gatherer_.BestAfterRound();
  verdict.base_is_new_best = gatherer_.ScoreBeatsBest();
  verdict.input_score = gatherer_.RoundScore();
  verdict.results = static_cast<size_t>(aggregator_->num_added());
  return verdict;
}

absl::StatusOr<std::shared_ptr<const Model>> AggregationRound::Aggregate() {
  // Nothing arrived: the global model carries over.
  if (aggregator_->num_added() == 0) return base_;
  absl::StatusOr<Model> aggregated = aggregator_->Finish();
  if (!aggregated.ok()) return aggregated.status();
  if (optimizer_.kind != v1::SERVER_OPTIMIZER_NONE) {
    absl::StatusOr<Model> stepped =
        ApplyServerOptimizer(optimizer_, *base_, *aggregated, scratch_dir_);
    if (!stepped.ok()) {
      return absl::Status(stepped.status().code(),
                          absl::StrCat("server optimizer ",
                                       ServerOptimizerName(optimizer_.kind),
                                       ": ", stepped.status().message()));
    }
    return std::make_shared<const Model>(std::move(*stepped));
  }
  return std::make_shared<const Model>(std::move(*aggregated));
}

}  // namespace swarm
