#include "persist/workspace.h"

#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/atomic_file.h"
#include "persist/test_util.h"

namespace swarm::persist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testutil::ListNames;
using testutil::ScopedTempDir;
using testutil::WriteRaw;

bool IsDir(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

TEST(WorkspaceTest, ValidJobIds) {
  for (const char* id :
       {"a", "mnist-2024", "job_1.v2", "...", ".hidden", "A.B-C_d"}) {
    EXPECT_TRUE(Workspace::ValidateJobId(id).ok()) << id;
  }
  EXPECT_TRUE(Workspace::ValidateJobId(std::string(64, 'x')).ok());
}

TEST(WorkspaceTest, InvalidJobIds) {
  struct Case {
    std::string id;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"", "1 to 64"},
           {std::string(65, 'x'), "has 65 characters"},
           {".", "outside"},
           {"..", "outside"},
           {"../x", "contains '/'"},
           {"a/b", "contains '/'"},
           {"/abs", "contains '/'"},
           {"a b", "contains ' '"},
           {std::string("a\0b", 3), "contains '\\x00'"},
           {"caf\xc3\xa9", "contains '\\xc3'"},
           {"x\\y", "contains '\\\\'"},
       }) {
    absl::Status status = Workspace::ValidateJobId(c.id);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.id;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.id;
  }
}

TEST(WorkspaceTest, Paths) {
  const Workspace ws("/data/ws/");
  EXPECT_EQ(ws.root(), "/data/ws");
  EXPECT_EQ(ws.JobDir("j1"), "/data/ws/j1");
  EXPECT_EQ(ws.JobConfigPath("j1"), "/data/ws/j1/job.json");
  EXPECT_EQ(ws.StatePath("j1"), "/data/ws/j1/state.json");
  EXPECT_EQ(ws.GlobalModelPath("j1"), "/data/ws/j1/global.safetensors");
  EXPECT_EQ(ws.BestModelPath("j1"), "/data/ws/j1/best.safetensors");
  EXPECT_EQ(ws.LastModelPath("j1"), "/data/ws/j1/last.safetensors");
  EXPECT_EQ(ws.RoundsDir("j1"), "/data/ws/j1/rounds");
  EXPECT_EQ(ws.RoundModelPath("j1", 12),
            "/data/ws/j1/rounds/round-000012.safetensors");
  EXPECT_EQ(ws.RoundModelPath("j1", 4000000000u),
            "/data/ws/j1/rounds/round-4000000000.safetensors");
  EXPECT_EQ(ws.OffloadDir("j1"), "/data/ws/j1/offload");
  EXPECT_EQ(Workspace("/").JobDir("j"), "/j");
  EXPECT_EQ(Workspace("").JobDir("j"), "./j");
  EXPECT_EQ(Workspace("rel").JobDir("j"), "rel/j");
}

TEST(WorkspaceTest, EnsureJobDirs) {
  ScopedTempDir dir;
  const Workspace ws(dir.Child("not/yet/there"));
  ASSERT_TRUE(ws.EnsureJobDirs("job").ok());
  EXPECT_TRUE(IsDir(ws.JobDir("job")));
  EXPECT_TRUE(IsDir(ws.RoundsDir("job")));
  EXPECT_TRUE(IsDir(ws.OffloadDir("job")));
  ASSERT_TRUE(ws.EnsureJobDirs("job").ok());  // Idempotent.
  EXPECT_EQ(ws.EnsureJobDirs("../escape").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsDir(dir.Child("not/yet/escape")));
}

TEST(WorkspaceTest, EnsureJobDirsRefusesFileInTheWay) {
  ScopedTempDir dir;
  const Workspace ws(dir.path());
  WriteRaw(dir.Child("job"), "a file");
  absl::Status status = ws.EnsureJobDirs("job");
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr(dir.Child("job")));
}

TEST(WorkspaceTest, CheckWritableCreatesTheRootAndLeavesNothing) {
  ScopedTempDir dir;
  const Workspace ws(dir.Child("new/root"));
  ASSERT_TRUE(ws.CheckWritable().ok());
  EXPECT_TRUE(IsDir(dir.Child("new/root")));
  absl::StatusOr<std::vector<std::string>> jobs = ws.ListJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_TRUE(jobs->empty());
  EXPECT_EQ(rmdir(dir.Child("new/root").c_str()), 0);  // Nothing left in it.
}

TEST(WorkspaceTest, CheckWritableNamesTheRootWhenAFileIsInTheWay) {
  ScopedTempDir dir;
  WriteRaw(dir.Child("file"), "x");
  const Workspace ws(dir.Child("file"));
  absl::Status status = ws.CheckWritable();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("workspace " + dir.Child("file")));
}

