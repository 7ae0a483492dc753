// The README's "Run a job across machines", followed literally by a new user
// (issue 34, "Done when"): three machines, each a network namespace of the
// fault lab (tests/support/netns.h) with its own /etc and /var/lib (overlays
// of this machine's, so nothing lands in the real ones), and the operator's
// machine, the lab's hub namespace. The test runs
//
//   swarmctl init --out myjob --learner mlp --site s1=ADDR1:7001 ...
//
// as step 1 says, parses what it prints (nothing here is written by hand),
// runs each site's printed commands against that site's machine (ssh and
// scp are stand-ins that run the command, or copy, on the machine with that
// address), then the operator's printed commands (start, status --watch,
// fetch) from the operator's machine, and expects the job done on every
// site, BEST and LAST fetched, each byte-identical to every site's own copy.
//
// Needs root (namespaces, overlay mounts) and dataset-fashion-mnist; without
// them it prints SKIP with the reason and shows as skipped.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model.h"
#include "tests/integration/local_swarm.h"
#include "tests/support/daemon.h"
#include "tests/support/netns.h"
#include "tests/support/process.h"

namespace swarm::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Enters the run's hub namespace (the operator's machine) before any test,
// while the process has one thread; leaves and removes it after the last.
class NetnsEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { NetnsLab::Get().Enter(); }
  void TearDown() override { NetnsLab::Get().Leave(); }
};
[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new NetnsEnvironment());

constexpr char kDataSet[] =
    "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

// What `swarmctl init` printed: each site's commands (after its
// "# NAME (HOST:PORT)" line) and the operator's (after "Then run the job
// from this machine:"). Commands are the indented lines.
struct Printed {
  struct Site {
    std::string name;
    std::string address;
    std::vector<std::string> commands;
  };
  std::vector<Site> sites;
  std::vector<std::string> admin;
};

Printed Parse(const std::string& out) {
  Printed printed;
  bool admin = false;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, "Then run the job from this machine")) {
      admin = true;
      continue;
    }
    if (!absl::ConsumePrefix(&line, "  ")) continue;
    if (admin) {
      printed.admin.emplace_back(line);
    } else if (absl::ConsumePrefix(&line, "# ")) {
      // "NAME (HOST:PORT)"
      std::vector<std::string> parts = absl::StrSplit(line, " (");
      Printed::Site site;
      site.name = parts[0];
      if (parts.size() > 1) {
        site.address = std::string(absl::StripSuffix(parts[1], ")"));
      }
      printed.sites.push_back(site);
    } else if (!printed.sites.empty()) {
      printed.sites.back().commands.emplace_back(line);
    }
  }
  return printed;
}

void WriteExecutable(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  chmod(path.c_str(), 0755);
}

// The stand-ins for ssh and scp in <dir>/bin, and `on-machine HOST COMMAND`
// under them: COMMAND (one shell command line) runs on the machine whose
// address is HOST, i.e. in its network namespace, with /etc and /var/lib
// overlaid by <machines>/HOST/{etc,var-lib}, and swarm-client installed
// (the build's cli/ first on its PATH).
void WriteRemoteTools(const std::string& bin, const std::string& machines,
                      const std::string& ip, const std::string& cli) {
  fs::create_directories(bin);
  WriteExecutable(
      bin + "/on-machine",
      absl::StrCat(
          "#!/bin/bash\n"
          "# on-machine HOST COMMAND: runs COMMAND on the test's machine "
          "HOST.\n"
          "host=$1; shift\n"
          "m=",
          machines,
          "/$host\n"
          "[ -f \"$m/netns\" ] || { echo \"ssh: Could not resolve hostname "
          "$host\" >&2; exit 255; }\n"
          "exec ",
          ip,
          " netns exec \"$(cat \"$m/netns\")\" /bin/bash -c '\n"
          "  m=$1; shift\n"
          "  mount -t overlay overlay -o lowerdir=/etc,upperdir=$m/etc,"
          "workdir=$m/etc-work /etc &&\n"
          "  mount -t overlay overlay -o lowerdir=/var/lib,"
          "upperdir=$m/var-lib,workdir=$m/var-lib-work /var/lib ||\n"
          "    exit 255\n"
          "  export PATH=",
          cli,
          ":$PATH\n"
          "  cd /\n"
          "  exec /bin/bash -c \"$*\"' on-machine \"$m\" \"$@\"\n"));
  WriteExecutable(bin + "/ssh",
                  absl::StrCat("#!/bin/bash\n"
                               "# ssh HOST COMMAND...\n"
                               "host=$1; shift\n"
                               "exec ",
                               bin, "/on-machine \"$host\" \"$*\"\n"));
  WriteExecutable(
      bin + "/scp",
      absl::StrCat(
          "#!/bin/bash\n"
          "# scp [-r] [-p] SOURCE HOST:TARGET: a copy from this machine to "
          "one of the test's (as cp does it there).\n"
          "flags=()\n"
          "while [[ $1 == -* ]]; do flags+=(\"$1\"); shift; done\n"
          "[ $# -eq 2 ] && [[ $2 == *:* ]] || { echo \"scp: expected SOURCE "
          "HOST:TARGET\" >&2; exit 1; }\n"
          "exec ",
          bin, "/on-machine \"${2%%:*}\" \"cp ${flags[*]} '$1' '${2#*:}'\"\n"));
}

