#include "persist/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/atomic_file.h"
#include "persist/file_util.h"
#include "persist/test_util.h"

namespace swarm::persist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testutil::ListNames;
using testutil::ScopedTempDir;
using testutil::WriteRaw;

TEST(MappedFileTest, MapsContents) {
  ScopedTempDir dir;
  const std::string path = dir.Child("f.bin");
  const std::string contents =
      std::string("abc\0def", 7) + std::string(10000, 'q');
  WriteRaw(path, contents);
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->data(), contents);
  EXPECT_EQ((*file)->size(), contents.size());
  EXPECT_EQ((*file)->path(), path);
}

TEST(MappedFileTest, EmptyFileIsEmptyView) {
  ScopedTempDir dir;
  WriteRaw(dir.Child("empty"), "");
  absl::StatusOr<std::unique_ptr<MappedFile>> file =
      MappedFile::Open(dir.Child("empty"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), 0u);
  EXPECT_TRUE((*file)->data().empty());
}

TEST(MappedFileTest, MissingFileIsNotFound) {
  ScopedTempDir dir;
  absl::StatusOr<std::unique_ptr<MappedFile>> file =
      MappedFile::Open(dir.Child("missing"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr(dir.Child("missing")));
}

TEST(MappedFileTest, DirectoryIsRefused) {
  ScopedTempDir dir;
  absl::StatusOr<std::unique_ptr<MappedFile>> file =
      MappedFile::Open(dir.path());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(file.status().message(), HasSubstr("not a regular file"));
}

TEST(MappedFileTest, MappingSurvivesReplacementByRename) {
  ScopedTempDir dir;
  const std::string path = dir.Child("global.safetensors");
  WriteRaw(path, "version one");
  absl::StatusOr<std::unique_ptr<MappedFile>> old_file = MappedFile::Open(path);
  ASSERT_TRUE(old_file.ok());
  ASSERT_TRUE(WriteFileAtomically(path, "version two, longer").ok());
  EXPECT_EQ((*old_file)->data(), "version one");
  EXPECT_EQ((*MappedFile::Open(path))->data(), "version two, longer");
}

TEST(WritableMappedFileTest, WriteAndCommit) {
  ScopedTempDir dir;
  const std::string path = dir.Child("offload-1.bin");
  const uint64_t size = 3 * 4096 + 17;
  absl::StatusOr<std::unique_ptr<WritableMappedFile>> file =
      WritableMappedFile::Create(path, size);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), size);
  EXPECT_EQ((*file)->final_path(), path);
  EXPECT_TRUE(IsTempFileName(BaseName((*file)->temp_path())))
      << (*file)->temp_path();
  // Not visible under its final name before Commit().
  EXPECT_THAT(ListNames(dir.path()),
              ElementsAre(BaseName((*file)->temp_path())));
  // Space is reserved and zero-filled.
  struct stat st {};
  ASSERT_EQ(stat((*file)->temp_path().c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), size);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, size);
  std::string expected(size, '\0');
  for (uint64_t i = 0; i < size; ++i) {
    EXPECT_EQ((*file)->data()[i], 0) << i;
    if ((*file)->data()[i] != 0) break;
    expected[i] = static_cast<char>(i * 31 + 7);
  }
  std::memcpy((*file)->data(), expected.data(), size);
  absl::StatusOr<std::unique_ptr<MappedFile>> committed = (*file)->Commit();
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ((*committed)->data(), expected);
  EXPECT_EQ((*committed)->path(), path);
  file->reset();  // Destroying after Commit() must not remove the file.
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("offload-1.bin"));
  EXPECT_EQ(*ReadFileToString(path), expected);
}

TEST(WritableMappedFileTest, ZeroSize) {
  ScopedTempDir dir;
  const std::string path = dir.Child("zero.bin");
  absl::StatusOr<std::unique_ptr<WritableMappedFile>> file =
      WritableMappedFile::Create(path, 0);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_NE((*file)->data(), nullptr);
  std::memcpy((*file)->data(), "", 0);
  absl::StatusOr<std::unique_ptr<MappedFile>> committed = (*file)->Commit();
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ((*committed)->size(), 0u);
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("zero.bin"));
}

TEST(WritableMappedFileTest, DestroyWithoutCommitRemovesTempKeepsOld) {
  ScopedTempDir dir;
  const std::string path = dir.Child("result.bin");
  WriteRaw(path, "old");
  {
    absl::StatusOr<std::unique_ptr<WritableMappedFile>> file =
        WritableMappedFile::Create(path, 8192);
    ASSERT_TRUE(file.ok()) << file.status();
    std::memset((*file)->data(), 'n', 8192);
    EXPECT_EQ(ListNames(dir.path()).size(), 2u);
  }
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("result.bin"));
  EXPECT_EQ(*ReadFileToString(path), "old");
}

