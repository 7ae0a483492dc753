// Simulations of whole jobs (issue 4, item 6): the same SiteDriver the
// daemon runs, one per site, over the in-process FakeNetwork, in virtual time
// (one ManualRunner for the whole swarm: deterministic and fast), plus
// Threaded* tests with a real thread pool per site, for ThreadSanitizer.
//
// Numbers are chosen so every aggregate is exact: the test learner's model
// is 256 F32 values i * 0.25 - 8, site k adds (k + 1) / 8 per round, and
// sample counts are picked so the total weight of each round is a power of
// two; then every sum, product and the final scaling by 1 / W are exact in
// F32/F64, and a round's global model must equal the weighted average
// computed here bit for bit.
#include "controller/site_driver.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "config/election.h"
#include "config/job_config.h"
#include "controller/fake_network.h"
#include "controller/model_store.h"
#include "controller/task_runner.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "learner/test_learner.h"

namespace swarm {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

constexpr char kJobId[] = "sim";

std::vector<float> Floats(const Model& model) {
  const int index = model.FindTensor(TestLearner::kTensorName);
  if (index < 0) return {};
  const absl::string_view bytes = model.tensor_data(index);
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

// The test learner, recording the global model of every round it validated
// and counting its training runs.
class RecordingLearner final : public Learner {
 public:
  explicit RecordingLearner(std::unique_ptr<TestLearner> inner)
      : inner_(std::move(inner)) {}

  absl::StatusOr<Model> InitialModel() override {
    return inner_->InitialModel();
  }
  absl::StatusOr<Metrics> Validate(const Model& global,
                                   uint32_t round) override {
    {
      absl::MutexLock lock(&mu_);
      globals_[round] = Floats(global);
    }
    return inner_->Validate(global, round);
  }
  absl::StatusOr<TrainOutput> Train(const Model& global, uint32_t round,
                                    const std::atomic<bool>& cancel) override {
    {
      absl::MutexLock lock(&mu_);
      ++trains_;
    }
    return inner_->Train(global, round, cancel);
  }

  std::map<uint32_t, std::vector<float>> globals() const {
    absl::MutexLock lock(&mu_);
    return globals_;
  }
  int trains() const {
    absl::MutexLock lock(&mu_);
    return trains_;
  }
  const TestLearnerOptions& options() const { return inner_->options(); }

 private:
  std::unique_ptr<TestLearner> inner_;
  mutable absl::Mutex mu_;
  std::map<uint32_t, std::vector<float>> globals_ ABSL_GUARDED_BY(mu_);
  int trains_ ABSL_GUARDED_BY(mu_) = 0;
};

// The scripted validation metric of each round (the same on every site):
// round 2's global model is the best.
const std::map<uint32_t, double>& ScriptedMetrics() {
  static const auto* metrics = new std::map<uint32_t, double>{
      {0, 0.5}, {1, 0.625}, {2, 0.875}, {3, 0.75}, {4, 0.8125}};
  return *metrics;
}
constexpr uint32_t kBestRound = 2;

struct SimConfig {
  int sites = 4;
  uint32_t rounds = 3;
  // Real thread pools (one per site) instead of virtual time.
  bool threaded = false;
  int call_attempts = 3;
  // Edits the job config before it is configured.
  std::function<void(v1::JobConfig*)> job;
  // Edits site i's learner options (defaults: see the file comment;
  // sample_count 1 for even i, 3 for odd i).
  std::function<void(int, TestLearnerOptions*)> learner;
};

SimConfig Config(
    int sites, uint32_t rounds,
    std::function<void(v1::JobConfig*)> job = nullptr,
    std::function<void(int, TestLearnerOptions*)> learner = nullptr) {
  SimConfig config;
  config.sites = sites;
  config.rounds = rounds;
  config.job = std::move(job);
  config.learner = std::move(learner);
  return config;
}

SimConfig Threaded(SimConfig config) {
  config.threaded = true;
  return config;
}

// Calls of `kind` (any when unset), from / to a site (any when empty), for a
// round (any when unset).
CallMatcher Calls(std::optional<CallKind> kind, std::string from = "",
                  std::string to = "",
                  std::optional<uint32_t> round = std::nullopt) {
  CallMatcher match;
  match.kind = kind;
  match.from = std::move(from);
  match.to = std::move(to);
  match.round = round;
  return match;
}

// A swarm of sites over a FakeNetwork.
class Sim {
 public:
  explicit Sim(SimConfig config) : config_(std::move(config)) {
    SetMinLogSeverity(LogSeverity::kWarning);
    network_ = config_.threaded ? std::make_unique<FakeNetwork>()
                                : std::make_unique<FakeNetwork>(&runner_);
    v1::JobConfig job;
    job.set_job_id(kJobId);
    for (int i = 0; i < config_.sites; ++i) {
      v1::SiteInfo* site = job.add_sites();
      site->set_name(Name(i));
      site->set_address(
          absl::StrCat("10.0.", i / 200, ".", i % 200 + 1, ":7000"));
    }
    job.set_num_rounds(config_.rounds);
    job.set_seed(20261130);
    job.set_wait_after_min_responses_ms(10'000);
    job.set_round_timeout_ms(600'000);
    job.set_request_to_submit_interval_ms(100);
    job.set_request_to_submit_max_wait_ms(30'000);
    job.set_request_to_submit_message_timeout_ms(2'000);
    job.set_final_result_ack_timeout_ms(10'000);
    job.set_keep_round_models(true);
    if (config_.job) config_.job(&job);
    job_ = WithDefaults(job);

    for (int i = 0; i < config_.sites; ++i) {
      auto site = std::make_unique<Site>();
      site->name = Name(i);
      TestLearnerOptions options;
      options.site = site->name;
      options.size = 256;
      options.init_scale = 0.25f;
      options.init_offset = -8.0f;
      options.delta = 0.125f * static_cast<float>(i + 1);
      options.sample_count = i % 2 == 0 ? 1 : 3;
      options.metrics = ScriptedMetrics();
      options.default_metric = 0.25;
      if (config_.learner) config_.learner(i, &options);
      absl::StatusOr<std::unique_ptr<TestLearner>> learner =
          TestLearner::Create(options);
      EXPECT_TRUE(learner.ok()) << learner.status();
      site->learner = std::make_unique<RecordingLearner>(std::move(*learner));
      TaskRunner* runner = &runner_;
      if (config_.threaded) {
        site->pool = std::make_unique<ThreadPoolRunner>(4);
        runner = site->pool.get();
      }
      DriverOptions controller_options;
      controller_options.site = site->name;
      controller_options.retry.attempts = config_.call_attempts;
      controller_options.jitter_seed = static_cast<uint64_t>(i) + 1;
      site->controller = std::make_unique<SiteDriver>(
          controller_options, network_->TransportFor(site->name),
          site->learner.get(), &site->store, runner);
      network_->AddSite(site->name, site->controller.get());
      sites_.push_back(std::move(site));
    }
  }

  ~Sim() {
    // No worker of one site may be inside another site's controller, and no
    // runner may run a task, when the controllers go.
    network_->Shutdown();
    for (auto& site : sites_) site->pool.reset();
  }

  static std::string Name(int i) { return absl::StrFormat("site-%02d", i); }
  int size() const { return static_cast<int>(sites_.size()); }
  int Index(absl::string_view name) const {
    for (int i = 0; i < size(); ++i) {
      if (sites_[i]->name == name) return i;
    }
    ADD_FAILURE() << "no site " << name;
    return 0;
  }
  SiteDriver& controller(int i) { return *sites_[i]->controller; }
  RecordingLearner& learner(int i) { return *sites_[i]->learner; }
  MemoryModelStore& store(int i) { return sites_[i]->store; }
  FakeNetwork& network() { return *network_; }
  ManualRunner& runner() { return runner_; }
  const v1::JobConfig& job() const { return job_; }
  uint32_t rounds() const { return job_.num_rounds(); }
  std::string Aggregator(uint32_t round) const {
    return ElectionOrder(job_, round).at(0);
  }
  bool IsTrainer(int i) const { return swarm::IsTrainer(job_, Name(i)); }

  void Configure() {
    v1::ConfigureRequest request;
    request.set_sender("operator");
    *request.mutable_job() = job_;
    for (int i = 0; i < size(); ++i) {
      const v1::Reply reply = controller(i).Configure(request);
      ASSERT_EQ(reply.outcome(), v1::OUTCOME_OK) << reply.message();
    }
  }
  void Start() {
    v1::StartRequest request;
    request.set_sender("operator");
    request.set_job_id(kJobId);
    const v1::Reply reply =
        controller(Index(job_.starting_site())).Start(request);
    ASSERT_EQ(reply.outcome(), v1::OUTCOME_OK) << reply.message();
  }
  // Configure, start and (virtual time) run until nothing is left to do.
  void RunJob() {
    Configure();
    Start();
    runner_.RunUntilIdle();
  }
  // Virtual time: runs one task at a time until `done` (true) or nothing is
  // left (false).
  bool RunUntil(const std::function<bool()>& done) {
    while (!done()) {
      if (runner_.RunUntilIdle(1) == 0) return done();
    }
    return true;
  }
  v1::AbortRequest AbortRequest() const {
    v1::AbortRequest request;
    request.set_job_id(kJobId);
    request.set_sender("operator");
    request.set_reason("test");
    return request;
  }

  v1::SiteStatus Status(int i) { return controller(i).Status().status(); }

  // Real threads: waits until every site in `which` (all when empty) is in
  // a terminal state, or `timeout` passes.
  bool WaitTerminal(absl::Duration timeout, std::vector<int> which = {}) {
    if (which.empty()) {
      for (int i = 0; i < size(); ++i) which.push_back(i);
    }
    const absl::Time deadline = absl::Now() + timeout;
    for (int i : which) {
      while (true) {
        const v1::StatusReply reply = controller(i).Status();
        const v1::SiteState state = reply.status().state();
        if (state == v1::SITE_STATE_DONE || state == v1::SITE_STATE_FAILED ||
            state == v1::SITE_STATE_ABORTED) {
          break;
        }
        if (absl::Now() >= deadline) return false;
        controller(i).WaitForStatusChange(reply.version(), deadline);
      }
    }
    return true;
  }

  // The global model of each round as the sites received it with the
  // learn task (every site that got it must have the same), and the
  // initial model as round start_round's.
  std::map<uint32_t, std::vector<float>> Globals() {
    std::map<uint32_t, std::vector<float>> globals;
    for (int i = 0; i < size(); ++i) {
      for (const auto& [round, values] : learner(i).globals()) {
        auto [it, inserted] = globals.emplace(round, values);
        if (!inserted) {
          EXPECT_TRUE(it->second == values)
              << Name(i) << " got another global model in round " << round;
        }
      }
    }
    return globals;
  }

  // Site i's BEST or LAST model, or null.
  std::shared_ptr<const Model> Final(int i, v1::ModelKind kind) {
    absl::StatusOr<std::shared_ptr<const Model>> model =
        store(i).LoadFinal(kJobId, kind);
    return model.ok() ? *model : nullptr;
  }

 private:
  struct Site {
    std::string name;
    std::unique_ptr<RecordingLearner> learner;
    MemoryModelStore store;
    std::unique_ptr<ThreadPoolRunner> pool;
    std::unique_ptr<SiteDriver> controller;
  };

  SimConfig config_;
  v1::JobConfig job_;
  ManualRunner runner_;
  std::unique_ptr<FakeNetwork> network_;
  std::vector<std::unique_ptr<Site>> sites_;
};

// sum_k c_k * (prev + d_k) / sum_k c_k over the trainers `included`, as the
// trainers (F32 addition) and FedAvg compute it when everything is exact.
std::vector<float> ExpectedAggregate(Sim& sim, const std::vector<float>& prev,
                                     const std::vector<int>& included) {
  double total = 0;
  for (int k : included) {
    total += static_cast<double>(sim.learner(k).options().sample_count);
  }
  int exponent = 0;
  EXPECT_EQ(std::frexp(total, &exponent), 0.5)
      << "the test's weights must total a power of two (exactness)";
  std::vector<float> next(prev.size());
  for (size_t i = 0; i < prev.size(); ++i) {
    double sum = 0;
    for (int k : included) {
      const TestLearnerOptions& options = sim.learner(k).options();
      const float trained = prev[i] + options.delta;
      sum += static_cast<double>(options.sample_count) * trained;
    }
    next[i] = static_cast<float>(sum / total);
  }
  return next;
}

std::vector<int> AllTrainers(Sim& sim) {
  std::vector<int> trainers;
  for (int i = 0; i < sim.size(); ++i) {
    if (sim.IsTrainer(i)) trainers.push_back(i);
  }
  return trainers;
}

// Every round's aggregate is exactly the weighted average of the results of
// `included(round)` over that round's global model; the last one is the
// LAST model of every site in `done_sites`; each aggregate is also what
// that round's elected aggregator stored. Returns the globals.
std::map<uint32_t, std::vector<float>> ExpectExactRounds(
    Sim& sim, const std::function<std::vector<int>(uint32_t)>& included,
    const std::vector<int>& done_sites) {
  std::map<uint32_t, std::vector<float>> globals = sim.Globals();
  const uint32_t first = sim.job().start_round();
  const uint32_t end = first + sim.rounds();
  std::vector<float> initial;
  {
    absl::StatusOr<Model> model = sim.learner(0).InitialModel();
    EXPECT_TRUE(model.ok());
    initial = Floats(*model);
  }
  EXPECT_TRUE(globals[first] == initial) << "round " << first;
  for (int i : done_sites) {
    std::shared_ptr<const Model> last = sim.Final(i, v1::MODEL_KIND_LAST);
    EXPECT_NE(last, nullptr) << Sim::Name(i) << " has no LAST model";
    if (last == nullptr) continue;
    auto [it, inserted] = globals.emplace(end, Floats(*last));
    if (!inserted) {
      EXPECT_TRUE(it->second == Floats(*last))
          << Sim::Name(i) << ": LAST differs";
    }
  }
  for (uint32_t round = first; round < end; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto prev = globals.find(round);
    auto next = globals.find(round + 1);
    if (prev == globals.end() || next == globals.end()) {
      ADD_FAILURE() << "no global model seen for round " << round << " or "
                    << round + 1;
      continue;
    }
    const std::vector<float> expected =
        ExpectedAggregate(sim, prev->second, included(round));
    EXPECT_TRUE(next->second == expected)
        << "aggregate of round " << round << ": element 0 is "
        << next->second[0] << ", expected " << expected[0];
    // The elected aggregator kept exactly this model (keep_round_models).
    const int aggregator = sim.Index(sim.Aggregator(round));
    absl::StatusOr<std::shared_ptr<const Model>> kept =
        sim.store(aggregator).LoadRound(kJobId, round + 1);
    EXPECT_TRUE(kept.ok()) << sim.Aggregator(round) << ": " << kept.status();
    if (kept.ok()) {
      EXPECT_TRUE(Floats(**kept) == expected);
    }
  }
  return globals;
}

// Learn tasks name, and results go to, each round's elected aggregator; a
// site completes exactly the rounds it was elected for.
void ExpectElectedAggregators(Sim& sim) {
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask ||
        call.kind == CallKind::kSubmitResult) {
      EXPECT_EQ(call.aggregator, sim.Aggregator(call.round))
          << CallKindName(call.kind) << " " << call.from << "->" << call.to;
    }
    if (call.kind == CallKind::kSubmitResult) {
      EXPECT_EQ(call.to, sim.Aggregator(call.round));
    }
  }
  const uint32_t first = sim.job().start_round();
  for (int i = 0; i < sim.size(); ++i) {
    uint64_t elected = 0;
    for (uint32_t round = first; round < first + sim.rounds(); ++round) {
      if (sim.Aggregator(round) == Sim::Name(i)) ++elected;
    }
    EXPECT_EQ(sim.Status(i).counters().rounds_completed(), elected)
        << Sim::Name(i);
  }
}

// BEST and LAST are byte-identical (data and metadata) on every site in
// `sites`, and BEST is round `best_round`'s global model.
void ExpectSameFinals(Sim& sim, const std::vector<int>& sites,
                      const std::map<uint32_t, std::vector<float>>& globals,
                      uint32_t best_round) {
  ASSERT_FALSE(sites.empty());
  for (v1::ModelKind kind : {v1::MODEL_KIND_BEST, v1::MODEL_KIND_LAST}) {
    std::shared_ptr<const Model> reference = sim.Final(sites[0], kind);
    ASSERT_NE(reference, nullptr) << v1::ModelKind_Name(kind);
    for (int i : sites) {
      std::shared_ptr<const Model> model = sim.Final(i, kind);
      ASSERT_NE(model, nullptr) << Sim::Name(i) << v1::ModelKind_Name(kind);
      EXPECT_TRUE(model->SameLayout(*reference));
      EXPECT_EQ(model->tensor_data(0), reference->tensor_data(0))
          << Sim::Name(i) << " " << v1::ModelKind_Name(kind);
      EXPECT_EQ(model->metadata(), reference->metadata()) << Sim::Name(i);
    }
  }
  std::shared_ptr<const Model> best = sim.Final(sites[0], v1::MODEL_KIND_BEST);
  auto it = globals.find(best_round);
  ASSERT_NE(it, globals.end());
  EXPECT_TRUE(Floats(*best) == it->second)
      << "BEST is not round " << best_round << "'s model";
  EXPECT_EQ(best->metadata().at("round"), absl::StrCat(best_round));
  EXPECT_EQ(best->metadata().at("best_site"), sim.Aggregator(best_round));
}

// Virtual time at which the first call of `kind` for `round` started, or
// InfiniteFuture.
absl::Time FirstCall(Sim& sim, CallKind kind, uint32_t round) {
  absl::Time first = absl::InfiniteFuture();
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == kind && call.round == round) {
      first = std::min(first, call.start);
    }
  }
  return first;
}

// When round `round` closed: its aggregator then scatters the next round
// (or distributes the final models) at once, at the same virtual time.
absl::Time RoundClosedAt(Sim& sim, uint32_t round) {
  if (round + 1 < sim.job().start_round() + sim.rounds()) {
    return FirstCall(sim, CallKind::kLearnTask, round + 1);
  }
  absl::Time first = absl::InfiniteFuture();
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kFinalResult)
      first = std::min(first, call.start);
  }
  return first;
}

// When round `round` opened: the aggregator got its learn task after every
// other trainer's (phase two of the scatter).
absl::Time RoundOpenedAt(Sim& sim, uint32_t round) {
  const std::string aggregator = sim.Aggregator(round);
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == round &&
        call.to == aggregator && call.result == "OK") {
      return call.end;
    }
  }
  // The aggregator scattered to itself: the round opened when its last
  // learn task to a trainer returned.
  absl::Time last = absl::InfinitePast();
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kLearnTask && call.round == round) {
      last = std::max(last, call.end);
    }
  }
  return last;
}

