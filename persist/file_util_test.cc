#include "persist/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "persist/test_util.h"

namespace swarm::persist {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(FileUtilTest, DirNameAndBaseName) {
  EXPECT_EQ(DirName("a/b/c.txt"), "a/b");
  EXPECT_EQ(DirName("c.txt"), ".");
  EXPECT_EQ(DirName("/c.txt"), "/");
  EXPECT_EQ(BaseName("a/b/c.txt"), "c.txt");
  EXPECT_EQ(BaseName("c.txt"), "c.txt");
  EXPECT_EQ(BaseName("a/b/"), "");
}

TEST(FileUtilTest, TempFileNames) {
  EXPECT_TRUE(IsTempFileName(".global.safetensors.tmp.1234.0123456789abcdef"));
  EXPECT_TRUE(IsTempFileName(".x.tmp.1.ffffffffffffffff"));
  EXPECT_FALSE(IsTempFileName("global.safetensors"));
  EXPECT_FALSE(IsTempFileName(".global.safetensors"));
  EXPECT_FALSE(IsTempFileName("x.tmp.1234.0123456789abcdef"));   // No dot.
  EXPECT_FALSE(IsTempFileName(".x.tmp.12a4.0123456789abcdef"));  // Bad pid.
  EXPECT_FALSE(IsTempFileName(".x.tmp.1234.0123456789abcde"));   // 15 hex.
  EXPECT_FALSE(IsTempFileName(".x.tmp.1234.0123456789abcdeg"));  // Not hex.
  EXPECT_FALSE(IsTempFileName(".tmp.1234.0123456789abcdef"));    // No base.
  EXPECT_FALSE(IsTempFileName(".x.tmq.1234.0123456789abcdef"));
}

TEST(FileUtilTest, CreateTempSiblingMakesRecognisableUniqueNames) {
  testutil::ScopedTempDir dir;
  const std::string final_path = dir.Child("model.safetensors");
  absl::StatusOr<TempFile> a = CreateTempSibling(final_path);
  absl::StatusOr<TempFile> b = CreateTempSibling(final_path);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->path, b->path);
  EXPECT_THAT(a->path, StartsWith(dir.Child(".model.safetensors.tmp.")));
  EXPECT_TRUE(IsTempFileName(BaseName(a->path))) << a->path;
  EXPECT_TRUE(CloseFd(a->fd, a->path).ok());
  EXPECT_TRUE(CloseFd(b->fd, b->path).ok());
  EXPECT_EQ(testutil::ListNames(dir.path()).size(), 2u);
}

TEST(FileUtilTest, CreateTempSiblingErrorsNameThePath) {
  absl::StatusOr<TempFile> missing =
      CreateTempSibling("/nonexistent-dir-swarm/x.bin");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("/nonexistent-dir-swarm/x.bin"));
  absl::StatusOr<TempFile> dir_path = CreateTempSibling("/tmp/");
  ASSERT_FALSE(dir_path.ok());
  EXPECT_EQ(dir_path.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FileUtilTest, ErrnoErrorMapsCodes) {
  EXPECT_EQ(ErrnoError(ENOSPC, "write", "/x").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoError(ENOENT, "open", "/x").code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(ErrnoError(EACCES, "cannot open", "/x/y").message(),
              HasSubstr("cannot open /x/y: "));
}

// Linux moves at most 0x7ffff000 bytes per write(2): a larger buffer takes
// several calls. /dev/null never reads the (untouched, unbacked) buffer.
TEST(FileUtilTest, WriteFullyTakesSeveralCallsPastTwoGiB) {
  constexpr size_t kBytes = (3ull << 30) + 5;
  void* mapped = mmap(nullptr, kBytes, PROT_READ,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  const int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  absl::Status status = WriteFully(
      fd, absl::string_view(static_cast<const char*>(mapped), kBytes),
      "/dev/null");
  EXPECT_TRUE(status.ok()) << status;
  close(fd);
  munmap(mapped, kBytes);
}

}  // namespace
}  // namespace swarm::persist
