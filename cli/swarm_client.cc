// swarm-client: the site daemon.
//
//   swarm-client --config site.json [--threads 8] [--insecure]
//                [--log-format text|json]
//   swarm-client --version   (release, git commit, wire protocol version)
//
// Serves with the site's certificate (site.json "tls_dir", made by swarmctl
// provision) and requires every caller to present a certificate of the same
// project CA. --insecure serves plaintext instead (and says so in the log).
//
// Serves the Peer service on the site's listen address, runs the jobs that
// swarmctl configures, and logs one line per meaningful event on stderr.
// SIGTERM or SIGINT shut it down cleanly. With listen port 0 it picks a free
// port and prints it ("listening on 127.0.0.1:PORT").
//
// With the site config's metrics_listen set it also serves the site's
// Prometheus metrics (cli/site_metrics.h) over plain HTTP at /metrics and
// prints the address it got on a second line ("metrics listening on
// 127.0.0.1:PORT"); an address in use refuses the start, naming the field.
// --log-format json logs one JSON object per line (common/logging.h).
// Whatever the config, a status watcher keeps the site's per-round record of
// its jobs (report/round_recorder.h), served by the History RPC for
// `swarmctl report`.
#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <malloc.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cli/site_metrics.h"
#include "common/logging.h"
#include "common/version.h"
#include "config/site_config.h"
#include "config/validation.h"
#include "controller/metered_transport.h"
#include "controller/model_store.h"
#include "controller/site_driver.h"
#include "controller/task_runner.h"
#include "learner/learner_factory.h"
#include "metrics/http_endpoint.h"
#include "metrics/metrics.h"
#include "persist/workspace.h"
#include "privacy/private_learner.h"
#include "report/round_recorder.h"
#include "rpc/grpc_stream.h"
#include "rpc/peer_client.h"
#include "rpc/peer_service.h"
#include "rpc/tls.h"
#include "security/certificates.h"
#include "security/model_signature.h"
#include "security/sha256_digest.h"
#include "trainerlink/external_learner.h"

namespace swarm {
namespace {

constexpr char kUsage[] =
    "usage: swarm-client --config site.json [--threads N] [--insecure]\n"
    "                    [--log-format text|json]\n"
    "       swarm-client --version | --help\n"
    "  site.json: {\"name\": \"site-a\", \"listen_address\": "
    "\"0.0.0.0:7001\",\n"
    "              \"workspace\": \"/var/lib/swarm\", \"tls_dir\": "
    "\"/etc/swarm/site-a\",\n"
    "              \"learner\": {\"kind\": \"mlp\", \"params\": {...}},\n"
    "              \"metrics_listen\": \"127.0.0.1:9464\"}  (optional)\n";

struct Flags {
  std::string config_path;
  int threads = 8;
  bool insecure = false;
  LogFormat log_format = LogFormat::kText;
};

// Parses the command line. Returns the exit code when the program should end
// now (help, or a usage error already printed).
std::optional<int> ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--insecure") {
      flags->insecure = true;
    } else if (arg == "--config" && i + 1 < argc) {
      flags->config_path = argv[++i];
    } else if (arg == "--log-format" && i + 1 < argc) {
      absl::StatusOr<LogFormat> format = ParseLogFormat(arg, argv[++i]);
      if (!format.ok()) {
        std::fprintf(stderr, "swarm-client: %s\n",
                     std::string(format.status().message()).c_str());
        return 2;
      }
      flags->log_format = *format;
    } else if (arg == "--threads" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &flags->threads) || flags->threads < 2) {
        std::fprintf(stderr,
                     "swarm-client: --threads must be an integer >= 2\n");
        return 2;
      }
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--version") {
      std::fputs(VersionText("swarm-client").c_str(), stdout);
      return 0;
    } else {
      std::fprintf(stderr, "swarm-client: unknown argument %s\n%s", arg.c_str(),
                   kUsage);
      return 2;
    }
  }
  if (flags->config_path.empty()) {
    std::fprintf(stderr, "swarm-client: --config is required\n%s", kUsage);
    return 2;
  }
  return std::nullopt;
}

