// swarmctl: the operator CLI.
//
//   swarmctl init   --out DIR (--local N | --site NAME=HOST:PORT ...)
//                   [--learner mlp|external|test]
//   swarmctl start  --job job.json [--wait-healthy SECONDS] [--rerun-finished]
//   swarmctl resume --job job.json
//   swarmctl status --job job.json [--watch] [--interval-ms 500]
//                   [--down-after-ms 30000]
//   swarmctl abort  --job job.json [--reason TEXT]
//   swarmctl fetch  --site HOST:PORT --which best|last --out FILE [--job-id ID]
//   swarmctl provision --out DIR --job job.json [--admin NAME]... [--site
//   NAME]... [--no-sites]
//   swarmctl health --site HOST:PORT [--server-name NAME] [--timeout-ms 3000]
//   swarmctl health --config site.json [--timeout-ms 3000]
//   swarmctl deploy k8s --job job.json --pki DIR --out DIR [--image IMG] ...
//   swarmctl report --job job.json --out DIR [--test-metric rounds.csv]
//                   [--test-column test_accuracy] [--timeout-ms 5000]
//
//   swarmctl version | --version;  swarmctl COMMAND --help
//
// Every command but provision talks mTLS with an admin identity:
// --tls-dir DIR (a folder made by provision: DIR/admins/<name>), or the
// SWARM_TLS_DIR environment variable; --insecure talks plaintext instead.
// --log-format json writes the diagnostics on stderr as JSON lines.
//
// Exit codes: 0 success; 1 a site failed or refused (the message names it);
// 2 bad usage or an invalid job config (nothing was sent to any site).
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cli/init_project.h"
#include "cli/k8s_manifests.h"
#include "common/logging.h"
#include "common/version.h"
#include "config/job_config.h"
#include "config/site_config.h"
#include "config/validation.h"
#include "model/tensor_sink.h"
#include "proto/health.grpc.pb.h"
#include "proto/swarm.grpc.pb.h"
#include "report/job_report.h"
#include "rpc/grpc_stream.h"
#include "rpc/tls.h"
#include "security/certificates.h"
#include "security/provision.h"
#include "security/sha256_digest.h"

namespace swarm {
namespace {

LogFormat& DiagnosticFormat() {
  static LogFormat format = LogFormat::kText;
  return format;
}

// A diagnostic on stderr: as written ("swarmctl: ...\n") in text format, one
// JSON line (common/logging.h) with --log-format json.
__attribute__((format(printf, 1, 2))) void Complain(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  char buffer[4096];
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  if (DiagnosticFormat() == LogFormat::kText) {
    std::fputs(buffer, stderr);
    return;
  }
  absl::string_view message = absl::StripSuffix(buffer, "\n");
  message = absl::StripPrefix(message, "swarmctl: ");
  const bool warning = absl::ConsumePrefix(&message, "warning: ");
  LogEvent(warning ? LogSeverity::kWarning : LogSeverity::kError,
           warning ? "warning" : "error", message, {{"program", "swarmctl"}});
}

// One subcommand's usage: what `swarmctl CMD --help` prints.
struct CommandHelp {
  const char* name;
  const char* usage;
};

constexpr CommandHelp kCommands[] = {
    {"init",
     "  swarmctl init --out DIR (--local N | --site NAME=HOST:PORT ... |\n"
     "                --sites FILE) [--learner mlp|external|test]\n"
     "                [--job-id ID] [--rounds N] [--admin NAME] [--force]\n"
     "      writes DIR/job.json, DIR/<site>/site.json with its certificates,\n"
     "      DIR/admins/<admin>, and prints the commands to run on each "
     "machine\n"
     "      (--sites FILE: one NAME=HOST:PORT a line; --force: write into an\n"
     "       existing DIR)\n"},
    {"start",
     "  swarmctl start  --job job.json [--wait-healthy SECONDS] "
     "[--rerun-finished]\n"
     "      checks every site first (reachable, same wire protocol major\n"
     "      version, not running another job, the job not finished or\n"
     "      interrupted), then configures every site, then starts the job;\n"
     "      --rerun-finished runs a finished job again over its final "
     "models\n"},
    {"resume",
     "  swarmctl resume --job job.json   (after the sites restarted)\n"},
    {"status",
     "  swarmctl status --job job.json [--watch] [--changes-only]\n"
     "                  [--interval-ms 500] [--down-after-ms 30000]\n"
     "      (--watch ends when every site is done (exit 0), or ended with "
     "some failed\n"
     "       or aborted (exit 1), or some are unreachable for --down-after-ms "
     "and the\n"
     "       others ended (exit 3))\n"},
    {"abort", "  swarmctl abort  --job job.json [--reason TEXT]\n"},
    {"fetch",
     "  swarmctl fetch  --site HOST:PORT --which best|last --out FILE "
     "[--job-id ID]\n"},
    {"provision",
     "  swarmctl provision --out DIR --job job.json [--admin NAME]... "
     "[--site NAME]... [--no-sites]\n"},
    {"health",
     "  swarmctl health --site HOST:PORT [--server-name NAME] "
     "[--timeout-ms 3000]\n"
     "  swarmctl health --config site.json [--timeout-ms 3000]\n"},
    {"deploy",
     "  swarmctl deploy k8s --job job.json --pki DIR --out DIR [--image IMG]\n"
     "      [--namespace NS] [--learner KIND] [--admin NAME] [--storage 1Gi]\n"
     "      [--cpu-request 250m] [--cpu-limit 2] [--memory-request 256Mi]\n"
     "      [--memory-limit 2Gi] [--wait-healthy 300]\n"},
    {"report",
     "  swarmctl report --job job.json --out DIR [--test-metric rounds.csv]\n"
     "      [--test-column test_accuracy] [--timeout-ms 5000]\n"},
    {"version",
     "  swarmctl version | --version   (release, git commit, wire "
     "protocol)\n"},
};

constexpr char kCommonFlags[] =
    "common: --tls-dir DIR (admin identity; or $SWARM_TLS_DIR) | --insecure\n"
    "        --log-format text|json (diagnostics on stderr; default text)\n"
    "        --help (after a command: that command's flags)\n";

// The usage of every command.
const char* UsageText() {
  static const std::string* text = [] {
    auto* all = new std::string("usage:\n");
    for (const CommandHelp& command : kCommands) *all += command.usage;
    *all += kCommonFlags;
    return all;
  }();
  return text->c_str();
}

// The usage of `command`, or nullptr for an unknown command.
const char* CommandUsage(const std::string& command) {
  for (const CommandHelp& known : kCommands) {
    if (command == known.name) return known.usage;
  }
  return nullptr;
}

constexpr absl::Duration kCallTimeout = absl::Seconds(10);

// The name every request carries as its sender: the certificate's name under
// TLS (sites refuse a request whose sender differs from it), "swarmctl"
// without TLS. Set once in ChooseCredentials.
std::string& Sender() {
  static auto* sender = new std::string("swarmctl");
  return *sender;
}

struct Args {
  std::string command;
  std::string subcommand;  // deploy k8s
  std::map<std::string, std::string> values;
  // Flags that may repeat (--admin, --site for provision).
  std::map<std::string, std::vector<std::string>> lists;
  bool watch = false;
  bool insecure = false;
  bool changes_only = false;
  bool no_sites = false;        // provision: admins only
  bool help = false;            // --help: the command's usage
  bool version = false;         // --version
  bool rerun_finished = false;  // start: run a finished job again
  bool force = false;           // init: write into an existing folder
};

// The channel credentials of this run (set once in Run).
std::shared_ptr<grpc::ChannelCredentials>& Credentials() {
  static auto* credentials = new std::shared_ptr<grpc::ChannelCredentials>();
  return *credentials;
}

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args args;
  if (argc < 2) return absl::InvalidArgumentError("missing command");
  args.command = argv[1];
  int first = 2;
  if (args.command == "deploy" && argc > 2 &&
      std::string(argv[2]).rfind("--", 0) != 0) {
    args.subcommand = argv[2];
    first = 3;
  }
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--watch") {
      args.watch = true;
    } else if (arg == "--insecure") {
      args.insecure = true;
    } else if (arg == "--changes-only") {
      args.changes_only = true;
    } else if (arg == "--no-sites") {
      args.no_sites = true;
    } else if (arg == "--help" || arg == "-h") {
      args.help = true;
    } else if (arg == "--version") {
      args.version = true;
    } else if (arg == "--rerun-finished") {
      args.rerun_finished = true;
    } else if (arg == "--force") {
      args.force = true;
    } else if ((arg == "--admin" || arg == "--site") && i + 1 < argc) {
      args.lists[arg.substr(2)].push_back(argv[i + 1]);
      args.values[arg.substr(2)] = argv[++i];
    } else if (arg.rfind("--", 0) == 0 && i + 1 < argc) {
      args.values[arg.substr(2)] = argv[++i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument ", arg));
    }
  }
  return args;
}

