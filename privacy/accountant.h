// One site's privacy accountant for one job: the ledger of every round's
// DP-SGD cost that left the site, composed in RDP (rdp.h) and converted to
// (ε, δ). It lives in the job's folder (<workspace>/<job>/privacy.json),
// replaced atomically after every charge, so a restart or a resume continues
// the count and never restarts it.
//
// The file holds the charges themselves, not only their RDP, so that a later
// version with another grid of orders recomputes the same ledger.
#ifndef SWARM_PRIVACY_ACCOUNTANT_H_
#define SWARM_PRIVACY_ACCOUNTANT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/swarm.pb.h"

namespace swarm::privacy {

// OK when `cost` is a valid DP-SGD cost: sampling_rate in (0, 1],
// noise_multiplier > 0 and finite, steps > 0. InvalidArgument naming the
// field and the rule otherwise.
absl::Status ValidateCost(const v1::PrivacyCost& cost);

class Accountant {
 public:
  struct Charge {
    uint32_t round = 0;
    v1::PrivacyCost cost;
  };

  // An empty ledger.
  Accountant();

  // Adds `cost` (validated) for `round`.
  absl::Status Add(uint32_t round, const v1::PrivacyCost& cost);

  // ε for `delta` of everything charged (0 when nothing is).
  absl::StatusOr<double> Epsilon(double delta) const;
  // ε for `delta` if `next` were charged on top.
  absl::StatusOr<double> EpsilonWith(const v1::PrivacyCost& next,
                                     double delta) const;

  const std::vector<Charge>& charges() const { return charges_; }
  uint64_t steps() const;
  // RDP per order of DefaultOrders().
  const std::vector<double>& rdp() const { return rdp_; }

  // {"version": 1, "charges": [{"round", "sampling_rate",
  //  "noise_multiplier", "steps"}, ...]}
  std::string ToJson() const;
  // DataLoss when `json` is not such a ledger (naming what is wrong).
  static absl::StatusOr<Accountant> FromJson(absl::string_view json);

  // Reads `path`; an empty ledger when it does not exist.
  static absl::StatusOr<Accountant> Load(const std::string& path);
  // Replaces `path` atomically with ToJson().
  absl::Status Save(const std::string& path) const;

 private:
  std::vector<Charge> charges_;
  std::vector<double> rdp_;
};

}  // namespace swarm::privacy

#endif  // SWARM_PRIVACY_ACCOUNTANT_H_
