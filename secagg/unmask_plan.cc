#include "secagg/unmask_plan.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace swarm::secagg {
namespace {

// The self seed of `trainer` from the answers' shares of it.
absl::StatusOr<Seed> RebuildSelfSeed(const UnmaskRequest& request,
                                     const std::vector<UnmaskAnswer>& answers,
                                     const std::string& trainer) {
  std::vector<Share> shares;
  std::vector<std::string> holders;
  for (const UnmaskAnswer& answer : answers) {
    auto it = answer.self_shares.find(trainer);
    if (it == answer.self_shares.end()) continue;
    shares.push_back(it->second);
    holders.push_back(answer.from);
  }
  if (static_cast<int>(shares.size()) < request.threshold) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation: ", shares.size(), " share(s) of ", trainer,
        "'s self-mask seed (from ",
        holders.empty() ? std::string("nobody") : absl::StrJoin(holders, ","),
        "); ", request.threshold, " are needed"));
  }
  absl::StatusOr<std::string> secret = CombineShares(shares, request.threshold);
  if (!secret.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("secure aggregation: the shares of ", trainer,
                     "'s self-mask seed: ", secret.status().message()));
  }
  Seed seed;
  if (secret->size() != seed.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation: the shares of ", trainer, "'s self-mask seed are ",
        secret->size(), " bytes, not ", seed.size()));
  }
  std::memcpy(seed.data(), secret->data(), seed.size());
  if (request.check_self_seed && !request.check_self_seed(trainer, seed)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation: the rebuilt self-mask seed of ", trainer,
        " is not the one it committed to (a wrong share among ",
        absl::StrJoin(holders, ","), ")"));
  }
  return seed;
}

}  // namespace

absl::StatusOr<Unmasking> PlanUnmasking(
    const UnmaskRequest& request, const std::vector<UnmaskAnswer>& answers) {
  if (request.threshold < 1) {
    return absl::InvalidArgumentError("threshold: must be at least 1");
  }
  Unmasking unmasking;
  for (const std::string& trainer : request.counted) {
    absl::StatusOr<Seed> seed = RebuildSelfSeed(request, answers, trainer);
    if (!seed.ok()) return seed.status();
    unmasking.self_seeds.push_back(*seed);
  }
  if (request.dropped.empty()) return unmasking;
  std::map<std::string, const UnmaskAnswer*> by_sender;
  for (const UnmaskAnswer& answer : answers) by_sender[answer.from] = &answer;
  for (const std::string& counted : request.counted) {
    auto answer = by_sender.find(counted);
    for (const std::string& dropped : request.dropped) {
      if (request.adjacent && !request.adjacent(counted, dropped)) continue;
      const bool known = answer != by_sender.end() &&
                         answer->second->pair_seeds.count(dropped) > 0;
      if (!known) {
        return absl::FailedPreconditionError(absl::StrCat(
            "secure aggregation: no pairwise seed of ", counted, " and ",
            dropped, " (", counted,
            answer == by_sender.end() ? " did not answer" : " did not give it",
            "): the mask ", counted, " added for ", dropped,
            " cannot come off at this attempt"));
      }
      unmasking.dropped_pairs.push_back(
          {counted, dropped, answer->second->pair_seeds.at(dropped)});
    }
  }
  return unmasking;
}

}  // namespace swarm::secagg
