// The fixture of the SiteMachine step tests (site_machine_test.cc,
// site_machine_round_test.cc): one machine, and the test as its driver and
// every other site: it answers the machine's calls, fires its timers and
// moves the time by hand.
#ifndef SWARM_CONTROLLER_SITE_MACHINE_FIXTURE_H_
#define SWARM_CONTROLLER_SITE_MACHINE_FIXTURE_H_

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "config/election.h"
#include "config/job_config.h"
#include "controller/replies.h"
#include "controller/site_machine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace site_machine_testing {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using What = effect::Persist::What;

inline const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

// Sites a..e; trainers a, b, c; d the only aggregator candidate (it
// aggregates every round); e neither. Two rounds; a starts.
inline v1::JobConfig Job(
    const std::function<void(v1::JobConfig*)>& edit = nullptr) {
  v1::JobConfig job;
  job.set_job_id("step");
  for (const char* name : {"a", "b", "c", "d", "e"}) {
    v1::SiteInfo* site = job.add_sites();
    site->set_name(name);
    site->set_address(absl::StrCat("127.0.0.1:", 7101 + job.sites_size()));
  }
  for (const char* name : {"a", "b", "c"}) job.add_trainers(name);
  job.add_aggregator_candidates("d");
  job.set_starting_site("a");
  job.set_num_rounds(2);
  job.set_seed(5);
  job.set_max_concurrent_submissions(1);
  job.set_round_timeout_ms(60'000);
  job.set_wait_after_min_responses_ms(10'000);
  job.set_request_to_submit_interval_ms(100);
  job.set_request_to_submit_max_wait_ms(30'000);
  if (edit) edit(&job);
  return WithDefaults(job);
}

// A model of four F32 `value`s.
inline Model MakeModel(float value) {
  absl::StatusOr<Model> model =
      Model::Create({TensorSpec{"w", v1::DTYPE_F32, {4}, 4 * sizeof(float)}});
  EXPECT_TRUE(model.ok()) << model.status();
  for (int i = 0; i < 4; ++i) {
    std::memcpy(model->mutable_tensor_data(0).data() + i * sizeof(float),
                &value, sizeof(float));
  }
  return std::move(*model);
}
inline std::shared_ptr<const Model> Shared(float value) {
  return std::make_shared<const Model>(MakeModel(value));
}
inline float First(const Model& model) {
  float value;
  std::memcpy(&value, model.tensor_data(0).data(), sizeof(float));
  return value;
}

inline v1::BestRecord Best(const std::string& site, double metric,
                           uint32_t round) {
  v1::BestRecord best;
  best.set_present(true);
  best.set_site(site);
  best.set_metric(metric);
  best.set_round(round);
  return best;
}

// --- Finders over one step's effects (pointers into `effects`).
template <typename T>
std::vector<const T*> All(const Effects& effects) {
  std::vector<const T*> found;
  for (const Effect& e : effects) {
    if (const T* t = std::get_if<T>(&e)) found.push_back(t);
  }
  return found;
}
inline std::vector<const effect::Send*> FindSends(const Effects& effects,
                                                  CallKind kind) {
  std::vector<const effect::Send*> found;
  for (const effect::Send* s : All<effect::Send>(effects)) {
    if (s->message.kind == kind) found.push_back(s);
  }
  return found;
}
inline std::vector<std::string> Targets(
    const std::vector<const effect::Send*>& s) {
  std::vector<std::string> names;
  for (const effect::Send* send : s) names.push_back(send->to.name());
  return names;
}
inline std::vector<What> PersistKinds(const Effects& effects) {
  std::vector<What> kinds;
  for (const auto* p : All<effect::Persist>(effects)) kinds.push_back(p->what);
  return kinds;
}
inline std::vector<absl::Time> TimerTimes(const Effects& effects) {
  std::vector<absl::Time> times;
  for (const auto* t : All<effect::SetTimer>(effects)) times.push_back(t->when);
  return times;
}
// The answer of type T to incoming call `request`, or null.
template <typename T>
const T* Answer(const Effects& effects, RequestId request) {
  for (const auto* r : All<effect::Reply>(effects)) {
    if (r->request == request) return std::get_if<T>(&r->answer);
  }
  return nullptr;
}
// The outcome of a Reply or a permission reply to `request`, if answered.
inline std::optional<v1::Outcome> OutcomeOf(const Effects& effects,
                                            RequestId request) {
  if (const auto* r = Answer<v1::Reply>(effects, request)) return r->outcome();
  if (const auto* p = Answer<v1::SubmitPermissionReply>(effects, request)) {
    return p->outcome();
  }
  return std::nullopt;
}
inline void Append(Effects& to, Effects from) {
  to.insert(to.end(), std::make_move_iterator(from.begin()),
            std::make_move_iterator(from.end()));
}

// A model stream into the machine, as the receiver feeds it.
struct Delivery {
  absl::Status admitted;  // The header's refusal.
  bool header_only = false;
  // The final answer (not OUTCOME_OK, the proto default, until answered).
  v1::Reply reply = MakeReply(v1::OUTCOME_ABORTED, "no answer");
  Effects effects;  // Of every step.
};

class SiteMachineTest : public ::testing::Test {
 protected:
  SiteMachineTest() { SetMinLogSeverity(LogSeverity::kError); }

  // Makes site `self` and configures it with `job`.
  void Make(const std::string& self, v1::JobConfig job = Job()) {
    ASSERT_TRUE(ValidateJobConfig(job).ok()) << ValidateJobConfig(job);
    view_ = std::make_unique<JobView>(job);
    machine_ = std::make_unique<SiteMachine>(SiteMachineOptions{self, {}});
    bool already = false;
    ASSERT_EQ(machine_->CheckConfigure(job, &already), std::nullopt);
    const RequestId id = next_request_++;
    configured_ = Step(event::Configure{id, job, ""});
    ASSERT_EQ(OutcomeOf(configured_, id), v1::OUTCOME_OK);
  }
  Effects Step(Event event) { return machine_->Step(std::move(event), now_); }
  v1::SiteStatus Status() const { return machine_->Status().status(); }

  // Start on the starting site, then its initial model: the first scatter.
  Effects StartAndScatter() {
    event::Start start{next_request_++, {}};
    start.start.set_job_id("step");
    const Effects started = Step(start);
    // Answered once the first round's aggregator has its task.
    EXPECT_EQ(OutcomeOf(started, start.request), std::nullopt);
    start_request_ = start.request;
    EXPECT_EQ(All<effect::LoadInitialModel>(started).size(), 1u);
    event::Start again{next_request_++, start.start};
    EXPECT_EQ(OutcomeOf(Step(again), again.request), v1::OUTCOME_REJECTED)
        << "started twice";
    return Step(event::InitialModel{Shared(1)});
  }

  // Header, then (if admitted with a body) the body, then (for a final
  // model) the end of its Persist.
  Delivery Deliver(const v1::ModelHeader& header,
                   absl::StatusOr<std::shared_ptr<const Model>> model) {
    Delivery d;
    const RequestId id = next_request_++;
    d.effects = Step(event::ModelHeader{id, header});
    const auto* admission =
        Answer<absl::StatusOr<ModelAdmission>>(d.effects, id);
    if (admission == nullptr) {
      ADD_FAILURE() << "header not answered";
    } else if (!admission->ok()) {
      d.admitted = admission->status();
      d.reply = ReplyFromStatus(d.admitted);
    } else if ((*admission)->header_only) {
      d.header_only = true;
      d.reply = OkReply((*admission)->reply_message);
    } else {
      Effects body = Step(event::MakeModelBody(id, header, std::move(model)));
      // A result is added outside the step; its answer comes after.
      for (const auto* add : All<effect::AddResult>(body)) {
        Append(body,
               Step(event::ResultAdded{add->request, add->round, add->header,
                                       add->job.Run(), add->job_run}));
        break;
      }
      for (const auto* p : All<effect::Persist>(body)) {
        if (p->what != What::kFinal || !p->notify) continue;
        Append(body, Step(event::PersistDone{p->persist, {}, ""}));
        break;
      }
      const v1::Reply* reply = Answer<v1::Reply>(body, id);
      EXPECT_NE(reply, nullptr) << "body not answered";
      if (reply != nullptr) d.reply = *reply;
      Append(d.effects, std::move(body));
    }
    return d;
  }

  v1::ModelHeader Header(v1::ModelKind kind, uint32_t round,
                         const std::string& sender, v1::BestRecord best = {}) {
    v1::ModelHeader h;
    h.set_kind(kind);
    h.set_job_id("step");
    h.set_round(round);
    h.set_sender(sender);
    h.set_aggregator(view_->AggregatorOf(round));
    *h.mutable_best() = best;
    if (kind == v1::MODEL_KIND_BEST || kind == v1::MODEL_KIND_LAST) {
      h.set_final_round(view_->last_round());
    }
    return h;
  }
  v1::ModelHeader LearnTask(uint32_t round,
                            const std::vector<std::string>& expected = {},
                            v1::BestRecord best = {}) {
    v1::ModelHeader h = Header(v1::MODEL_KIND_LEARN_TASK, round,
                               view_->ScattererOf(round), best);
    for (const std::string& name : expected) h.add_expected_trainers(name);
    return h;
  }
  v1::ModelHeader Result(const std::string& trainer, uint32_t round,
                         uint64_t samples = 1, double metric = 0.5) {
    v1::ModelHeader h = Header(v1::MODEL_KIND_RESULT, round, trainer);
    h.set_sample_count(samples);
    (*h.mutable_metrics())["accuracy"] = metric;
    return h;
  }

  // A permission request from `trainer`, held until `hold_until` if RETRY.
  Effects Ask(const std::string& trainer, uint32_t round, RequestId* id,
              absl::Time hold_until = absl::InfinitePast()) {
    *id = next_request_++;
    event::PermissionAsked asked{*id, {}, hold_until};
    asked.ask.set_job_id("step");
    asked.ask.set_sender(trainer);
    asked.ask.set_round(round);
    return Step(std::move(asked));
  }
  std::optional<v1::Outcome> AskNow(const std::string& trainer,
                                    uint32_t round) {
    RequestId id;
    const Effects effects = Ask(trainer, round, &id);
    return OutcomeOf(effects, id);
  }
  // Permission, then the whole result.
  Delivery Submit(const std::string& trainer, uint32_t round,
                  uint64_t samples = 1, double metric = 0.5, float value = 2) {
    EXPECT_EQ(AskNow(trainer, round), v1::OUTCOME_OK) << trainer;
    return Deliver(Result(trainer, round, samples, metric), Shared(value));
  }
  // The learner's report for round 0: metric 0.5, 2 samples.
  Effects Trained() {
    return Step(event::TrainingDone{0, Metrics{{"accuracy", 0.5}},
                                    TrainOutput{MakeModel(3), 2}});
  }

  // The end of an outgoing call.
  Effects Done(const effect::Send& send, v1::Outcome outcome = v1::OUTCOME_OK,
               uint64_t retry_after_ms = 0) {
    PeerReply reply;
    reply.reply = MakeReply(outcome, "scripted");
    reply.permission.set_outcome(outcome);
    reply.permission.set_retry_after_ms(retry_after_ms);
    return Step(event::CallDone{send.call, reply});
  }
  Effects Fire(const effect::SetTimer& timer) {
    now_ = std::max(now_, timer.when);
    return Step(event::TimerFired{timer.timer});
  }
  // Acknowledges every learn task in `fx`: the last step's effects (the
  // aggregator's task, once every trainer acknowledged).
  Effects AckLearnTasks(const Effects& fx) {
    Effects last;
    for (const auto* t : FindSends(fx, CallKind::kLearnTask)) last = Done(*t);
    return last;
  }
  // Runs the aggregation `closing` asked for: what the machine does next.
  Effects Aggregated(const Effects& closing) {
    const auto run = All<effect::RunAggregation>(closing);
    if (run.size() != 1u) {
      ADD_FAILURE() << "the round did not close";
      return {};
    }
    return Step(RunAggregationWork(*run[0]));
  }

  // Site d with round `round` open, trainers `expected`.
  Effects OpenAtD(uint32_t round,
                  std::vector<std::string> expected = {"a", "b", "c"},
                  v1::BestRecord best = {}, v1::JobConfig job = Job()) {
    Make("d", std::move(job));
    Delivery task = Deliver(LearnTask(round, expected, best), Shared(1));
    EXPECT_EQ(task.reply.outcome(), v1::OUTCOME_OK) << task.reply.message();
    EXPECT_EQ(Status().state(), v1::SITE_STATE_GATHERING);
    return std::move(task.effects);
  }

  absl::Time now_ = kT0;
  RequestId next_request_ = 1;
  RequestId start_request_ = 0;  // The Start answered later (AnswerStart).
  Effects configured_;           // What the Configure step did.
  std::unique_ptr<JobView> view_;
  std::unique_ptr<SiteMachine> machine_;
};

}  // namespace site_machine_testing
}  // namespace swarm

#endif  // SWARM_CONTROLLER_SITE_MACHINE_FIXTURE_H_