std::unique_ptr<v1::Peer::Stub> StubFor(const std::string& address) {
  grpc::ChannelArguments args;
  ApplyModelStreamArgs(&args, AssemblerLimits());
  return v1::Peer::NewStub(
      grpc::CreateCustomChannel(address, Credentials(), args));
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

std::string SiteLabel(const v1::SiteInfo& site) {
  return absl::StrCat("site ", site.name(), " (", site.address(), ")");
}

absl::StatusOr<v1::JobConfig> LoadJob(const Args& args) {
  auto it = args.values.find("job");
  if (it == args.values.end()) {
    return absl::InvalidArgumentError("--job job.json is required");
  }
  return LoadJobConfig(it->second);
}

int ChooseCredentials(const Args& args);

// One grpc.health.v1.Health/Check call (service ""): OK when the site at
// `address` answers SERVING. `server_name`, when not empty, is the name its
// certificate must carry instead of the address's host.
absl::Status CheckHealth(const std::string& address,
                         const std::string& server_name,
                         absl::Duration timeout) {
  grpc::ChannelArguments channel_args;
  if (!server_name.empty()) channel_args.SetSslTargetNameOverride(server_name);
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateCustomChannel(address, Credentials(), channel_args));
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    return absl::UnavailableError(
        absl::StrCat("health of site ", address, ": ", status.error_message()));
  }
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(
        absl::StrCat("site ", address, " is ",
                     grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                         response.status())));
  }
  return absl::OkStatus();
}

// Sends Abort of `job` to one site; an error naming why it did not take.
absl::Status AbortOn(const v1::JobConfig& job, const v1::SiteInfo& site,
                     const std::string& reason) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallTimeout);
  v1::AbortRequest request;
  request.set_job_id(job.job_id());
  request.set_sender(Sender());
  request.set_reason(reason);
  v1::Reply reply;
  grpc::Status status =
      StubFor(site.address())->Abort(&context, request, &reply);
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  if (reply.outcome() != v1::OUTCOME_OK) {
    return absl::FailedPreconditionError(reply.message());
  }
  return absl::OkStatus();
}

// After a configure failed part-way (`failed` refused it or did not answer):
// a start is all-or-nothing, so the sites it configured so far
// (`configured`) are rolled back (the job is aborted there before it
// started: they do not wait for a start, and a restarted daemon does not
// reload it), and the same command can simply be run again. A resume rolls
// nothing back (its sites hold the job they reloaded): `configured` is empty
// then. Says so, naming every site; returns 1.
int RollBack(const v1::JobConfig& job, const char* verb,
             const v1::SiteInfo& failed,
             const std::vector<v1::SiteInfo>& configured) {
  std::vector<std::string> rolled_back, kept;
  const std::string reason =
      absl::StrCat("swarmctl start rolled back: the configure of ",
                   failed.name(), " failed before the job started");
  for (const v1::SiteInfo& site : configured) {
    absl::Status aborted = AbortOn(job, site, reason);
    if (aborted.ok()) {
      rolled_back.push_back(site.name());
    } else {
      kept.push_back(absl::StrCat(SiteLabel(site), ": ", aborted.message()));
    }
  }
  Complain(
      "swarmctl: job %s was not %s on any site%s\n", job.job_id().c_str(), verb,
      rolled_back.empty() ? ""
                          : absl::StrCat("; rolled back its configuration on ",
                                         absl::StrJoin(rolled_back, ", "))
                                .c_str());
  if (!kept.empty()) {
    Complain(
        "swarmctl: could not roll back (they hold the job's configuration "
        "and wait for a start; a configure of the same job replaces it):\n  "
        "%s\n",
        absl::StrJoin(kept, "\n  ").c_str());
  }
  Complain("swarmctl: fix %s (named above) and run the same command again\n",
           SiteLabel(failed).c_str());
  return 1;
}

// Sends `job` to every site (a site already running this very job answers
// OK). Returns the exit code: 0, or 1 naming the site that refused. A start
// (`start`) then rolls back the sites configured before that one, except
// those in `running` (they ran this job before the start: nothing of theirs
// is touched); a resume rolls back nothing.
int ConfigureAll(const v1::JobConfig& job, bool start, bool rerun_finished,
                 const std::set<std::string>& running) {
  std::vector<v1::SiteInfo> configured;
  const char* verb = start ? "started" : "resumed";
  for (const v1::SiteInfo& site : job.sites()) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    v1::ConfigureRequest request;
    request.set_sender(Sender());
    *request.mutable_job() = job;
    *request.mutable_protocol() = OwnProtocolVersion();
    request.set_rerun_finished(rerun_finished);
    v1::Reply reply;
    grpc::Status status =
        StubFor(site.address())->Configure(&context, request, &reply);
    if (!status.ok()) {
      Complain("swarmctl: %s: configure failed: %s\n", SiteLabel(site).c_str(),
               status.error_message().c_str());
      return RollBack(job, verb, site, configured);
    }
    if (reply.outcome() != v1::OUTCOME_OK) {
      Complain(
          "swarmctl: %s refused the job (%s): %s\n", SiteLabel(site).c_str(),
          v1::Outcome_Name(reply.outcome()).c_str(), reply.message().c_str());
      return RollBack(job, verb, site, configured);
    }
    std::printf("configured %s\n", SiteLabel(site).c_str());
    std::fflush(stdout);
    if (start && running.count(site.name()) == 0) configured.push_back(site);
  }
  return 0;
}