struct Credentials {
  std::shared_ptr<grpc::ServerCredentials> server;
  std::shared_ptr<grpc::ChannelCredentials> channel;
  // With TLS: signs the learn tasks this site broadcasts, and checks those
  // that reach it through other sites.
  std::shared_ptr<const security::ModelSigner> signer;
  std::shared_ptr<const security::ModelSignatureVerifier> verifier;
};

// The site's certificate (checked against the config's name), or plaintext
// with --insecure.
absl::StatusOr<Credentials> LoadCredentials(const v1::SiteConfig& config,
                                            const std::string& config_path,
                                            bool insecure) {
  if (insecure) {
    SWARM_LOG_WARNING(
        "--insecure: serving and calling peers WITHOUT TLS; anyone who can "
        "reach this port can act as any site or admin");
    return Credentials{grpc::InsecureServerCredentials(),
                       grpc::InsecureChannelCredentials(), nullptr, nullptr};
  }
  if (config.tls_dir().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "site config ", config_path,
        " has no tls_dir: provision certificates with `swarmctl provision` "
        "and set tls_dir, or run with --insecure"));
  }
  absl::StatusOr<security::TlsIdentity> identity =
      security::LoadTlsIdentity(config.tls_dir());
  if (!identity.ok()) {
    return absl::Status(
        identity.status().code(),
        absl::StrCat("TLS identity: ", identity.status().message()));
  }
  if (identity->name != config.name() ||
      identity->role != security::kSiteRole) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the certificate ", config.tls_dir(), "/cert.pem is for \"",
        identity->name, "\" (", identity->role, "), but site config ",
        config_path, " names site \"", config.name(), "\""));
  }
  absl::StatusOr<security::ModelSigner> signer =
      security::ModelSigner::Create(identity->key_pem, identity->cert_pem);
  absl::StatusOr<security::ModelSignatureVerifier> verifier =
      security::ModelSignatureVerifier::Create(identity->ca_pem);
  if (!signer.ok() || !verifier.ok()) {
    const absl::Status failed =
        !signer.ok() ? signer.status() : verifier.status();
    return absl::Status(failed.code(),
                        absl::StrCat("TLS identity in ", config.tls_dir(),
                                     ": model signing: ", failed.message()));
  }
  return Credentials{
      security::ServerCredentials(*identity),
      security::ClientCredentials(*identity),
      std::make_shared<const security::ModelSigner>(std::move(*signer)),
      std::make_shared<const security::ModelSignatureVerifier>(
          std::move(*verifier))};
}

struct SiteLearners {
  std::unique_ptr<Learner> learner;
  // Set when learner.kind is "external" (owned by `learner`).
  trainerlink::ExternalLearner* external = nullptr;
};

// learner.kind "external": a trainer process over the trainer link;
// otherwise a built-in learner.
absl::StatusOr<SiteLearners> CreateLearner(const v1::SiteConfig& config) {
  SiteLearners result;
  if (config.learner().kind() == "external") {
    absl::StatusOr<std::unique_ptr<trainerlink::ExternalLearner>> created =
        trainerlink::ExternalLearner::Create(config);
    if (!created.ok()) return created.status();
    result.external = created->get();
    result.learner = std::move(*created);
    return result;
  }
  absl::StatusOr<std::unique_ptr<SiteLearner>> created =
      SiteLearner::Create(config.learner(), config.name());
  if (!created.ok()) return created.status();
  result.learner = std::move(*created);
  return result;
}