// Times at which results of `round` were accepted (the calls' returns).
std::vector<absl::Time> ResultTimes(Sim& sim, uint32_t round) {
  std::vector<absl::Time> times;
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kSubmitResult && call.round == round &&
        call.result == "OK") {
      times.push_back(call.end);
    }
  }
  std::sort(times.begin(), times.end());
  return times;
}

// A trainer that is neither the starting site nor elected in any round
// (so the job does not depend on it), preferring the heaviest weight.
int BystanderTrainer(Sim& sim) {
  std::set<std::string> busy = {sim.job().starting_site()};
  const uint32_t first = sim.job().start_round();
  for (uint32_t round = first; round < first + sim.rounds(); ++round) {
    busy.insert(sim.Aggregator(round));
  }
  for (int i = sim.size() - 1; i >= 0; --i) {
    if (busy.count(Sim::Name(i)) == 0 && sim.IsTrainer(i)) return i;
  }
  ADD_FAILURE() << "every site aggregates some round; change the seed";
  return -1;
}

std::vector<int> AllSites(Sim& sim) {
  std::vector<int> all;
  for (int i = 0; i < sim.size(); ++i) all.push_back(i);
  return all;
}

std::vector<int> Without(std::vector<int> sites, int site) {
  sites.erase(std::remove(sites.begin(), sites.end(), site), sites.end());
  return sites;
}