// How long a start may take to get the first round's learn tasks out: the
// trainers' tasks (each call retried while it fails), then the aggregator's,
// failing over through every candidate in the worst case.
absl::Duration StartTimeout(const v1::JobConfig& job) {
  const absl::Duration ack =
      absl::Milliseconds(job.learn_task_ack_timeout_ms());
  const absl::Duration failover = absl::Milliseconds(job.failover_timeout_ms());
  const int candidates = std::max(job.aggregator_candidates_size(), 1);
  return kCallTimeout + 2 * ack + candidates * (failover + ack);
}

// Sends Start (or a resume) to `to`, which answers once the first round's
// learn tasks are out. Exit code: 0 when every trainer and the aggregator
// got its task, 1 naming the ones that did not (the job goes on without
// them that round) or why the start failed.
// `done` says what happened on success ("started on site s1").
int SendStart(const v1::JobConfig& job, const v1::SiteInfo& to, bool resume,
              const std::string& done) {
  grpc::ClientContext context;
  SetDeadline(&context, StartTimeout(job));
  v1::StartRequest request;
  request.set_sender(Sender());
  request.set_job_id(job.job_id());
  request.set_resume(resume);
  v1::Reply reply;
  grpc::Status status = StubFor(to.address())->Start(&context, request, &reply);
  const char* verb = resume ? "resume" : "start";
  if (!status.ok() || reply.outcome() != v1::OUTCOME_OK) {
    Complain(
        "swarmctl: %s did not %s the job: %s\n", SiteLabel(to).c_str(), verb,
        status.ok() ? reply.message().c_str() : status.error_message().c_str());
    return 1;
  }
  std::printf("job %s %s; %s\n", job.job_id().c_str(), done.c_str(),
              reply.message().c_str());
  if (reply.not_reached_size() == 0) return 0;
  for (const std::string& site : reply.not_reached()) {
    Complain("swarmctl: the first round's learn task did not reach %s\n",
             site.c_str());
  }
  Complain(
      "swarmctl: job %s runs without those sites this round (they take part "
      "again from a later round's task if they come back)\n",
      job.job_id().c_str());
  return 1;
}

std::string StateName(v1::SiteState state) {
  std::string name = v1::SiteState_Name(state);
  const std::string prefix = "SITE_STATE_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(c));
  return name;
}

// What one site answered to a Status call (any job) before a start.
struct SiteProbe {
  v1::SiteInfo site;
  grpc::Status rpc;
  v1::StatusReply reply;
};

bool IsTerminal(v1::SiteState state) {
  return state == v1::SITE_STATE_DONE || state == v1::SITE_STATE_FAILED ||
         state == v1::SITE_STATE_ABORTED;
}

// Status of every site of `job` at once (whatever job it runs).
std::vector<SiteProbe> ProbeSites(const v1::JobConfig& job,
                                  absl::Duration timeout) {
  std::vector<SiteProbe> probes(job.sites_size());
  std::vector<std::thread> calls;
  for (int i = 0; i < job.sites_size(); ++i) {
    probes[i].site = job.sites(i);
    calls.emplace_back([&probes, i, timeout] {
      grpc::ClientContext context;
      SetDeadline(&context, timeout);
      v1::StatusRequest request;
      request.set_sender(Sender());
      probes[i].rpc = StubFor(probes[i].site.address())
                          ->Status(&context, request, &probes[i].reply);
    });
  }
  for (std::thread& call : calls) call.join();
  return probes;
}

// Refuses the start when a site does not answer or speaks another wire
// protocol major version; names each site and its version. Returns 1 or 0.
int CheckReachableAndCompatible(const v1::JobConfig& job,
                                const std::vector<SiteProbe>& probes) {
  std::vector<std::string> down;
  bool mixed = false;
  std::string versions;
  // Sites too old for the job's features (same major, a lower minor): a
  // 1.2 site ignores server_optimizer (it would aggregate without it and
  // refuse a learn task carrying the optimizer's state mid-job).
  std::vector<std::string> too_old;
  for (const SiteProbe& probe : probes) {
    // A peer without the Status call (not a swarm-client) answers
    // UNIMPLEMENTED: it is there; it sent no version (1.0).
    if (!probe.rpc.ok() &&
        probe.rpc.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
      down.push_back(absl::StrCat(
          SiteLabel(probe.site), ": ",
          probe.rpc.error_message().empty()
              ? absl::StrCat("gRPC status ", probe.rpc.error_code())
              : probe.rpc.error_message()));
      continue;
    }
    const v1::ProtocolVersion version =
        PeerProtocolVersion(probe.reply.protocol(), probe.reply.has_protocol());
    mixed |= !CheckProtocolCompatible(version, "").ok();
    if (job.server_optimizer() != v1::SERVER_OPTIMIZER_NONE &&
        version.major_version() == kWireProtocolMajor &&
        version.minor_version() < 3) {
      too_old.push_back(absl::StrCat(SiteLabel(probe.site),
                                     ": wire protocol ",
                                     ProtocolText(version)));
    }
    absl::StrAppend(
        &versions, "  ", SiteLabel(probe.site), ": wire protocol ",
        ProtocolText(version),
        probe.reply.build().empty()
            ? " (a release older than the version exchange)"
            : absl::StrCat(" (swarm-client ", probe.reply.build(), ")"),
        "\n");
  }
  if (!down.empty()) {
    Complain(
        "swarmctl: did not start job %s: nothing was changed on any site; "
        "these sites do not answer:\n  %s\nstart them (or correct their "
        "address in the job config) and run the same command again\n",
        job.job_id().c_str(), absl::StrJoin(down, "\n  ").c_str());
    return 1;
  }
  if (mixed) {
    Complain(
        "swarmctl: did not start job %s: its sites speak different wire "
        "protocol major versions (nothing was changed on any site):\n%s  "
        "swarmctl: wire protocol %s (%s)\nonly one major version works "
        "together: upgrade the sites that differ (docs/design.md, "
        "\"Compatibility\")\n",
        job.job_id().c_str(), versions.c_str(),
        ProtocolText(OwnProtocolVersion()).c_str(), BuildText().c_str());
    return 1;
  }
  if (!too_old.empty()) {
    Complain(
        "swarmctl: did not start job %s: server_optimizer %s needs wire "
        "protocol 1.3 or later at every site (nothing was changed on any "
        "site); these sites are older:\n  %s\nupgrade them, or run the job "
        "without server_optimizer\n",
        job.job_id().c_str(),
        v1::ServerOptimizer_Name(job.server_optimizer()).c_str(),
        absl::StrJoin(too_old, "\n  ").c_str());
    return 1;
  }
  return 0;
}