// The workspace check as the user `uid` would see it: run in a child that
// takes that uid (root ignores mode bits). Returns "<code>:<message>".
std::string CheckWritableAs(const Workspace& ws, uid_t uid) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    std::string out = "setuid failed";
    if (setgid(uid) == 0 && setuid(uid) == 0) {
      const absl::Status status = ws.CheckWritable();
      out =
          absl::StrCat(static_cast<int>(status.code()), ":", status.message());
    }
    (void)!write(fds[1], out.data(), out.size());
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buffer[512];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) out.append(buffer, n);
  close(fds[0]);
  waitpid(child, nullptr, 0);
  return out;
}

TEST(WorkspaceTest, CheckWritableRefusesAReadOnlyDirectory) {
  ScopedTempDir dir;
  ASSERT_EQ(mkdir(dir.Child("ro").c_str(), 0555), 0);
  const Workspace ws(dir.Child("ro"));
  if (geteuid() != 0) {
    absl::Status status = ws.CheckWritable();
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(status.message(), HasSubstr("not writable"));
    return;
  }
  // Root writes into mode 0555 directories: as root, check a read-only
  // mount (what a container's read-only volume is), and the 0555 directory
  // as an unprivileged user.
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  EXPECT_THAT(CheckWritableAs(ws, 65534),
              HasSubstr(absl::StrCat(
                  static_cast<int>(absl::StatusCode::kPermissionDenied),
                  ":workspace ", dir.Child("ro"), " is not writable")));
  ASSERT_EQ(mkdir(dir.Child("mnt").c_str(), 0755), 0);
  ASSERT_EQ(
      mount("tmpfs", dir.Child("mnt").c_str(), "tmpfs", MS_RDONLY, "size=1m"),
      0)
      << "mount a read-only tmpfs: " << std::strerror(errno);
  const Workspace mounted(dir.Child("mnt"));
  const absl::Status status = mounted.CheckWritable();
  umount(dir.Child("mnt").c_str());
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("is not writable"));
  EXPECT_THAT(status.message(), HasSubstr("Read-only file system"));
}

TEST(WorkspaceTest, JobConfigRoundTrip) {
  ScopedTempDir dir;
  const Workspace ws(dir.path());
  v1::JobConfig config;
  config.set_job_id("mnist");
  config.add_sites()->set_name("site-a");
  config.add_sites()->set_name("site-b");
  config.add_trainers("site-a");
  config.set_num_rounds(7);
  config.set_round_timeout_ms(123456789012ull);
  ASSERT_TRUE(ws.WriteJobConfig(config).ok());
  EXPECT_TRUE(IsDir(ws.OffloadDir("mnist")));
  absl::StatusOr<v1::JobConfig> read = ws.ReadJobConfig("mnist");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), config.SerializeAsString());
  // Human-readable JSON with the proto field names.
  const std::string json = *ReadFileToString(ws.JobConfigPath("mnist"));
  EXPECT_THAT(json, HasSubstr("\"num_rounds\": 7"));
  EXPECT_THAT(ListNames(ws.JobDir("mnist")),
              ElementsAre("job.json", "offload", "rounds"));
}

