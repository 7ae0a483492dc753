#include "cli/init_project.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "config/job_config.h"
#include "config/site_config.h"
#include "config/validation.h"
#include "google/protobuf/util/json_util.h"
#include "proto/swarm.pb.h"
#include "security/provision.h"

namespace swarm {
namespace {

namespace fs = std::filesystem;

// `count` distinct free TCP ports on 127.0.0.1 (each bound to port 0 while
// the others are taken, then released for the daemons).
absl::StatusOr<std::vector<int>> FreeLoopbackPorts(int count) {
  std::vector<int> sockets;
  std::vector<int> ports;
  absl::Status error;
  for (int i = 0; i < count && error.ok(); ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd < 0 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
            0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) !=
            0) {
      error = absl::UnavailableError("--local: cannot find a free port");
    } else {
      ports.push_back(ntohs(address.sin_port));
    }
    if (fd >= 0) sockets.push_back(fd);
  }
  for (int fd : sockets) ::close(fd);
  if (!error.ok()) return error;
  return ports;
}

// The job's sites from --local or the NAME=HOST:PORT entries.
absl::StatusOr<std::vector<v1::SiteInfo>> ChooseSites(
    const InitOptions& options) {
  std::vector<v1::SiteInfo> sites;
  if (options.local > 0) {
    absl::StatusOr<std::vector<int>> ports = FreeLoopbackPorts(options.local);
    if (!ports.ok()) return ports.status();
    for (int i = 0; i < options.local; ++i) {
      v1::SiteInfo site;
      site.set_name(absl::StrCat("site-", i + 1));
      site.set_address(absl::StrCat("127.0.0.1:", (*ports)[i]));
      sites.push_back(site);
    }
    return sites;
  }
  for (const std::string& entry : options.sites) {
    std::pair<std::string, std::string> parts =
        absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (parts.second.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--site ", entry,
                       ": expected NAME=HOST:PORT (e.g. "
                       "hospital-a=10.0.0.5:7001)"));
    }
    v1::SiteInfo site;
    site.set_name(parts.first);
    site.set_address(parts.second);
    sites.push_back(site);
  }
  return sites;
}

// The learner block of site `index` (0-based) of `count`.
absl::Status SetLearner(const InitOptions& options, int index, int count,
                        v1::SiteConfig* config) {
  v1::LearnerConfig* learner = config->mutable_learner();
  learner->set_kind(options.learner == "external" ? "external"
                                                  : options.learner);
  auto& params = *learner->mutable_params();
  if (options.learner == "mlp") {
    // Fashion-MNIST, each site its own non-IID shard (as the demo).
    params["sites"] = absl::StrCat(count);
    params["site_index"] = absl::StrCat(index);
    params["partition"] = "dirichlet";
    params["alpha"] = "0.5";
    params["data_seed"] = "1";
    params["seed"] = "1";
    params["epochs"] = "1";
    params["lr"] = "0.05";
  } else if (options.learner == "external") {
    config->mutable_trainer()->set_mode("attach");
  } else if (options.learner != "test") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--learner ", options.learner, ": expected mlp, external or test"));
  }
  return absl::OkStatus();
}

// The site config of `site`: with --local every path is under DIR; for a
// real machine the folder DIR/sites/<site> is copied to /etc/swarm/<site>
// and the workspace is /var/lib/swarm/<site>.
absl::StatusOr<v1::SiteConfig> SiteConfigFor(const InitOptions& options,
                                             const std::string& dir,
                                             const v1::SiteInfo& site,
                                             int index, int count) {
  v1::SiteConfig config;
  config.set_name(site.name());
  absl::StatusOr<HostPort> address = ParseHostPort(site.address());
  if (!address.ok()) return address.status();
  const std::string folder = absl::StrCat(dir, "/sites/", site.name());
  if (options.local > 0) {
    config.set_listen_address(site.address());
    config.set_workspace(absl::StrCat(folder, "/workspace"));
    config.set_tls_dir(folder);
  } else {
    config.set_listen_address(absl::StrCat("0.0.0.0:", address->port));
    config.set_workspace(absl::StrCat("/var/lib/swarm/", site.name()));
    config.set_tls_dir(absl::StrCat("/etc/swarm/", site.name()));
  }
  if (absl::Status learner = SetLearner(options, index, count, &config);
      !learner.ok()) {
    return learner;
  }
  if (absl::Status valid = ValidateSiteConfig(config); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("site ", site.name(), ": ", valid.message()));
  }
  return config;
}

