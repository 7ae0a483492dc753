// swarmctl: the operator CLI.
//
//   swarmctl start  --job job.json
//   swarmctl status --job job.json [--watch] [--interval-ms 500]
//   swarmctl abort  --job job.json [--reason TEXT]
//   swarmctl fetch  --site HOST:PORT --which best|last --out FILE [--job-id ID]
//
// Exit codes: 0 success; 1 a site failed or refused (the message names it);
// 2 bad usage or an invalid job config (nothing was sent to any site).
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "controller/job_config.h"
#include "proto/swarm.grpc.pb.h"
#include "streaming/grpc_stream.h"
#include "streaming/tensor_sink.h"

namespace swarm {
namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  swarmctl start  --job job.json\n"
    "  swarmctl status --job job.json [--watch] [--interval-ms 500]\n"
    "  swarmctl abort  --job job.json [--reason TEXT]\n"
    "  swarmctl fetch  --site HOST:PORT --which best|last --out FILE "
    "[--job-id ID]\n";

constexpr absl::Duration kCallTimeout = absl::Seconds(10);
constexpr char kOperator[] = "swarmctl";

struct Args {
  std::string command;
  std::map<std::string, std::string> values;
  bool watch = false;
};

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args args;
  if (argc < 2) return absl::InvalidArgumentError("missing command");
  args.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--watch") {
      args.watch = true;
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
  return v1::Peer::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
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

int Start(const Args& args) {
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    std::fprintf(stderr, "swarmctl: %s\n",
                 std::string(job.status().message()).c_str());
    return 2;
  }
  for (const v1::SiteInfo& site : job->sites()) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    v1::ConfigureRequest request;
    request.set_sender(kOperator);
    *request.mutable_job() = *job;
    v1::Reply reply;
    grpc::Status status =
        StubFor(site.address())->Configure(&context, request, &reply);
    if (!status.ok()) {
      std::fprintf(stderr, "swarmctl: %s: configure failed: %s\n",
                   SiteLabel(site).c_str(), status.error_message().c_str());
      return 1;
    }
    if (reply.outcome() != v1::OUTCOME_OK) {
      std::fprintf(stderr, "swarmctl: %s refused the job (%s): %s\n",
                   SiteLabel(site).c_str(),
                   v1::Outcome_Name(reply.outcome()).c_str(),
                   reply.message().c_str());
      return 1;
    }
    std::printf("configured %s\n", SiteLabel(site).c_str());
  }
  const v1::SiteInfo* starter = FindSite(*job, job->starting_site());
  grpc::ClientContext context;
  SetDeadline(&context, kCallTimeout);
  v1::StartRequest request;
  request.set_sender(kOperator);
  request.set_job_id(job->job_id());
  v1::Reply reply;
  grpc::Status status =
      StubFor(starter->address())->Start(&context, request, &reply);
  if (!status.ok() || reply.outcome() != v1::OUTCOME_OK) {
    std::fprintf(
        stderr, "swarmctl: %s did not start the job: %s\n",
        SiteLabel(*starter).c_str(),
        status.ok() ? reply.message().c_str() : status.error_message().c_str());
    return 1;
  }
  std::printf("job %s started on %s\n", job->job_id().c_str(),
              SiteLabel(*starter).c_str());
  return 0;
}

std::string StateName(v1::SiteState state) {
  std::string name = v1::SiteState_Name(state);
  const std::string prefix = "SITE_STATE_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(c));
  return name;
}

int Status(const Args& args) {
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    std::fprintf(stderr, "swarmctl: %s\n",
                 std::string(job.status().message()).c_str());
    return 2;
  }
  int interval_ms = 500;
  if (args.values.count("interval-ms") > 0 &&
      !absl::SimpleAtoi(args.values.at("interval-ms"), &interval_ms)) {
    std::fprintf(stderr, "swarmctl: --interval-ms must be an integer\n");
    return 2;
  }
  std::map<std::string, std::unique_ptr<v1::Peer::Stub>> stubs;
  for (const v1::SiteInfo& site : job->sites()) {
    stubs[site.name()] = StubFor(site.address());
  }
  while (true) {
    int done = 0;
    int failed = 0;
    std::string table =
        absl::StrFormat("%-16s %-24s %-12s %6s %-10s %s\n", "SITE", "STATE",
                        "ROLE", "ROUND", "BEST", "LAST ERROR");
    for (const v1::SiteInfo& site : job->sites()) {
      grpc::ClientContext context;
      SetDeadline(&context, absl::Seconds(3));
      v1::StatusRequest request;
      request.set_job_id(job->job_id());
      request.set_sender(kOperator);
      v1::StatusReply reply;
      grpc::Status status =
          stubs[site.name()]->Status(&context, request, &reply);
      if (!status.ok()) {
        absl::StrAppendFormat(&table, "%-16s %-24s %-12s %6s %-10s %s\n",
                              site.name(), "unreachable", "-", "-", "-",
                              status.error_message());
        ++failed;
        continue;
      }
      const v1::SiteStatus& s = reply.status();
      std::string role = s.role().trainer() ? "trainer" : "";
      if (s.role().aggregator()) role += role.empty() ? "aggregator" : "+aggr";
      const std::string best =
          s.best().present() ? absl::StrFormat("%.4f", s.best().metric()) : "-";
      absl::StrAppendFormat(&table, "%-16s %-24s %-12s %6d %-10s %s\n",
                            site.name(), StateName(s.state()),
                            role.empty() ? "-" : role, s.round(), best,
                            s.last_error());
      if (s.state() == v1::SITE_STATE_DONE) ++done;
      if (s.state() == v1::SITE_STATE_FAILED ||
          s.state() == v1::SITE_STATE_ABORTED) {
        ++failed;
      }
    }
    std::printf("%s", table.c_str());
    const int sites = job->sites_size();
    if (!args.watch) return failed > 0 ? 1 : 0;
    if (done == sites) {
      std::printf("job %s done on every site\n", job->job_id().c_str());
      return 0;
    }
    if (done + failed == sites && failed > 0) {
      std::printf("job %s ended with %d site(s) failed or aborted\n",
                  job->job_id().c_str(), failed);
      return 1;
    }
    std::printf("\n");
    std::fflush(stdout);
    absl::SleepFor(absl::Milliseconds(interval_ms));  // operator display only
  }
}

