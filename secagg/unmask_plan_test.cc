#include "secagg/unmask_plan.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "secagg/test_mask_generator.h"

namespace swarm::secagg {
namespace {

using ::testing::HasSubstr;

Seed RandomSeed(std::mt19937& engine) {
  Seed seed;
  for (uint8_t& b : seed) b = static_cast<uint8_t>(engine() & 0xFF);
  return seed;
}

// A round of n trainers with threshold t: seeds, shares and masked uploads,
// as the protocol would make them (the transport aside).
class Round {
 public:
  Round(int n, int t, uint32_t seed) : n_(n), t_(t), engine_(seed) {
    for (int i = 0; i < n; ++i) {
      names_.push_back(absl::StrCat("site-", i));
      self_.push_back(RandomSeed(engine_));
      inputs_.emplace_back(kWords);
      for (uint32_t& w : inputs_.back()) w = engine_();
    }
    pair_.assign(n, std::vector<Seed>(n));
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j)
        pair_[i][j] = pair_[j][i] = RandomSeed(engine_);
    }
    // Shares of each trainer's self seed: share k goes to trainer k.
    shares_.resize(n);
    for (int i = 0; i < n; ++i) {
      const std::string secret(reinterpret_cast<const char*>(self_[i].data()),
                               self_[i].size());
      shares_[i] = *SplitSecret(secret, t, n, [this](absl::Span<uint8_t> out) {
        for (uint8_t& b : out) b = static_cast<uint8_t>(engine_() & 0xFF);
      });
    }
  }

  std::vector<uint32_t> Upload(int i) const {
    std::vector<uint32_t> upload = inputs_[i];
    std::vector<PairSeed> pairs;
    for (int j = 0; j < n_; ++j) {
      if (j != i) pairs.push_back({names_[j], pair_[i][j]});
    }
    EXPECT_TRUE(
        MaskUpdate(prg_, names_[i], self_[i], pairs, 0, absl::MakeSpan(upload))
            .ok());
    return upload;
  }

  // Trainer k's answer about `counted` and `dropped`.
  UnmaskAnswer Answer(int k, const std::vector<int>& counted,
                      const std::vector<int>& dropped) const {
    UnmaskAnswer answer;
    answer.from = names_[k];
    for (int c : counted) answer.self_shares[names_[c]] = shares_[c][k];
    if (std::count(counted.begin(), counted.end(), k) > 0) {
      for (int d : dropped) answer.pair_seeds[names_[d]] = pair_[k][d];
    }
    return answer;
  }

  UnmaskRequest Request(const std::vector<int>& counted,
                        const std::vector<int>& dropped) const {
    UnmaskRequest request;
    for (int c : counted) request.counted.push_back(names_[c]);
    for (int d : dropped) request.dropped.push_back(names_[d]);
    request.threshold = t_;
    return request;
  }

  std::vector<uint32_t> MaskedSum(const std::vector<int>& counted) const {
    std::vector<uint32_t> sum(kWords, 0);
    for (int c : counted) {
      const std::vector<uint32_t> upload = Upload(c);
      for (size_t k = 0; k < kWords; ++k) sum[k] += upload[k];
    }
    return sum;
  }
  std::vector<uint32_t> PlainSum(const std::vector<int>& counted) const {
    std::vector<uint32_t> sum(kWords, 0);
    for (int c : counted) {
      for (size_t k = 0; k < kWords; ++k) sum[k] += inputs_[c][k];
    }
    return sum;
  }
  const TestGenerator& prg() const { return prg_; }
  const std::vector<Seed>& self_seeds() const { return self_; }
  const std::string& name(int i) const { return names_[i]; }

 private:
  static constexpr size_t kWords = 64;
  int n_;
  int t_;
  mutable std::mt19937 engine_;
  std::vector<std::string> names_;
  std::vector<Seed> self_;
  std::vector<std::vector<Seed>> pair_;
  std::vector<std::vector<Share>> shares_;
  std::vector<std::vector<uint32_t>> inputs_;
  TestGenerator prg_;
};

