#include "tests/integration/local_swarm.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "config/site_config.h"
#include "gtest/gtest.h"
#include "tests/support/daemon.h"

namespace swarm::testing {

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options)
           .ok()) {
    ADD_FAILURE() << "cannot print " << message.GetTypeName() << " as JSON";
  }
  return json;
}

std::string MakeTempDir(absl::string_view prefix, absl::string_view label) {
  const char* tmp = getenv("TMPDIR");
  std::string safe(label);
  for (char& c : safe) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c))) c = '-';
  }
  std::string pattern = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/",
                                     prefix, "-", safe, "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << pattern << ": " << strerror(errno);
    return "/tmp";
  }
  return pattern;
}

std::string SwarmClientPath() { return SWARM_CLIENT_PATH; }
std::string SwarmctlPath() { return SWARMCTL_PATH; }

int TimeScale() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return 4;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  return 4;
#else
  return 1;
#endif
#else
  return 1;
#endif
}

LocalSwarm::LocalSwarm(absl::string_view label, Transport transport)
    : dir_(MakeTempDir("swarm-it", label)), transport_(transport) {
  absl::StatusOr<security::KeyAndCert> ca =
      security::CreateCa("integration CA");
  if (!ca.ok()) {
    ADD_FAILURE() << "cannot make a CA: " << ca.status();
    return;
  }
  ca_ = std::move(*ca);
  Identity("admin", security::kAdminRole);
  admin_tls_dir_ = absl::StrCat(dir_, "/pki/admin");
}

const security::TlsIdentity& LocalSwarm::Identity(const std::string& name,
                                                  const std::string& role) {
  auto it = identities_.find(name);
  if (it != identities_.end()) return it->second;
  security::CertRequest request;
  request.common_name = name;
  request.role = role;
  request.ip_addresses = {"127.0.0.1"};
  request.dns_names = {"localhost"};
  absl::StatusOr<security::KeyAndCert> issued =
      security::IssueCertificate(ca_, request);
  if (!issued.ok())
    ADD_FAILURE() << "cannot issue for " << name << ": " << issued.status();
  security::TlsIdentity identity;
  if (issued.ok()) {
    identity.key_pem = issued->key_pem;
    identity.cert_pem = issued->cert_pem;
  }
  identity.ca_pem = ca_.cert_pem;
  identity.name = name;
  identity.role = role;
  const std::string folder = absl::StrCat(dir_, "/pki/", name);
  std::filesystem::create_directories(folder);
  WriteFile(absl::StrCat("pki/", name, "/key.pem"), identity.key_pem);
  WriteFile(absl::StrCat("pki/", name, "/cert.pem"), identity.cert_pem);
  WriteFile(absl::StrCat("pki/", name, "/ca.crt"), identity.ca_pem);
  chmod(absl::StrCat(folder, "/key.pem").c_str(), 0600);
  return identities_.emplace(name, std::move(identity)).first->second;
}

std::unique_ptr<v1::Peer::Stub> LocalSwarm::StubAs(const std::string& name,
                                                   const std::string& as,
                                                   const std::string& role) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return v1::Peer::NewStub(grpc::CreateCustomChannel(
      site(name).address, security::ClientCredentials(Identity(as, role)),
      args));
}

LocalSwarm::~LocalSwarm() {
  for (auto& [name, site] : sites_) {
    if (site.process != nullptr) site.process->Kill();
  }
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "LocalSwarm: keeping %s (configs, logs, workspaces)\n",
                 dir_.c_str());
    return;
  }
  std::error_code error;
  std::filesystem::remove_all(dir_, error);
}

absl::Status LocalSwarm::StartSite(
    const std::string& name,
    const std::map<std::string, std::string>& learner_params,
    uint32_t max_calls_per_peer) {
  if (sites_.count(name) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("site ", name, " started"));
  }
  v1::SiteConfig config;
  config.mutable_learner()->set_kind("test");
  if (max_calls_per_peer > 0) config.set_max_calls_per_peer(max_calls_per_peer);
  for (const auto& [key, value] : learner_params) {
    (*config.mutable_learner()->mutable_params())[key] = value;
  }
  return StartSiteWithConfig(name, std::move(config));
}

absl::Status LocalSwarm::StartSiteWithMetrics(
    const std::string& name,
    const std::map<std::string, std::string>& learner_params,
    const std::vector<std::string>& extra_args) {
  v1::SiteConfig config;
  config.mutable_learner()->set_kind("test");
  config.set_metrics_listen("127.0.0.1:0");
  for (const auto& [key, value] : learner_params) {
    (*config.mutable_learner()->mutable_params())[key] = value;
  }
  return StartSiteWithConfig(name, std::move(config), extra_args);
}

absl::Status LocalSwarm::StartExternalSite(
    const std::string& name, const v1::TrainerConfig& trainer,
    const std::map<std::string, std::string>& learner_params) {
  v1::SiteConfig config;
  config.mutable_learner()->set_kind("external");
  *config.mutable_trainer() = trainer;
  for (const auto& [key, value] : learner_params) {
    (*config.mutable_learner()->mutable_params())[key] = value;
  }
  return StartSiteWithConfig(name, std::move(config));
}