absl::Status WriteJson(const std::string& path,
                       const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  print.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, print)
           .ok()) {
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  std::ofstream file(path, std::ios::trunc);
  file << json;
  file.close();
  if (!file) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string LocalCommands(const InitOptions& options, const std::string& dir,
                          const v1::JobConfig& job) {
  std::string text = absl::StrCat(
      "Start the ", job.sites_size(),
      " sites on this machine (each keeps running until stopped):\n");
  for (const v1::SiteInfo& site : job.sites()) {
    absl::StrAppend(&text, "  ", options.swarm_client, " --config ", dir,
                    "/sites/", site.name(), "/site.json >", dir, "/sites/",
                    site.name(), "/daemon.log 2>&1 &\n");
  }
  return text;
}

std::string RemoteCommands(const InitOptions& options, const std::string& dir,
                           const v1::JobConfig& job) {
  std::string text =
      "On each machine: copy its folder (it holds the site's private key) "
      "and start its daemon (swarm-client installed there, e.g. from the "
      "image in docs/deploy.md):\n";
  for (const v1::SiteInfo& site : job.sites()) {
    const std::string host =
        site.address().substr(0, site.address().rfind(':'));
    // /etc/swarm does not exist on a fresh machine: scp would not make it.
    absl::StrAppend(
        &text, "  # ", site.name(), " (", site.address(), ")\n", "  ssh ", host,
        " mkdir -p /etc/swarm\n", "  scp -rp ", dir, "/sites/", site.name(),
        " ", host, ":/etc/swarm/", site.name(), "\n", "  ssh ", host,
        " swarm-client --config /etc/swarm/", site.name(), "/site.json\n");
  }
  return text;
}

// The commands to print after the folder is written.
std::string Commands(const InitOptions& options, const std::string& dir,
                     const v1::JobConfig& job) {
  std::string text =
      absl::StrCat("wrote ", dir, "/job.json, ", dir, "/sites/<site>/ and ",
                   dir, "/admins/", options.admin, "/\n\n");
  text += options.local > 0 ? LocalCommands(options, dir, job)
                            : RemoteCommands(options, dir, job);
  if (options.learner == "external") {
    text +=
        "(each site waits for its trainer: start it on that machine with "
        "SWARM_TRAINER_SOCKET=<workspace>/trainer/link.sock; docs/trainers.md)"
        "\n";
  }
  absl::StrAppend(&text, "Then run the job from this machine:\n",
                  "  export SWARM_TLS_DIR=", dir, "/admins/", options.admin,
                  "\n", "  ", options.swarmctl, " start --job ", dir,
                  "/job.json --wait-healthy 60\n", "  ", options.swarmctl,
                  " status --job ", dir, "/job.json --watch\n", "  ",
                  options.swarmctl, " fetch --site ", job.sites(0).address(),
                  " --which best --out ", dir, "/best.safetensors\n", "  ",
                  options.swarmctl, " fetch --site ", job.sites(0).address(),
                  " --which last --out ", dir, "/last.safetensors\n");
  return text;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ReadSitesFile(
    const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(
        absl::StrCat("--sites ", path, ": cannot read it"));
  }
  std::vector<std::string> sites;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    absl::string_view entry = absl::StripAsciiWhitespace(line);
    if (entry.empty() || entry[0] == '#') continue;
    if (entry.find('=') == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sites ", path, " line ", number, ": \"", entry,
                       "\" is not NAME=HOST:PORT"));
    }
    sites.emplace_back(entry);
  }
  return sites;
}

absl::StatusOr<std::string> InitProject(const InitOptions& options) {
  if (options.out.empty()) {
    return absl::InvalidArgumentError("init needs --out DIR");
  }
  if ((options.local > 0) == !options.sites.empty()) {
    return absl::InvalidArgumentError(
        "init needs either --local N or the sites (--site NAME=HOST:PORT, "
        "repeated, or --sites FILE), not both");
  }
  std::error_code error;
  const std::string dir =
      fs::absolute(options.out, error).lexically_normal().string();
  if (fs::exists(dir) && !options.force) {
    return absl::AlreadyExistsError(absl::StrCat(
        dir,
        " exists; nothing was written (choose another --out, or pass "
        "--force to write into it: its CA is reused, the other files "
        "are replaced)"));
  }
  absl::StatusOr<std::vector<v1::SiteInfo>> sites = ChooseSites(options);
  if (!sites.ok()) return sites.status();
  v1::JobConfig job;
  job.set_job_id(options.job_id);
  job.set_num_rounds(options.rounds);
  job.set_seed(2026);
  for (const v1::SiteInfo& site : *sites) *job.add_sites() = site;
  if (absl::Status valid = ValidateJobConfig(job); !valid.ok()) return valid;
  std::vector<v1::SiteConfig> configs;
  for (int i = 0; i < job.sites_size(); ++i) {
    absl::StatusOr<v1::SiteConfig> config =
        SiteConfigFor(options, dir, job.sites(i), i, job.sites_size());
    if (!config.ok()) return config.status();
    configs.push_back(*std::move(config));
  }
  // Everything is checked; now the files.
  fs::create_directories(dir, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  security::ProvisionOptions provision;
  provision.admins = {options.admin};
  absl::StatusOr<security::ProvisionReport> report =
      security::Provision(job, dir, provision);
  if (!report.ok()) return report.status();
  if (absl::Status written = WriteJson(dir + "/job.json", job); !written.ok()) {
    return written;
  }
  for (const v1::SiteConfig& config : configs) {
    absl::Status written = WriteJson(
        absl::StrCat(dir, "/sites/", config.name(), "/site.json"), config);
    if (!written.ok()) return written;
  }
  return Commands(options, dir, job);
}

}  // namespace swarm
