#include "security/provision.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "config/validation.h"
#include "persist/atomic_file.h"

namespace swarm::security {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status MakeDirs(const std::string& dir, mode_t mode) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  if (chmod(dir.c_str(), mode) != 0) return Errno("cannot chmod", dir);
  return absl::OkStatus();
}

absl::Status WritePublicFile(const std::string& path,
                             absl::string_view contents) {
  SWARM_RETURN_IF_ERROR(persist::WriteFileAtomically(path, contents));
  if (chmod(path.c_str(), 0644) != 0) return Errno("cannot chmod", path);
  return absl::OkStatus();
}

absl::Status WriteIdentity(const std::string& dir, const KeyAndCert& issued,
                           const std::string& ca_cert) {
  SWARM_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  SWARM_RETURN_IF_ERROR(WriteSecretFile(dir + "/key.pem", issued.key_pem));
  SWARM_RETURN_IF_ERROR(WritePublicFile(dir + "/cert.pem", issued.cert_pem));
  return WritePublicFile(dir + "/ca.crt", ca_cert);
}

}  // namespace

absl::Status WriteSecretFile(const std::string& path,
                             absl::string_view contents) {
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  const int fd =
      open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create", temp);
  fchmod(fd, 0600);  // Even if the file existed with a wider mode.
  size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n =
        write(fd, contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status status = Errno("cannot write", temp);
      close(fd);
      unlink(temp.c_str());
      return status;
    }
    written += n;
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    absl::Status status = Errno("cannot sync", temp);
    unlink(temp.c_str());
    return status;
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status status = Errno("cannot rename into", path);
    unlink(temp.c_str());
    return status;
  }
  return persist::FsyncDirectory(
      std::filesystem::path(path).parent_path().string());
}

CertRequest SiteCertRequest(const v1::SiteInfo& site) {
  CertRequest request;
  request.common_name = site.name();
  request.role = kSiteRole;
  std::vector<std::string> hosts;
  absl::StatusOr<HostPort> address = ParseHostPort(site.address());
  if (address.ok()) hosts.push_back(address->host);
  for (const std::string& extra : site.extra_sans()) hosts.push_back(extra);
  for (const std::string& host : hosts) {
    std::vector<std::string>& list =
        IsIpAddress(host) ? request.ip_addresses : request.dns_names;
    if (std::find(list.begin(), list.end(), host) == list.end())
      list.push_back(host);
  }
  return request;
}

absl::StatusOr<ProvisionReport> Provision(const v1::JobConfig& job,
                                          const std::string& out_dir,
                                          const ProvisionOptions& options) {
  for (const std::string& name : options.only_sites) {
    bool known = false;
    for (const v1::SiteInfo& site : job.sites()) known |= site.name() == name;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("--site ", name, ": not a site of job ", job.job_id()));
    }
  }
  for (const std::string& admin : options.admins) {
    SWARM_RETURN_IF_ERROR(ValidateName("--admin", admin));
    for (const v1::SiteInfo& site : job.sites()) {
      if (site.name() == admin) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--admin ", admin, ": an admin cannot have a site's name"));
      }
    }
  }
  ProvisionReport report;
  const std::string ca_dir = out_dir + "/ca";
  KeyAndCert ca;
  if (std::filesystem::exists(ca_dir + "/ca.key")) {
    SWARM_ASSIGN_OR_RETURN(ca.key_pem,
                           persist::ReadFileToString(ca_dir + "/ca.key"));
    SWARM_ASSIGN_OR_RETURN(ca.cert_pem,
                           persist::ReadFileToString(ca_dir + "/ca.crt"));
  } else {
    SWARM_ASSIGN_OR_RETURN(ca,
                           CreateCa(absl::StrCat("swarm CA ", job.job_id())));
    SWARM_RETURN_IF_ERROR(MakeDirs(ca_dir, 0700));
    SWARM_RETURN_IF_ERROR(WriteSecretFile(ca_dir + "/ca.key", ca.key_pem));
    SWARM_RETURN_IF_ERROR(WritePublicFile(ca_dir + "/ca.crt", ca.cert_pem));
    report.created_ca = true;
  }
  const absl::Time now = absl::Now();
  if (!options.no_sites) {
    for (const v1::SiteInfo& site : job.sites()) {
      if (!options.only_sites.empty() &&
          std::find(options.only_sites.begin(), options.only_sites.end(),
                    site.name()) == options.only_sites.end()) {
        continue;
      }
      CertRequest request = SiteCertRequest(site);
      request.not_before = now - absl::Hours(1);
      request.not_after = now + options.validity;
      SWARM_ASSIGN_OR_RETURN(KeyAndCert issued, IssueCertificate(ca, request));
      const std::string dir = absl::StrCat(out_dir, "/sites/", site.name());
      SWARM_RETURN_IF_ERROR(WriteIdentity(dir, issued, ca.cert_pem));
      report.folders.push_back(dir);
    }
  }
  for (const std::string& admin : options.admins) {
    CertRequest request;
    request.common_name = admin;
    request.role = kAdminRole;
    request.not_before = now - absl::Hours(1);
    request.not_after = now + options.validity;
    SWARM_ASSIGN_OR_RETURN(KeyAndCert issued, IssueCertificate(ca, request));
    const std::string dir = absl::StrCat(out_dir, "/admins/", admin);
    SWARM_RETURN_IF_ERROR(WriteIdentity(dir, issued, ca.cert_pem));
    report.folders.push_back(dir);
  }
  return report;
}

}  // namespace swarm::security