// Lets the external trainer see which job runs and whether it has ended.
void ConnectTrainerToJob(trainerlink::ExternalLearner* external,
                         SiteDriver* controller) {
  external->SetJobView([controller] {
    const v1::SiteStatus status = controller->Status().status();
    trainerlink::JobView view;
    view.job_id = status.job_id();
    view.ended = status.state() == v1::SITE_STATE_DONE ||
                 status.state() == v1::SITE_STATE_FAILED ||
                 status.state() == v1::SITE_STATE_ABORTED;
    return view;
  });
}

// Refuses a Configure of a job that already finished in this site's
// workspace (its BEST or LAST is there) while the site does not hold that
// job (e.g. after a restart: a finished job is not reloaded), unless the
// request asks to run it again. The models stay untouched.
absl::Status RefuseFinishedJob(const persist::Workspace& workspace,
                               const SiteDriver& controller,
                               const std::string& site,
                               const v1::ConfigureRequest& request) {
  const std::string& job_id = request.job().job_id();
  if (request.rerun_finished() || !ValidateName("job_id", job_id).ok()) {
    return absl::OkStatus();  // A bad name is refused by the usual checks.
  }
  std::optional<v1::JobConfig> held = controller.job();
  if (held.has_value() && held->job_id() == job_id) return absl::OkStatus();
  std::error_code error;
  if (!std::filesystem::exists(workspace.BestModelPath(job_id), error) &&
      !std::filesystem::exists(workspace.LastModelPath(job_id), error)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", job_id, " already finished at site ", site,
      "; its final models are in ",
      std::filesystem::path(workspace.BestModelPath(job_id))
          .parent_path()
          .string(),
      " (best.safetensors, last.safetensors). Give the job a new job_id, or "
      "run it again over them with swarmctl start --rerun-finished"));
}

PeerServiceOptions ServiceOptionsFor(const v1::SiteConfig& config,
                                     bool insecure) {
  PeerServiceOptions options;
  options.tls = !insecure;
  if (config.max_calls_per_peer() > 0) {
    options.max_calls_per_peer = static_cast<int>(config.max_calls_per_peer());
  }
  if (config.max_stream_seconds() > 0) {
    options.max_stream_time = absl::Seconds(config.max_stream_seconds());
  }
  return options;
}

// Serves `service` (and the standard health service) on the config's listen
// address; prints the port it got. Null when it cannot listen.
std::unique_ptr<grpc::Server> StartServer(
    const v1::SiteConfig& config,
    std::shared_ptr<grpc::ServerCredentials> credentials,
    PeerService* service) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen_address(), std::move(credentials),
                           &port);
  ApplyModelStreamArgs(&builder, AssemblerLimits());
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    SWARM_LOG_ERROR("cannot listen on %s", config.listen_address());
    return nullptr;
  }
  const std::string host =
      config.listen_address().substr(0, config.listen_address().rfind(':'));
  LogEvent(LogSeverity::kInfo, "listening",
           absl::StrFormat(
               "site %s listening on %s:%d (workspace %s; swarm-client %s, "
               "wire protocol %s)",
               config.name(), host, port, config.workspace(), BuildText(),
               ProtocolText(OwnProtocolVersion())),
           {{"address", absl::StrCat(host, ":", port)},
            {"workspace", config.workspace()},
            {"version", ReleaseVersion()}});
  std::printf("listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  return server;
}

// The site's metrics (served when metrics_listen is set), its per-round
// record (the History RPC) and the job name on log lines (JSON format), all
// fed by one status watcher.
class Observability {
 public:
  Observability() = default;
  Observability(const Observability&) = delete;
  Observability& operator=(const Observability&) = delete;
  ~Observability() { Stop(); }