absl::Status LocalSwarm::StartSiteWithSiteConfig(const std::string& name,
                                                 v1::SiteConfig config) {
  return StartSiteWithConfig(name, std::move(config));
}

absl::Status LocalSwarm::RestartSite(const std::string& name, bool kill) {
  auto it = sites_.find(name);
  if (it == sites_.end()) {
    return absl::NotFoundError(absl::StrCat("no site ", name));
  }
  absl::StatusOr<v1::SiteConfig> config =
      LoadSiteConfig(it->second.config_path);
  if (!config.ok()) return config.status();
  config->set_listen_address(it->second.address);
  config->clear_tls_dir();  // Set again by StartSiteWithConfig.
  Process& process = *it->second.process;
  if (kill) {
    process.Kill();
  } else {
    absl::Status signalled = process.Signal(SIGTERM);
    if (!signalled.ok()) return signalled;
    absl::StatusOr<ExitInfo> exit =
        process.Wait(absl::Now() + absl::Seconds(30) * TimeScale());
    if (!exit.ok()) return exit.status();
    if (!exit->exited || exit->exit_code != 0) {
      return absl::InternalError(
          absl::StrCat("site ", name, " stopped badly: ", exit->ToString()));
    }
  }
  sites_.erase(it);
  names_.erase(std::find(names_.begin(), names_.end(), name));
  return StartSiteWithConfig(name, *std::move(config));
}

std::string LocalSwarm::Workspace(const std::string& name) const {
  return absl::StrCat(dir_, "/ws-", name);
}

absl::Status LocalSwarm::StartSiteWithConfig(
    const std::string& name, v1::SiteConfig config,
    const std::vector<std::string>& extra_args) {
  if (sites_.count(name) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("site ", name, " started"));
  }
  SiteProcess site;
  site.name = name;
  site.workspace = Workspace(name);
  site.log_path = absl::StrCat(dir_, "/", name, ".log");
  config.set_name(name);
  if (config.listen_address().empty()) {
    config.set_listen_address("127.0.0.1:0");
  }
  config.set_workspace(site.workspace);
  std::vector<std::string> argv = {SwarmClientPath(), "--config"};
  if (transport_ == Transport::kMutualTls) {
    Identity(name, security::kSiteRole);
    config.set_tls_dir(absl::StrCat(dir_, "/pki/", name));
  }
  site.config_path = WriteFile(absl::StrCat(name, ".json"), ToJson(config));
  argv.push_back(site.config_path);
  if (transport_ == Transport::kInsecure) argv.push_back("--insecure");
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  DaemonStart start;
  start.name = name;
  start.argv = std::move(argv);
  start.log_path = site.log_path;
  start.expect_metrics = !config.metrics_listen().empty();
  start.timeout = absl::Seconds(30) * TimeScale();
  absl::StatusOr<StartedDaemon> daemon = StartDaemon(start);
  if (!daemon.ok()) return daemon.status();
  site.process = std::move(daemon->process);
  site.address = std::move(daemon->address);
  site.metrics_address = std::move(daemon->metrics_address);
  names_.push_back(name);
  sites_.emplace(name, std::move(site));
  return absl::OkStatus();
}

SiteProcess& LocalSwarm::site(const std::string& name) {
  auto it = sites_.find(name);
  if (it == sites_.end()) {
    ADD_FAILURE() << "no site " << name;
    static SiteProcess* none = new SiteProcess();
    return *none;
  }
  return it->second;
}

v1::SiteInfo LocalSwarm::Info(const std::string& name) {
  v1::SiteInfo info;
  info.set_name(name);
  info.set_address(site(name).address);
  return info;
}

std::string LocalSwarm::WriteFile(const std::string& name,
                                  const std::string& text) {
  const std::string path = absl::StrCat(dir_, "/", name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) ADD_FAILURE() << "cannot write " << path;
  return path;
}

std::string LocalSwarm::WriteJob(const v1::JobConfig& job,
                                 const std::string& name) {
  return WriteFile(name, ToJson(job));
}

// swarmctl acts as the admin (or, in an insecure swarm, runs --insecure)
// unless the test says otherwise.
static std::vector<std::string> WithAdminIdentity(std::vector<std::string> args,
                                                  const std::string& tls_dir,
                                                  Transport transport) {
  const bool chosen =
      std::find(args.begin(), args.end(), "--insecure") != args.end() ||
      std::find(args.begin(), args.end(), "--tls-dir") != args.end() ||
      (!args.empty() && args[0] == "provision");
  if (chosen) return args;
  if (transport == Transport::kInsecure) {
    args.push_back("--insecure");
  } else {
    args.push_back("--tls-dir");
    args.push_back(tls_dir);
  }
  return args;
}

CommandResult LocalSwarm::Swarmctl(const std::vector<std::string>& args,
                                   absl::Duration timeout) {
  std::vector<std::string> argv = {SwarmctlPath()};
  const std::vector<std::string> full =
      WithAdminIdentity(args, admin_tls_dir_, transport_);
  argv.insert(argv.end(), full.begin(), full.end());
  return RunCommand(argv, absl::StrCat(dir_, "/swarmctl-", ++commands_),
                    timeout * TimeScale());
}

