// ExternalLearner: a Learner whose training runs in a trainer process the user
// wrote, reached over the trainer link (proto/trainer_link.proto) on a Unix
// domain socket. Selected by site config learner.kind "external"; the
// site config's `trainer` block says how (see v1::TrainerConfig):
//   launch  the daemon starts trainer.command with SWARM_TRAINER_SOCKET (and
//           SWARM_SITE) in its environment, restarts it with backoff when it
//           exits, and stops it at Shutdown;
//   attach  the daemon waits for a trainer started on its own to connect.
// The socket's folder is created with mode 0700 and the socket is 0600: only
// the daemon's user can connect. Model hand-off goes through safetensors files
// in <workspace>/trainer/ (trainer_link.h, model_files.h).
#ifndef SWARM_TRAINERLINK_EXTERNAL_LEARNER_H_
#define SWARM_TRAINERLINK_EXTERNAL_LEARNER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "learner/learner.h"
#include "proto/swarm.pb.h"
#include "trainerlink/trainer_link.h"
#include "trainerlink/trainer_process.h"

namespace swarm::trainerlink {

// The environment variable that carries the socket path to the trainer.
inline constexpr char kSocketEnv[] = "SWARM_TRAINER_SOCKET";

class LinkService;

class ExternalLearner final : public Learner {
 public:
  // Serves the link on TrainerSocketPath(config) and, in launch mode, starts
  // the trainer. REQUIRES: config passed ValidateSiteConfig with learner.kind
  // "external". Errors name the socket path (cannot bind, path taken by a
  // non-socket file).
  static absl::StatusOr<std::unique_ptr<ExternalLearner>> Create(
      const v1::SiteConfig& config);
  ~ExternalLearner() override;  // Shutdown().
  ExternalLearner(const ExternalLearner&) = delete;
  ExternalLearner& operator=(const ExternalLearner&) = delete;

  // See TrainerLink::SetJobView.
  void SetJobView(std::function<JobView()> view);
  std::string WaitingFor() override;
  void SetWaitingListener(std::function<void()> changed) override;

  absl::StatusOr<Model> InitialModel() override;
  absl::StatusOr<Metrics> Validate(const Model& global,
                                   uint32_t round) override;
  absl::StatusOr<TrainOutput> Train(const Model& global, uint32_t round,
                                    const std::atomic<bool>& cancel) override;
  // Keeps the job's learner_params (merged over the site's) for the tasks.
  absl::Status ConfigureForJob(
      const std::map<std::string, std::string>& job_params) override;
  // Also tells the link whether the job requires differential privacy.
  absl::Status ConfigureJob(const v1::JobConfig& job) override;

  // Stops the trainer (launch mode), ends every waiting call and stops
  // serving. Idempotent.
  void Shutdown();

  const std::string& socket_path() const { return socket_path_; }
  TrainerLink& link() { return *link_; }

 private:
  ExternalLearner(v1::SiteConfig config, std::string socket_path);

  const v1::SiteConfig config_;
  const std::string socket_path_;
  std::unique_ptr<TrainerLink> link_;
  std::unique_ptr<LinkService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<TrainerProcess> process_;
  bool shut_down_ = false;  // Only touched by Shutdown (one caller at a time).
};

}  // namespace swarm::trainerlink

#endif  // SWARM_TRAINERLINK_EXTERNAL_LEARNER_H_
