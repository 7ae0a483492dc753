#include "cli/k8s_manifests.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "config/validation.h"
#include "google/protobuf/util/json_util.h"
#include "security/identity.h"
#include "security/provision.h"

namespace swarm {
namespace {

constexpr char kTlsMount[] = "/etc/swarm/tls";
constexpr char kConfigMount[] = "/etc/swarm/config";
constexpr char kWorkspace[] = "/var/lib/swarm";

// RFC 1035 label, as Kubernetes requires of Service names: 1-63 of [a-z0-9-],
// starting with a letter, ending with a letter or digit.
bool IsDns1035Label(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  if (!absl::ascii_islower(name.front())) return false;
  if (name.back() == '-') return false;
  for (char c : name) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') {
      return false;
    }
  }
  return true;
}

// `text` as a YAML block scalar ("|") indented by `indent` spaces.
std::string Block(const std::string& text, int indent) {
  const std::string pad(indent, ' ');
  std::string out = "|\n";
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty()) continue;
    absl::StrAppend(&out, pad, line, "\n");
  }
  return out;
}

// A double-quoted YAML (and JSON) string.
std::string Quote(const std::string& text) {
  return absl::StrCat(
      "\"", absl::StrReplaceAll(text, {{"\\", "\\\\"}, {"\"", "\\\""}}), "\"");
}

std::string Labels(const std::string& job, const std::string& site,
                   int indent) {
  const std::string pad(indent, ' ');
  std::string out = absl::StrCat(pad, "app.kubernetes.io/name: swarm\n", pad,
                                 "swarm/job: ", Quote(job), "\n");
  if (!site.empty())
    absl::StrAppend(&out, pad, "swarm/site: ", Quote(site), "\n");
  return out;
}

std::string TlsSecret(const std::string& name, const std::string& job,
                      const std::string& site,
                      const security::TlsIdentity& identity) {
  return absl::StrCat("apiVersion: v1\nkind: Secret\nmetadata:\n  name: ", name,
                      "\n  labels:\n", Labels(job, site, 4),
                      "type: Opaque\nstringData:\n",
                      "  key.pem: ", Block(identity.key_pem, 4),
                      "  cert.pem: ", Block(identity.cert_pem, 4),
                      "  ca.crt: ", Block(identity.ca_pem, 4));
}

std::string ProbeCommand(int indent) {
  const std::string pad(indent, ' ');
  return absl::StrCat(pad, "exec:\n", pad,
                      "  command: [\"swarmctl\", \"health\", \"--config\", \"",
                      kConfigMount,
                      "/site.json\", \"--timeout-ms\", "
                      "\"4000\"]\n");
}

}  // namespace

std::vector<std::string> ServiceDnsNames(const std::string& service,
                                         const std::string& namespace_name) {
  return {service, absl::StrCat(service, ".", namespace_name, ".svc"),
          absl::StrCat(service, ".", namespace_name, ".svc.cluster.local")};
}

namespace {

// The Kubernetes name of the job's objects: "swarm-" + the job id, lower
// case, with '.' and '_' as '-'.
absl::StatusOr<std::string> KubernetesJobName(const v1::JobConfig& job) {
  std::string job_name = absl::AsciiStrToLower(job.job_id());
  absl::StrReplaceAll({{".", "-"}, {"_", "-"}}, &job_name);
  job_name = absl::StrCat("swarm-", job_name);
  if (!IsDns1035Label(job_name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job_id ", job.job_id(), " does not map to a Kubernetes name (",
        job_name, ": at most 63 characters, not ending in '-')"));
  }
  return job_name;
}

struct SiteService {
  std::string name;  // The Service (the host of the site's address).
  std::string port;
};

// Each site's Service name and port from its address; adds the Service's DNS
// names to the site's certificate names in `issued`.
absl::StatusOr<std::vector<SiteService>> AssignServices(
    const std::string& namespace_name, v1::JobConfig* issued) {
  std::vector<SiteService> services;
  for (v1::SiteInfo& site : *issued->mutable_sites()) {
    SWARM_ASSIGN_OR_RETURN(HostPort address, ParseHostPort(site.address()));
    if (!IsDns1035Label(address.host)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "site ", site.name(), ": address host \"", address.host,
          "\" must be its Kubernetes Service name (1-63 of [a-z0-9-], "
          "starting with a letter, e.g. \"",
          absl::AsciiStrToLower(site.name()), ":7001\")"));
    }
    for (const std::string& name :
         ServiceDnsNames(address.host, namespace_name)) {
      if (name != address.host) site.add_extra_sans(name);
    }
    services.push_back({address.host, absl::StrCat(address.port)});
  }
  return services;
}