TEST(UnmaskPlanTest, ATrainerDroppedBeforeItsUploadCountedComesOff) {
  // Six trainers, threshold 3: trainer 5 dropped before its upload
  // counted; the five counted ones answer (each counted trainer must give
  // its pairwise seed with 5).
  Round round(6, 3, 11);
  const std::vector<int> counted = {0, 1, 2, 3, 4};
  const std::vector<int> dropped = {5};
  std::vector<UnmaskAnswer> answers;
  for (int k : {1, 2, 3, 4, 0})
    answers.push_back(round.Answer(k, counted, dropped));
  absl::StatusOr<Unmasking> plan =
      PlanUnmasking(round.Request(counted, dropped), answers);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint32_t> sum = round.MaskedSum(counted);
  EXPECT_TRUE(UnmaskSum(round.prg(), *plan, 0, absl::MakeSpan(sum)).ok());
  EXPECT_EQ(sum, round.PlainSum(counted));
}

TEST(UnmaskPlanTest, NoDropoutNeedsOnlyTSharesPerTrainer) {
  Round round(5, 3, 12);
  const std::vector<int> counted = {0, 1, 2, 3, 4};
  // Only three trainers answer (two dropped during unmasking): enough.
  std::vector<UnmaskAnswer> answers;
  for (int k : {4, 0, 2}) answers.push_back(round.Answer(k, counted, {}));
  absl::StatusOr<Unmasking> plan =
      PlanUnmasking(round.Request(counted, {}), answers);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint32_t> sum = round.MaskedSum(counted);
  EXPECT_TRUE(UnmaskSum(round.prg(), *plan, 0, absl::MakeSpan(sum)).ok());
  EXPECT_EQ(sum, round.PlainSum(counted));
}

TEST(UnmaskPlanTest, BelowTheThresholdItFailsNamingTheTrainer) {
  Round round(5, 3, 13);
  const std::vector<int> counted = {0, 1, 2, 3, 4};
  std::vector<UnmaskAnswer> answers = {round.Answer(1, counted, {}),
                                       round.Answer(2, counted, {})};
  absl::StatusOr<Unmasking> plan =
      PlanUnmasking(round.Request(counted, {}), answers);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("2 share(s) of site-0's self-mask seed (from "
                        "site-1,site-2); 3 are needed"));
}

TEST(UnmaskPlanTest, ACountedTrainerLostWithADroppedPeersSeedFailsTheAttempt) {
  Round round(5, 2, 14);
  const std::vector<int> counted = {0, 1, 2, 3};
  const std::vector<int> dropped = {4};
  std::vector<UnmaskAnswer> answers;
  for (int k : {1, 2, 3}) answers.push_back(round.Answer(k, counted, dropped));
  absl::StatusOr<Unmasking> plan =
      PlanUnmasking(round.Request(counted, dropped), answers);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(),
              HasSubstr("no pairwise seed of site-0 and site-4 (site-0 did not "
                        "answer)"));
}

TEST(UnmaskPlanTest, AWrongShareIsCaughtByTheCommitment) {
  Round round(4, 2, 15);
  const std::vector<int> counted = {0, 1, 2, 3};
  std::vector<UnmaskAnswer> answers = {round.Answer(1, counted, {}),
                                       round.Answer(2, counted, {})};
  answers[0].self_shares["site-3"].y[0] ^= 1;  // A lying holder.
  UnmaskRequest request = round.Request(counted, {});
  request.check_self_seed = [&](const std::string& trainer, const Seed& seed) {
    const int i = trainer.back() - '0';
    return seed == round.self_seeds()[i];
  };
  absl::StatusOr<Unmasking> plan = PlanUnmasking(request, answers);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(),
              HasSubstr("rebuilt self-mask seed of site-3 is not the one it "
                        "committed to"));
}

}  // namespace
}  // namespace swarm::secagg
