// PlanUnmasking: the aggregator's side of unmasking a round (design section
// 10). The gather closed with the uploads of `counted` in the masked sum;
// the other trainers of the round (`dropped`) never got theirs counted. The
// aggregator asked the surviving trainers, each for one kind of secret per
// peer (never both: RevealLedger): the shares they hold of every counted
// trainer's self-mask seed, and the pairwise seed each counted trainer
// shares with every dropped one. From their answers this rebuilds the
// counted trainers' self seeds (any `threshold` shares) and collects the
// dropped pairs: the Unmasking that UnmaskSum removes from the sum.
//
// Pure. Fails, naming what is missing, when a counted trainer's seed has
// fewer than `threshold` shares among the answers, or a counted trainer
// that did not answer shares a seed with a dropped one (its mask for the
// dropped trainer cannot come off): the round then cannot be unmasked at
// this attempt, and goes to the next (fresh masks over the kept results).
#ifndef SWARM_SECAGG_UNMASK_PLAN_H_
#define SWARM_SECAGG_UNMASK_PLAN_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "secagg/masking.h"
#include "secagg/shamir.h"

namespace swarm::secagg {

// One surviving trainer's answer to the unmasking request.
struct UnmaskAnswer {
  std::string from;
  // Its shares of the counted trainers' self-mask seeds, by trainer.
  std::map<std::string, Share> self_shares;
  // Its pairwise seeds with the dropped trainers, by trainer (only when it
  // is counted itself).
  std::map<std::string, Seed> pair_seeds;
};

struct UnmaskRequest {
  std::vector<std::string> counted;
  std::vector<std::string> dropped;
  int threshold = 0;
  // Optional: whether a rebuilt seed is the one trainer committed to (its
  // upload carried a commitment); false fails the plan naming the trainer.
  std::function<bool(const std::string& trainer, const Seed& seed)>
      check_self_seed;
  // Whether two trainers are neighbours (mask with each other:
  // secagg/neighbours.h); empty: every pair is (the complete graph).
  std::function<bool(const std::string& a, const std::string& b)> adjacent;
};

absl::StatusOr<Unmasking> PlanUnmasking(
    const UnmaskRequest& request, const std::vector<UnmaskAnswer>& answers);

}  // namespace swarm::secagg

#endif  // SWARM_SECAGG_UNMASK_PLAN_H_