// ---------------------------------------------------------------------------

TEST(SimTest, ThirtyTwoSitesCompleteTenRounds) {
  // 16 sites with 1 sample and 16 with 3: 64 in all, a power of two.
  Sim sim(Config(32, 10));
  sim.RunJob();

  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    EXPECT_EQ(status.last_error(), "") << Sim::Name(i);
    EXPECT_LE(status.counters().max_submissions_in_flight(), 1u);
    EXPECT_EQ(status.counters().rounds_trained(), 10u) << Sim::Name(i);
    EXPECT_TRUE(status.best().present());
    EXPECT_EQ(status.best().round(), kBestRound);
    EXPECT_EQ(status.best().site(), sim.Aggregator(kBestRound));
    EXPECT_EQ(status.best().metric(), ScriptedMetrics().at(kBestRound));
  }
  const auto globals = ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, all);
  ExpectElectedAggregators(sim);
  ExpectSameFinals(sim, all, globals, kBestRound);

  // Results accepted: every trainer in every round, nothing refused.
  uint64_t accepted = 0;
  uint64_t rejected = 0;
  std::set<std::string> aggregators;
  for (int i : all) {
    accepted += sim.Status(i).counters().results_accepted();
    rejected += sim.Status(i).counters().results_rejected();
  }
  for (uint32_t round = 0; round < 10; ++round) {
    aggregators.insert(sim.Aggregator(round));
  }
  EXPECT_EQ(accepted, 32u * 10u);
  EXPECT_EQ(rejected, 0u);
  EXPECT_GT(aggregators.size(), 1u) << "the election never varied";
  // The holder of BEST shared it when it was not the last aggregator.
  if (sim.Aggregator(kBestRound) != sim.Aggregator(9)) {
    bool shared = false;
    for (const CallRecord& call : sim.network().Log()) {
      shared |= call.kind == CallKind::kShareBest &&
                call.to == sim.Aggregator(kBestRound) && call.result == "OK";
    }
    EXPECT_TRUE(shared);
  }
}

