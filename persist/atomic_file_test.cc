#include "persist/atomic_file.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"

namespace swarm::persist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testutil::ListNames;
using testutil::ScopedTempDir;
using testutil::WriteRaw;

TEST(AtomicFileTest, WritesNewFile) {
  ScopedTempDir dir;
  const std::string path = dir.Child("a.txt");
  ASSERT_TRUE(WriteFileAtomically(path, "hello").ok());
  absl::StatusOr<std::string> read = ReadFileToString(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "hello");
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("a.txt"));
}

TEST(AtomicFileTest, ReplacesExistingFileAndEmptyContents) {
  ScopedTempDir dir;
  const std::string path = dir.Child("a.txt");
  WriteRaw(path, "old contents");
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  EXPECT_EQ(*ReadFileToString(path), "");
  ASSERT_TRUE(WriteFileAtomically(path, std::string("a\0b", 3)).ok());
  EXPECT_EQ(*ReadFileToString(path), std::string("a\0b", 3));
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("a.txt"));
}

TEST(AtomicFileTest, AbandonedWriterLeavesOldFileAndRemovesTemp) {
  ScopedTempDir dir;
  const std::string path = dir.Child("state.json");
  WriteRaw(path, "old");
  {
    absl::StatusOr<std::unique_ptr<AtomicFileWriter>> writer =
        AtomicFileWriter::Create(path);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append(std::string(3 << 20, 'x')).ok());
    ASSERT_TRUE((*writer)->Append("tail").ok());
    EXPECT_EQ(ListNames(dir.path()).size(), 2u);  // old + temp
    struct stat st {};
    EXPECT_EQ(stat((*writer)->temp_path().c_str(), &st), 0);
  }
  EXPECT_EQ(*ReadFileToString(path), "old");
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("state.json"));
}

TEST(AtomicFileTest, MixedAppendSizesArriveInOrder) {
  ScopedTempDir dir;
  const std::string path = dir.Child("big.bin");
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> writer =
      AtomicFileWriter::Create(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::string expected;
  for (size_t size : {1u, 100u, 1u << 20, 7u, (1u << 20) - 3, 5u << 20, 3u}) {
    std::string piece(size, static_cast<char>('a' + expected.size() % 26));
    ASSERT_TRUE((*writer)->Append(piece).ok());
    expected += piece;
  }
  EXPECT_EQ((*writer)->size(), expected.size());
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(*ReadFileToString(path), expected);
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("big.bin"));
}

TEST(AtomicFileTest, UseAfterCommitIsFailedPrecondition) {
  ScopedTempDir dir;
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> writer =
      AtomicFileWriter::Create(dir.Child("a"));
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ((*writer)->Append("x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ReadFileToString(dir.Child("a")), "");
}

TEST(AtomicFileTest, FailedRenameLeavesOldAndRemovesTemp) {
  ScopedTempDir dir;
  // A non-empty directory in the way: rename(2) fails.
  const std::string path = dir.Child("blocked");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  WriteRaw(path + "/keep", "kept");
  absl::Status status = WriteFileAtomically(path, "new");
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("cannot rename"));
  EXPECT_THAT(status.message(), HasSubstr(path));
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("blocked"));
  EXPECT_EQ(*ReadFileToString(path + "/keep"), "kept");
}

TEST(AtomicFileTest, FailedWriteLeavesOldAndRemovesTemp) {
  ScopedTempDir dir;
  const std::string path = dir.Child("model.bin");
  WriteRaw(path, "old model");
  // A file size limit makes write(2) fail with EFBIG (SIGXFSZ ignored).
  struct rlimit old_limit {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &old_action), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status status =
      WriteFileAtomically(path, std::string(4 << 20, 'z'));
  setrlimit(RLIMIT_FSIZE, &old_limit);
  sigaction(SIGXFSZ, &old_action, nullptr);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("cannot write"));
  EXPECT_THAT(status.message(), HasSubstr(".model.bin.tmp."));
  EXPECT_EQ(*ReadFileToString(path), "old model");
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("model.bin"));
}

TEST(AtomicFileTest, MissingDirectoryIsNotFound) {
  ScopedTempDir dir;
  const std::string path = dir.Child("no/such/dir/a.txt");
  absl::Status status = WriteFileAtomically(path, "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(path));
}

TEST(AtomicFileTest, ReadMissingFileIsNotFound) {
  ScopedTempDir dir;
  absl::StatusOr<std::string> read = ReadFileToString(dir.Child("missing"));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr(dir.Child("missing")));
}

TEST(AtomicFileTest, FsyncDirectory) {
  ScopedTempDir dir;
  EXPECT_TRUE(FsyncDirectory(dir.path()).ok());
  absl::Status missing = FsyncDirectory(dir.Child("missing"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr(dir.Child("missing")));
}

}  // namespace
}  // namespace swarm::persist