// Refuses to start over what a site holds: another job still running, this
// job finished (its final models; unless --rerun-finished) or interrupted
// by a restart (use resume). Returns 1 or 0.
int CheckJobStates(const Args& args, const v1::JobConfig& job,
                   const std::vector<SiteProbe>& probes) {
  std::vector<std::string> finished, rejoined, busy;
  int64_t resume_round = -1;
  for (const SiteProbe& probe : probes) {
    const v1::SiteStatus& s = probe.reply.status();
    if (s.job_id() != job.job_id()) {
      // Started and not ended: IDLE is a running job between two tasks
      // (only CONFIGURED has not started, and is configured anew).
      if (!s.job_id().empty() && !IsTerminal(s.state()) &&
          s.state() != v1::SITE_STATE_CONFIGURED) {
        busy.push_back(absl::StrCat(SiteLabel(probe.site), " runs job ",
                                    s.job_id(), " (", StateName(s.state()),
                                    ", round ", s.round(), ")"));
      }
      continue;
    }
    if (s.state() == v1::SITE_STATE_DONE) finished.push_back(probe.site.name());
    // A reloaded job that never started (CONFIGURED: a start that did not
    // finish, then a restart) has nothing to resume: it is configured anew.
    if (s.rejoined() && !IsTerminal(s.state()) &&
        s.state() != v1::SITE_STATE_CONFIGURED) {
      rejoined.push_back(probe.site.name());
      resume_round = std::max(resume_round, s.global_round());
    }
  }
  const std::string file = args.values.at("job");
  if (!busy.empty()) {
    Complain(
        "swarmctl: did not start job %s (nothing was changed): %s; abort "
        "that job first (swarmctl abort with its job config) or wait until "
        "it ends\n",
        job.job_id().c_str(), absl::StrJoin(busy, "; ").c_str());
    return 1;
  }
  if (!rejoined.empty()) {
    Complain(
        "swarmctl: did not start job %s: it was interrupted, and %s "
        "restarted and reloaded it (nothing was changed); continue it with\n"
        "  swarmctl resume --job %s\n(it resumes from the global model of "
        "round %lld)\n",
        job.job_id().c_str(), absl::StrJoin(rejoined, ", ").c_str(),
        file.c_str(), static_cast<long long>(resume_round));
    return 1;
  }
  if (!finished.empty() && !args.rerun_finished) {
    Complain(
        "swarmctl: did not start job %s: it already finished on %s, and its "
        "final models are there (<workspace>/%s/best.safetensors and "
        "last.safetensors on each site; nothing was changed). Fetch them "
        "with\n  swarmctl fetch --site %s --which best --out best.safetensors"
        "\nTo train again, give the job a new job_id, or pass "
        "--rerun-finished to run it afresh over those models.\n",
        job.job_id().c_str(), absl::StrJoin(finished, ", ").c_str(),
        job.job_id().c_str(), job.sites(0).address().c_str());
    return 1;
  }
  return 0;
}

int Start(const Args& args) {
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    Complain("swarmctl: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  // --wait-healthy SECONDS: first wait (at most that long in all) until every
  // site answers its health check, e.g. while containers are still starting.
  if (args.values.count("wait-healthy") > 0) {
    int seconds = 0;
    if (!absl::SimpleAtoi(args.values.at("wait-healthy"), &seconds) ||
        seconds < 0) {
      Complain("swarmctl: --wait-healthy must be a number of seconds\n");
      return 2;
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(seconds);
    for (const v1::SiteInfo& site : job->sites()) {
      while (true) {
        absl::Status health = CheckHealth(site.address(), "", absl::Seconds(2));
        if (health.ok()) break;
        if (absl::Now() >= deadline) {
          Complain("swarmctl: %s not healthy after %ds: %s\n",
                   SiteLabel(site).c_str(), seconds,
                   std::string(health.message()).c_str());
          return 1;
        }
        absl::SleepFor(absl::Seconds(1));  // polling a starting site
      }
      std::printf("%s is serving\n", SiteLabel(site).c_str());
    }
  }
  // Everything is checked on every site before anything changes on any.
  const std::vector<SiteProbe> probes = ProbeSites(*job, kCallTimeout);
  if (int code = CheckReachableAndCompatible(*job, probes); code != 0) {
    return code;
  }
  if (int code = CheckJobStates(args, *job, probes); code != 0) return code;
  // Sites that already run this very job (it started) answer the configure
  // OK and are never rolled back.
  std::set<std::string> running;
  for (const SiteProbe& probe : probes) {
    const v1::SiteStatus& s = probe.reply.status();
    if (s.job_id() == job->job_id() && !IsTerminal(s.state()) &&
        s.state() != v1::SITE_STATE_CONFIGURED) {
      running.insert(probe.site.name());
    }
  }
  if (int code =
          ConfigureAll(*job, /*start=*/true, args.rerun_finished, running);
      code != 0) {
    return code;
  }
  const v1::SiteInfo& starter = *FindSite(*job, job->starting_site());
  return SendStart(*job, starter, /*resume=*/false,
                   absl::StrCat("started on ", SiteLabel(starter)));
}

// After the sites restarted (a power cut, a redeploy): every site is sent
// the same job (a restarted daemon reloaded it from its workspace, and a
// different config is refused, naming the difference), then the site that
// holds the latest persisted global model scatters that round again. At
// most the round in progress is lost; the best record is the one the
// state files kept.
int Resume(const Args& args) {
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    Complain("swarmctl: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  if (int code = ConfigureAll(*job, /*start=*/false, /*rerun_finished=*/false,
                              /*running=*/{});
      code != 0) {
    return code;
  }
  const v1::SiteInfo* from = nullptr;
  int64_t latest = -1;
  for (const v1::SiteInfo& site : job->sites()) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    v1::StatusRequest request;
    request.set_sender(Sender());
    request.set_job_id(job->job_id());
    v1::StatusReply reply;
    grpc::Status status =
        StubFor(site.address())->Status(&context, request, &reply);
    if (!status.ok()) {
      Complain("swarmctl: %s: status failed: %s\n", SiteLabel(site).c_str(),
               status.error_message().c_str());
      return 1;
    }
    const v1::SiteStatus& site_status = reply.status();
    std::printf("%s: %s, round %u, persisted global model of round %lld%s\n",
                SiteLabel(site).c_str(),
                v1::SiteState_Name(site_status.state()).c_str(),
                site_status.round(),
                static_cast<long long>(site_status.global_round()),
                site_status.rejoined() ? " (reloaded after a restart)" : "");
    if (site_status.rejoined() && site_status.global_round() > latest) {
      latest = site_status.global_round();
      from = &site;
    }
  }
  if (from == nullptr) {
    Complain(
        "swarmctl: no site of job %s reloaded a persisted global model after "
        "a restart; nothing to resume from (start the job again with "
        "swarmctl start)\n",
        job->job_id().c_str());
    return 1;
  }
  return SendStart(
      *job, *from, /*resume=*/true,
      absl::StrCat("resumed at round ", latest, " from ", SiteLabel(*from)));
}

constexpr char kStatusRow[] = "%-12s %-22s %-12s %5s %-12s %-8s %-8s %s\n";

// One pass over every site: the status table and how many sites are done or
// have failed (unreachable, failed or aborted).
struct StatusTable {
  std::string text;
  int done = 0;
  int failed = 0;  // Failed or aborted.
  std::vector<std::string> unreachable;
  // Sites that answer but run another job or none.
  std::vector<std::string> elsewhere;
};

