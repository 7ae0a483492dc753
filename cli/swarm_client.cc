// swarm-client: the site daemon.
//
//   swarm-client --config site.json [--threads 8] [--insecure]
//
// Serves with the site's certificate (site.json "tls_dir", made by swarmctl
// provision) and requires every caller to present a certificate of the same
// project CA. --insecure serves plaintext instead (and says so in the log).
//
// Serves the Peer service on the site's listen address, runs the jobs that
// swarmctl configures, and logs one line per meaningful event on stderr.
// SIGTERM or SIGINT shut it down cleanly. With listen port 0 it picks a free
// port and prints it ("listening on 127.0.0.1:PORT").
#include <grpc/grpc.h>
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
#include "rpc/peer_client.h"
#include "rpc/peer_service.h"
#include "config/site_config.h"
#include "controller/site_driver.h"
#include "controller/task_runner.h"
#include "learner/learner_factory.h"
#include "persist/workspace.h"
#include "security/certificates.h"
#include "rpc/grpc_stream.h"
#include "rpc/tls.h"
#include "trainerlink/external_learner.h"

namespace swarm {
namespace {

constexpr char kUsage[] =
    "usage: swarm-client --config site.json [--threads N] [--insecure]\n"
    "  site.json: {\"name\": \"site-a\", \"listen_address\": "
    "\"0.0.0.0:7001\",\n"
    "              \"workspace\": \"/var/lib/swarm\", \"tls_dir\": "
    "\"/etc/swarm/site-a\",\n"
    "              \"learner\": {\"kind\": \"mlp\", \"params\": {...}}}\n";

int Run(int argc, char** argv) {
  std::string config_path;
  int threads = 8;
  bool insecure = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--insecure") {
      insecure = true;
      continue;
    }
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

  std::shared_ptr<grpc::ServerCredentials> server_credentials;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
  if (insecure) {
    SWARM_LOG_WARNING(
        "--insecure: serving and calling peers WITHOUT TLS; anyone who can "
        "reach this port can act as any site or admin");
    server_credentials = grpc::InsecureServerCredentials();
    channel_credentials = grpc::InsecureChannelCredentials();
  } else {
    if (config->tls_dir().empty()) {
      SWARM_LOG_ERROR(
          "site config %s has no tls_dir: provision certificates with "
          "`swarmctl provision` and set tls_dir, or run with --insecure",
          config_path);
      return 2;
    }
    absl::StatusOr<security::TlsIdentity> identity =
        security::LoadTlsIdentity(config->tls_dir());
    if (!identity.ok()) {
      SWARM_LOG_ERROR("TLS identity: %s", identity.status().message());
      return 2;
    }
    if (identity->name != config->name() ||
        identity->role != security::kSiteRole) {
      SWARM_LOG_ERROR(
          "the certificate %s/cert.pem is for \"%s\" (%s), but site config "
          "%s names site \"%s\"",
          config->tls_dir(), identity->name, identity->role, config_path,
          config->name());
      return 2;
    }
    server_credentials = security::ServerCredentials(*identity);
    channel_credentials = security::ClientCredentials(*identity);
  }

  // Refuse to start on a workspace this process cannot write (a read-only
  // mount, wrong owner) rather than fail in the first round.
  if (absl::Status writable =
          persist::Workspace(config->workspace()).CheckWritable();
      !writable.ok()) {
    SWARM_LOG_ERROR("site config %s: %s", config_path, writable.message());
    return 2;
  }

  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // learner.kind "external": a trainer process over the trainer link;
  // otherwise a built-in learner.
  std::unique_ptr<Learner> learner;
  trainerlink::ExternalLearner* external = nullptr;
  if (config->learner().kind() == "external") {
    absl::StatusOr<std::unique_ptr<trainerlink::ExternalLearner>> created =
        trainerlink::ExternalLearner::Create(*config);
    if (!created.ok()) {
      SWARM_LOG_ERROR("learner: %s", created.status().message());
      return 2;
    }
    external = created->get();
    learner = std::move(*created);
  } else {
    absl::StatusOr<std::unique_ptr<SiteLearner>> created =
        SiteLearner::Create(config->learner(), config->name());
    if (!created.ok()) {
      SWARM_LOG_ERROR("learner: %s", created.status().message());
      return 2;
    }
    learner = std::move(*created);
  }
  TuneMallocForModelStreams();
  WorkspaceModelStore store(config->workspace());
  absl::Status cleaned = store.workspace().CleanStaleOffloadAll();
  if (!cleaned.ok()) {
    SWARM_LOG_WARNING("cleaning stale offload files: %s", cleaned.message());
  }

  auto runner = std::make_unique<ThreadPoolRunner>(threads);
  PeerChannels channels(channel_credentials);
  GrpcPeerTransport transport(&channels, runner.get());
  DriverOptions options;
  options.site = config->name();
  SiteDriver controller(options, &transport, learner.get(), &store,
                        runner.get());
  if (external != nullptr) {
    external->SetJobView([&controller] {
      const v1::SiteStatus status = controller.Status().status();
      trainerlink::JobView view;
      view.job_id = status.job_id();
      view.ended = status.state() == v1::SITE_STATE_DONE ||
                   status.state() == v1::SITE_STATE_FAILED ||
                   status.state() == v1::SITE_STATE_ABORTED;
      return view;
    });
  }
  PeerServiceOptions service_options;
  service_options.tls = !insecure;
  if (config->max_calls_per_peer() > 0) {
    service_options.max_calls_per_peer =
        static_cast<int>(config->max_calls_per_peer());
  }
  if (config->max_stream_seconds() > 0) {
    service_options.max_stream_time =
        absl::Seconds(config->max_stream_seconds());
  }
  PeerService service(&controller, service_options);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config->listen_address(), server_credentials, &port);
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
  // Stops the trainer and ends a worker's wait for it, so the join is prompt.
  if (external != nullptr) external->Shutdown();
  runner.reset();  // Joins the workers before the controller goes away.
  SWARM_LOG_INFO("stopped");
  return 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) {
  // Holds gRPC up while Run's servers and channels exist, then waits for
  // gRPC's own asynchronous cleanup (connections still closing, their TLS
  // state) to finish before the process exits.
  grpc_init();
  const int code = swarm::Run(argc, argv);
  grpc_shutdown_blocking();
  return code;
}
