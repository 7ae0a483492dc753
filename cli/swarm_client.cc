// swarm-client: the site daemon.
//
//   swarm-client --config site.json [--threads 8]
//
// Serves the Peer service on the site's listen address, runs the jobs that
// swarmctl configures, and logs one line per meaningful event on stderr.
// SIGTERM or SIGINT shut it down cleanly. With listen port 0 it picks a free
// port and prints it ("listening on 127.0.0.1:PORT").
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "controller/model_store.h"
#include "controller/peer_client.h"
#include "controller/peer_service.h"
#include "controller/site_config.h"
#include "controller/swarm_controller.h"
#include "controller/task_runner.h"
#include "learner/learner_factory.h"
#include "streaming/grpc_stream.h"

namespace swarm {
namespace {

constexpr char kUsage[] =
    "usage: swarm-client --config site.json [--threads N]\n"
    "  site.json: {\"name\": \"site-a\", \"listen_address\": "
    "\"0.0.0.0:7001\",\n"
    "              \"workspace\": \"/var/lib/swarm\",\n"
    "              \"learner\": {\"kind\": \"mlp\", \"params\": {...}}}\n";

int Run(int argc, char** argv) {
  std::string config_path;
  int threads = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (arg == "--threads" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &threads) || threads < 2) {
        std::fprintf(stderr,
                     "swarm-client: --threads must be an integer >= 2\n");
        return 2;
      }
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "swarm-client: unknown argument %s\n%s", arg.c_str(),
                   kUsage);
      return 2;
    }
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "swarm-client: --config is required\n%s", kUsage);
    return 2;
  }
  absl::StatusOr<v1::SiteConfig> config = LoadSiteConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "swarm-client: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  SetLogTag(config->name());

  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<Learner>> learner =
      CreateLearner(config->learner(), config->name(), {});
  if (!learner.ok()) {
    SWARM_LOG_ERROR("learner: %s", learner.status().message());
    return 2;
  }
  TuneMallocForModelStreams();
  WorkspaceModelStore store(config->workspace());
  absl::Status cleaned = store.workspace().CleanStaleOffloadAll();
  if (!cleaned.ok()) {
    SWARM_LOG_WARNING("cleaning stale offload files: %s", cleaned.message());
  }

  auto runner = std::make_unique<ThreadPoolRunner>(threads);
  PeerChannels channels;
  GrpcPeerTransport transport(&channels);
  ControllerOptions options;
  options.site = config->name();
  SwarmController controller(options, &transport, learner->get(), &store,
                             runner.get());
  PeerService service(&controller);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config->listen_address(),
                           grpc::InsecureServerCredentials(), &port);
  ApplyModelStreamArgs(&builder, AssemblerLimits());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    SWARM_LOG_ERROR("cannot listen on %s", config->listen_address());
    return 1;
  }
  const std::string host =
      config->listen_address().substr(0, config->listen_address().rfind(':'));
  SWARM_LOG_INFO("site %s listening on %s:%d (workspace %s)", config->name(),
                 host, port, config->workspace());
  std::printf("listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  SWARM_LOG_INFO("%s received; shutting down", strsignal(signal_number));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  runner.reset();  // Joins the workers before the controller goes away.
  SWARM_LOG_INFO("stopped");
  return 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Run(argc, argv); }