  // Registers the metrics (kept whether served or not: the round record
  // takes its byte counts from them) and binds the endpoint when
  // metrics_listen is set (not serving the site's metrics until Watch).
  // Errors name the field metrics_listen. REQUIRES: called once, before
  // Watch.
  absl::Status Listen(const v1::SiteConfig& config) {
    absl::StatusOr<std::unique_ptr<SiteMetrics>> metrics =
        SiteMetrics::Create(&registry_, config.name());
    if (!metrics.ok()) return metrics.status();
    metrics_ = std::move(*metrics);
    absl::StatusOr<std::unique_ptr<ReceivedModelMeter>> received =
        ReceivedModelMeter::Create(&registry_, config.name());
    if (!received.ok()) return received.status();
    received_ = std::move(*received);
    if (config.metrics_listen().empty()) return absl::OkStatus();
    if (absl::Status process = RegisterProcessMetrics(&registry_);
        !process.ok()) {
      return process;
    }
    endpoint_ = std::make_unique<MetricsHttpEndpoint>(&registry_);
    return endpoint_->Start(config.metrics_listen());
  }

  // `inner` with its outgoing calls counted per peer. REQUIRES: after
  // Listen; `inner` outlives every use of the result.
  PeerTransport* Meter(PeerTransport* inner, const std::string& site) {
    absl::StatusOr<std::unique_ptr<MeteredTransport>> metered =
        MeteredTransport::Create(inner, &registry_, site);
    if (!metered.ok()) {
      SWARM_LOG_WARNING("per-peer metrics off: %s", metered.status().message());
      return inner;
    }
    metered_ = std::move(*metered);
    return metered_.get();
  }

  // The Peer service's hooks: models received (per-peer metrics) and the
  // History RPC. REQUIRES: after Listen; this outlives the service.
  void Serve(PeerServiceOptions* options) {
    options->on_model_received = [this](const ReceivedModel& model) {
      received_->Observe(model.peer, model.bytes, model.status);
    };
    options->history = [this](const v1::HistoryRequest& request) {
      // The watcher looks every 50 ms at most: catch up first, so a History
      // asked right after the job ended shows its end.
      if (watcher_ != nullptr) watcher_->LookNow();
      return recorder_.History(request.job_id(), absl::Now());
    };
  }

  // "" when metrics are off.
  std::string address() const {
    return endpoint_ != nullptr ? endpoint_->bound_address() : "";
  }

  // Starts the watcher when something needs it. REQUIRES: `controller`
  // outlives Stop().
  void Watch(SiteDriver* controller) {
    watcher_ = std::make_unique<StatusWatcher>(
        [controller](uint64_t version, uint64_t after_change,
                     absl::Time deadline) {
          StatusWatcher::Watched watched;
          watched.reply = controller->WaitForStatusChange(
              version, deadline, after_change, &watched.changes);
          return watched;
        },
        [this](const v1::StatusReply& reply, absl::Time now) {
          if (reply.status().job_id() != job_) {
            job_ = reply.status().job_id();
            SetLogJob(job_);
          }
          // Nobody can read the site's metrics unless they are served.
          if (endpoint_ != nullptr) metrics_->Observe(reply, now);
          recorder_.Observe(
              reply, now,
              report::Traffic{
                  metered_ != nullptr ? metered_->bytes_sent_at(now) : 0,
                  received_->bytes_received_at(now)});
        });
    watcher_->Start();
  }

  // Stops the watcher and the endpoint (a scrape in progress finishes).
  void Stop() {
    if (watcher_ != nullptr) watcher_->Stop();
    if (endpoint_ != nullptr) endpoint_->Stop();
  }

 private:
  MetricsRegistry registry_;
  std::unique_ptr<SiteMetrics> metrics_;
  std::unique_ptr<MetricsHttpEndpoint> endpoint_;
  std::unique_ptr<StatusWatcher> watcher_;
  std::unique_ptr<MeteredTransport> metered_;
  std::unique_ptr<ReceivedModelMeter> received_;
  report::RoundRecorder recorder_;
  std::string job_;  // Used by the watcher's thread only.
};