TEST(SimTest, TrainerOnlyAndCandidateOnlySites) {
  // Sites 0-3 train, sites 2-5 may aggregate: 0 and 1 are trainer-only, 4
  // and 5 candidate-only. Weights 1, 3, 1, 3: 8.
  Sim sim(Config(6, 5, [](v1::JobConfig* job) {
    for (int i = 0; i < 4; ++i) job->add_trainers(Sim::Name(i));
    for (int i = 2; i < 6; ++i) job->add_aggregator_candidates(Sim::Name(i));
  }));
  sim.RunJob();
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  for (int i : {0, 1}) {
    EXPECT_EQ(sim.Status(i).counters().rounds_completed(), 0u);
  }
  for (int i : {4, 5}) {
    EXPECT_EQ(sim.learner(i).trains(), 0) << Sim::Name(i);
    EXPECT_EQ(sim.Status(i).counters().rounds_trained(), 0u);
  }
  const auto globals = ExpectExactRounds(
      sim,
      [&](uint32_t) {
        return std::vector<int>{0, 1, 2, 3};
      },
      all);
  ExpectElectedAggregators(sim);
  ExpectSameFinals(sim, all, globals, kBestRound);
}

TEST(SimTest, DroppedLearnTaskTrainerIsReportedAndNotWaitedFor) {
  // Every attempt of round 1's learn task to one trainer is dropped: it
  // does not acknowledge, so it is not in the round's expected set (design
  // section 6): the scatterer reports it and the round closes on the last
  // result of the others, neither at the grace time nor at the timeout.
  // Five sites with weight 1, 1, 1, 1 and the bystander's 4: without it, 4.
  Sim probe(Config(5, 3));
  const int dropped = BystanderTrainer(probe);
  ASSERT_GE(dropped, 0);
  Sim sim(Config(5, 3, nullptr, [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == dropped ? 4 : 1;
  }));
  const std::string name = Sim::Name(dropped);
  sim.network().AddFault(Calls(CallKind::kLearnTask, "", name, 1),
                         Fault::kDrop);
  sim.Configure();
  sim.Start();
  // Right after round 1's first result, the scatterer has reported it.
  ASSERT_TRUE(sim.RunUntil([&] { return !ResultTimes(sim, 1).empty(); }));
  const int scatterer = sim.Index(sim.Aggregator(0));
  EXPECT_THAT(
      sim.Status(scatterer).last_error(),
      HasSubstr(absl::StrCat("learn task to ", name, " not acknowledged")));
  sim.runner().RunUntilIdle();

  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  EXPECT_EQ(sim.learner(dropped).globals().count(1), 0u);
  EXPECT_EQ(sim.learner(dropped).trains(), 2);
  const std::vector<int> all = AllSites(sim);
  ExpectExactRounds(
      sim,
      [&](uint32_t round) { return round == 1 ? Without(all, dropped) : all; },
      all);
  // Not waited for: closed with the others' last result.
  const absl::Time closed = RoundClosedAt(sim, 1);
  EXPECT_EQ(closed, ResultTimes(sim, 1).back());
  EXPECT_LT(closed - RoundOpenedAt(sim, 1), absl::Seconds(10));
}

TEST(SimTest, LostLearnTaskClosesAtGraceTimeNotTimeout) {
  // Round 1's learn task to one trainer is acknowledged and then lost (the
  // trainer acknowledged and crashed, say): it is expected but never
  // submits. With min_responses_required = 4 of 5, the round closes
  // wait_after_min_responses (10 s) after the fourth result, not at the
  // round timeout (600 s). Results take 300 ms to arrive, so the fourth
  // arrives after the round opened.
  Sim probe(Config(5, 3));
  const int lost = BystanderTrainer(probe);
  ASSERT_GE(lost, 0);
  Sim sim(Config(
      5, 3,
      [](v1::JobConfig* job) {
        job->set_min_responses_required(4);
        job->set_max_concurrent_submissions(5);
      },
      [&](int i, TestLearnerOptions* options) {
        options->sample_count = i == lost ? 4 : 1;
      }));
  const std::string name = Sim::Name(lost);
  sim.network().AddFault(Calls(CallKind::kLearnTask, "", name, 1),
                         Fault::kLoseAfterAck);
  sim.network().AddDelay(Calls(CallKind::kSubmitResult),
                         absl::Milliseconds(300));
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.RunUntil([&] {
    return FirstCall(sim, CallKind::kLearnTask, 2) != absl::InfiniteFuture();
  }));
  const int aggregator = sim.Index(sim.Aggregator(1));
  EXPECT_THAT(sim.Status(aggregator).last_error(),
              HasSubstr(absl::StrCat("no result from ", name)));
  sim.runner().RunUntilIdle();

  const absl::Time opened = RoundOpenedAt(sim, 1);
  const std::vector<absl::Time> results = ResultTimes(sim, 1);
  // The aggregator's own result does not cross the network.
  const size_t remote = sim.IsTrainer(aggregator) ? 3 : 4;
  ASSERT_EQ(results.size(), remote);
  EXPECT_GT(results.back(), opened);
  EXPECT_EQ(RoundClosedAt(sim, 1), results.back() + absl::Seconds(10));
  EXPECT_LT(RoundClosedAt(sim, 1), opened + absl::Seconds(600));

  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  ExpectExactRounds(
      sim,
      [&](uint32_t round) { return round == 1 ? Without(all, lost) : all; },
      all);
}