// The row of a site that answers but does not run `job_id`: what it runs.
std::string ElsewhereRow(const std::string& name, const v1::SiteStatus& s) {
  if (s.job_id().empty()) {
    return absl::StrFormat(kStatusRow, name, "no job", "-", "-", "-", "-", "-",
                           "this site holds no job (not configured)");
  }
  return absl::StrFormat(
      kStatusRow, name, absl::StrCat("runs job ", s.job_id()), "-",
      absl::StrCat(s.round()), "-", "-", "-",
      absl::StrCat("another job (", StateName(s.state()), "), not this one"));
}

std::string StatusRow(const std::string& name, const v1::SiteStatus& s) {
  std::string role = s.role().trainer() ? "trainer" : "";
  if (s.role().aggregator()) role += role.empty() ? "aggregator" : "+aggr";
  const std::string best =
      s.best().present() ? absl::StrFormat("%.4f", s.best().metric()) : "-";
  auto accuracy = s.metrics().find("accuracy");
  const std::string validation =
      accuracy == s.metrics().end() ? "-"
                                    : absl::StrFormat("%.4f", accuracy->second);
  // "waiting for trainer" says more than "training" while it lasts.
  const std::string state =
      s.waiting_for().empty() ? StateName(s.state()) : s.waiting_for();
  return absl::StrFormat(kStatusRow, name, state, role.empty() ? "-" : role,
                         absl::StrCat(s.round()),
                         s.aggregator().empty() ? "-" : s.aggregator(),
                         validation, best, s.last_error());
}

// The events under a site's row: failovers it made or saw, a restart it
// rejoined from, aggregates it dropped, trainers it stopped waiting for, and
// why the job ended there.
std::string StatusEvents(const std::string& name, const v1::SiteStatus& s) {
  std::string events;
  for (const v1::Failover& failover : s.failovers()) {
    absl::StrAppendFormat(
        &events, "    %s: round %u failed over from %s to %s (%s)\n", name,
        failover.round(), failover.from(), failover.to(), failover.reason());
  }
  const v1::SiteCounters& c = s.counters();
  if (s.rejoined() || c.rejoins() > 0) {
    absl::StrAppendFormat(&events,
                          "    %s: reloaded its job after a restart%s\n", name,
                          c.rejoins() > 0 ? " and rejoined" : "");
  }
  if (c.discarded_aggregates() > 0) {
    absl::StrAppendFormat(&events,
                          "    %s: dropped %u aggregate(s) of a losing chain\n",
                          name, c.discarded_aggregates());
  }
  if (c.trainers_dropped() > 0) {
    absl::StrAppendFormat(&events,
                          "    %s: stopped waiting for %u silent trainer(s)\n",
                          name, c.trainers_dropped());
  }
  if (s.has_privacy()) {
    const v1::PrivacySpent& p = s.privacy();
    absl::StrAppendFormat(
        &events,
        "    %s: privacy spent: epsilon %.3f (delta %g) over %u round(s)%s%s\n",
        name, p.epsilon(), p.delta(), p.rounds(),
        p.max_epsilon() > 0 ? absl::StrFormat(" of budget %g", p.max_epsilon())
                            : std::string(),
        p.budget_exhausted() ? ": budget exhausted, stopped training" : "");
  }
  if (!s.end_reason().empty()) {
    absl::StrAppendFormat(&events, "    %s: ended: %s\n", name, s.end_reason());
  }
  return events;
}

StatusTable PollStatus(
    const v1::JobConfig& job,
    const std::map<std::string, std::unique_ptr<v1::Peer::Stub>>& stubs) {
  StatusTable table;
  table.text = absl::StrFormat(kStatusRow, "SITE", "STATE", "ROLE", "ROUND",
                               "AGGREGATOR", "VAL ACC", "BEST", "LAST ERROR");
  for (const v1::SiteInfo& site : job.sites()) {
    grpc::ClientContext context;
    SetDeadline(&context, absl::Seconds(3));
    v1::StatusRequest request;  // Any job: a site running another says so.
    request.set_sender(Sender());
    v1::StatusReply reply;
    grpc::Status status =
        stubs.at(site.name())->Status(&context, request, &reply);
    if (!status.ok()) {
      absl::StrAppendFormat(&table.text, kStatusRow, site.name(), "unreachable",
                            "-", "-", "-", "-", "-", status.error_message());
      table.unreachable.push_back(site.name());
      continue;
    }
    const v1::SiteStatus& s = reply.status();
    if (s.job_id() != job.job_id()) {
      table.text += ElsewhereRow(site.name(), s);
      table.elsewhere.push_back(site.name());
      continue;
    }
    table.text += StatusRow(site.name(), s);
    table.text += StatusEvents(site.name(), s);
    if (s.state() == v1::SITE_STATE_DONE) ++table.done;
    if (s.state() == v1::SITE_STATE_FAILED ||
        s.state() == v1::SITE_STATE_ABORTED) {
      ++table.failed;
    }
  }
  return table;
}