TEST(WritableMappedFileTest, CommitReplacesOldFile) {
  ScopedTempDir dir;
  const std::string path = dir.Child("result.bin");
  WriteRaw(path, "old contents that are longer");
  absl::StatusOr<std::unique_ptr<WritableMappedFile>> file =
      WritableMappedFile::Create(path, 3);
  ASSERT_TRUE(file.ok());
  std::memcpy((*file)->data(), "new", 3);
  ASSERT_TRUE((*file)->Commit().ok());
  EXPECT_EQ(*ReadFileToString(path), "new");
  absl::StatusOr<std::unique_ptr<MappedFile>> again = (*file)->Commit();
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ReadFileToString(path), "new");
}

TEST(WritableMappedFileTest, FailedCommitRemovesTemp) {
  ScopedTempDir dir;
  const std::string path = dir.Child("blocked");
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  WriteRaw(path + "/keep", "kept");
  absl::StatusOr<std::unique_ptr<WritableMappedFile>> file =
      WritableMappedFile::Create(path, 16);
  ASSERT_TRUE(file.ok());
  absl::StatusOr<std::unique_ptr<MappedFile>> committed = (*file)->Commit();
  ASSERT_FALSE(committed.ok());
  EXPECT_THAT(committed.status().message(), HasSubstr("cannot rename"));
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("blocked"));
  file->reset();
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("blocked"));
}

TEST(WritableMappedFileTest, MissingDirectoryIsNotFound) {
  ScopedTempDir dir;
  absl::StatusOr<std::unique_ptr<WritableMappedFile>> file =
      WritableMappedFile::Create(dir.Child("nope/x.bin"), 10);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr(dir.Child("nope/x.bin")));
}

TEST(WritableMappedFileTest, FileSizeLimitFailsCreateNamingPathAndSize) {
  ScopedTempDir dir;
  const std::string path = dir.Child("huge.bin");
  struct rlimit old_limit {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &old_action), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::StatusOr<std::unique_ptr<WritableMappedFile>> file =
      WritableMappedFile::Create(path, 8 << 20);
  setrlimit(RLIMIT_FSIZE, &old_limit);
  sigaction(SIGXFSZ, &old_action, nullptr);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr(path));
  EXPECT_THAT(file.status().message(), HasSubstr("8388608 bytes"));
  EXPECT_TRUE(ListNames(dir.path()).empty());
}

// ENOSPC needs a file system that refuses a too-large fallocate quickly; a
// size-limited tmpfs does (without allocating anything). On ext4 the kernel
// would fill the disk first, so no such test runs there.
TEST(WritableMappedFileTest, DiskFullIsResourceExhaustedNamingPathAndSize) {
  const char* kShm = "/dev/shm";
  struct statfs fs {};
  struct statvfs vfs {};
  constexpr long kTmpfsMagic = 0x01021994;
  if (statfs(kShm, &fs) != 0 || fs.f_type != kTmpfsMagic ||
      statvfs(kShm, &vfs) != 0 || vfs.f_blocks == 0 ||
      access(kShm, W_OK) != 0) {
    GTEST_SKIP() << "no writable size-limited tmpfs at /dev/shm";
  }
  const uint64_t too_big =
      static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize * 2 + 4096;
  const std::string path = std::string(kShm) + "/swarm_persist_test_enospc_" +
                           std::to_string(getpid());
  absl::StatusOr<std::unique_ptr<WritableMappedFile>> file =
      WritableMappedFile::Create(path, too_big);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kResourceExhausted)
      << file.status();
  EXPECT_THAT(file.status().message(), HasSubstr(path));
  EXPECT_THAT(file.status().message(), HasSubstr(std::to_string(too_big)));
  for (const std::string& name : ListNames(kShm)) {
    EXPECT_EQ(
        name.find("swarm_persist_test_enospc_" + std::to_string(getpid())),
        std::string::npos)
        << "leftover " << name;
  }
}

TEST(MappedFileTest, MapsASparseFilePastFourGiB) {
  constexpr uint64_t kSize = (5ull << 30) + 3;
  constexpr uint64_t kMarkAt = (4ull << 30) + 12;
  ScopedTempDir dir;
  const std::string path = dir.Child("sparse.bin");
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kSize)), 0);
  ASSERT_EQ(pwrite(fd, "high", 4, static_cast<off_t>(kMarkAt)), 4);
  ASSERT_EQ(pwrite(fd, "end", 3, static_cast<off_t>(kSize - 3)), 3);
  close(fd);
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), kSize);
  EXPECT_EQ((*file)->data().size(), kSize);
  EXPECT_EQ((*file)->data().substr(kMarkAt, 4), "high");
  EXPECT_EQ((*file)->data().substr(kMarkAt - (4ull << 30), 4),
            std::string(4, '\0'));
  EXPECT_EQ((*file)->data().substr(kSize - 3), "end");
}

}  // namespace
}  // namespace swarm::persist