TEST(SimTest, BelowMinimumClosesAtRoundTimeout) {
  // Two of five trainers lose round 1's task; the minimum (4) is never
  // reached: the round closes exactly round_timeout after it opened, and
  // aggregates the three results it has.
  Sim probe(Config(5, 3));
  const int lost = BystanderTrainer(probe);
  ASSERT_GE(lost, 0);
  int second = -1;
  for (int i = 0; i < 5; ++i) {
    if (i != lost && probe.Aggregator(1) != Sim::Name(i) &&
        probe.job().starting_site() != Sim::Name(i)) {
      second = i;
    }
  }
  ASSERT_GE(second, 0);
  const std::vector<int> all = AllSites(probe);
  const std::vector<int> remaining = Without(Without(all, lost), second);
  // Weights: 2, 1, 1 for the remaining three (4), 2 and 2 for the others
  // (8 in all).
  Sim sim(Config(
      5, 3,
      [](v1::JobConfig* job) {
        job->set_min_responses_required(4);
        job->set_round_timeout_ms(120'000);
      },
      [&](int i, TestLearnerOptions* options) {
        options->sample_count = (i == lost || i == second) ? 2
                                : i == remaining[0]        ? 2
                                                           : 1;
      }));
  for (int i : {lost, second}) {
    sim.network().AddFault(Calls(CallKind::kLearnTask, "", Sim::Name(i), 1),
                           Fault::kLoseAfterAck);
  }
  sim.RunJob();
  EXPECT_EQ(RoundClosedAt(sim, 1), RoundOpenedAt(sim, 1) + absl::Seconds(120));
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  ExpectExactRounds(
      sim, [&](uint32_t round) { return round == 1 ? remaining : all; }, all);
}

// The final models and every round's global model of a job.
struct JobOutcome {
  std::map<uint32_t, std::vector<float>> globals;
  std::vector<std::string> best;
  std::vector<std::string> last;
  uint64_t accepted = 0;
};

JobOutcome Outcome(Sim& sim) {
  JobOutcome outcome;
  outcome.globals = sim.Globals();
  for (int i = 0; i < sim.size(); ++i) {
    std::shared_ptr<const Model> best = sim.Final(i, v1::MODEL_KIND_BEST);
    std::shared_ptr<const Model> last = sim.Final(i, v1::MODEL_KIND_LAST);
    outcome.best.push_back(best ? std::string(best->tensor_data(0)) : "");
    outcome.last.push_back(last ? std::string(last->tensor_data(0)) : "");
    outcome.accepted += sim.Status(i).counters().results_accepted();
  }
  return outcome;
}

TEST(SimTest, DuplicatedMessagesChangeNothing) {
  // Every call is delivered twice. The model is 12 KB in 4 KiB chunks, so
  // each stream is assembled from several chunks.
  SimConfig config = Config(
      8, 5, [](v1::JobConfig* job) { job->set_chunk_size(4096); },
      [](int, TestLearnerOptions* options) { options->size = 3000; });
  Sim plain(config);
  plain.RunJob();
  const JobOutcome expected = Outcome(plain);

  Sim doubled(config);
  doubled.network().AddFault(CallMatcher(), Fault::kDuplicate);
  doubled.RunJob();
  const JobOutcome outcome = Outcome(doubled);

  int duplicated = 0;
  std::set<CallKind> kinds;
  for (const CallRecord& call : doubled.network().Log()) {
    if (call.deliveries == 2) {
      ++duplicated;
      kinds.insert(call.kind);
    }
  }
  EXPECT_GT(duplicated, 0);
  EXPECT_EQ(kinds.size(), 5u) << "every kind of call was duplicated";
  for (int i = 0; i < doubled.size(); ++i) {
    EXPECT_EQ(doubled.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    EXPECT_TRUE(MessageDifferencer::Equals(doubled.Status(i).best(),
                                           plain.Status(i).best()));
    EXPECT_LE(doubled.Status(i).counters().max_submissions_in_flight(), 1u);
  }
  EXPECT_TRUE(outcome.globals == expected.globals);
  EXPECT_TRUE(outcome.best == expected.best) << "BEST differs";
  EXPECT_TRUE(outcome.last == expected.last) << "LAST differs";
  EXPECT_EQ(outcome.accepted, expected.accepted);
  ExpectExactRounds(
      doubled, [&](uint32_t) { return AllTrainers(doubled); },
      AllSites(doubled));
}

TEST(SimTest, LostRepliesAreRetriedWithoutLosingAnything) {
  // The first reply of every kind of call to every site is lost after the
  // message was handled (the caller sees DeadlineExceeded and retries): a
  // re-sent learn task must still count as acknowledged, and the job ends
  // as if nothing happened.
  SimConfig config = Config(8, 5);
  Sim plain(config);
  plain.RunJob();
  const JobOutcome expected = Outcome(plain);

  Sim lossy(config);
  for (int i = 0; i < lossy.size(); ++i) {
    for (CallKind kind : {CallKind::kLearnTask, CallKind::kRequestToSubmit,
                          CallKind::kSubmitResult, CallKind::kShareBest,
                          CallKind::kFinalResult}) {
      lossy.network().AddFault(Calls(kind, "", Sim::Name(i)), Fault::kDropReply,
                               1);
    }
  }
  lossy.RunJob();
  int lost = 0;
  for (const CallRecord& call : lossy.network().Log()) {
    lost += call.fault == "drop_reply";
  }
  EXPECT_GT(lost, 0);
  for (int i = 0; i < lossy.size(); ++i) {
    EXPECT_EQ(lossy.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  const JobOutcome outcome = Outcome(lossy);
  EXPECT_TRUE(outcome.globals == expected.globals);
  EXPECT_TRUE(outcome.best == expected.best) << "BEST differs";
  EXPECT_TRUE(outcome.last == expected.last) << "LAST differs";
  ExpectExactRounds(
      lossy, [&](uint32_t) { return AllTrainers(lossy); }, AllSites(lossy));
}

TEST(SimTest, LostAckOfTheAggregatorsTaskDoesNotFailTheJob) {
  // The aggregator's learn task of round r arrives but its acknowledgement
  // is lost. Before the scatterer's retry (after a backoff) the aggregator
  // has already closed round r and moved on to round r + 1, so the retry is
  // refused as stale; that must not count as "aggregator unreachable".
  // All submissions at once: a round takes no virtual time, less than the
  // scatterer's backoff.
  const SimConfig config = Config(
      4, 4, [](v1::JobConfig* job) { job->set_max_concurrent_submissions(4); });
  Sim probe(config);
  uint32_t round = 0;
  auto scatterer = [&](uint32_t r) {
    return r == 0 ? probe.job().starting_site() : probe.Aggregator(r - 1);
  };
  while (round < 4 && scatterer(round) == probe.Aggregator(round)) ++round;
  ASSERT_LT(round, 4u) << "every aggregator scatters to itself";
  Sim sim(config);
  sim.network().AddFault(
      Calls(CallKind::kLearnTask, "", sim.Aggregator(round), round),
      Fault::kDropReply, 1);
  // Round r + 1's results take a second, so the retry finds the aggregator
  // in round r + 1.
  sim.network().AddDelay(Calls(CallKind::kSubmitResult, "", "", round + 1),
                         absl::Seconds(1));
  sim.RunJob();
  bool refused_as_stale = false;
  for (const CallRecord& call : sim.network().Log()) {
    refused_as_stale |= call.kind == CallKind::kLearnTask &&
                        call.round == round &&
                        call.to == sim.Aggregator(round) &&
                        absl::StrContains(call.result, "already has");
  }
  EXPECT_TRUE(refused_as_stale);
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    EXPECT_EQ(sim.Status(i).last_error(), "") << Sim::Name(i);
  }
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, all);
}

// The first round after round 0 whose elected aggregator differs from the
// previous round's (so that its learn task crosses the network), or
// `rounds` when there is none.
uint32_t FirstRoundWithNewAggregator(Sim& sim, uint32_t rounds) {
  uint32_t round = 1;
  while (round < rounds && sim.Aggregator(round) == sim.Aggregator(round - 1)) {
    ++round;
  }
  return round;
}

TEST(SimTest, IsolatedAggregatorFailsTheJobVisibly) {
  // Right after round r's election (its first learn task is on the wire),
  // the elected aggregator is cut off. Failover is future work: every other
  // site must end FAILED with an error naming that aggregator, in bounded
  // virtual time, instead of waiting forever.
  SimConfig config = Config(5, 4);
  Sim probe(config);
  const uint32_t round = FirstRoundWithNewAggregator(probe, 4);
  ASSERT_LT(round, 4u) << "no round changes aggregator; change the seed";
  Sim sim(config);
  const std::string aggregator = sim.Aggregator(round);
  sim.network().SetObserver([&](const CallRecord& call) {
    if (call.kind == CallKind::kLearnTask && call.round == round) {
      sim.network().Isolate(aggregator);
    }
  });
  sim.Configure();
  sim.Start();
  const absl::Time started = sim.runner().Now();
  sim.runner().RunUntilIdle();
  for (int i = 0; i < sim.size(); ++i) {
    if (Sim::Name(i) == aggregator) continue;
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_FAILED) << Sim::Name(i);
    EXPECT_THAT(status.last_error(), HasSubstr(aggregator)) << Sim::Name(i);
    // Failed within request_to_submit_max_wait (30 s) of the cut, plus the
    // rounds before it. (The clock itself runs on to stale no-op timers.)
    EXPECT_LT(absl::FromUnixMillis(status.last_error_time_ms()) - started,
              absl::Seconds(40))
        << Sim::Name(i);
  }
}

TEST(SimTest, AggregatorCutOffBrieflyRunsItsRoundOnceBack) {
  // The elected aggregator of round r is cut off as round r's scatter
  // begins and is back 5 s later, well past the ordinary retries (about
  // 1.5 s) but within request_to_submit_max_wait (30 s). The scatterer keeps
  // retrying its learn task, so the round runs once it is back, with every
  // trainer (the aggregator trains on that same task), and the job
  // completes with exact aggregates.
  SimConfig config = Config(5, 4);
  Sim probe(config);
  const uint32_t round = FirstRoundWithNewAggregator(probe, 4);
  ASSERT_LT(round, 4u) << "no round changes aggregator; change the seed";
  // Weights: 1 per site, 4 for the cut aggregator (a total of 8).
  const int cut_site = probe.Index(probe.Aggregator(round));
  config.learner = [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == cut_site ? 4 : 1;
  };
  Sim sim(config);
  const std::string aggregator = sim.Aggregator(round);
  bool cut = false;
  sim.network().SetObserver([&](const CallRecord& call) {
    if (!cut && call.kind == CallKind::kLearnTask && call.round == round) {
      cut = true;
      sim.network().Isolate(aggregator);
      sim.runner().PostAfter(absl::Seconds(5),
                             [&] { sim.network().Recover(aggregator); });
    }
  });
  sim.Configure();
  sim.Start();
  sim.runner().RunUntilIdle();
  ASSERT_TRUE(cut);
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << sim.Status(i).last_error();
  }
  // The round opened only after the cut healed.
  EXPECT_GE(RoundOpenedAt(sim, round) - RoundOpenedAt(sim, round - 1),
            absl::Seconds(5));
  ExpectExactRounds(
      sim, [&](uint32_t) { return all; }, all);
}

