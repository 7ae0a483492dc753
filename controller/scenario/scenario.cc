// The scenario driver's world: machines, the queue, the calls between them.
#include "controller/scenario/scenario.h"

#include <cstring>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "controller/peer_transport.h"
#include "controller/replies.h"
#include "controller/retry_policy.h"
#include "controller/scenario/scenario_internal.h"
#include "streaming/assembler.h"
#include "streaming/chunker.h"
#include "streaming/partial_sum_sink.h"

namespace swarm::scenario {
namespace {

std::string Short(absl::string_view name, absl::string_view prefix) {
  return absl::AsciiStrToLower(absl::StripPrefix(name, prefix));
}

// The stand-in learner's result: every F32 value of `global` plus `delta`.
absl::StatusOr<Model> Trained(const Model& global, float delta) {
  absl::StatusOr<Model> out = global.Clone();
  if (!out.ok()) return out.status();
  for (size_t t = 0; t < out->num_tensors(); ++t) {
    if (out->spec(t).dtype != v1::DTYPE_F32) continue;
    absl::Span<char> bytes = out->mutable_tensor_data(t);
    for (size_t at = 0; at + sizeof(float) <= bytes.size();
         at += sizeof(float)) {
      float value;
      std::memcpy(&value, bytes.data() + at, sizeof(float));
      value += delta;
      std::memcpy(bytes.data() + at, &value, sizeof(float));
    }
  }
  return out;
}

}  // namespace

// "SubmitResult" -> "submit_result".
std::string KindName(CallKind kind) {
  std::string out;
  for (char c : CallKindName(kind)) {
    if (absl::ascii_isupper(c)) {
      if (!out.empty()) out.push_back('_');
      out.push_back(absl::ascii_tolower(c));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string StateName(v1::SiteState state) {
  return std::string(
      absl::StripPrefix(v1::SiteState_Name(state), "SITE_STATE_"));
}

std::string OutcomeName(v1::Outcome outcome) {
  return std::string(absl::StripPrefix(v1::Outcome_Name(outcome), "OUTCOME_"));
}

float FirstValue(const Model& model) {
  float value = 0;
  if (model.num_tensors() > 0 && model.tensor_data(0).size() >= 4) {
    std::memcpy(&value, model.tensor_data(0).data(), sizeof(float));
  }
  return value;
}

Scenario::Scenario(std::string work_dir)
    : work_dir_(std::move(work_dir)), now_(kT0) {
  shown_ = {"op", "state"};
}

Scenario::~Scenario() = default;

void Scenario::Print(const std::string& category, const std::string& line) {
  if (shown_.count(category) == 0 && shown_.count("all") == 0) return;
  absl::StrAppendFormat(&output_, "%.3fs %s\n",
                        absl::ToDoubleSeconds(now_ - kT0), line);
}

void Scenario::At(absl::Time when, const std::string& site, std::string what,
                  std::function<void()> run) {
  queue_.emplace(std::make_pair(when, next_seq_++),
                 Timed{site, std::move(what), std::move(run)});
}

bool Scenario::RunUntil(absl::Time until, const std::function<bool()>& stop) {
  while (!queue_.empty()) {
    auto first = queue_.begin();
    const absl::Time when = first->first.first;
    if (when > until) break;
    Timed item = std::move(first->second);
    queue_.erase(first);
    now_ = std::max(now_, when);
    if (!item.site.empty()) {
      const Site& site = *sites_.at(item.site);
      if (site.dead || site.frozen) continue;  // Its work died with it.
    }
    item.run();
    if (stop && stop()) return true;
  }
  return false;
}

bool Scenario::Reachable(const std::string& from, const std::string& to) const {
  if (from == to) return true;
  auto site = sites_.find(to);
  if (site == sites_.end() || site->second->dead) return false;
  return cut_.count({from, to}) == 0;
}

void Scenario::StepSite(Site& site, Event event) {
  if (site.dead || site.frozen) return;
  Effects effects = site.machine->Step(std::move(event), now_);
  Carry(site, std::move(effects));
  NoteChanges(site);
}

void Scenario::Carry(Site& site, Effects effects) {
  for (Effect& effect : effects) CarryOne(site, effect);
}

// Every effect kind is handled here or the build fails (the static_assert):
// a kind added to the machine's vocabulary must be given a meaning in the
// scenarios too.
void Scenario::CarryOne(Site& site, Effect& effect) {
  const std::string name = site.name;
  std::visit(
      [&](auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, effect::Send>) {
          auto call = std::make_shared<Call>();
          call->from = name;
          call->to = e.to.name();
          call->message = std::move(e.message);
          call->call = e.call;
          call->retry = e.retry;
          call->retry_until = e.retry_until;
          At(now_, name, "send", [this, call] { Deliver(call); });
        } else if constexpr (std::is_same_v<T, effect::Reply>) {
          Answer(site, e);
        } else if constexpr (std::is_same_v<T, effect::StartTraining>) {
          Train(site, e);
        } else if constexpr (std::is_same_v<T, effect::CancelTraining>) {
          ++site.training;
          Print("work", absl::StrCat(name, ": training cancelled"));
        } else if constexpr (std::is_same_v<T, effect::LoadInitialModel>) {
          absl::StatusOr<std::shared_ptr<const Model>> initial = InitialModel();
          if (e.kept_round.has_value()) {
            initial =
                absl::NotFoundError("the scenario keeps no earlier round");
          }
          At(now_, name, "initial model", [this, name, initial] {
            StepSite(*sites_.at(name), event::InitialModel{initial});
          });
        } else if constexpr (std::is_same_v<T, effect::RunAggregation>) {
          Print("work", absl::StrCat(name, ": aggregate r", e.round));
          At(now_, name, "aggregate", [this, name, run = e] {
            StepSite(*sites_.at(name), RunAggregationWork(run));
          });
        } else if constexpr (std::is_same_v<T, effect::AddResult>) {
          Print("work",
                absl::StrCat(name, ": add ",
                             e.header.kind() == v1::MODEL_KIND_PARTIAL_SUM
                                 ? "partial sum"
                                 : "result",
                             " of ", e.header.sender(), " r", e.round));
          At(now_, name, "added", [this, name, add = e] {
            StepSite(*sites_.at(name),
                     event::ResultAdded{add.request, add.round, add.header,
                                        add.job.Run(), add.job_run});
          });
        } else if constexpr (std::is_same_v<T, effect::Release>) {
          // Dropped where the machine asked: nothing else holds it.
        } else if constexpr (std::is_same_v<T, effect::SetTimer>) {
          At(e.when, name, "timer", [this, name, id = e.timer] {
            Print("timers", absl::StrCat(name, ": timer ", id));
            StepSite(*sites_.at(name), event::TimerFired{id});
          });
        } else if constexpr (std::is_same_v<T, effect::Persist>) {
          Persist(site, e);
        } else if constexpr (std::is_same_v<T, effect::PrepareTransport> ||
                             std::is_same_v<T, effect::StatusChanged>) {
          // Nothing to do: no connections to open, no held Status calls.
        } else {
          static_assert(sizeof(T) == 0, "an effect the scenario ignores");
        }
      },
      effect);
}

void Scenario::Train(Site& site, const effect::StartTraining& train) {
  const uint64_t generation = ++site.training;
  const std::string name = site.name;
  Print("work", absl::StrCat(name, ": train r", train.round));
  // Deterministic: the result moves every value by 0.1 per site index; the
  // metric grows with the round and the site.
  const float delta = 0.1f * static_cast<float>(site.index);
  const double metric = 0.5 + 0.01 * train.round + 0.001 * site.index;
  At(now_ + train_time_, name, "trained",
     [this, name, generation, round = train.round, global = train.global, delta,
      metric] {
       Site& s = *sites_.at(name);
       if (s.training != generation) return;  // Cancelled.
       absl::StatusOr<TrainOutput> output = absl::InternalError("no model");
       if (global != nullptr) {
         absl::StatusOr<Model> model = Trained(*global, delta);
         if (model.ok()) {
           output = TrainOutput{*std::move(model), 10,
                                v1::PAYLOAD_KIND_FULL_WEIGHTS};
         } else {
           output = model.status();
         }
       }
       Print("work", absl::StrCat(name, ": trained r", round));
       StepSite(s, event::TrainingDone{round, Metrics{{"accuracy", metric}},
                                       std::move(output)});
     });
}

void Scenario::Persist(Site& site, const effect::Persist& persist) {
  using What = effect::Persist::What;
  std::string what;
  switch (persist.what) {
    case What::kGlobal:
      what = absl::StrCat("global r", persist.round);
      if (persist.keep_round && persist.model != nullptr) {
        site.kept[persist.round] = FirstValue(*persist.model);
      }
      break;
    case What::kFinal:
      what = Short(v1::ModelKind_Name(persist.kind), "MODEL_KIND_");
      if (persist.model != nullptr) {
        site.finals[what] = FirstValue(*persist.model);
      }
      break;
    case What::kBestModel:
      what = absl::StrCat("held-best r", persist.round);
      break;
    case What::kState:
      what = "state";
      break;
    case What::kClearOffload:
      what = "clear offload";
      break;
    case What::kSetAsideRound:
      what = absl::StrCat("set aside r", persist.round, " as ", persist.tag);
      site.kept.erase(persist.round);
      break;
  }
  const bool reported = persist.notify || persist.map_back;
  const bool quiet =
      persist.what == What::kState || persist.what == What::kClearOffload;
  if (!reported) {
    if (!quiet) Print("work", absl::StrCat(site.name, ": write ", what));
    return;
  }
  event::PersistDone done{persist.persist, absl::OkStatus(), what,
                          persist.map_back ? persist.model : nullptr};
  if (site.hold_persist) {
    Print("work", absl::StrCat(site.name, ": write ", what, " (held)"));
    site.held.push_back(std::move(done));
    return;
  }
  if (!quiet) Print("work", absl::StrCat(site.name, ": write ", what));
  const std::string name = site.name;
  At(now_, name, "persisted",
     [this, name, done] { StepSite(*sites_.at(name), done); });
}

std::string Scenario::CallLine(const Call& call) const {
  const PeerMessage& m = call.message;
  std::string line =
      absl::StrCat(call.from, " -> ", call.to, " ", KindName(m.kind));
  if (m.kind == CallKind::kRequestToSubmit) {
    absl::StrAppend(&line, " ", m.permission.job_id(), " r",
                    m.permission.round());
    if (m.permission.probe()) absl::StrAppend(&line, " probe");
    if (m.permission.direct()) absl::StrAppend(&line, " direct");
  } else if (m.kind == CallKind::kShareBest) {
    absl::StrAppend(&line, " ", m.share_best.job_id());
  } else {
    absl::StrAppend(&line, " ", m.header.job_id(), " r", m.header.round());
    if (m.header.attempt() > 0)
      absl::StrAppend(&line, " a", m.header.attempt());
    if (m.header.kind() == v1::MODEL_KIND_BEST ||
        m.header.kind() == v1::MODEL_KIND_LAST) {
      absl::StrAppend(
          &line, " ",
          Short(v1::ModelKind_Name(m.header.kind()), "MODEL_KIND_"));
    }
    if (m.header.kind() == v1::MODEL_KIND_PARTIAL_SUM) {
      absl::StrAppend(&line, " (partial sum)");
    }
  }
  if (call.call == 0) absl::StrAppend(&line, " (hop)");
  if (call.attempt > 1) absl::StrAppend(&line, " #", call.attempt);
  return line;
}

void Scenario::Deliver(std::shared_ptr<Call> call) {
  if (call_break_ && call_break_(*call)) {
    // Stop before it: it goes first when the script goes on.
    call_break_ = nullptr;
    break_hit_ = true;
    Print("op", absl::StrCat("before ", CallLine(*call)));
    queue_.emplace(std::make_pair(now_, front_seq_--),
                   Timed{"", "send", [this, call] { Deliver(call); }});
    return;
  }
  auto target = sites_.find(call->to);
  if (target == sites_.end()) {
    return Failed(call, absl::NotFoundError("no such site"));
  }
  if (!Reachable(call->from, call->to)) {
    return Failed(call, absl::UnavailableError(
                            target->second->dead ? "connection refused (killed)"
                                                 : "unreachable (cut)"));
  }
  if (target->second->frozen) {
    Print("calls", absl::StrCat(CallLine(*call), ": no answer (frozen)"));
    At(now_ + call->message.timeout, "", "deadline", [this, call] {
      Failed(call, absl::DeadlineExceededError("no answer (frozen)"));
    });
    return;
  }
  Print("calls", CallLine(*call));
  DeliverIncoming(*target->second, std::move(call));
}

void Scenario::DeliverIncoming(Site& target, std::shared_ptr<Call> call) {
  const RequestId request = next_request_++;
  auto incoming = std::make_shared<Incoming>();
  incoming->call = call;
  target.incoming[request] = incoming;
  const PeerMessage& m = call->message;
  switch (m.kind) {
    case CallKind::kRequestToSubmit:
      return StepSite(target,
                      event::PermissionAsked{request, m.permission,
                                             now_ + m.timeout - kHoldMargin});
    case CallKind::kShareBest:
      return StepSite(target, event::ShareBest{request, m.share_best});
    case CallKind::kLearnTask:
    case CallKind::kSubmitResult:
    case CallKind::kFinalResult:
      incoming->header_stage = true;
      return StepSite(target, event::ModelHeader{request, m.header});
  }
}

void Scenario::Answer(Site& site, effect::Reply& reply) {
  auto found = site.incoming.find(reply.request);
  if (found == site.incoming.end()) return;
  std::shared_ptr<Incoming> incoming = found->second;
  if (incoming->call == nullptr) {  // The operator's.
    site.incoming.erase(found);
    const auto* answer = std::get_if<v1::Reply>(&reply.answer);
    Print("op", absl::StrCat(site.name, ": ", incoming->what, ": ",
                             answer == nullptr
                                 ? std::string("?")
                                 : absl::StrCat(OutcomeName(answer->outcome()),
                                                " ", answer->message())));
    return;
  }
  std::shared_ptr<Call> call = incoming->call;
  if (auto* admission =
          std::get_if<absl::StatusOr<ModelAdmission>>(&reply.answer)) {
    if (!incoming->header_stage) return;
    incoming->header_stage = false;
    if (!admission->ok()) {
      site.incoming.erase(found);
      return Failed(call, admission->status());
    }
    if ((*admission)->header_only) {
      site.incoming.erase(found);
      PeerReply peer;
      peer.reply = OkReply((*admission)->reply_message);
      return Finish(call, std::move(peer));
    }
    auto body = std::make_shared<ModelAdmission>(*std::move(*admission));
    const std::string name = site.name;
    const RequestId request = reply.request;
    At(now_, name, "body", [this, name, request, body] {
      DeliverBody(*sites_.at(name), request, std::move(*body));
    });
    return;
  }
  site.incoming.erase(found);
  PeerReply peer;
  if (auto* permission =
          std::get_if<v1::SubmitPermissionReply>(&reply.answer)) {
    peer.permission = *permission;
  } else if (auto* plain = std::get_if<v1::Reply>(&reply.answer)) {
    peer.reply = *plain;
  }
  // Replies travel back as queued items, never inside the target's step.
  At(now_, "", "reply", [this, call, peer] { Finish(call, peer); });
}

void Scenario::DeliverBody(Site& target, RequestId request,
                           ModelAdmission admission) {
  auto found = target.incoming.find(request);
  if (found == target.incoming.end()) return;
  const std::shared_ptr<Call> call = found->second->call;
  const v1::ModelHeader& header = call->message.header;
  std::shared_ptr<const Model> model = call->message.model != nullptr
                                           ? call->message.model
                                           : std::make_shared<const Model>();
  MemorySink memory;
  MemorySink onward;
  std::unique_ptr<TensorSink> sink = std::move(admission.sink);
  std::optional<ModelAdmission::ChainHop> hop = std::move(admission.chain_hop);
  absl::Status onward_began;
  if (hop.has_value()) {
    onward_began = onward.Begin(hop->onward, hop->own->specs());
    sink = std::make_unique<PartialSumSink>(
        hop->own, hop->own_weight,
        [&](uint32_t index, uint64_t offset, absl::string_view data) {
          if (!onward_began.ok()) return onward_began;
          absl::StatusOr<char*> dst =
              onward.WritableRange(index, offset, data.size());
          if (!dst.ok()) return dst.status();
          std::memcpy(*dst, data.data(), data.size());
          return onward.CommitRange(index, offset, data.size());
        });
  }
  absl::StatusOr<Model> body =
      AssembleStream(model, header, sink != nullptr ? sink.get() : &memory,
                     std::move(admission.assembler));
  if (hop.has_value() && body.ok()) {
    return SendOnward(target, request, *hop, onward.Finish());
  }
  absl::StatusOr<std::shared_ptr<const Model>> shared =
      body.ok() ? absl::StatusOr<std::shared_ptr<const Model>>(
                      std::make_shared<const Model>(*std::move(body)))
                : body.status();
  StepSite(target, event::MakeModelBody(request, header, std::move(shared)));
}

void Scenario::SendOnward(Site& hop, RequestId request,
                          const ModelAdmission::ChainHop& chain,
                          absl::StatusOr<Model> sum) {
  const v1::ModelHeader header = hop.incoming.at(request)->call->message.header;
  const std::string name = hop.name;
  auto reply_to_hop = [this, name, request,
                       header](absl::StatusOr<PeerReply> reply) {
    const absl::Status status =
        reply.ok() ? StatusFromHopReply(reply->reply) : reply.status();
    absl::StatusOr<std::shared_ptr<const Model>> model =
        status.ok() ? absl::StatusOr<std::shared_ptr<const Model>>(
                          std::make_shared<const Model>())
                    : status;
    StepSite(*sites_.at(name),
             event::MakeModelBody(request, header, std::move(model)));
  };
  if (!sum.ok()) return reply_to_hop(sum.status());
  auto call = std::make_shared<Call>();
  call->from = name;
  call->to = chain.next;
  call->message.kind = CallKind::kSubmitResult;
  call->message.header = chain.onward;
  call->message.model = std::make_shared<const Model>(*std::move(sum));
  call->retry = false;
  call->done = std::move(reply_to_hop);
  Deliver(std::move(call));
}

void Scenario::Finish(std::shared_ptr<Call> call,
                      absl::StatusOr<PeerReply> reply) {
  if (reply.ok() && !Reachable(call->to, call->from)) {
    return Failed(call, absl::UnavailableError("connection lost"));
  }
  if (reply.ok()) {
    const v1::Outcome outcome = reply->outcome(call->message.kind);
    std::string line =
        absl::StrCat(CallLine(*call), ": ", OutcomeName(outcome));
    const std::string& message =
        call->message.kind == CallKind::kRequestToSubmit
            ? reply->permission.message()
            : reply->reply.message();
    if (outcome != v1::OUTCOME_OK && !message.empty()) {
      absl::StrAppend(&line, " (", message, ")");
    }
    Print("calls", line);
  }
  if (call->done) return call->done(std::move(reply));
  auto from = sites_.find(call->from);
  if (from == sites_.end() || from->second->dead) return;
  StepSite(*from->second, event::CallDone{call->call, std::move(reply),
                                          call->maybe_delivered});
}

void Scenario::Failed(std::shared_ptr<Call> call, const absl::Status& status) {
  std::string line = absl::StrCat(CallLine(*call), ": ",
                                  absl::StatusCodeToString(status.code()), " ",
                                  status.message());
  if (absl::IsDeadlineExceeded(status)) call->maybe_delivered = true;
  auto from = sites_.find(call->from);
  const bool alive = from != sites_.end() && !from->second->dead;
  if (call->call != 0 && call->retry && alive &&
      RetryPolicy::Retryable(status)) {
    const std::optional<absl::Duration> delay = RetryPolicy().NextDelay(
        status, call->attempt, 0.5, now_, call->retry_until);
    if (delay.has_value() && from->second->machine->WantsCall(call->call)) {
      Print("calls",
            absl::StrCat(line, "; retry in ", absl::FormatDuration(*delay)));
      ++call->attempt;
      At(now_ + *delay, call->from, "retry", [this, call] { Deliver(call); });
      return;
    }
  }
  Print("calls", line);
  Finish(call, status);
}

}  // namespace swarm::scenario