absl::StatusOr<std::unique_ptr<Process>> LocalSwarm::StartSwarmctl(
    const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> argv = {SwarmctlPath()};
  const std::vector<std::string> full =
      WithAdminIdentity(args, admin_tls_dir_, transport_);
  argv.insert(argv.end(), full.begin(), full.end());
  return Process::Start(argv, absl::StrCat(dir_, "/", name, ".out"),
                        absl::StrCat(dir_, "/", name, ".err"));
}

v1::Peer::Stub& LocalSwarm::Stub(const std::string& name) {
  SiteProcess& s = site(name);
  if (s.stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    s.stub = v1::Peer::NewStub(
        grpc::CreateCustomChannel(s.address,
                                  transport_ == Transport::kInsecure
                                      ? grpc::InsecureChannelCredentials()
                                      : security::ClientCredentials(Identity(
                                            "admin", security::kAdminRole)),
                                  args));
  }
  return *s.stub;
}

absl::StatusOr<v1::StatusReply> LocalSwarm::Status(const std::string& name,
                                                   const std::string& job_id,
                                                   uint64_t wait_ms,
                                                   uint64_t known_version) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(
      absl::Now() + absl::Milliseconds(static_cast<int64_t>(wait_ms)) +
      absl::Seconds(10)));
  v1::StatusRequest request;
  request.set_job_id(job_id);
  request.set_sender("admin");
  request.set_wait_for_change_ms(wait_ms);
  request.set_known_version(known_version);
  v1::StatusReply reply;
  grpc::Status status = Stub(name).Status(&context, request, &reply);
  if (!status.ok()) {
    return absl::Status(
        static_cast<absl::StatusCode>(status.error_code()),
        absl::StrCat("Status of site ", name, ": ", status.error_message()));
  }
  return reply;
}

absl::Status LocalSwarm::WaitAllDone(const std::string& job_id,
                                     absl::Time deadline) {
  for (const std::string& name : names_) {
    uint64_t version = 0;
    while (true) {
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (left <= 0) {
        absl::StatusOr<v1::StatusReply> last = Status(name, job_id);
        return absl::DeadlineExceededError(absl::StrCat(
            "job ", job_id, " not done on site ", name, " in time: ",
            last.ok() ? last->status().ShortDebugString()
                      : std::string(last.status().message())));
      }
      absl::StatusOr<v1::StatusReply> reply =
          Status(name, job_id, std::min<int64_t>(left, 2000), version);
      if (!reply.ok()) return reply.status();
      const v1::SiteState state = reply->status().state();
      if (state == v1::SITE_STATE_DONE) break;
      if (state == v1::SITE_STATE_FAILED || state == v1::SITE_STATE_ABORTED) {
        return absl::AbortedError(
            absl::StrCat("site ", name, " is ", v1::SiteState_Name(state),
                         "; last error: ", reply->status().last_error()));
      }
      version = reply->version();
    }
  }
  return absl::OkStatus();
}

absl::Status LocalSwarm::StopAll(absl::Duration timeout) {
  // Close this process's own connections first (as a swarmctl that has
  // exited would): a gRPC server's graceful shutdown waits for connected
  // clients up to the daemon's shutdown deadline. Then signal every site so
  // they shut down in parallel, and check each.
  for (const std::string& name : names_) {
    SiteProcess& s = sites_.at(name);
    s.stub.reset();
    if (s.process != nullptr && s.process->running()) {
      s.process->Signal(SIGTERM).IgnoreError();
    }
  }
  absl::Status first;
  for (const std::string& name : names_) {
    SiteProcess& s = sites_.at(name);
    if (s.process == nullptr) continue;
    absl::StatusOr<ExitInfo> exit =
        s.process->Wait(absl::Now() + timeout * TimeScale());
    absl::Status status;
    if (!exit.ok()) {
      s.process->Kill();
      status = absl::DeadlineExceededError(absl::StrCat(
          "site ", name, " did not stop within ",
          absl::FormatDuration(timeout * TimeScale()), " of SIGTERM"));
    } else if (!exit->exited || exit->exit_code != 0) {
      status = absl::InternalError(absl::StrCat(
          "site ", name, " ended with ", exit->ToString(), " after SIGTERM\n",
          LastLines(ReadFileOrEmpty(s.log_path), 30)));
    }
    if (first.ok()) first = status;
  }
  return first;
}

std::string LocalSwarm::Logs(int lines) {
  std::string out;
  for (const std::string& name : names_) {
    absl::StrAppend(&out, "--- ", name, " (", sites_.at(name).log_path, "):\n",
                    LastLines(ReadFileOrEmpty(sites_.at(name).log_path), lines),
                    "\n");
  }
  return out;
}

absl::StatusOr<std::string> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

bool FileExists(const std::string& path) {
  std::error_code error;
  return std::filesystem::exists(path, error);
}

std::vector<std::string> ListFiles(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.is_regular_file()) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace swarm::testing
