// Attack modes for tests and benches (design section 11): a learner that
// wraps a site's real learner (the test learner or the built-in MLP) and
// turns its results or its metrics into an attacker's.
//
// Learner params (each may be given per site as "<key>.<site name>", like
// the other learner keys, so that only some sites attack):
//   attack               none | sign_flip | scaling | noise | alie | ipm
//                                                                  none
//   attack_scale         sign_flip: the result is global - s * update
//                        (default 1); scaling: global + s * update (10);
//                        ipm: global - s * mean honest update (0.5)
//   attack_noise         noise: global + N(0, sigma^2) per weight     1
//   attack_z             alie: mean - z * stddev of the honest
//                        results per weight; 0 = Baruch et al.'s
//                        z_max for n sites of which attack_colluders
//                        attack                                        0
//   attack_colluders     alie: the attacking sites, f                  1
//   attack_honest_sites  alie, ipm: the honest sites, comma-separated
//                        (required for these modes)
//   attack_samples       claim this many times the real sample count   1
//   attack_metric        report this value for attack_metric_name
//                        whatever the model's real validation metric
//   attack_metric_name   the metric that lies                   accuracy
//
// Where ALIE and IPM get the honest statistics. The literature assumes an
// omniscient attacker that knows the mean (and deviation) of the honest
// updates of the round. Here the attacker computes them itself: it holds a
// learner for every site named in attack_honest_sites, made from the same
// params as those sites' own learners (for the MLP, their site_index, so
// the same deterministic Dirichlet shard; for the test learner, their
// site name), trains each from the round's global model, and takes the
// mean and standard deviation per weight. Those are the honest sites'
// updates of that round exactly when local training is deterministic (the
// MLP's minibatch order is seeded by seed, round and site_index), at the
// cost of training every honest shard once more per attacking site.
//
// Only F32 tensors are attacked (both built-in learners use F32); others
// pass through as trained.
#ifndef SWARM_LEARNER_ATTACK_H_
#define SWARM_LEARNER_ATTACK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "learner/learner.h"

namespace swarm {

enum class AttackMode { kNone, kSignFlip, kScaling, kNoise, kAlie, kIpm };

struct AttackOptions {
  AttackMode mode = AttackMode::kNone;
  double scale = 1;
  double noise = 1;
  double z = 0;
  int colluders = 1;
  std::vector<std::string> honest_sites;
  uint64_t sample_multiplier = 1;
  std::optional<double> metric;
  std::string metric_name = "accuracy";
  // Seeds the noise (mixed with the round).
  uint64_t seed = 1;

  // Anything to do at all.
  bool active() const {
    return mode != AttackMode::kNone || sample_multiplier != 1 ||
           metric.has_value();
  }
};

// Reads the attack params for `site`. InvalidArgument naming the key for a
// malformed value, an unknown mode, or ALIE / IPM without honest sites.
absl::StatusOr<AttackOptions> ParseAttackOptions(
    absl::string_view site, const std::map<std::string, std::string>& params);

// The attack keys (for the learners' unknown-parameter warnings).
bool IsAttackParam(absl::string_view key);

// Baruch et al.'s z_max for n sites of which f attack: s = floor(n / 2 + 1)
// - f honest sites must be "convinced"; z = Phi^-1((n - s) / n).
double AlieZ(int n, int f);

// Wraps `inner` (which it owns). `honest` are the learners of the honest
// sites (ALIE, IPM; empty otherwise), also owned.
std::unique_ptr<Learner> NewAttackingLearner(
    std::unique_ptr<Learner> inner, AttackOptions options,
    std::vector<std::unique_ptr<Learner>> honest);

}  // namespace swarm

#endif  // SWARM_LEARNER_ATTACK_H_