int Abort(const Args& args) {
  absl::StatusOr<v1::JobConfig> job = LoadJob(args);
  if (!job.ok()) {
    std::fprintf(stderr, "swarmctl: %s\n",
                 std::string(job.status().message()).c_str());
    return 2;
  }
  int failures = 0;
  for (const v1::SiteInfo& site : job->sites()) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    v1::AbortRequest request;
    request.set_job_id(job->job_id());
    request.set_sender(kOperator);
    if (args.values.count("reason") > 0)
      request.set_reason(args.values.at("reason"));
    v1::Reply reply;
    grpc::Status status =
        StubFor(site.address())->Abort(&context, request, &reply);
    if (!status.ok() || reply.outcome() != v1::OUTCOME_OK) {
      std::fprintf(stderr, "swarmctl: %s: abort failed: %s\n",
                   SiteLabel(site).c_str(),
                   status.ok() ? reply.message().c_str()
                               : status.error_message().c_str());
      ++failures;
      continue;
    }
    std::printf("aborted on %s\n", SiteLabel(site).c_str());
  }
  return failures > 0 ? 1 : 0;
}

int Fetch(const Args& args) {
  for (const char* required : {"site", "which", "out"}) {
    if (args.values.count(required) == 0) {
      std::fprintf(stderr, "swarmctl: fetch needs --%s\n%s", required, kUsage);
      return 2;
    }
  }
  const std::string address = args.values.at("site");
  const std::string which = args.values.at("which");
  if (which != "best" && which != "last") {
    std::fprintf(stderr, "swarmctl: --which must be best or last, not %s\n",
                 which.c_str());
    return 2;
  }
  std::unique_ptr<v1::Peer::Stub> stub = StubFor(address);
  std::string job_id =
      args.values.count("job-id") > 0 ? args.values.at("job-id") : "";
  if (job_id.empty()) {
    grpc::ClientContext context;
    SetDeadline(&context, kCallTimeout);
    v1::StatusRequest request;
    request.set_sender(kOperator);
    v1::StatusReply reply;
    grpc::Status status = stub->Status(&context, request, &reply);
    if (!status.ok()) {
      std::fprintf(stderr, "swarmctl: site %s: %s\n", address.c_str(),
                   status.error_message().c_str());
      return 1;
    }
    job_id = reply.status().job_id();
  }
  v1::FetchModelRequest request;
  request.set_job_id(job_id);
  request.set_sender(kOperator);
  request.set_which(which == "best" ? v1::MODEL_SELECTOR_BEST
                                    : v1::MODEL_SELECTOR_LAST);
  DiskSink sink(args.values.at("out"));
  Assembler assembler(&sink, AssemblerOptions());
  grpc::ClientContext context;
  SetDeadline(&context, absl::Hours(1));
  grpc::ChannelArguments channel_args;
  ApplyModelStreamArgs(&channel_args, AssemblerLimits());
  auto channel = grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), channel_args);
  absl::StatusOr<Model> model =
      FetchModelFromPeer(channel.get(), &context, request, &assembler);
  if (!model.ok()) {
    std::fprintf(stderr, "swarmctl: fetching %s from site %s: %s\n",
                 which.c_str(), address.c_str(),
                 std::string(model.status().message()).c_str());
    return 1;
  }
  std::printf("wrote %s (%zu tensors, %llu bytes) from site %s\n",
              args.values.at("out").c_str(), model->num_tensors(),
              static_cast<unsigned long long>(model->total_bytes()),
              address.c_str());
  return 0;
}

int Run(int argc, char** argv) {
  absl::StatusOr<Args> args = ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "swarmctl: %s\n%s",
                 std::string(args.status().message()).c_str(), kUsage);
    return 2;
  }
  if (args->command == "start") return Start(*args);
  if (args->command == "status") return Status(*args);
  if (args->command == "abort") return Abort(*args);
  if (args->command == "fetch") return Fetch(*args);
  if (args->command == "help" || args->command == "--help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::fprintf(stderr, "swarmctl: unknown command %s\n%s",
               args->command.c_str(), kUsage);
  return 2;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Run(argc, argv); }
