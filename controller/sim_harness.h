// The harness of the simulations (sim_*_test.cc): a swarm of SiteDrivers,
// one per site, over the in-process FakeNetwork, in virtual time (one
// ManualRunner for the whole swarm: deterministic and fast) or with a real
// thread pool per site (Threaded*, for ThreadSanitizer).
//
// Numbers are chosen so every aggregate is exact: the test learner's model
// is 256 F32 values i * 0.25 - 8, site k adds (k + 1) / 8 per round, and
// sample counts are picked so the total weight of each round is a power of
// two; then every sum, product and the final scaling by 1 / W are exact in
// F32/F64, and a round's global model must equal the weighted average
// computed here bit for bit.
#ifndef SWARM_CONTROLLER_SIM_HARNESS_H_
#define SWARM_CONTROLLER_SIM_HARNESS_H_

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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
#include "controller/fault_injection_model_store.h"
#include "controller/model_store.h"
#include "controller/site_driver.h"
#include "controller/task_runner.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "learner/test_learner.h"

namespace swarm {
namespace sim {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

inline constexpr char kJobId[] = "sim";

inline std::vector<float> Floats(const Model& model) {
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
      if (privacy_stop_round_.has_value() && round >= *privacy_stop_round_) {
        return MarkStoppedForJob(absl::FailedPreconditionError(
            absl::StrCat("privacy budget exhausted: site ",
                         inner_->options().site, " stops training")));
      }
    }
    return inner_->Validate(global, round);
  }
  absl::StatusOr<TrainOutput> Train(const Model& global, uint32_t round,
                                    const std::atomic<bool>& cancel) override {
    int trained;
    {
      absl::MutexLock lock(&mu_);
      trained = ++trains_;
    }
    absl::StatusOr<TrainOutput> output = inner_->Train(global, round, cancel);
    absl::MutexLock lock(&mu_);
    if (output.ok() && epsilon_per_round_ > 0) {
      v1::PrivacySpent spent;
      spent.set_epsilon(epsilon_per_round_ * trained);
      spent.set_delta(1e-5);
      spent.set_rounds(static_cast<uint32_t>(trained));
      output->spent = spent;
    }
    return output;
  }

  // Differential privacy as a site's accountant reports it
  // (privacy/private_learner.h): each result carries the spend, epsilon
  // `epsilon_per_round` per round trained (delta 1e-5); from `stop_round`
  // on the site is out of budget: Validate fails, marked StoppedForJob.
  void SimulatePrivacy(double epsilon_per_round,
                       std::optional<uint32_t> stop_round) {
    absl::MutexLock lock(&mu_);
    epsilon_per_round_ = epsilon_per_round;
    privacy_stop_round_ = stop_round;
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
  double epsilon_per_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint32_t> privacy_stop_round_ ABSL_GUARDED_BY(mu_);
};

// The scripted validation metric of each round (the same on every site):
// round 2's global model is the best.
inline const std::map<uint32_t, double>& ScriptedMetrics() {
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

inline SimConfig Config(
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

inline SimConfig Threaded(SimConfig config) {
  config.threaded = true;
  return config;
}

// Calls of `kind` (any when unset), from / to a site (any when empty), for a
// round (any when unset).
inline CallMatcher Calls(std::optional<CallKind> kind, std::string from = "",
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
      site->disk = std::make_unique<FaultInjectionModelStore>(&site->store);
      site->controller = std::make_unique<SiteDriver>(
          controller_options, network_->TransportFor(site->name),
          site->learner.get(), site->disk.get(), runner);
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
  // The site's store as its driver sees it: inject disk faults here.
  FaultInjectionModelStore& disk(int i) { return *sites_[i]->disk; }
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
  // Sends Start; its answer (once the first round's tasks are out) lands in
  // start_reply().
  void Start() {
    v1::StartRequest request;
    request.set_sender("operator");
    request.set_job_id(kJobId);
    start_reply_ = std::make_shared<StartReply>();
    controller(Index(job_.starting_site()))
        .Start(request, [reply = start_reply_](v1::Reply answer) {
          absl::MutexLock lock(&reply->mu);
          reply->reply = std::move(answer);
        });
  }
  // The answer to the last Start, if it came. REQUIRES: Start() called.
  std::optional<v1::Reply> start_reply() const {
    absl::MutexLock lock(&start_reply_->mu);
    return start_reply_->reply;
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
    std::unique_ptr<FaultInjectionModelStore> disk;  // Over `store`.
    std::unique_ptr<ThreadPoolRunner> pool;
    std::unique_ptr<SiteDriver> controller;
  };

  struct StartReply {
    absl::Mutex mu;
    std::optional<v1::Reply> reply ABSL_GUARDED_BY(mu);
  };
  SimConfig config_;
  v1::JobConfig job_;
  std::shared_ptr<StartReply> start_reply_;
  ManualRunner runner_;
  std::unique_ptr<FakeNetwork> network_;
  std::vector<std::unique_ptr<Site>> sites_;
};

}  // namespace sim
}  // namespace swarm

#endif  // SWARM_CONTROLLER_SIM_HARNESS_H_
