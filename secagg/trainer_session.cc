#include "secagg/trainer_session.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace swarm::secagg {

absl::StatusOr<TrainerSession> TrainerSession::Start(
    Options options, const PairSeedFn& pair_seed, const RandomBytes& random) {
  const int holders = static_cast<int>(options.neighbours.size()) + 1;
  if (options.threshold < 1 || options.threshold > holders) {
    return absl::InvalidArgumentError(
        absl::StrCat("threshold: must be 1..", holders,
                     " (the neighbours and the trainer "
                     "itself), not ",
                     options.threshold));
  }
  if (std::count(options.neighbours.begin(), options.neighbours.end(),
                 options.self) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.self, " is among its own neighbours"));
  }
  TrainerSession session(std::move(options));
  const Options& o = session.options_;
  for (const std::string& peer : o.neighbours) {
    absl::StatusOr<Seed> seed = pair_seed(peer);
    if (!seed.ok()) {
      return absl::Status(seed.status().code(),
                          absl::StrCat("the pairwise seed with ", peer, ": ",
                                       seed.status().message()));
    }
    session.pair_seeds_[peer] = *seed;
  }
  random(absl::MakeSpan(session.self_seed_));
  absl::StatusOr<std::vector<Share>> shares =
      SplitSecret(absl::string_view(
                      reinterpret_cast<const char*>(session.self_seed_.data()),
                      session.self_seed_.size()),
                  o.threshold, holders, random);
  if (!shares.ok()) return shares.status();
  for (size_t i = 0; i < o.neighbours.size(); ++i) {
    session.shares_to_send_[o.neighbours[i]] = (*shares)[i];
  }
  session.own_share_ = shares->back();
  return session;
}

bool TrainerSession::IsNeighbour(const std::string& site) const {
  return pair_seeds_.count(site) > 0;
}

absl::Status TrainerSession::KeepShare(const std::string& from,
                                       const Share& share) {
  if (!IsNeighbour(from)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a self-mask share from ", from,
                     ", which is not a neighbour of ", options_.self));
  }
  auto [it, added] = held_shares_.try_emplace(from, share);
  if (!added && (it->second.x != share.x || it->second.y != share.y)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a second, different self-mask share from ", from, " for round ",
        options_.round, " attempt ", options_.attempt));
  }
  return absl::OkStatus();
}

absl::Status TrainerSession::Mask(const MaskGenerator& prg, uint64_t offset,
                                  absl::Span<uint32_t> encoded) const {
  std::vector<PairSeed> pairs;
  pairs.reserve(pair_seeds_.size());
  for (const auto& [peer, seed] : pair_seeds_) pairs.push_back({peer, seed});
  return MaskUpdate(prg, options_.self, self_seed_, pairs, offset, encoded);
}

absl::StatusOr<UnmaskAnswer> TrainerSession::Answer(
    const std::vector<std::string>& counted,
    const std::vector<std::string>& dropped, const std::string& aggregator,
    RevealLedger* ledger) const {
  const std::set<std::string> counted_set(counted.begin(), counted.end());
  for (const std::string& name : dropped) {
    if (counted_set.count(name) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unmasking request: ", name, " is both counted and dropped"));
    }
  }
  // What would be revealed, checked whole before anything is recorded.
  std::vector<std::pair<std::string, Reveal>> reveals;
  for (const std::string& peer : counted) {
    if (peer == options_.self || held_shares_.count(peer) > 0) {
      reveals.emplace_back(peer, Reveal::kSelfShare);
    }
  }
  if (counted_set.count(options_.self) > 0) {
    for (const std::string& peer : dropped) {
      if (IsNeighbour(peer)) reveals.emplace_back(peer, Reveal::kPairSeed);
    }
  }
  for (const auto& [peer, reveal] : reveals) {
    if (absl::Status allowed = ledger->Check(options_.round, peer, reveal);
        !allowed.ok()) {
      return allowed;
    }
  }
  UnmaskAnswer answer;
  answer.from = options_.self;
  for (const auto& [peer, reveal] : reveals) {
    // Checked above: Record cannot refuse.
    ledger->Record(options_.round, options_.attempt, peer, reveal, aggregator)
        .IgnoreError();
    if (reveal == Reveal::kPairSeed) {
      answer.pair_seeds[peer] = pair_seeds_.at(peer);
    } else {
      answer.self_shares[peer] =
          peer == options_.self ? own_share_ : held_shares_.at(peer);
    }
  }
  return answer;
}

}  // namespace swarm::secagg