// A machine for the site at `host`: its namespace and its own /etc and
// /var/lib (empty overlays).
void AddMachine(const std::string& machines, const std::string& host,
                const std::string& netns) {
  const std::string m = absl::StrCat(machines, "/", host);
  for (const char* dir : {"etc", "etc-work", "var-lib", "var-lib-work"}) {
    fs::create_directories(absl::StrCat(m, "/", dir));
  }
  std::ofstream(m + "/netns") << netns;
}

std::string FetchTarget(const std::vector<std::string>& admin,
                        const std::string& which) {
  for (const std::string& command : admin) {
    if (!absl::StrContains(command, " fetch ") ||
        !absl::StrContains(command, absl::StrCat("--which ", which))) {
      continue;
    }
    std::vector<std::string> words = absl::StrSplit(command, ' ');
    for (size_t i = 0; i + 1 < words.size(); ++i) {
      if (words[i] == "--out") return words[i + 1];
    }
  }
  return "";
}

TEST(WalkthroughTest, TheReadmeAcrossThreeMachinesWithInitAlone) {
  NetnsLab& lab = NetnsLab::Get();
  if (!lab.unavailable().empty()) {
    std::printf("SKIP: %s\n", lab.unavailable().c_str());
    GTEST_SKIP() << lab.unavailable();
  }
  if (access(kDataSet, R_OK) != 0) {
    std::printf("SKIP: no %s (install dataset-fashion-mnist)\n", kDataSet);
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const absl::Time began = absl::Now();
  const std::string dir = MakeTempDir("swarm-walkthrough", "readme");
  const std::string machines = dir + "/machines";
  const std::string bin = dir + "/bin";
  const std::string cli = fs::path(SwarmClientPath()).parent_path().string();
  WriteRemoteTools(bin, machines, lab.ip(), cli);
  // The operator's shell finds the stand-ins (and swarmctl, installed).
  setenv("PATH", absl::StrCat(bin, ":", cli, ":", getenv("PATH")).c_str(), 1);

  Network net("w");
  ASSERT_TRUE(net.Create().ok());
  std::vector<std::string> flags;
  const std::vector<std::string> names = {"s1", "s2", "s3"};
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StatusOr<std::string> address =
        net.AddSite(names[i], static_cast<int>(i) + 1);
    ASSERT_TRUE(address.ok()) << address.status();
    AddMachine(machines, *address, net.Namespace(names[i]));
    flags.push_back(absl::StrCat("--site ", names[i], "=", *address, ":7001"));
  }
  // A machine with overlays at all? Else say why and skip.
  {
    const CommandResult probe =
        RunCommand({bin + "/ssh", net.Address("s1"), "true"}, dir + "/probe",
                   absl::Seconds(30));
    if (probe.code() != 0) {
      std::printf("SKIP: cannot give a namespace its own /etc (overlay): %s\n",
                  probe.ToString().c_str());
      GTEST_SKIP() << "no overlay mounts: " << probe.ToString();
    }
  }

  // 1. Describe the swarm (README step 1), from the operator's folder.
  const std::string init_line =
      absl::StrCat("cd ", dir, " && swarmctl init --out myjob --learner mlp ",
                   absl::StrJoin(flags, " "));
  const CommandResult init = RunCommand({"/bin/bash", "-c", init_line},
                                        dir + "/init", absl::Seconds(60));
  ASSERT_EQ(init.code(), 0) << init.ToString();
  const Printed printed = Parse(init.out);
  ASSERT_EQ(printed.sites.size(), 3u) << init.out;
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(printed.sites[i].name, names[i]) << init.out;
    EXPECT_EQ(printed.sites[i].address,
              absl::StrCat(net.Address(names[i]), ":7001"))
        << init.out;
  }

  // 2. On each site's machine, its printed commands: the last one starts
  // the daemon (it runs until stopped), the others must succeed.
  std::vector<std::unique_ptr<Process>> daemons;
  for (const Printed::Site& site : printed.sites) {
    ASSERT_FALSE(site.commands.empty()) << init.out;
    for (size_t i = 0; i + 1 < site.commands.size(); ++i) {
      const CommandResult step = RunCommand(
          {"/bin/bash", "-c", site.commands[i]},
          absl::StrCat(dir, "/", site.name, "-step", i), absl::Seconds(30));
      ASSERT_EQ(step.code(), 0)
          << "on " << site.name << ", `" << site.commands[i]
          << "` as printed: " << step.ToString();
    }
    const std::string& daemon = site.commands.back();
    ASSERT_THAT(daemon, HasSubstr("swarm-client --config")) << init.out;
    DaemonStart start;
    start.name = site.name;
    start.argv = {"/bin/bash", "-c", absl::StrCat("exec ", daemon)};
    start.log_path = absl::StrCat(dir, "/", site.name, ".log");
    start.timeout = absl::Seconds(30) * TimeScale();
    absl::StatusOr<StartedDaemon> started = StartDaemon(start);
    ASSERT_TRUE(started.ok()) << "on " << site.name << ", `" << daemon
                              << "` as printed: " << started.status();
    daemons.push_back(std::move(started->process));
  }

  // 3. From the operator's machine, its printed commands as one shell
  // session (the export holds for the commands after it).
  ASSERT_GE(printed.admin.size(), 4u) << init.out;
  const std::string script = dir + "/operator.sh";
  std::ofstream(script) << "set -e\ncd " << dir << "\n"
                        << absl::StrJoin(printed.admin, "\n") << "\n";
  const CommandResult run = RunCommand({"/bin/bash", script}, dir + "/operator",
                                       absl::Seconds(150) * TimeScale());
  std::string logs;
  for (const std::string& name : names) {
    absl::StrAppend(&logs, "--- ", name, "\n",
                    LastLines(ReadFileOrEmpty(dir + "/" + name + ".log"), 15));
  }
  ASSERT_EQ(run.code(), 0) << run.ToString() << logs;
  EXPECT_THAT(run.out, HasSubstr("done on every site")) << run.out;

  // BEST and LAST where the printed fetch commands put them, each holding
  // the tensors of every site's own copy (in its machine's /var/lib; the
  // sites' copies are byte-identical).
  for (const char* which : {"best", "last"}) {
    const std::string target = FetchTarget(printed.admin, which);
    ASSERT_FALSE(target.empty())
        << "init printed no fetch of " << which << ": " << init.out;
    const std::string path = fs::path(target).is_absolute()
                                 ? target
                                 : absl::StrCat(dir, "/", target);
    absl::StatusOr<Model> fetched = Model::LoadSafetensors(path);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    std::string first;
    for (const std::string& name : names) {
      const std::string own =
          absl::StrCat(machines, "/", net.Address(name), "/var-lib/swarm/",
                       name, "/swarm-job/", which, ".safetensors");
      absl::StatusOr<std::string> bytes = ReadBytes(own);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      if (first.empty()) first = *bytes;
      EXPECT_TRUE(*bytes == first) << own << " differs from s1's";
      absl::StatusOr<Model> copy = Model::LoadSafetensors(own);
      ASSERT_TRUE(copy.ok()) << copy.status();
      ASSERT_TRUE(copy->SameLayout(*fetched)) << own << " vs " << path;
      // The final's metadata too (kind, metric, best site, end reason), not
      // that of the stream that brought it.
      EXPECT_EQ(copy->metadata(), fetched->metadata()) << own << " vs " << path;
      for (size_t i = 0; i < copy->num_tensors(); ++i) {
        EXPECT_EQ(copy->tensor_data(i), fetched->tensor_data(i))
            << copy->spec(i).name << " of " << own << " vs " << path;
      }
    }
  }
  // Nothing of it in this machine's own /etc or /var/lib.
  EXPECT_FALSE(fs::exists("/etc/swarm/s1"));
  EXPECT_FALSE(fs::exists("/var/lib/swarm/s1"));
  std::printf("[ walkthrough ] the README's job on 3 machines: %.1f s\n",
              absl::ToDoubleSeconds(absl::Now() - began));
  for (auto& daemon : daemons) daemon->Kill();
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace swarm::testing
