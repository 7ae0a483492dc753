// Kubernetes manifests for one job: per site a Secret (its key, certificate
// and the project CA), a ConfigMap (its site.json), a PersistentVolumeClaim
// (its workspace), a Service and a Deployment (replicas 1, probes on
// `swarmctl health`, resource requests and limits); and for the job a
// Secret (the operator's admin identity), a ConfigMap (job.json) and a Job
// that runs `swarmctl start --wait-healthy` and follows the job to its end.
//
// Each site's Service is named after the host of its address in the job, so
// the addresses the sites call each other by are Service DNS names; the
// certificates (issued by security::Provision under DIR's CA) carry that
// name plus <svc>.<namespace>.svc and <svc>.<namespace>.svc.cluster.local.
#ifndef SWARM_CLI_K8S_MANIFESTS_H_
#define SWARM_CLI_K8S_MANIFESTS_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "proto/swarm.pb.h"

namespace swarm {

struct K8sOptions {
  std::string image = "localhost/swarm:latest";
  std::string namespace_name = "default";
  std::string admin = "k8s-operator";  // the Job's admin identity
  std::string learner_kind = "mlp";    // each site's learner.kind
  std::string storage = "1Gi";         // workspace PVC size
  std::string cpu_request = "250m";
  std::string cpu_limit = "2";
  std::string memory_request = "256Mi";
  std::string memory_limit = "2Gi";
  // Seconds the Job waits for every site to answer its health check.
  int wait_healthy_seconds = 300;
};

// The certificate names a site needs for `namespace_name`: the Service name
// and its two qualified forms. REQUIRES: `service` is a DNS-1035 label.
std::vector<std::string> ServiceDnsNames(const std::string& service,
                                         const std::string& namespace_name);

// Validates `job` for Kubernetes (every address host is a DNS-1035 label,
// usable as a Service name; the job id maps to a resource name), issues the
// site certificates and the admin identity into `pki_dir` (reusing its CA;
// see security/provision.h) with the Service names as SANs, and returns the
// manifests by file name: "<service>.yaml" per site and "job.yaml".
// InvalidArgument names the site and the rule.
absl::StatusOr<std::map<std::string, std::string>> GenerateK8sManifests(
    const v1::JobConfig& job, const std::string& pki_dir,
    const K8sOptions& options);

}  // namespace swarm

#endif  // SWARM_CLI_K8S_MANIFESTS_H_