// The site's learner, wrapped by its privacy accountant. Errors are ready
// to log (and exit 2 on).
absl::StatusOr<SiteLearners> CreatePrivateLearner(
    const v1::SiteConfig& config, const std::string& config_path) {
  absl::StatusOr<SiteLearners> learners = CreateLearner(config);
  if (!learners.ok()) {
    return absl::Status(learners.status().code(),
                        absl::StrCat("learner: ", learners.status().message()));
  }
  // The site's privacy accountant wraps whatever learner trains
  // (docs/privacy.md).
  if (absl::Status policy = privacy::ValidatePolicy(config.privacy());
      !policy.ok()) {
    return absl::Status(policy.code(), absl::StrCat("site config ", config_path,
                                                    ": ", policy.message()));
  }
  learners->learner = std::make_unique<privacy::PrivateLearner>(
      std::move(learners->learner), config.privacy(),
      persist::Workspace(config.workspace()), config.name(),
      std::map<std::string, std::string>(config.learner().params().begin(),
                                         config.learner().params().end()));
  return learners;
}

// A restart: the job this site was in comes back from the workspace, and
// the site rejoins at the next learn task (or `swarmctl resume`).
void ReloadJob(SiteDriver* controller, const std::string& workspace) {
  absl::StatusOr<std::string> recovered = controller->RecoverJob();
  if (!recovered.ok()) {
    SWARM_LOG_WARNING("not reloading the job in workspace %s: %s", workspace,
                      recovered.status().message());
  } else if (!recovered->empty()) {
    SWARM_LOG_INFO("reloaded job %s from workspace %s", *recovered, workspace);
  }
}

// Logs and prints the metrics address, when metrics are served.
void AnnounceMetrics(const Observability& observability) {
  if (observability.address().empty()) return;
  LogEvent(LogSeverity::kInfo, "metrics_listening",
           absl::StrCat("metrics listening on http://", observability.address(),
                        "/metrics"),
           {{"address", observability.address()}});
  std::printf("metrics listening on %s\n", observability.address().c_str());
  std::fflush(stdout);
}

// The writes asked for so far land before the runner stops (it drops
// the tasks it has not run): a job that ended here is reloaded as ended.
void FinishWorkspaceWrites(SiteDriver* controller) {
  const size_t unwritten =
      controller->FinishWrites(absl::Now() + absl::Seconds(10));
  if (unwritten > 0) {
    SWARM_LOG_WARNING(
        "%d workspace write(s) not done 10 s after the shutdown began; "
        "stopping without them (a restart reloads the state before them)",
        unwritten);
  }
}

// Runs the site (its controller and Peer server) until one of `signals`
// arrives, then shuts it down. The exit code.
int RunSite(const Flags& flags, const v1::SiteConfig& config,
            const Credentials& credentials, const sigset_t& signals,
            SiteLearners* learners, Observability* observability) {
  TuneMallocForModelStreams();
  WorkspaceModelStore store(config.workspace());
  absl::Status cleaned = store.workspace().CleanStaleOffloadAll();
  if (!cleaned.ok()) {
    SWARM_LOG_WARNING("cleaning stale offload files: %s", cleaned.message());
  }

  auto runner = std::make_unique<ThreadPoolRunner>(flags.threads);
  PeerChannels channels(credentials.channel);
  GrpcPeerTransport transport(&channels, runner.get());
  transport.set_signer(credentials.signer);
  DriverOptions options;
  options.site = config.name();
  SiteDriver controller(options,
                        observability->Meter(&transport, config.name()),
                        learners->learner.get(), &store, runner.get());
  ReloadJob(&controller, config.workspace());
  if (learners->external != nullptr) {
    ConnectTrainerToJob(learners->external, &controller);
  }
  PeerServiceOptions service_options =
      ServiceOptionsFor(config, flags.insecure);
  observability->Serve(&service_options);
  service_options.forward_channels = &channels;
  service_options.verifier = credentials.verifier;
  service_options.check_configure =
      [&store, &controller, &config](const v1::ConfigureRequest& request) {
        return RefuseFinishedJob(store.workspace(), controller, config.name(),
                                 request);
      };
  // Watching before serving: the History RPC reads the watcher.
  observability->Watch(&controller);
  PeerService service(&controller, std::move(service_options));
  std::unique_ptr<grpc::Server> server =
      StartServer(config, credentials.server, &service);
  if (server == nullptr) return 1;
  AnnounceMetrics(*observability);

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  SWARM_LOG_INFO("%s received; shutting down", strsignal(signal_number));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // Stops the trainer and ends a worker's wait for it, so the join is prompt.
  if (learners->external != nullptr) learners->external->Shutdown();
  observability->Stop();  // Before the controller it watches goes away.
  FinishWorkspaceWrites(&controller);
  runner.reset();  // Joins the workers before the controller goes away.
  SWARM_LOG_INFO("stopped");
  return 0;
}

