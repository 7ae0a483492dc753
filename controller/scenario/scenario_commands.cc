// The scenario driver's commands (see testdata/README.md).
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "config/job_config.h"
#include "controller/job_view.h"
#include "controller/scenario/scenario.h"
#include "controller/scenario/scenario_internal.h"
#include "streaming/chunker.h"

namespace swarm::scenario {
namespace {

absl::StatusOr<absl::Duration> ParseDuration(const std::string& text) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not a duration (e.g. 5s, 200ms)"));
  }
  return d;
}

absl::StatusOr<uint64_t> ParseCount(const std::string& text) {
  uint64_t n;
  if (!absl::SimpleAtoi(text, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not a number"));
  }
  return n;
}

uint64_t Ms(absl::Duration d) {
  return static_cast<uint64_t>(absl::ToInt64Milliseconds(d));
}

// One option of `sites` (and its value, if it takes one) into `job`.
absl::Status ApplyOption(const std::vector<std::string>& args, size_t& i,
                         v1::JobConfig& job, absl::Duration& train_time) {
  const std::string& name = args[i];
  if (name == "chain") {
    job.set_reduce_results_in_chain(true);
    return absl::OkStatus();
  }
  if (name == "lean") {
    job.set_lean_memory_min_model_bytes(0);
    return absl::OkStatus();
  }
  if (name == "keep-rounds") {
    job.set_keep_round_models(true);
    return absl::OkStatus();
  }
  if (i + 1 >= args.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown option \"", name, "\" or it lacks its value"));
  }
  const std::string& value = args[++i];
  if (name == "min" || name == "seed" || name == "slots") {
    absl::StatusOr<uint64_t> n = ParseCount(value);
    if (!n.ok()) return n.status();
    if (name == "min") job.set_min_responses_required(*n);
    if (name == "seed") job.set_seed(*n);
    if (name == "slots") job.set_max_concurrent_submissions(*n);
    return absl::OkStatus();
  }
  absl::StatusOr<absl::Duration> d = ParseDuration(value);
  if (!d.ok()) return d.status();
  if (name == "failover") {
    job.set_failover_timeout_ms(Ms(*d));
  } else if (name == "round-timeout") {
    job.set_round_timeout_ms(Ms(*d));
  } else if (name == "wait") {
    job.set_wait_after_min_responses_ms(Ms(*d));
  } else if (name == "train") {
    train_time = *d;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown option \"", name, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<const Model> InitialModel() {
  absl::StatusOr<Model> model =
      Model::Create({TensorSpec{"w", v1::DTYPE_F32, {4}, 4 * sizeof(float)}});
  const float one = 1;
  for (int i = 0; i < 4; ++i) {
    std::memcpy(model->mutable_tensor_data(0).data() + i * sizeof(float), &one,
                sizeof(float));
  }
  return std::make_shared<const Model>(*std::move(model));
}

absl::StatusOr<Model> AssembleStream(std::shared_ptr<const Model> model,
                                     const v1::ModelHeader& header,
                                     TensorSink* sink,
                                     AssemblerOptions options) {
  const uint64_t chunk_size =
      header.chunk_size() != 0 ? header.chunk_size() : kMinChunkSize;
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(std::move(model), header, chunk_size);
  if (!chunker.ok()) return chunker.status();
  Assembler assembler(sink, std::move(options));
  absl::Status fed = assembler.OnHeader((*chunker)->header(),
                                        (*chunker)->header().ByteSizeLong());
  while (fed.ok()) {
    std::optional<ChunkRef> chunk = (*chunker)->NextChunk();
    if (!chunk.has_value()) {
      fed = assembler.OnTrailer((*chunker)->Trailer());
      break;
    }
    fed = assembler.OnChunk(chunk->tensor_index, chunk->offset, chunk->data);
  }
  return assembler.Finish();
}

std::string Scenario::Run(const std::string& line) {
  output_.clear();
  std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  absl::Status status = absl::InvalidArgumentError("empty command");
  if (!words.empty()) {
    const std::string command = words[0];
    const std::vector<std::string> args(words.begin() + 1, words.end());
    if (command == "sites") {
      status = Sites(args);
    } else if (command == "configure") {
      status = Configure(args);
    } else if (command == "start" || command == "abort") {
      status = Operator(command, args);
    } else if (command == "stabilize" || command == "tick" ||
               command == "run-until-idle" || command == "run-until" ||
               command == "run-until-call") {
      status = Advance(command, args);
    } else if (command == "kill" || command == "freeze" || command == "cut" ||
               command == "partition" || command == "heal") {
      status = Network(command, args);
    } else if (command == "hold" || command == "release") {
      status = HoldPersist(command == "hold", args);
    } else if (command == "status") {
      status = ShowStatus(args);
    } else if (command == "models") {
      status = ShowModels(args);
    } else if (command == "show") {
      status = Show(args);
    } else {
      status = absl::InvalidArgumentError(
          absl::StrCat("unknown command \"", command, "\""));
    }
  }
  if (!status.ok()) absl::StrAppend(&output_, "error: ", status.message());
  while (!output_.empty() && output_.back() == '\n') output_.pop_back();
  return output_.empty() ? "ok" : output_;
}

absl::StatusOr<Scenario::Site*> Scenario::Find(const std::string& name) {
  auto it = sites_.find(name);
  if (it == sites_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("no site \"", name, "\""));
  }
  return it->second.get();
}

