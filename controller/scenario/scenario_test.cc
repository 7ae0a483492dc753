// Runs every script in controller/scenario/testdata/ through a fresh
// Scenario and compares each command's output with the one written under
// it. SWARM_SCENARIO_REWRITE=1 in the environment rewrites the scripts with
// what the commands print now (review the diff before committing it);
// SWARM_SCENARIO_DIR runs the scripts of another folder instead.
#include "controller/scenario/scenario.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "gtest/gtest.h"

namespace swarm::scenario {
namespace {

// The scripts' folder: SWARM_SCENARIO_DIR in the environment (to try a
// script of one's own), else the project's testdata/.
std::string ScriptDir() {
  const char* dir = std::getenv("SWARM_SCENARIO_DIR");
  return dir != nullptr && *dir != '\0' ? dir : SWARM_SCENARIO_TESTDATA;
}

std::vector<std::string> Scripts() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(ScriptDir())) {
    if (entry.path().extension() == ".txt") {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class ScenarioTest : public ::testing::TestWithParam<std::string> {
 protected:
  ScenarioTest() { SetMinLogSeverity(LogSeverity::kError); }
};

TEST_P(ScenarioTest, Script) {
  const std::string path = ScriptDir() + "/" + GetParam();
  const std::string script = ReadAll(path);
  ASSERT_FALSE(script.empty()) << "cannot read " << path;
  const std::string work =
      ::testing::TempDir() + "/scenario-" + GetParam() + "-work";
  std::filesystem::remove_all(work);
  Scenario scenario(work);
  std::vector<CaseResult> cases;
  const std::string rewritten = RunScript(script, scenario, &cases);
  const char* rewrite = std::getenv("SWARM_SCENARIO_REWRITE");
  if (rewrite != nullptr && std::string(rewrite) == "1") {
    std::ofstream(path) << rewritten;
    GTEST_SKIP() << "rewrote " << path;
  }
  for (const CaseResult& c : cases) {
    EXPECT_EQ(c.actual, c.expected)
        << GetParam() << ":" << c.line << ": " << c.command;
  }
  std::filesystem::remove_all(work);
}

// The runner itself: a wrong expectation is reported with its line, and the
// rewritten script carries what the command printed.
TEST(RunScriptTest, ReportsAndRewritesAMismatch) {
  const std::string script =
      "# A comment.\n"
      "sites 2 rounds 1\n"
      "----\n"
      "ok\n"
      "\n"
      "status s1\n"
      "----\n"
      "0.000s s1: DONE\n"
      "\n"
      "bogus\n";
  Scenario scenario(::testing::TempDir() + "/scenario-runner-work");
  std::vector<CaseResult> cases;
  const std::string rewritten = RunScript(script, scenario, &cases);
  ASSERT_EQ(cases.size(), 3u);
  EXPECT_EQ(cases[0].actual, cases[0].expected);
  EXPECT_EQ(cases[1].line, 6);
  EXPECT_EQ(cases[1].expected, "0.000s s1: DONE");
  EXPECT_EQ(cases[1].actual, "0.000s s1: IDLE - r0 a0 aggregator - global r-1");
  EXPECT_EQ(cases[2].actual, "error: unknown command \"bogus\"");
  EXPECT_EQ(rewritten,
            "# A comment.\n"
            "sites 2 rounds 1\n"
            "----\n"
            "ok\n"
            "\n"
            "status s1\n"
            "----\n"
            "0.000s s1: IDLE - r0 a0 aggregator - global r-1\n"
            "\n"
            "bogus\n"
            "----\n"
            "error: unknown command \"bogus\"\n");
}

INSTANTIATE_TEST_SUITE_P(Testdata, ScenarioTest, ::testing::ValuesIn(Scripts()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name =
                               info.param.substr(0, info.param.size() - 4);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace swarm::scenario