int Status(const Args& args) {
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    Complain("swarmctl: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  int interval_ms = 500;
  if (args.values.count("interval-ms") > 0 &&
      !absl::SimpleAtoi(args.values.at("interval-ms"), &interval_ms)) {
    Complain("swarmctl: --interval-ms must be an integer\n");
    return 2;
  }
  std::map<std::string, std::unique_ptr<v1::Peer::Stub>> stubs;
  for (const v1::SiteInfo& site : job->sites()) {
    stubs[site.name()] = StubFor(site.address());
  }
  int down_after_ms = 30000;
  if (args.values.count("down-after-ms") > 0 &&
      (!absl::SimpleAtoi(args.values.at("down-after-ms"), &down_after_ms) ||
       down_after_ms < 0)) {
    Complain("swarmctl: --down-after-ms must be a non-negative integer\n");
    return 2;
  }
  // When each unreachable site was first seen so (a restart is not down).
  std::map<std::string, absl::Time> unreachable_since;
  std::string last_text;
  while (true) {
    const StatusTable table = PollStatus(*job, stubs);
    const absl::Time now = absl::Now();
    std::map<std::string, absl::Time> still;
    int down = 0;
    for (const std::string& name : table.unreachable) {
      auto it = unreachable_since.find(name);
      still[name] = it == unreachable_since.end() ? now : it->second;
      if (now - still[name] >= absl::Milliseconds(down_after_ms)) ++down;
    }
    unreachable_since = std::move(still);
    if (!args.changes_only || table.text != last_text) {
      std::printf("%s", table.text.c_str());
      if (args.watch) std::printf("\n");
      last_text = table.text;
    }
    const int sites = job->sites_size();
    const int unreachable = static_cast<int>(table.unreachable.size());
    const int elsewhere = static_cast<int>(table.elsewhere.size());
    if (!args.watch) return table.failed + unreachable + elsewhere > 0 ? 1 : 0;
    if (table.done == sites) {
      std::printf("job %s done on every site\n", job->job_id().c_str());
      return 0;
    }
    if (elsewhere > 0 &&
        table.done + table.failed + down + elsewhere == sites) {
      std::printf("job %s ended on its sites; %d site(s) do not run it: %s\n",
                  job->job_id().c_str(), elsewhere,
                  absl::StrJoin(table.elsewhere, ", ").c_str());
      return 1;
    }
    if (table.done + table.failed + down == sites) {
      if (table.failed > 0) {
        std::printf(
            "job %s ended with %d site(s) failed or aborted%s\n",
            job->job_id().c_str(), table.failed,
            down > 0 ? absl::StrCat(" and ", down, " down").c_str() : "");
        return 1;
      }
      std::printf(
          "job %s ended on every reachable site; %d site(s) down "
          "(unreachable for %d ms): %s\n",
          job->job_id().c_str(), down, down_after_ms,
          absl::StrJoin(table.unreachable, ", ").c_str());
      return 3;
    }
    std::fflush(stdout);
    absl::SleepFor(absl::Milliseconds(interval_ms));  // operator display only
  }
}

int Abort(const Args& args) {
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    Complain("swarmctl: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  int failures = 0;
  const std::string reason =
      args.values.count("reason") > 0 ? args.values.at("reason") : "";
  for (const v1::SiteInfo& site : job->sites()) {
    if (absl::Status aborted = AbortOn(*job, site, reason); !aborted.ok()) {
      Complain("swarmctl: %s: abort failed: %s\n", SiteLabel(site).c_str(),
               std::string(aborted.message()).c_str());
      ++failures;
      continue;
    }
    std::printf("aborted on %s\n", SiteLabel(site).c_str());
  }
  return failures > 0 ? 1 : 0;
}

// After a failed fetch: when the site still runs `job_id`, says so, with its
// round and state (the final models exist once the job is done there).
void ExplainUnfinished(v1::Peer::Stub* stub, const std::string& job_id,
                       const std::string& address) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallTimeout);
  v1::StatusRequest request;
  request.set_sender(Sender());
  v1::StatusReply reply;
  if (!stub->Status(&context, request, &reply).ok()) return;
  const v1::SiteStatus& s = reply.status();
  if (s.job_id() != job_id) {
    Complain("swarmctl: site %s holds %s, not job %s\n", address.c_str(),
             s.job_id().empty() ? "no job"
                                : absl::StrCat("job ", s.job_id()).c_str(),
             job_id.c_str());
    return;
  }
  if (IsTerminal(s.state())) return;
  Complain(
      "swarmctl: job %s is still running on site %s (round %u, %s): its "
      "final models are there once it is done (swarmctl status --watch)\n",
      job_id.c_str(), address.c_str(), s.round(), StateName(s.state()).c_str());
}

int Fetch(const Args& args) {
  for (const char* required : {"site", "which", "out"}) {
    if (args.values.count(required) == 0) {
      Complain("swarmctl: fetch needs --%s\n%s", required, UsageText());
      return 2;
    }
  }
  const std::string address = args.values.at("site");
  const std::string which = args.values.at("which");
  if (which != "best" && which != "last") {
    Complain("swarmctl: --which must be best or last, not %s\n", which.c_str());
    return 2;
  }
  std::unique_ptr<v1::Peer::Stub> stub = StubFor(address);
  std::string job_id =
      args.values.count("job-id") > 0 ? args.values.at("job-id") : "";
  if (job_id.empty()) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    v1::StatusRequest request;
    request.set_sender(Sender());
    v1::StatusReply reply;
    grpc::Status status = stub->Status(&context, request, &reply);
    if (!status.ok()) {
      Complain("swarmctl: site %s: %s\n", address.c_str(),
               status.error_message().c_str());
      return 1;
    }
    job_id = reply.status().job_id();
  }
  v1::FetchModelRequest request;
  request.set_job_id(job_id);
  request.set_sender(Sender());
  request.set_which(which == "best" ? v1::MODEL_SELECTOR_BEST
                                    : v1::MODEL_SELECTOR_LAST);
  DiskSink sink(args.values.at("out"));
  Assembler assembler(&sink, AssemblerOptions());
  grpc::ClientContext context;
  SetDeadline(&context, absl::Hours(1));
  grpc::ChannelArguments channel_args;
  ApplyModelStreamArgs(&channel_args, AssemblerLimits());
  auto channel =
      grpc::CreateCustomChannel(address, Credentials(), channel_args);
  absl::StatusOr<Model> model =
      FetchModelFromPeer(channel.get(), &context, request, &assembler);
  if (!model.ok()) {
    Complain("swarmctl: fetching %s from site %s: %s\n", which.c_str(),
             address.c_str(), std::string(model.status().message()).c_str());
    ExplainUnfinished(stub.get(), job_id, address);
    return 1;
  }
  std::printf("wrote %s (%zu tensors, %llu bytes) from site %s\n",
              args.values.at("out").c_str(), model->num_tensors(),
              static_cast<unsigned long long>(model->total_bytes()),
              address.c_str());
  return 0;
}

// The path of a program beside this one (as built, cli/; as installed, the
// same bin folder), or its bare name when it is not there.
std::string ProgramBesideMe(const std::string& name) {
  std::error_code error;
  const std::filesystem::path me =
      std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return name;
  const std::filesystem::path beside = me.parent_path() / name;
  return std::filesystem::exists(beside, error) ? beside.string() : name;
}

// swarmctl init (cli/init_project.h): exit 0, 2 for bad usage or an existing
// folder (named; nothing written), 1 when writing failed.
int Init(const Args& args) {
  InitOptions options;
  const std::map<std::string, std::string*> strings = {
      {"out", &options.out},
      {"learner", &options.learner},
      {"job-id", &options.job_id}};
  for (const auto& [flag, value] : strings) {
    if (args.values.count(flag) > 0) *value = args.values.at(flag);
  }
  const std::map<std::string, int*> numbers = {{"local", &options.local},
                                               {"rounds", &options.rounds}};
  for (const auto& [flag, value] : numbers) {
    if (args.values.count(flag) > 0 &&
        (!absl::SimpleAtoi(args.values.at(flag), value) || *value < 1)) {
      Complain("swarmctl: init: --%s must be a positive integer, not %s\n",
               flag.c_str(), args.values.at(flag).c_str());
      return 2;
    }
  }
  if (args.lists.count("admin") > 0) options.admin = args.lists.at("admin")[0];
  if (args.lists.count("site") > 0) options.sites = args.lists.at("site");
  if (args.values.count("sites") > 0) {
    absl::StatusOr<std::vector<std::string>> listed =
        ReadSitesFile(args.values.at("sites"));
    if (!listed.ok()) {
      Complain("swarmctl: init: %s\n",
               std::string(listed.status().message()).c_str());
      return 2;
    }
    options.sites.insert(options.sites.end(), listed->begin(), listed->end());
  }
  options.force = args.force;
  options.swarmctl = ProgramBesideMe("swarmctl");
  options.swarm_client = ProgramBesideMe("swarm-client");
  absl::StatusOr<std::string> commands = InitProject(options);
  if (!commands.ok()) {
    Complain("swarmctl: init: %s\n",
             std::string(commands.status().message()).c_str());
    const absl::StatusCode code = commands.status().code();
    return code == absl::StatusCode::kInvalidArgument ||
                   code == absl::StatusCode::kAlreadyExists
               ? 2
               : 1;
  }
  std::fputs(commands->c_str(), stdout);
  return 0;
}