TEST(SimTest, IsolatedTrainerIsNotWaitedForAndRejoinsAfterRecovery) {
  // A trainer is cut off from round 1 to round 3: its learn tasks are not
  // acknowledged, so rounds 1 and 2 neither wait for it nor count it, and
  // the scatterers report it. It recovers before round 3 and takes part
  // again. Weights: 1 per site, 4 for it (4 without it, 8 with it).
  SimConfig config = Config(5, 5);
  Sim probe(config);
  const int cut = BystanderTrainer(probe);
  ASSERT_GE(cut, 0);
  config.learner = [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == cut ? 4 : 1;
  };
  Sim sim(config);
  const std::string name = Sim::Name(cut);
  sim.network().SetObserver([&](const CallRecord& call) {
    if (call.kind == CallKind::kLearnTask && call.round == 1) {
      sim.network().Isolate(name);
    }
    if (call.kind == CallKind::kLearnTask && call.round == 3) {
      sim.network().Recover(name);
    }
  });
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.RunUntil([&] { return !ResultTimes(sim, 1).empty(); }));
  EXPECT_THAT(sim.Status(sim.Index(sim.Aggregator(0))).last_error(),
              HasSubstr(absl::StrCat("learn task to ", name)));
  sim.runner().RunUntilIdle();

  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  for (uint32_t round : {1u, 2u}) {
    // Closed on the last result of the others: no grace wait (10 s), no
    // timeout.
    EXPECT_EQ(RoundClosedAt(sim, round), ResultTimes(sim, round).back());
    EXPECT_LT(RoundClosedAt(sim, round) - RoundOpenedAt(sim, round),
              absl::Seconds(10));
    EXPECT_EQ(sim.learner(cut).globals().count(round), 0u);
  }
  EXPECT_EQ(sim.learner(cut).globals().count(3), 1u);
  ExpectExactRounds(
      sim,
      [&](uint32_t round) {
        return round == 1 || round == 2 ? Without(all, cut) : all;
      },
      all);
}

