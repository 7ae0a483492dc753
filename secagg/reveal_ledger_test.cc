#include "secagg/reveal_ledger.h"

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/atomic_file.h"

namespace swarm::secagg {
namespace {

using ::testing::HasSubstr;

TEST(RevealLedgerTest, OneKindPerPeerAndRoundAcrossEveryAttempt) {
  RevealLedger ledger;
  ASSERT_TRUE(ledger.Record(4, 0, "site-b", Reveal::kSelfShare, "site-a").ok());
  // A repeat, to the backup at the next attempt: nothing new, allowed.
  EXPECT_TRUE(ledger.Record(4, 1, "site-b", Reveal::kSelfShare, "site-c").ok());
  // The other kind, to any attempt or aggregator: refused, naming why.
  const absl::Status both =
      ledger.Record(4, 1, "site-b", Reveal::kPairSeed, "site-c");
  EXPECT_EQ(both.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(both.message(), HasSubstr("never reveals both"));
  EXPECT_THAT(both.message(), HasSubstr("self-share of site-b went to site-a "
                                        "at attempt 0"));
  EXPECT_FALSE(ledger.Check(4, "site-b", Reveal::kPairSeed).ok());
  // Another peer, another round: free.
  EXPECT_TRUE(ledger.Check(4, "site-d", Reveal::kPairSeed).ok());
  EXPECT_TRUE(ledger.Check(5, "site-b", Reveal::kPairSeed).ok());
  EXPECT_EQ(ledger.size(), 1u);
}

TEST(RevealLedgerTest, WhatWasRevealedSurvivesARestart) {
  RevealLedger ledger;
  ASSERT_TRUE(ledger.Record(2, 0, "site-b", Reveal::kPairSeed, "site-a").ok());
  ASSERT_TRUE(ledger.Record(2, 0, "site-c", Reveal::kSelfShare, "site-a").ok());
  absl::StatusOr<RevealLedger> reloaded =
      RevealLedger::Parse(ledger.Serialize());
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(reloaded->Serialize(), ledger.Serialize());
  EXPECT_FALSE(reloaded->Check(2, "site-b", Reveal::kSelfShare).ok());
  EXPECT_FALSE(reloaded->Check(2, "site-c", Reveal::kPairSeed).ok());
}

TEST(RevealLedgerTest, ACorruptLedgerIsRefusedNamingTheLine) {
  absl::StatusOr<RevealLedger> bad =
      RevealLedger::Parse("1 0 self-share site-b site-a\n1 0 secret x y\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("line 2"));
  EXPECT_FALSE(RevealLedger::Parse("x 0 pair-seed a b\n").ok());
  EXPECT_FALSE(RevealLedger::Parse("1 0 pair-seed a\n").ok());
  // Two lines that break the rule between them.
  absl::StatusOr<RevealLedger> broken = RevealLedger::Parse(
      "1 0 self-share site-b site-a\n1 1 pair-seed site-b site-c\n");
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), HasSubstr("breaks the rule"));
}

TEST(RevealLedgerTest, TheFileKeepsItAcrossARestartAndRefusesDamage) {
  const std::string dir =
      std::filesystem::path(::testing::TempDir()) / "reveal_ledger_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/secagg-reveals.txt";
  absl::StatusOr<RevealLedger> fresh = LoadRevealLedger(path);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->size(), 0u);
  ASSERT_TRUE(fresh->Record(3, 0, "site-b", Reveal::kSelfShare, "site-a").ok());
  ASSERT_TRUE(SaveRevealLedger(path, *fresh).ok());
  absl::StatusOr<RevealLedger> reloaded = LoadRevealLedger(path);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_FALSE(reloaded->Check(3, "site-b", Reveal::kPairSeed).ok());
  ASSERT_TRUE(persist::WriteFileAtomically(path, "3 0 nonsense\n").ok());
  absl::StatusOr<RevealLedger> damaged = LoadRevealLedger(path);
  ASSERT_FALSE(damaged.ok());
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(), HasSubstr("secagg-reveals.txt"));
}

}  // namespace
}  // namespace swarm::secagg
