#include "tests/faults/netns_swarm.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "rpc/tls.h"
#include "security/identity.h"
#include "tests/integration/local_swarm.h"
#include "tests/support/daemon.h"

namespace swarm::testing {
namespace {

bool WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

bool Terminal(v1::SiteState state) {
  return state == v1::SITE_STATE_DONE || state == v1::SITE_STATE_FAILED ||
         state == v1::SITE_STATE_ABORTED;
}

std::string StateName(v1::SiteState state) {
  const std::string full = v1::SiteState_Name(state);
  absl::string_view name = full;
  absl::ConsumePrefix(&name, "SITE_STATE_");
  return absl::AsciiStrToLower(name);
}

}  // namespace

NetnsSwarm::NetnsSwarm(const std::string& label, const std::string& tag)
    : dir_(MakeTempDir("swarm-faults", label)), net_(tag) {}

NetnsSwarm::~NetnsSwarm() {
  for (auto& [name, site] : sites_) {
    site.stub.reset();
    if (site.process != nullptr) site.process->Kill();
  }
  if (::testing::Test::HasFailure() || getenv("SWARM_FAULTS_KEEP") != nullptr) {
    std::fprintf(stderr,
                 "NetnsSwarm: keeping %s (job, configs, logs, workspaces)\n",
                 dir_.c_str());
    return;
  }
  std::error_code error;
  std::filesystem::remove_all(dir_, error);
}

absl::Status NetnsSwarm::CreateNetwork(const std::vector<std::string>& names) {
  if (absl::Status s = net_.Create(); !s.ok()) return s;
  int index = 0;
  for (const std::string& name : names) {
    absl::StatusOr<std::string> address = net_.AddSite(name, ++index);
    if (!address.ok()) return address.status();
    Site site;
    site.address = absl::StrCat(*address, ":", kSitePort);
    site.log_path = absl::StrCat(dir_, "/", name, ".log");
    site.config_path = absl::StrCat(dir_, "/", name, ".json");
    names_.push_back(name);
    sites_.emplace(name, std::move(site));
  }
  return absl::OkStatus();
}

v1::JobConfig NetnsSwarm::BaseJob(const std::string& job_id) const {
  v1::JobConfig job;
  job.set_job_id(job_id);
  for (const std::string& name : names_) {
    v1::SiteInfo* info = job.add_sites();
    info->set_name(name);
    info->set_address(sites_.at(name).address);
  }
  return job;
}

absl::StatusOr<std::string> NetnsSwarm::WriteJobFile(
    const v1::JobConfig& job, const std::string& file_name) {
  const std::string path = absl::StrCat(dir_, "/", file_name);
  if (!WriteText(path, ToJson(job))) {
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return path;
}

absl::Status NetnsSwarm::WriteJobAndProvision(const v1::JobConfig& job) {
  job_path_ = absl::StrCat(dir_, "/job.json");
  if (!WriteText(job_path_, ToJson(job))) {
    return absl::InternalError(absl::StrCat("cannot write ", job_path_));
  }
  CommandResult provision =
      Swarmctl({"provision", "--out", absl::StrCat(dir_, "/pki"), "--job",
                job_path_, "--admin", "admin"});
  if (provision.code() != 0) {
    return absl::InternalError(
        absl::StrCat("swarmctl provision: ", provision.ToString()));
  }
  for (const std::string& name : names_) {
    v1::SiteConfig config;
    config.set_name(name);
    config.set_listen_address(sites_.at(name).address);
    config.set_workspace(Workspace(name));
    config.set_tls_dir(absl::StrCat(dir_, "/pki/sites/", name));
    config.mutable_learner()->set_kind("test");
    if (!WriteText(sites_.at(name).config_path, ToJson(config))) {
      return absl::InternalError("cannot write a site config");
    }
  }
  return absl::OkStatus();
}

std::string NetnsSwarm::Workspace(const std::string& name) const {
  return absl::StrCat(dir_, "/ws-", name);
}

absl::Status NetnsSwarm::StartSite(const std::string& name) {
  auto it = sites_.find(name);
  if (it == sites_.end()) return absl::NotFoundError("no site " + name);
  Site& site = it->second;
  if (site.process != nullptr && site.process->running()) {
    return absl::FailedPreconditionError(
        absl::StrCat("site ", name, " is running"));
  }
  site.process.reset();
  // Mark each start in the log, so a restart's lines can be told apart.
  {
    std::ofstream log(site.log_path, std::ios::app);
    log << "==== test: start " << ++starts_ << " of " << name << " at "
        << absl::FormatTime(absl::Now()) << "\n";
  }
  DaemonStart start;
  start.name = name;
  start.argv =
      net_.Exec(name, {SwarmClientPath(), "--config", site.config_path});
  start.log_path = site.log_path;
  start.timeout = absl::Seconds(30) * TimeScale();
  absl::StatusOr<StartedDaemon> daemon = StartDaemon(start);
  if (!daemon.ok()) return daemon.status();
  site.process = std::move(daemon->process);
  return absl::OkStatus();
}

absl::Status NetnsSwarm::StartAll() {
  for (const std::string& name : names_) {
    if (absl::Status s = StartSite(name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void NetnsSwarm::Kill(const std::string& name) {
  Site& site = sites_.at(name);
  if (site.process != nullptr) site.process->Kill();
}

absl::Status NetnsSwarm::Signal(const std::string& name, int signal) {
  Site& site = sites_.at(name);
  if (site.process == nullptr)
    return absl::FailedPreconditionError("no process");
  return site.process->Signal(signal);
}

bool NetnsSwarm::Running(const std::string& name) {
  Site& site = sites_.at(name);
  if (site.process == nullptr) return false;
  // Wait with a past deadline only reaps a process that ended.
  (void)site.process->Wait(absl::InfinitePast());
  return site.process->running();
}

CommandResult NetnsSwarm::Swarmctl(const std::vector<std::string>& args,
                                   absl::Duration timeout) {
  std::vector<std::string> argv = {SwarmctlPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  if (args.empty() || args[0] != "provision") {
    argv.push_back("--tls-dir");
    argv.push_back(absl::StrCat(dir_, "/pki/admins/admin"));
  }
  return RunCommand(argv, absl::StrCat(dir_, "/swarmctl-", ++commands_),
                    timeout * TimeScale());
}

v1::Peer::Stub& NetnsSwarm::Stub(const std::string& name) {
  Site& site = sites_.at(name);
  if (site.stub == nullptr) {
    absl::StatusOr<security::TlsIdentity> admin =
        security::LoadTlsIdentity(absl::StrCat(dir_, "/pki/admins/admin"));
    if (!admin.ok()) ADD_FAILURE() << "admin identity: " << admin.status();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    // A site comes back within seconds after a restart or a healed link;
    // gRPC's default reconnect backoff (up to 2 minutes) would hide it.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    site.stub = v1::Peer::NewStub(grpc::CreateCustomChannel(
        site.address,
        security::ClientCredentials(admin.ok() ? *admin
                                               : security::TlsIdentity()),
        args));
  }
  return *site.stub;
}

absl::StatusOr<v1::SiteStatus> NetnsSwarm::Status(const std::string& name,
                                                  const std::string& job_id,
                                                  absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::StatusRequest request;
  request.set_job_id(job_id);
  request.set_sender("admin");
  v1::StatusReply reply;
  grpc::Status status = Stub(name).Status(&context, request, &reply);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("Status: ", status.error_message()));
  }
  return reply.status();
}

Snapshot NetnsSwarm::Poll(const std::string& job_id) {
  Snapshot snapshot;
  for (const std::string& name : names_) {
    if (!Running(name)) {
      snapshot.emplace(name, absl::UnavailableError("daemon not running"));
      continue;
    }
    snapshot.emplace(name, Status(name, job_id, absl::Milliseconds(1500)));
  }
  return snapshot;
}

std::string NetnsSwarm::Table(const Snapshot& snapshot) {
  std::string out;
  for (const auto& [name, status] : snapshot) {
    if (!status.ok()) {
      absl::StrAppend(&out, "  ", name, ": status call failed (",
                      absl::StatusCodeToString(status.status().code()), ": ",
                      status.status().message(), ")\n");
      continue;
    }
    absl::StrAppendFormat(
        &out, "  %s: %s round %d aggregator %s trained %d aggregated %d%s%s\n",
        name, StateName(status->state()), status->round(),
        status->aggregator().empty() ? "-" : status->aggregator(),
        status->counters().rounds_trained(),
        status->counters().rounds_completed(),
        status->waiting_for().empty()
            ? ""
            : absl::StrCat(" waiting for ", status->waiting_for()),
        status->last_error().empty()
            ? ""
            : absl::StrCat(" last_error: \"", status->last_error(), "\""));
  }
  return out;
}

absl::Status NetnsSwarm::WaitFor(
    const std::string& job_id, const std::function<bool(const Snapshot&)>& done,
    absl::Time deadline, const std::string& what) {
  const absl::Time start = absl::Now();
  // What each site's polls answered, one entry per change ("+1.2s TRAINING
  // r1"): a timeout then says whether the awaited state was never reached or
  // fell between two polls.
  std::map<std::string, std::string> seen;
  std::map<std::string, std::string> last_seen;
  int polls = 0;
  Snapshot last;
  while (true) {
    last = Poll(job_id);
    ++polls;
    for (const auto& [name, status] : last) {
      const std::string now =
          status.ok()
              ? absl::StrCat(StateName(status->state()), " r", status->round())
              : std::string(absl::StatusCodeToString(status.status().code()));
      if (last_seen[name] == now) continue;
      last_seen[name] = now;
      absl::StrAppendFormat(&seen[name], " +%.1fs %s",
                            absl::ToDoubleSeconds(absl::Now() - start), now);
    }
    if (done(last)) return absl::OkStatus();
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::string history;
  for (const auto& [name, changes] : seen) {
    absl::StrAppend(&history, "  ", name, ":", changes, "\n");
  }
  return absl::DeadlineExceededError(
      absl::StrCat("timed out waiting for ", what, " (", polls, " polls in ",
                   absl::FormatDuration(absl::Now() - start), "); sites:\n",
                   Table(last), "what the polls saw:\n", history));
}

JobOutcome NetnsSwarm::WaitJobEnd(const std::string& job_id,
                                  absl::Time deadline, absl::Duration stall) {
  const absl::Time start = absl::Now();
  JobOutcome outcome;
  std::string progress;
  absl::Time changed = start;
  Snapshot last;
  while (true) {
    last = Poll(job_id);
    bool all_done = true;
    bool all_ended = true;
    std::string key;
    for (const auto& [name, status] : last) {
      if (!status.ok()) {
        all_done = false;
        all_ended &= !Running(name);
        absl::StrAppend(&key, name, ":down;");
        continue;
      }
      all_done &= status->state() == v1::SITE_STATE_DONE;
      all_ended &= Terminal(status->state());
      absl::StrAppend(&key, name, ":", status->state(), "/", status->round(),
                      "/", status->counters().rounds_trained(), "/",
                      status->counters().rounds_completed(), ";");
    }
    if (key != progress) {
      progress = key;
      changed = absl::Now();
    }
    if (all_done) {
      outcome.all_done = true;
      break;
    }
    if (all_ended) {
      outcome.reason = "every site ended, not all of them done";
      break;
    }
    if (absl::Now() - changed >= stall) {
      outcome.reason = absl::StrCat("no site changed state for ",
                                    absl::FormatDuration(stall));
      break;
    }
    if (absl::Now() >= deadline) {
      outcome.reason = "deadline";
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  outcome.elapsed = absl::Now() - start;
  outcome.table = Table(last);
  return outcome;
}

absl::Status NetnsSwarm::CheckFinalFiles(const std::string& job_id) {
  return CheckFinalFiles(job_id, names_);
}

absl::Status NetnsSwarm::CheckFinalFiles(
    const std::string& job_id, const std::vector<std::string>& sites) {
  if (sites.empty()) return absl::InvalidArgumentError("no site to check");
  for (const char* which : {"best", "last"}) {
    std::string reference;
    for (const std::string& name : sites) {
      const std::string path = absl::StrCat(Workspace(name), "/", job_id, "/",
                                            which, ".safetensors");
      absl::StatusOr<std::string> bytes = ReadBytes(path);
      if (!bytes.ok()) {
        return absl::NotFoundError(absl::StrCat(
            "site ", name, " has no ", which, ".safetensors (", path, ")"));
      }
      if (name == sites.front()) {
        reference = std::move(*bytes);
      } else if (*bytes != reference) {
        return absl::DataLossError(absl::StrCat(
            "site ", name, "'s ", which, ".safetensors differs from site ",
            sites.front(), "'s (", bytes->size(), " vs ", reference.size(),
            " bytes)"));
      }
    }
  }
  return absl::OkStatus();
}

std::string NetnsSwarm::Log(const std::string& name, int lines) {
  return LastLines(ReadFileOrEmpty(sites_.at(name).log_path), lines);
}

std::string NetnsSwarm::Logs(int lines) {
  std::string out;
  for (const std::string& name : names_) {
    absl::StrAppend(&out, "--- ", name, " (", sites_.at(name).log_path, "):\n",
                    Log(name, lines), "\n");
  }
  return out;
}

}  // namespace swarm::testing