TEST(WorkspaceTest, JobConfigErrors) {
  ScopedTempDir dir;
  const Workspace ws(dir.path());
  v1::JobConfig bad;
  bad.set_job_id("../x");
  EXPECT_EQ(ws.WriteJobConfig(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ListNames(dir.path()).empty());

  absl::StatusOr<v1::JobConfig> missing = ws.ReadJobConfig("absent");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("absent/job.json"));

  ASSERT_TRUE(ws.EnsureJobDirs("j").ok());
  WriteRaw(ws.JobConfigPath("j"), "{ not json");
  absl::StatusOr<v1::JobConfig> garbled = ws.ReadJobConfig("j");
  EXPECT_EQ(garbled.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(garbled.status().message(), HasSubstr("j/job.json"));
  EXPECT_THAT(garbled.status().message(), HasSubstr("JobConfig"));

  WriteRaw(ws.JobConfigPath("j"), R"({"job_id": "other"})");
  absl::StatusOr<v1::JobConfig> other = ws.ReadJobConfig("j");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(other.status().message(), HasSubstr("\"other\""));

  WriteRaw(ws.JobConfigPath("j"), R"({"job_id": "j", "from_the_future": 1})");
  EXPECT_TRUE(ws.ReadJobConfig("j").ok());
}

TEST(WorkspaceTest, StateRoundTrip) {
  ScopedTempDir dir;
  const Workspace ws(dir.path());
  EXPECT_EQ(ws.ReadState("j").status().code(), absl::StatusCode::kNotFound);
  v1::JobState state;
  state.set_job_id("j");
  state.set_last_completed_round(-1);
  ASSERT_TRUE(ws.WriteState(state).ok());
  absl::StatusOr<v1::JobState> read = ws.ReadState("j");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->last_completed_round(), -1);

  state.set_last_completed_round(41);
  state.mutable_best()->set_present(true);
  state.mutable_best()->set_site("site-b");
  state.mutable_best()->set_metric(0.875);
  state.mutable_best()->set_round(40);
  state.set_updated_time_ms(1764483230123);
  ASSERT_TRUE(ws.WriteState(state).ok());
  read = ws.ReadState("j");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), state.SerializeAsString());
  EXPECT_THAT(ListNames(ws.JobDir("j")),
              ElementsAre("offload", "rounds", "state.json"));
  EXPECT_EQ(ws.ReadState("..").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorkspaceTest, ClearOffload) {
  ScopedTempDir dir;
  const Workspace ws(dir.path());
  EXPECT_TRUE(ws.ClearOffload("nojob").ok());  // Nothing to clear.
  ASSERT_TRUE(ws.EnsureJobDirs("j").ok());
  WriteRaw(ws.OffloadDir("j") + "/result-site-a.bin", "a");
  WriteRaw(ws.OffloadDir("j") + "/.hidden", "b");
  ASSERT_EQ(mkdir((ws.OffloadDir("j") + "/sub").c_str(), 0755), 0);
  WriteRaw(ws.OffloadDir("j") + "/sub/x", "c");
  WriteRaw(ws.GlobalModelPath("j"), "model");
  ASSERT_TRUE(ws.ClearOffload("j").ok());
  EXPECT_TRUE(IsDir(ws.OffloadDir("j")));
  EXPECT_TRUE(ListNames(ws.OffloadDir("j")).empty());
  EXPECT_EQ(*ReadFileToString(ws.GlobalModelPath("j")), "model");
  EXPECT_EQ(ws.ClearOffload("../j").code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkspaceTest, CleanStaleOffloadAll) {
  ScopedTempDir dir;
  const Workspace ws(dir.Child("ws"));
  EXPECT_TRUE(ws.CleanStaleOffloadAll().ok());  // No workspace yet.
  ASSERT_TRUE(ws.EnsureJobDirs("j1").ok());
  ASSERT_TRUE(ws.EnsureJobDirs("j2").ok());
  WriteRaw(ws.OffloadDir("j1") + "/r1.bin", "x");
  WriteRaw(ws.OffloadDir("j2") + "/r2.bin", "y");
  const std::string stale_temp =
      ws.JobDir("j1") + "/.global.safetensors.tmp.123.0123456789abcdef";
  const std::string stale_round_temp =
      ws.RoundsDir("j2") + "/.round-000001.safetensors.tmp.9.fedcba9876543210";
  WriteRaw(stale_temp, "torn");
  WriteRaw(stale_round_temp, "torn");
  WriteRaw(ws.GlobalModelPath("j1"), "keep");
  WriteRaw(ws.RoundModelPath("j2", 1), "keep");
  WriteRaw(ws.JobDir("j1") + "/.notes", "keep");
  // Not job directories: left alone.
  WriteRaw(dir.Child("ws/loose-file"), "keep");
  ASSERT_EQ(mkdir(dir.Child("ws/bad name").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(dir.Child("ws/bad name/offload").c_str(), 0755), 0);
  WriteRaw(dir.Child("ws/bad name/offload/x"), "keep");
  ASSERT_EQ(mkdir(dir.Child("outside").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(dir.Child("outside/offload").c_str(), 0755), 0);
  WriteRaw(dir.Child("outside/offload/x"), "keep");
  ASSERT_EQ(symlink(dir.Child("outside").c_str(), dir.Child("ws/link").c_str()),
            0);

  ASSERT_TRUE(ws.CleanStaleOffloadAll().ok());
  EXPECT_TRUE(ListNames(ws.OffloadDir("j1")).empty());
  EXPECT_TRUE(ListNames(ws.OffloadDir("j2")).empty());
  EXPECT_THAT(ListNames(ws.JobDir("j1")),
              ElementsAre(".notes", "global.safetensors", "offload", "rounds"));
  EXPECT_THAT(ListNames(ws.RoundsDir("j2")),
              ElementsAre("round-000001.safetensors"));
  EXPECT_THAT(ListNames(dir.Child("ws/bad name/offload")), ElementsAre("x"));
  EXPECT_THAT(ListNames(dir.Child("outside/offload")), ElementsAre("x"));
  EXPECT_THAT(*ws.ListJobs(), ElementsAre("j1", "j2"));
}

}  // namespace
}  // namespace swarm::persist