// The site's Deployment: one replica of swarm-client over its workspace.
std::string SiteDeployment(const v1::JobConfig& job, const v1::SiteInfo& site,
                           const SiteService& service,
                           const K8sOptions& options) {
  const std::string& svc = service.name;
  const std::string& port = service.port;
  return absl::StrCat(
      "---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: ", svc,
      "\n  labels:\n", Labels(job.job_id(), site.name(), 4),
      "spec:\n  replicas: 1\n"
      "  strategy:\n    type: Recreate  # one writer of the workspace\n"
      "  selector:\n    matchLabels:\n      swarm/service: ",
      svc, "\n  template:\n    metadata:\n      labels:\n",
      Labels(job.job_id(), site.name(), 8), "        swarm/service: ", svc,
      "\n    spec:\n      securityContext:\n        runAsNonRoot: true\n"
      "        runAsUser: 10001\n        runAsGroup: 10001\n"
      "        fsGroup: 10001\n"
      "      terminationGracePeriodSeconds: 30\n"
      "      containers:\n      - name: site\n        image: ",
      options.image, "\n        args: [\"--config\", \"", kConfigMount,
      "/site.json\"]\n        ports:\n        - name: peer\n"
      "          containerPort: ",
      port, "\n        readinessProbe:\n", ProbeCommand(10),
      "          initialDelaySeconds: 2\n          periodSeconds: 10\n"
      "          timeoutSeconds: 5\n        livenessProbe:\n",
      ProbeCommand(10),
      "          initialDelaySeconds: 15\n          periodSeconds: 20\n"
      "          timeoutSeconds: 5\n          failureThreshold: 3\n"
      "        resources:\n          requests:\n            cpu: ",
      Quote(options.cpu_request),
      "\n            memory: ", Quote(options.memory_request),
      "\n          limits:\n            cpu: ", Quote(options.cpu_limit),
      "\n            memory: ", Quote(options.memory_limit),
      "\n        volumeMounts:\n        - name: tls\n          mountPath: ",
      kTlsMount,
      "\n          readOnly: true\n        - name: config\n"
      "          mountPath: ",
      kConfigMount,
      "\n          readOnly: true\n        - name: workspace\n"
      "          mountPath: ",
      kWorkspace,
      "\n      volumes:\n      - name: tls\n        secret:\n"
      "          secretName: ",
      svc,
      "-tls\n          defaultMode: 0440\n          optional: false\n"
      "      - name: config\n        configMap:\n          name: ",
      svc,
      "-config\n      - name: workspace\n        persistentVolumeClaim:\n"
      "          claimName: ",
      svc, "-workspace\n");
}

// The site's Secret, ConfigMap, PersistentVolumeClaim, Service and
// Deployment.
absl::StatusOr<std::string> SiteManifest(const v1::JobConfig& job,
                                         const v1::SiteInfo& site,
                                         const SiteService& service,
                                         const std::string& pki_dir,
                                         const K8sOptions& options) {
  const std::string& svc = service.name;
  const std::string& port = service.port;
  SWARM_ASSIGN_OR_RETURN(
      security::TlsIdentity identity,
      security::LoadTlsIdentity(absl::StrCat(pki_dir, "/sites/", site.name())));
  const std::string site_json = absl::StrCat(
      "{\"name\": ", Quote(site.name()),
      ", \"listen_address\": \"0.0.0.0:", port, "\", \"workspace\": \"",
      kWorkspace, "\", \"tls_dir\": \"", kTlsMount,
      "\", \"learner\": {\"kind\": ", Quote(options.learner_kind), "}}");
  return absl::StrCat(
      "# Site ", site.name(), " of job ", job.job_id(),
      " (generated by swarmctl deploy k8s).\n",
      TlsSecret(svc + "-tls", job.job_id(), site.name(), identity),
      "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ", svc,
      "-config\n  labels:\n", Labels(job.job_id(), site.name(), 4),
      "data:\n  site.json: ", Block(site_json, 4),
      "---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: ",
      svc, "-workspace\n  labels:\n", Labels(job.job_id(), site.name(), 4),
      "spec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n"
      "      storage: ",
      options.storage, "\n",
      "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: ", svc,
      "\n  labels:\n", Labels(job.job_id(), site.name(), 4),
      "spec:\n  selector:\n    swarm/service: ", svc,
      "\n  ports:\n  - name: peer\n    port: ", port,
      "\n    targetPort: ", port, "\n",
      SiteDeployment(job, site, service, options));
}