int Provision(const Args& args) {
  if (args.values.count("out") == 0) {
    Complain("swarmctl: provision needs --out DIR\n%s", UsageText());
    return 2;
  }
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    Complain("swarmctl: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  security::ProvisionOptions options;
  if (args.lists.count("admin") > 0) options.admins = args.lists.at("admin");
  if (args.lists.count("site") > 0) options.only_sites = args.lists.at("site");
  options.no_sites = args.no_sites;
  const std::string out = args.values.at("out");
  absl::StatusOr<security::ProvisionReport> report =
      security::Provision(*job, out, options);
  if (!report.ok()) {
    Complain("swarmctl: provision: %s\n",
             std::string(report.status().message()).c_str());
    return report.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("%s CA in %s/ca (keep ca.key there)\n",
              report->created_ca ? "created the" : "reused the", out.c_str());
  for (const std::string& folder : report->folders) {
    std::printf("wrote %s\n", folder.c_str());
  }
  return 0;
}

// The standard gRPC health check (grpc.health.v1.Health/Check, service "")
// against one site: exit 0 when it answers SERVING, 1 otherwise (2: bad
// usage). For container health checks and Kubernetes probes.
//   --site HOST:PORT: credentials as for the other commands; --server-name is
//     the name the site's certificate must carry when the address is not one
//     of its names.
//   --config site.json: checks the daemon of that site config from inside its
//     own container or machine: dials the local listen port with the site's
//     own identity (tls_dir) and expects the first name of its certificate.
int Health(const Args& args) {
  if (args.values.count("site") == args.values.count("config")) {
    Complain(
        "swarmctl: health needs one of --site HOST:PORT or --config "
        "site.json\n%s",
        UsageText());
    return 2;
  }
  int timeout_ms = 3000;
  if (args.values.count("timeout-ms") > 0 &&
      (!absl::SimpleAtoi(args.values.at("timeout-ms"), &timeout_ms) ||
       timeout_ms <= 0)) {
    Complain("swarmctl: --timeout-ms must be a positive integer\n");
    return 2;
  }
  std::string address;
  std::string server_name =
      args.values.count("server-name") > 0 ? args.values.at("server-name") : "";
  if (args.values.count("site") > 0) {
    address = args.values.at("site");
    if (int code = ChooseCredentials(args); code != 0) return code;
  } else {
    absl::StatusOr<v1::SiteConfig> config =
        LoadSiteConfig(args.values.at("config"));
    if (!config.ok()) {
      Complain("swarmctl: %s\n",
               std::string(config.status().message()).c_str());
      return 2;
    }
    absl::StatusOr<HostPort> listen = ParseHostPort(config->listen_address());
    if (!listen.ok()) {
      Complain("swarmctl: %s\n",
               std::string(listen.status().message()).c_str());
      return 2;
    }
    const bool wildcard = listen->host == "0.0.0.0" || listen->host == "::";
    const std::string host = wildcard ? "127.0.0.1" : listen->host;
    address = absl::StrCat(host.find(':') != std::string::npos
                               ? absl::StrCat("[", host, "]")
                               : host,
                           ":", listen->port);
    if (config->tls_dir().empty()) {
      Credentials() = grpc::InsecureChannelCredentials();
    } else {
      absl::StatusOr<security::TlsIdentity> identity =
          security::LoadTlsIdentity(config->tls_dir());
      if (!identity.ok()) {
        Complain("swarmctl: %s\n",
                 std::string(identity.status().message()).c_str());
        return 1;
      }
      Credentials() = security::ClientCredentials(*identity);
      absl::StatusOr<security::CertInfo> info =
          security::ParseCertificate(identity->cert_pem);
      if (server_name.empty() && info.ok() && !info->dns_names.empty()) {
        server_name = info->dns_names.front();
      }
    }
  }
  if (absl::Status health =
          CheckHealth(address, server_name, absl::Milliseconds(timeout_ms));
      !health.ok()) {
    Complain("swarmctl: %s\n", std::string(health.message()).c_str());
    return 1;
  }
  std::printf("site %s: SERVING\n", address.c_str());
  return 0;
}

// Writes the Kubernetes manifests of a job (cli/k8s_manifests.h) into --out,
// issuing the certificates into --pki.
int DeployK8s(const Args& args) {
  if (args.subcommand != "k8s") {
    Complain("swarmctl: deploy supports only k8s\n%s", UsageText());
    return 2;
  }
  for (const char* required : {"pki", "out"}) {
    if (args.values.count(required) == 0) {
      Complain("swarmctl: deploy k8s needs --%s\n%s", required, UsageText());
      return 2;
    }
  }
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    Complain("swarmctl: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  K8sOptions options;
  const std::map<std::string, std::string*> strings = {
      {"image", &options.image},
      {"namespace", &options.namespace_name},
      {"admin", &options.admin},
      {"learner", &options.learner_kind},
      {"storage", &options.storage},
      {"cpu-request", &options.cpu_request},
      {"cpu-limit", &options.cpu_limit},
      {"memory-request", &options.memory_request},
      {"memory-limit", &options.memory_limit}};
  for (const auto& [flag, value] : strings) {
    if (args.values.count(flag) > 0) *value = args.values.at(flag);
  }
  if (args.values.count("wait-healthy") > 0 &&
      !absl::SimpleAtoi(args.values.at("wait-healthy"),
                        &options.wait_healthy_seconds)) {
    Complain("swarmctl: --wait-healthy must be a number\n");
    return 2;
  }
  absl::StatusOr<std::map<std::string, std::string>> files =
      GenerateK8sManifests(*job, args.values.at("pki"), options);
  if (!files.ok()) {
    Complain("swarmctl: deploy k8s: %s\n",
             std::string(files.status().message()).c_str());
    return files.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const std::string out = args.values.at("out");
  std::error_code error;
  std::filesystem::create_directories(out, error);
  if (error) {
    Complain("swarmctl: cannot create %s: %s\n", out.c_str(),
             error.message().c_str());
    return 1;
  }
  for (const auto& [name, contents] : *files) {
    // The files hold private keys (Secrets): mode 0600.
    absl::Status written =
        security::WriteSecretFile(absl::StrCat(out, "/", name), contents);
    if (!written.ok()) {
      Complain("swarmctl: %s\n", std::string(written.message()).c_str());
      return 1;
    }
    std::printf("wrote %s/%s\n", out.c_str(), name.c_str());
  }
  std::printf("apply with: kubectl apply -f %s/ (sites first, then job.yaml)\n",
              out.c_str());
  return 0;
}

// Asks every site of `job` for its history of the job, each call with a
// deadline of `timeout_ms`. Every site at once: a silent site costs one
// deadline, not one each.
std::vector<report::SiteHistory> AskHistories(const v1::JobConfig& job,
                                              int timeout_ms) {
  std::vector<report::SiteHistory> sites(job.sites_size());
  std::vector<std::thread> calls;
  for (int i = 0; i < job.sites_size(); ++i) {
    sites[i].site = job.sites(i);
    calls.emplace_back([&, i] {
      grpc::ClientContext context;
      SetDeadline(&context, absl::Milliseconds(timeout_ms));
      v1::HistoryRequest request;
      request.set_job_id(job.job_id());
      request.set_sender(Sender());
      grpc::Status status = StubFor(job.sites(i).address())
                                ->History(&context, request, &sites[i].reply);
      if (!status.ok()) {
        sites[i].status = absl::UnavailableError(status.error_message());
      }
    });
  }
  for (std::thread& call : calls) call.join();
  return sites;
}

// swarmctl report: asks every site of the job for its per-round history
// (History, each call with a deadline), and writes DIR/report.html,
// report.csv and report.json. A site that does not answer is named, and the
// report is written from the others; no site knowing the job is an error
// naming the job and the sites asked (exit 1).
int Report(const Args& args) {
  if (int code = ChooseCredentials(args); code != 0) return code;
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    Complain("swarmctl: %s\n", std::string(job.status().message()).c_str());
    return 2;
  }
  if (args.values.count("out") == 0) {
    Complain("swarmctl: report needs --out DIR\n%s", UsageText());
    return 2;
  }
  int timeout_ms = 5000;
  if (args.values.count("timeout-ms") > 0 &&
      (!absl::SimpleAtoi(args.values.at("timeout-ms"), &timeout_ms) ||
       timeout_ms <= 0)) {
    Complain("swarmctl: --timeout-ms must be a positive integer\n");
    return 2;
  }
  std::map<uint32_t, double> test_metric;
  const std::string test_column = args.values.count("test-column") > 0
                                      ? args.values.at("test-column")
                                      : "test_accuracy";
  if (args.values.count("test-metric") > 0) {
    const std::string& path = args.values.at("test-metric");
    std::ifstream file(path);
    std::stringstream text;
    text << file.rdbuf();
    absl::StatusOr<std::map<uint32_t, double>> parsed =
        file ? report::ParseMetricCsv(text.str(), test_column)
             : absl::NotFoundError("cannot read it");
    if (!parsed.ok()) {
      Complain("swarmctl: --test-metric %s: %s\n", path.c_str(),
               std::string(parsed.status().message()).c_str());
      return 2;
    }
    test_metric = std::move(*parsed);
  }
  const std::vector<report::SiteHistory> sites = AskHistories(*job, timeout_ms);
  absl::StatusOr<report::JobReport> built =
      report::JobReport::Build(*job, sites, test_metric, test_column);
  if (!built.ok()) {
    Complain("swarmctl: %s\n", std::string(built.status().message()).c_str());
    return 1;
  }
  for (const report::SiteRow& site : built->sites()) {
    if (site.answered) continue;
    Complain(
        "swarmctl: warning: site %s (%s) did not answer: %s; the report "
        "is written from the other sites\n",
        site.name.c_str(), site.address.c_str(), site.error.c_str());
  }
  const std::string& out = args.values.at("out");
  if (absl::Status written = report::WriteReport(*built, out); !written.ok()) {
    Complain("swarmctl: %s\n", std::string(written.message()).c_str());
    return 1;
  }
  std::printf("report of job %s (%zu rounds, %zu of %d sites answered): %s\n",
              job->job_id().c_str(), built->rounds().size(),
              job->sites_size() - built->MissingSites().size(),
              job->sites_size(),
              (std::filesystem::path(out) / "report.html").string().c_str());
  return 0;
}

// Sets Credentials() from --insecure, --tls-dir or $SWARM_TLS_DIR.
int ChooseCredentials(const Args& args) {
  if (args.insecure) {
    Complain("swarmctl: warning: --insecure: talking to sites WITHOUT TLS\n");
    Credentials() = grpc::InsecureChannelCredentials();
    return 0;
  }
  std::string dir =
      args.values.count("tls-dir") > 0 ? args.values.at("tls-dir") : "";
  if (dir.empty() && std::getenv("SWARM_TLS_DIR") != nullptr) {
    dir = std::getenv("SWARM_TLS_DIR");
  }
  if (dir.empty()) {
    Complain(
        "swarmctl: give an admin identity with --tls-dir DIR (made by "
        "swarmctl provision --admin NAME) or SWARM_TLS_DIR, or use "
        "--insecure\n");
    return 2;
  }
  absl::StatusOr<security::TlsIdentity> identity =
      security::LoadTlsIdentity(dir);
  if (!identity.ok()) {
    Complain("swarmctl: %s\n",
             std::string(identity.status().message()).c_str());
    return 2;
  }
  Credentials() = security::ClientCredentials(*identity);
  Sender() = identity->name;
  return 0;
}

// --version, --help, `help [COMMAND]` and `version`: the exit code, or -1
// when the command is something else.
int HelpOrVersion(const Args& args) {
  const std::string& command = args.command;
  if (args.version || command == "--version" ||
      (command == "version" && !args.help)) {
    std::fputs(VersionText("swarmctl").c_str(), stdout);
    return 0;
  }
  if (command == "help" || command == "--help" || command == "-h") {
    std::fputs(UsageText(), stdout);
    return 0;
  }
  if (!args.help) return -1;
  const char* usage = CommandUsage(command);
  if (usage == nullptr) {
    Complain("swarmctl: unknown command %s\n%s", command.c_str(), UsageText());
    return 2;
  }
  std::printf("usage:\n%s%s", usage, kCommonFlags);
  return 0;
}

int Run(int argc, char** argv) {
  absl::StatusOr<Args> args = ParseArgs(argc, argv);
  if (args.ok() && args->values.count("log-format") > 0) {
    absl::StatusOr<LogFormat> format =
        ParseLogFormat("--log-format", args->values.at("log-format"));
    if (!format.ok()) {
      Complain("swarmctl: %s\n",
               std::string(format.status().message()).c_str());
      return 2;
    }
    DiagnosticFormat() = *format;
    SetLogFormat(*format);
  }
  if (!args.ok()) {
    Complain("swarmctl: %s\n%s", std::string(args.status().message()).c_str(),
             UsageText());
    return 2;
  }
  if (int code = HelpOrVersion(*args); code >= 0) return code;
  if (args->command == "init") return Init(*args);
  if (args->command == "provision") return Provision(*args);
  if (args->command == "deploy") return DeployK8s(*args);
  if (args->command == "start" || args->command == "resume" ||
      args->command == "status" || args->command == "abort" ||
      args->command == "fetch") {
    if (int code = ChooseCredentials(*args); code != 0) return code;
  }
  if (args->command == "start") return Start(*args);
  if (args->command == "resume") return Resume(*args);
  if (args->command == "status") return Status(*args);
  if (args->command == "abort") return Abort(*args);
  if (args->command == "fetch") return Fetch(*args);
  if (args->command == "health") return Health(*args);
  if (args->command == "report") return Report(*args);
  Complain("swarmctl: unknown command %s\n%s", args->command.c_str(),
           UsageText());
  return 2;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) {
  // Holds gRPC up while Run's servers and channels exist, then waits for
  // gRPC's own asynchronous cleanup (connections still closing, their TLS
  // state) to finish before the process exits.
  grpc_init();
  // A site's model may arrive with a SHA-256 stream digest (signed models).
  swarm::security::RegisterSha256StreamDigest();
  const int code = swarm::Run(argc, argv);
  grpc_shutdown_blocking();
  return code;
}