int Run(int argc, char** argv) {
  Flags flags;
  if (std::optional<int> exit_code = ParseFlags(argc, argv, &flags)) {
    return *exit_code;
  }
  SetLogFormat(flags.log_format);
  absl::StatusOr<v1::SiteConfig> config = LoadSiteConfig(flags.config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "swarm-client: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  SetLogTag(config->name());
  absl::StatusOr<Credentials> credentials =
      LoadCredentials(*config, flags.config_path, flags.insecure);
  if (!credentials.ok()) {
    SWARM_LOG_ERROR("%s", credentials.status().message());
    return 2;
  }
  // Refuse to start on a workspace this process cannot write (a read-only
  // mount, wrong owner) rather than fail in the first round.
  if (absl::Status writable =
          persist::Workspace(config->workspace()).CheckWritable();
      !writable.ok()) {
    SWARM_LOG_ERROR("site config %s: %s", flags.config_path,
                    writable.message());
    return 2;
  }

  // Signals are taken by RunSite's sigwait (main blocked them before any
  // thread started; blocking again is harmless).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Before the learner and the gRPC server: a metrics address in use
  // refuses the start before anything else runs.
  Observability observability;
  if (absl::Status listening = observability.Listen(*config); !listening.ok()) {
    SWARM_LOG_ERROR("site config %s: %s", flags.config_path,
                    listening.message());
    return listening.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }

  absl::StatusOr<SiteLearners> learners =
      CreatePrivateLearner(*config, flags.config_path);
  if (!learners.ok()) {
    SWARM_LOG_ERROR("%s", learners.status().message());
    return 2;
  }
  return RunSite(flags, *config, *credentials, signals, &*learners,
                 &observability);
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) {
  // SIGINT and SIGTERM are taken by Run's sigwait. They are blocked here,
  // before grpc_init starts gRPC's threads: a thread that does not block
  // them could take one with its default action and kill the daemon
  // instead of shutting it down (seen once in CI: "killed by signal 15"
  // right after "listening").
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // glibc's malloc makes up to 8 arenas per core, one per thread that
  // contends, and each keeps what was freed in it: gRPC's buffers for a
  // large model spread over them. Two arenas kept a 256 MiB model's sites
  // 80-150 MiB lower (integration_memory_test: 751-786 MiB against
  // 857-934 MiB at peak) at no round time we could measure (16 sites, small
  // model: wall ratio 1.02, CPU 0.92). Before any thread starts; a
  // MALLOC_ARENA_MAX in the environment wins.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
  // Holds gRPC up while Run's servers and channels exist, then waits for
  // gRPC's own asynchronous cleanup (connections still closing, their TLS
  // state) to finish before the process exits.
  grpc_init();
  // Signed models travel with SHA-256 stream digests (security/).
  swarm::security::RegisterSha256StreamDigest();
  // Debian's Abseil checks every lock order for cycles (a debugging aid
  // that cost the daemon about 2% of its CPU in round_bench); the tests,
  // which exercise the same locks, keep the check.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const int code = swarm::Run(argc, argv);
  grpc_shutdown_blocking();
  return code;
}
