#include "privacy/accountant.h"

#include <cstdio>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "persist/atomic_file.h"
#include "privacy/rdp.h"

namespace swarm::privacy {
namespace {

v1::PrivacyCost Cost(double q, double sigma, uint64_t steps) {
  v1::PrivacyCost cost;
  cost.set_sampling_rate(q);
  cost.set_noise_multiplier(sigma);
  cost.set_steps(steps);
  return cost;
}

std::string TempPath(const std::string& name) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("accountant_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

TEST(AccountantTest, EmptyLedgerSpendsNothing) {
  Accountant accountant;
  EXPECT_EQ(*accountant.Epsilon(1e-5), 0.0);
  EXPECT_EQ(accountant.steps(), 0u);
  EXPECT_FALSE(accountant.Epsilon(0.0).ok());
}

// Composition over rounds equals one run of all the steps.
TEST(AccountantTest, RoundsComposeLikeOneRun) {
  Accountant accountant;
  for (uint32_t round = 0; round < 10; ++round) {
    ASSERT_TRUE(accountant.Add(round, Cost(0.01, 1.1, 100)).ok());
  }
  EXPECT_EQ(accountant.steps(), 1000u);
  const double eps = *accountant.Epsilon(1e-5);
  EXPECT_NEAR(eps, *DpSgdEpsilon(0.01, 1.1, 1000, 1e-5), 1e-9);
  EXPECT_NEAR(*accountant.EpsilonWith(Cost(0.01, 1.1, 100), 1e-5),
              *DpSgdEpsilon(0.01, 1.1, 1100, 1e-5), 1e-9);
  EXPECT_EQ(accountant.charges().size(), 10u);  // EpsilonWith charges none.
}

TEST(AccountantTest, RefusesInvalidCosts) {
  Accountant accountant;
  absl::Status zero_rate = accountant.Add(0, Cost(0.0, 1.0, 1));
  EXPECT_EQ(zero_rate.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero_rate.message().find("sampling_rate"), std::string::npos);
  EXPECT_FALSE(accountant.Add(0, Cost(0.1, 0.0, 1)).ok());
  EXPECT_FALSE(accountant.Add(0, Cost(0.1, 1.0, 0)).ok());
  EXPECT_TRUE(accountant.charges().empty());
}

TEST(AccountantTest, SurvivesSaveAndLoad) {
  const std::string path = TempPath("privacy.json");
  std::remove(path.c_str());
  absl::StatusOr<Accountant> fresh = Accountant::Load(path);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->charges().empty());

  Accountant accountant;
  ASSERT_TRUE(accountant.Add(3, Cost(256.0 / 60000.0, 1.1, 235)).ok());
  ASSERT_TRUE(accountant.Add(4, Cost(0.3, 0.9, 7)).ok());
  ASSERT_TRUE(accountant.Save(path).ok());
  absl::StatusOr<Accountant> loaded = Accountant::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->charges().size(), 2u);
  EXPECT_EQ(loaded->charges()[1].round, 4u);
  EXPECT_EQ(loaded->charges()[0].cost.sampling_rate(), 256.0 / 60000.0);
  EXPECT_EQ(*loaded->Epsilon(1e-5), *accountant.Epsilon(1e-5));
}

TEST(AccountantTest, CorruptLedgerIsDataLoss) {
  const std::string path = TempPath("bad.json");
  for (const char* text :
       {"not json", "{\"version\": 2, \"charges\": []}",
        "{\"version\": 1, \"charges\": [{\"round\": 1}]}",
        "{\"version\": 1, \"charges\": [{\"round\": 1, \"sampling_rate\": 2,"
        " \"noise_multiplier\": 1, \"steps\": 3}]}"}) {
    ASSERT_TRUE(persist::WriteFileAtomically(path, text).ok());
    absl::StatusOr<Accountant> loaded = Accountant::Load(path);
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << text;
    EXPECT_NE(loaded.status().message().find(path), std::string::npos);
  }
}

}  // namespace
}  // namespace swarm::privacy