TEST(SimTest, AbortStopsEveryActivityPromptly) {
  Sim sim(Config(6, 5));
  sim.Configure();
  sim.Start();
  // Mid-job: round 2 has results coming in.
  ASSERT_TRUE(sim.RunUntil([&] { return !ResultTimes(sim, 2).empty(); }));
  for (int i = 0; i < sim.size(); ++i) {
    const v1::Reply reply = sim.controller(i).Abort(sim.AbortRequest());
    EXPECT_EQ(reply.outcome(), v1::OUTCOME_OK) << reply.message();
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_ABORTED);
  }
  std::vector<v1::SiteStatus> before;
  std::vector<int> trains;
  for (int i = 0; i < sim.size(); ++i) {
    before.push_back(sim.Status(i));
    trains.push_back(sim.learner(i).trains());
  }
  const size_t calls = sim.network().Log().size();
  sim.runner().RunUntilIdle();
  for (int i = 0; i < sim.size(); ++i) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_TRUE(MessageDifferencer::Equals(status, before[i]))
        << Sim::Name(i) << ": " << status.ShortDebugString() << " vs "
        << before[i].ShortDebugString();
    EXPECT_EQ(status.state(), v1::SITE_STATE_ABORTED);
    EXPECT_THAT(status.last_error(), HasSubstr("aborted by operator"));
    EXPECT_EQ(sim.learner(i).trains(), trains[i]) << Sim::Name(i);
    EXPECT_EQ(sim.Final(i, v1::MODEL_KIND_LAST), nullptr);
    EXPECT_EQ(sim.store(i).state().state(), v1::SITE_STATE_ABORTED);
  }
  // Whatever was still on its way was refused.
  const std::vector<CallRecord> log = sim.network().Log();
  for (size_t k = calls; k < log.size(); ++k) {
    EXPECT_NE(log[k].result, "OK")
        << CallKindName(log[k].kind) << " " << log[k].from << "->" << log[k].to
        << " round " << log[k].round;
  }
}

TEST(SimTest, AbortedAggregatorRefusesResultsAndPermissions) {
  // Only the aggregator of round 1 is aborted, in the middle of its round:
  // the other sites' requests are answered ABORTED, nothing more is
  // aggregated there, and the trainers do not hang.
  Sim sim(Config(5, 3));
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.RunUntil([&] { return !ResultTimes(sim, 1).empty(); }));
  const int aggregator = sim.Index(sim.Aggregator(1));
  const uint64_t accepted =
      sim.Status(aggregator).counters().results_accepted();
  sim.controller(aggregator).Abort(sim.AbortRequest());
  sim.runner().RunUntilIdle();
  EXPECT_EQ(sim.Status(aggregator).state(), v1::SITE_STATE_ABORTED);
  EXPECT_EQ(sim.Status(aggregator).counters().results_accepted(), accepted);
  for (int i = 0; i < sim.size(); ++i) {
    const v1::SiteState state = sim.Status(i).state();
    EXPECT_NE(state, v1::SITE_STATE_DONE) << Sim::Name(i);
    EXPECT_NE(state, v1::SITE_STATE_WAITING_FOR_PERMISSION) << Sim::Name(i);
    EXPECT_NE(state, v1::SITE_STATE_SUBMITTING) << Sim::Name(i);
  }
}

class MaxConcurrentTest
    : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {};

TEST_P(MaxConcurrentTest, SubmissionsInFlightNeverExceedTheLimit) {
  // Uploads take 50 ms of virtual time, so they overlap unless the
  // aggregator's permissions keep them apart.
  const auto [limit, hold] = GetParam();
  Sim sim(Config(8, 3, [limit = limit](v1::JobConfig* job) {
    job->set_max_concurrent_submissions(limit);
  }));
  sim.network().AddDelay(Calls(CallKind::kSubmitResult), absl::Milliseconds(5),
                         absl::Milliseconds(50));
  sim.network().set_hold_permission_retries(hold);
  sim.RunJob();
  uint64_t most = 0;
  for (int i = 0; i < sim.size(); ++i) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE) << Sim::Name(i);
    EXPECT_LE(status.counters().max_submissions_in_flight(), limit);
    EXPECT_EQ(status.counters().submissions_in_flight(), 0u);
    most = std::max(most, status.counters().max_submissions_in_flight());
  }
  // The limit was reached (the uploads did compete) and enforced.
  EXPECT_EQ(most, limit);
  int retries = 0;
  for (const CallRecord& call : sim.network().Log()) {
    retries += call.kind == CallKind::kRequestToSubmit &&
               call.result == "OUTCOME_RETRY";
  }
  if (!hold) {
    EXPECT_GT(retries, 0) << "no trainer ever had to wait";
  }
  ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, AllSites(sim));
}

INSTANTIATE_TEST_SUITE_P(Limits, MaxConcurrentTest,
                         ::testing::Combine(::testing::Values(1u, 3u),
                                            ::testing::Bool()));

TEST(SimTest, SlowTrainerIsCutOffAfterGraceWait) {
  // min_responses_required = 4 of 5 and a 10 s grace wait. One trainer
  // answers 30 s late (its permission request is that slow): the round
  // closes 10 s after the fourth result, without it; its late request is
  // not granted for the closed round, and the job goes on and completes.
  Sim probe(Config(5, 3));
  const int slow = BystanderTrainer(probe);
  ASSERT_GE(slow, 0);
  Sim sim(Config(
      5, 3, [](v1::JobConfig* job) { job->set_min_responses_required(4); },
      [&](int i, TestLearnerOptions* options) {
        options->sample_count = i == slow ? 4 : 1;
      }));
  const std::string name = Sim::Name(slow);
  sim.network().AddDelay(Calls(CallKind::kRequestToSubmit, name, "", 1),
                         absl::Seconds(30));
  sim.RunJob();
  const absl::Time closed = RoundClosedAt(sim, 1);
  const std::vector<absl::Time> results = ResultTimes(sim, 1);
  ASSERT_FALSE(results.empty());
  EXPECT_EQ(closed, results.back() + absl::Seconds(10));
  for (const CallRecord& call : sim.network().Log()) {
    if (call.kind == CallKind::kSubmitResult && call.from == name) {
      EXPECT_NE(call.round, 1u) << "the slow result reached the aggregator";
    }
  }
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  ExpectExactRounds(
      sim,
      [&](uint32_t round) { return round == 1 ? Without(all, slow) : all; },
      all);
}