// The job: job.json, the operator identity, and the Job that starts it.
absl::StatusOr<std::string> JobManifest(const v1::JobConfig& job,
                                        const std::string& job_name,
                                        const std::string& pki_dir,
                                        const K8sOptions& options) {
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.add_whitespace = true;
  std::string job_json;
  if (!google::protobuf::util::MessageToJsonString(job, &job_json, print)
           .ok()) {
    return absl::InternalError("cannot print the job config as JSON");
  }
  SWARM_ASSIGN_OR_RETURN(security::TlsIdentity admin,
                         security::LoadTlsIdentity(
                             absl::StrCat(pki_dir, "/admins/", options.admin)));
  const std::string job_file = "/etc/swarm/job/job.json";
  return absl::StrCat(
      "# Starts job ", job.job_id(), " on its ", job.sites_size(),
      " sites and follows it to its end (generated by swarmctl deploy k8s).\n",
      TlsSecret(job_name + "-operator-tls", job.job_id(), "", admin),
      "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ", job_name,
      "-job\n  labels:\n", Labels(job.job_id(), "", 4),
      "data:\n  job.json: ", Block(job_json, 4),
      "---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: ", job_name,
      "-start\n  labels:\n", Labels(job.job_id(), "", 4),
      "spec:\n  backoffLimit: 0\n  template:\n    metadata:\n      labels:\n",
      Labels(job.job_id(), "", 8),
      "    spec:\n      restartPolicy: Never\n"
      "      securityContext:\n        runAsNonRoot: true\n"
      "        runAsUser: 10001\n        runAsGroup: 10001\n"
      "        fsGroup: 10001\n"
      "      containers:\n      - name: swarmctl\n        image: ",
      options.image,
      "\n        command: [\"/bin/bash\", \"-c\"]\n        args:\n        - ",
      Quote(absl::StrCat("swarmctl start --job ", job_file, " --wait-healthy ",
                         options.wait_healthy_seconds,
                         " && exec swarmctl status --job ", job_file,
                         " --watch --changes-only --interval-ms 2000")),
      "\n        env:\n        - name: SWARM_TLS_DIR\n          value: ",
      kTlsMount,
      "\n        resources:\n          requests:\n            cpu: \"50m\"\n"
      "            memory: \"64Mi\"\n          limits:\n            cpu: "
      "\"500m\"\n            memory: \"256Mi\"\n"
      "        volumeMounts:\n        - name: tls\n          mountPath: ",
      kTlsMount,
      "\n          readOnly: true\n        - name: job\n"
      "          mountPath: /etc/swarm/job\n          readOnly: true\n"
      "      volumes:\n      - name: tls\n        secret:\n          "
      "secretName: ",
      job_name,
      "-operator-tls\n          defaultMode: 0440\n"
      "          optional: false\n      - name: job\n        configMap:\n"
      "          name: ",
      job_name, "-job\n");
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> GenerateK8sManifests(
    const v1::JobConfig& job, const std::string& pki_dir,
    const K8sOptions& options) {
  if (!IsDns1035Label(options.namespace_name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--namespace ", options.namespace_name,
                     ": not a Kubernetes namespace name (1-63 of [a-z0-9-], "
                     "starting with a letter)"));
  }
  SWARM_ASSIGN_OR_RETURN(const std::string job_name, KubernetesJobName(job));
  // Service names from the addresses, and certificates that carry them.
  v1::JobConfig issued = job;
  SWARM_ASSIGN_OR_RETURN(std::vector<SiteService> services,
                         AssignServices(options.namespace_name, &issued));
  security::ProvisionOptions provision;
  provision.admins = {options.admin};
  SWARM_RETURN_IF_ERROR(
      security::Provision(issued, pki_dir, provision).status());

  std::map<std::string, std::string> files;
  for (int i = 0; i < issued.sites_size(); ++i) {
    SWARM_ASSIGN_OR_RETURN(
        files[services[i].name + ".yaml"],
        SiteManifest(job, issued.sites(i), services[i], pki_dir, options));
  }
  SWARM_ASSIGN_OR_RETURN(files["job.yaml"],
                         JobManifest(job, job_name, pki_dir, options));
  return files;
}

}  // namespace swarm