// sites N rounds R [options]
absl::Status Scenario::Sites(const std::vector<std::string>& args) {
  if (args.size() < 3 || args[1] != "rounds" || !sites_.empty()) {
    return absl::InvalidArgumentError(
        "usage: sites N rounds R [options], once per script");
  }
  absl::StatusOr<uint64_t> n = ParseCount(args[0]);
  absl::StatusOr<uint64_t> rounds = ParseCount(args[2]);
  if (!n.ok()) return n.status();
  if (!rounds.ok()) return rounds.status();
  v1::JobConfig job;
  for (uint64_t i = 1; i <= *n; ++i) {
    const std::string name = absl::StrCat("s", i);
    v1::SiteInfo* site = job.add_sites();
    site->set_name(name);
    site->set_address(absl::StrCat("127.0.0.1:", 7000 + i));
    job.add_trainers(name);
    job.add_aggregator_candidates(name);
    auto machine = std::make_unique<Site>();
    machine->name = name;
    machine->index = static_cast<int>(i);
    machine->machine =
        std::make_unique<SiteMachine>(SiteMachineOptions{name, {}});
    names_.push_back(name);
    sites_[name] = std::move(machine);
  }
  job.set_starting_site("s1");
  job.set_num_rounds(*rounds);
  job.set_seed(1);
  job.set_round_timeout_ms(60'000);
  job.set_wait_after_min_responses_ms(10'000);
  job.set_request_to_submit_interval_ms(100);
  for (size_t i = 3; i < args.size(); ++i) {
    if (absl::Status s = ApplyOption(args, i, job, train_time_); !s.ok()) {
      return s;
    }
  }
  job_ = std::move(job);
  return absl::OkStatus();
}

// configure [job ID]: every live site, with the job `sites` made.
absl::Status Scenario::Configure(const std::vector<std::string>& args) {
  v1::JobConfig job = job_;
  job.set_job_id("job1");
  if (args.size() == 2 && args[0] == "job") {
    job.set_job_id(args[1]);
  } else if (!args.empty()) {
    return absl::InvalidArgumentError("usage: configure [job ID]");
  }
  job = WithDefaults(std::move(job));
  if (absl::Status valid = ValidateJobConfig(job); !valid.ok()) return valid;
  const JobView view(job);
  for (uint32_t r = view.first_round(); r <= view.last_round(); ++r) {
    const std::vector<std::string> order = view.ElectionOrder(r);
    Print("op",
          absl::StrCat(job.job_id(), " r", r, ": ", order.front(), ", then ",
                       absl::StrJoin(order.begin() + 1, order.end(), " ")));
  }
  for (const std::string& name : names_) {
    Site& site = *sites_.at(name);
    if (site.dead || site.frozen) continue;
    bool already = false;
    if (std::optional<v1::Reply> refused =
            site.machine->CheckConfigure(job, &already)) {
      Print("op",
            absl::StrCat(name, ": configure: ", OutcomeName(refused->outcome()),
                         " ", refused->message()));
      continue;
    }
    const std::string folder =
        absl::StrCat(work_dir_, "/", name, "/", job.job_id());
    std::error_code ignored;
    std::filesystem::create_directories(folder + "/offload", ignored);
    const RequestId request = next_request_++;
    site.incoming[request] =
        std::make_shared<Incoming>(Incoming{nullptr, "configure", false});
    StepSite(site, event::Configure{request, job, folder + "/offload"});
  }
  return absl::OkStatus();
}

// start [SITE] | abort [SITE...]
absl::Status Scenario::Operator(const std::string& what,
                                const std::vector<std::string>& args) {
  std::vector<std::string> targets = args;
  if (targets.empty()) {
    if (what == "start") {
      targets.push_back(job_.starting_site());
    } else {
      targets = names_;
    }
  }
  for (const std::string& name : targets) {
    absl::StatusOr<Site*> site = Find(name);
    if (!site.ok()) return site.status();
    if ((*site)->dead || (*site)->frozen) continue;
    const std::string job = (*site)->machine->Status().status().job_id();
    const RequestId request = next_request_++;
    (*site)->incoming[request] =
        std::make_shared<Incoming>(Incoming{nullptr, what, false});
    if (what == "start") {
      event::Start start{request, {}};
      start.start.set_job_id(job);
      start.start.set_sender("operator");
      StepSite(**site, std::move(start));
    } else {
      event::Abort abort{request, {}};
      abort.abort.set_job_id(job);
      abort.abort.set_sender("operator");
      abort.abort.set_reason("the script aborts");
      StepSite(**site, std::move(abort));
    }
  }
  return absl::OkStatus();
}

// KIND [from A] [to B]: a call of that kind (learn_task, request_to_submit,
// submit_result, share_best, final_result) between those sites.
absl::StatusOr<std::function<bool(const Scenario::Call&)>>
Scenario::CallMatcher(const std::vector<std::string>& args) {
  if (args.empty() || args.size() % 2 == 0) {
    return absl::InvalidArgumentError(
        "usage: run-until-call KIND [from A] [to B] [max D]");
  }
  std::string from;
  std::string to;
  for (size_t i = 1; i + 1 < args.size(); i += 2) {
    if (args[i] == "from") {
      from = args[i + 1];
    } else if (args[i] == "to") {
      to = args[i + 1];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", args[i], "\": not from or to"));
    }
  }
  const std::string kind = args[0];
  return std::function<bool(const Call&)>([kind, from, to](const Call& call) {
    return KindName(call.message.kind) == kind &&
           (from.empty() || call.from == from) && (to.empty() || call.to == to);
  });
}