TEST(SimTest, FailedTrainingIsNotCountedAndTheRoundCloses) {
  // One trainer's training fails in round 1 (scripted): it tells the
  // aggregator, is not counted, and the round closes with the others'
  // results at once (it does not wait for the grace time or the timeout).
  Sim probe(Config(5, 3));
  const int failing = BystanderTrainer(probe);
  ASSERT_GE(failing, 0);
  Sim sim(Config(5, 3, nullptr, [&](int i, TestLearnerOptions* options) {
    options->sample_count = i == failing ? 4 : 1;
    if (i == failing) options->fail_rounds = {1};
  }));
  sim.RunJob();
  const std::string name = Sim::Name(failing);
  bool told = false;
  for (const CallRecord& call : sim.network().Log()) {
    told |= call.kind == CallKind::kSubmitResult && call.from == name &&
            call.round == 1 && call.failed_result && call.result == "OK";
  }
  EXPECT_TRUE(told);
  EXPECT_LT(RoundClosedAt(sim, 1) - RoundOpenedAt(sim, 1), absl::Seconds(10));
  EXPECT_THAT(sim.Status(failing).last_error(),
              HasSubstr("scripted training failure"));
  EXPECT_EQ(sim.Status(failing).counters().rounds_trained(), 2u);
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  ExpectExactRounds(
      sim,
      [&](uint32_t round) { return round == 1 ? Without(all, failing) : all; },
      all);
}

// A job with a bit of everything: dropped calls (retried with backoff),
// delays, duplicates, lost replies.
std::vector<std::string> FaultyRunLog() {
  Sim sim(Config(6, 4));
  sim.network().AddFault(Calls(CallKind::kLearnTask, "", Sim::Name(3)),
                         Fault::kDrop, 2);
  sim.network().AddFault(Calls(CallKind::kSubmitResult), Fault::kDrop, 3);
  sim.network().AddFault(Calls(CallKind::kRequestToSubmit), Fault::kDuplicate,
                         5);
  sim.network().AddFault(Calls(CallKind::kFinalResult), Fault::kDropReply, 2);
  sim.network().AddDelay(Calls(CallKind::kSubmitResult), absl::Milliseconds(7),
                         absl::Milliseconds(13));
  sim.RunJob();
  std::vector<std::string> lines;
  for (const CallRecord& call : sim.network().Log()) {
    lines.push_back(absl::StrCat(
        absl::FormatTime(call.start), " ", absl::FormatTime(call.end), " ",
        CallKindName(call.kind), " ", call.from, "->", call.to, " r",
        call.round, " ", call.fault, " ", call.deliveries, " ", call.result));
  }
  for (int i = 0; i < sim.size(); ++i) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE) << Sim::Name(i);
  }
  return lines;
}

TEST(SimTest, RunsAreDeterministic) {
  const std::vector<std::string> first = FaultyRunLog();
  const std::vector<std::string> second = FaultyRunLog();
  EXPECT_GT(first.size(), 50u);
  EXPECT_EQ(first, second);
}

// ---------------------------------------------------------------------------
// Real threads (run under ThreadSanitizer: ctest -L concurrency).

TEST(ThreadedSimTest, EightSitesCompleteWithThreadPools) {
  Sim sim(Threaded(Config(8, 5, [](v1::JobConfig* job) {
    job->set_max_concurrent_submissions(2);
  })));
  sim.network().AddDelay(Calls(CallKind::kSubmitResult), absl::ZeroDuration(),
                         absl::Milliseconds(1));
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.WaitTerminal(absl::Seconds(120)));
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    const v1::SiteStatus status = sim.Status(i);
    EXPECT_EQ(status.state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << status.last_error();
    EXPECT_LE(status.counters().max_submissions_in_flight(), 2u);
  }
  const auto globals = ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, all);
  ExpectElectedAggregators(sim);
  ExpectSameFinals(sim, all, globals, kBestRound);
}

TEST(ThreadedSimTest, DuplicatesAndLostRepliesWithThreadPools) {
  Sim sim(Threaded(Config(8, 4, [](v1::JobConfig* job) {
    job->set_max_concurrent_submissions(3);
  })));
  sim.network().AddFault(Calls(CallKind::kSubmitResult), Fault::kDropReply, 3);
  sim.network().AddFault(CallMatcher(), Fault::kDuplicate);
  sim.Configure();
  sim.Start();
  ASSERT_TRUE(sim.WaitTerminal(absl::Seconds(120)));
  const std::vector<int> all = AllSites(sim);
  for (int i : all) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_DONE)
        << Sim::Name(i) << ": " << sim.Status(i).last_error();
  }
  const auto globals = ExpectExactRounds(
      sim, [&](uint32_t) { return AllTrainers(sim); }, all);
  ExpectSameFinals(sim, all, globals, kBestRound);
}

TEST(ThreadedSimTest, AbortWhileRunning) {
  Sim sim(Threaded(Config(6, 50)));
  sim.Configure();
  sim.Start();
  // Let a few rounds go by, then abort every site while work is under way.
  const int starter = sim.Index(sim.job().starting_site());
  while (sim.Status(starter).round() < 3) {
    const v1::StatusReply reply = sim.controller(starter).Status();
    sim.controller(starter).WaitForStatusChange(
        reply.version(), absl::Now() + absl::Seconds(10));
  }
  for (int i = 0; i < sim.size(); ++i) {
    sim.controller(i).Abort(sim.AbortRequest());
  }
  ASSERT_TRUE(sim.WaitTerminal(absl::Seconds(30)));
  std::vector<int> trains;
  for (int i = 0; i < sim.size(); ++i) {
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_ABORTED);
    trains.push_back(sim.learner(i).trains());
  }
  // Nothing trains after the abort (a training already running may finish).
  absl::SleepFor(absl::Milliseconds(200));
  for (int i = 0; i < sim.size(); ++i) {
    EXPECT_LE(sim.learner(i).trains(), trains[i] + 1) << Sim::Name(i);
    EXPECT_EQ(sim.Status(i).state(), v1::SITE_STATE_ABORTED);
  }
}

}  // namespace
}  // namespace swarm