// stabilize | tick D | run-until-idle [max D] | run-until SITE STATE [rN]
// [max D] | run-until-call KIND [from A] [to B] [max D]
absl::Status Scenario::Advance(const std::string& what,
                               const std::vector<std::string>& args) {
  if (what == "stabilize") {
    RunUntil(now_, nullptr);
    return absl::OkStatus();
  }
  if (what == "tick") {
    if (args.size() != 1) return absl::InvalidArgumentError("usage: tick D");
    absl::StatusOr<absl::Duration> d = ParseDuration(args[0]);
    if (!d.ok()) return d.status();
    const absl::Time until = now_ + *d;
    RunUntil(until, nullptr);
    now_ = std::max(now_, until);
    return absl::OkStatus();
  }
  std::vector<std::string> rest = args;
  absl::Duration max = absl::Hours(1);
  if (rest.size() >= 2 && rest[rest.size() - 2] == "max") {
    absl::StatusOr<absl::Duration> d = ParseDuration(rest.back());
    if (!d.ok()) return d.status();
    max = *d;
    rest.resize(rest.size() - 2);
  }
  std::function<bool()> stop = [this] { return queue_.empty(); };
  std::string goal = "idle";
  if (what == "run-until-call") {
    absl::StatusOr<std::function<bool(const Call&)>> match = CallMatcher(rest);
    if (!match.ok()) return match.status();
    call_break_ = *std::move(match);
    break_hit_ = false;
    stop = [this] { return break_hit_; };
    goal = absl::StrCat("at ", absl::StrJoin(rest, " "));
  } else if (what == "run-until") {
    if (rest.size() < 2 || rest.size() > 3) {
      return absl::InvalidArgumentError(
          "usage: run-until SITE STATE [rN] [max D]");
    }
    absl::StatusOr<Site*> site = Find(rest[0]);
    if (!site.ok()) return site.status();
    std::optional<uint64_t> round;
    if (rest.size() == 3) {
      absl::StatusOr<uint64_t> r =
          ParseCount(std::string(absl::StripPrefix(rest[2], "r")));
      if (!r.ok()) return r.status();
      round = *r;
    }
    const std::string state = absl::AsciiStrToUpper(rest[1]);
    stop = [site = *site, state, round] {
      const v1::SiteStatus s = site->machine->Status().status();
      return StateName(s.state()) == state &&
             (!round.has_value() || s.round() == *round);
    };
    goal = absl::StrJoin(rest, " ");
    if (stop()) return absl::OkStatus();
  }
  const bool reached = RunUntil(now_ + max, stop);
  call_break_ = nullptr;
  if (!reached && !(what == "run-until-idle" && queue_.empty())) {
    Print("op", absl::StrCat("not ", goal, " after ", absl::FormatDuration(max),
                             " (", queue_.size(), " queued)"));
  }
  return absl::OkStatus();
}

// kill SITE | freeze SITE | cut A B | partition A,B | C,D | heal
absl::Status Scenario::Network(const std::string& what,
                               const std::vector<std::string>& args) {
  if (what == "heal") {
    cut_.clear();
    return absl::OkStatus();
  }
  if (what == "kill" || what == "freeze") {
    if (args.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("usage: ", what, " SITE"));
    }
    absl::StatusOr<Site*> site = Find(args[0]);
    if (!site.ok()) return site.status();
    Site& s = **site;
    (what == "kill" ? s.dead : s.frozen) = true;
    ++s.training;
    // The calls it holds: cut off at once (killed) or at their deadline.
    for (auto& [request, incoming] : s.incoming) {
      if (incoming->call == nullptr) continue;
      std::shared_ptr<Call> call = incoming->call;
      const bool killed = what == "kill";
      At(killed ? now_ : now_ + call->message.timeout, "", "cut off",
         [this, call, killed] {
           Failed(call, killed ? absl::UnavailableError("connection lost")
                               : absl::DeadlineExceededError("no answer"));
         });
    }
    s.incoming.clear();
    Print("op", absl::StrCat(s.name, (what == "kill" ? " killed" : " frozen")));
    return absl::OkStatus();
  }
  std::vector<std::vector<std::string>> groups;
  if (what == "cut") {
    if (args.size() != 2) return absl::InvalidArgumentError("usage: cut A B");
    groups = {{args[0]}, {args[1]}};
  } else {
    for (absl::string_view group :
         absl::StrSplit(absl::StrJoin(args, ""), '|')) {
      groups.push_back(absl::StrSplit(group, ',', absl::SkipEmpty()));
    }
    if (groups.size() < 2) {
      return absl::InvalidArgumentError("usage: partition A,B | C,D");
    }
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    for (size_t j = 0; j < groups.size(); ++j) {
      if (i == j) continue;
      for (const std::string& a : groups[i]) {
        if (absl::Status s = Find(a).status(); !s.ok()) return s;
        for (const std::string& b : groups[j]) cut_.insert({a, b});
      }
    }
  }
  return absl::OkStatus();
}

// hold persist [SITE...] | release persist [SITE...]
absl::Status Scenario::HoldPersist(bool hold,
                                   const std::vector<std::string>& args) {
  if (args.empty() || args[0] != "persist") {
    return absl::InvalidArgumentError("usage: hold|release persist [SITE...]");
  }
  std::vector<std::string> targets(args.begin() + 1, args.end());
  if (targets.empty()) targets = names_;
  for (const std::string& name : targets) {
    absl::StatusOr<Site*> site = Find(name);
    if (!site.ok()) return site.status();
    Site& s = **site;
    s.hold_persist = hold;
    if (hold) continue;
    for (event::PersistDone& done : s.held) {
      Print("work", absl::StrCat(name, ": write ", done.what, " completes"));
      At(now_, name, "persisted", [this, name, done = std::move(done)] {
        StepSite(*sites_.at(name), done);
      });
    }
    s.held.clear();
  }
  return absl::OkStatus();
}

}  // namespace swarm::scenario
