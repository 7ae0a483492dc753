#include "learner/idx_reader.h"

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class IdxReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/idx_reader_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // A header for unsigned-byte data of shape `dims`.
  static std::vector<uint8_t> Header(const std::vector<uint32_t>& dims,
                                     uint8_t type = 0x08) {
    std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
    for (uint32_t d : dims) {
      out.push_back(static_cast<uint8_t>(d >> 24));
      out.push_back(static_cast<uint8_t>(d >> 16));
      out.push_back(static_cast<uint8_t>(d >> 8));
      out.push_back(static_cast<uint8_t>(d));
    }
    return out;
  }

  static std::vector<uint8_t> Concat(std::vector<uint8_t> a,
                                     const std::vector<uint8_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  std::string WriteGz(const std::string& name,
                      const std::vector<uint8_t>& bytes) {
    const std::string path = Path(name);
    gzFile file = gzopen(path.c_str(), "wb");
    EXPECT_NE(file, nullptr);
    if (!bytes.empty()) {
      EXPECT_EQ(gzwrite(file, bytes.data(), bytes.size()),
                static_cast<int>(bytes.size()));
    }
    EXPECT_EQ(gzclose(file), Z_OK);
    return path;
  }

  std::string WritePlain(const std::string& name,
                         const std::vector<uint8_t>& bytes) {
    const std::string path = Path(name);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return path;
  }

  std::vector<uint8_t> ReadRaw(const std::string& path) {
    std::vector<uint8_t> out;
    std::FILE* f = std::fopen(path.c_str(), "rb");
    EXPECT_NE(f, nullptr);
    int c;
    while ((c = std::fgetc(f)) != EOF) out.push_back(static_cast<uint8_t>(c));
    std::fclose(f);
    return out;
  }

  static std::vector<uint8_t> Data(size_t n) {
    std::vector<uint8_t> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * 7 + 1);
    return out;
  }

  std::string dir_;
};

TEST_F(IdxReaderTest, ReadsGzipFile) {
  const std::string path =
      WriteGz("good.gz", Concat(Header({2, 2, 3}), Data(12)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->dims, ElementsAre(2, 2, 3));
  EXPECT_EQ(array->data, Data(12));
}

TEST_F(IdxReaderTest, ReadsPlainFile) {
  const std::string path = WritePlain("labels", Concat(Header({5}), Data(5)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->dims, ElementsAre(5));
  EXPECT_EQ(array->data, Data(5));
}

TEST_F(IdxReaderTest, MissingFileIsNotFound) {
  const std::string path = Path("nothing-here.gz");
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(array.status().message(), HasSubstr(path));
}

TEST_F(IdxReaderTest, BadHeadersAreDataLoss) {
  struct Case {
    std::string name;
    std::vector<uint8_t> bytes;
    std::string why;
  };
  std::vector<uint8_t> bad_magic = Concat(Header({3}), Data(3));
  bad_magic[0] = 0x1f;
  const std::vector<Case> cases = {
      {"magic.gz", bad_magic, "bad magic"},
      {"type.gz", Concat(Header({3}, 0x0d), Data(12)), "element type 0x0d"},
      {"nodims.gz", Header({}), "0 dimensions"},
      {"zero.gz", Header({0, 3}), "size 0"},
      {"huge.gz", Header({65536, 65536}), "more than"},
      {"empty.gz", {}, "header"},
      {"short-dims.gz", {0, 0, 8, 3, 0, 0, 0, 2}, "size of dimension 1"},
  };
  for (const Case& c : cases) {
    const std::string path = WriteGz(c.name, c.bytes);
    absl::StatusOr<IdxArray> array = ReadIdxFile(path);
    EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss) << c.name;
    EXPECT_THAT(array.status().message(), HasSubstr(path)) << c.name;
    EXPECT_THAT(array.status().message(), HasSubstr(c.why)) << c.name;
  }
}

TEST_F(IdxReaderTest, TruncatedDataIsDataLoss) {
  // The header promises 12 bytes; 7 follow.
  const std::string path =
      WriteGz("short.gz", Concat(Header({2, 2, 3}), Data(7)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr(path));
  EXPECT_THAT(array.status().message(), HasSubstr("truncated"));
}

TEST_F(IdxReaderTest, TruncatedGzipStreamIsDataLoss) {
  const std::string good =
      WriteGz("good.gz", Concat(Header({100, 10}), Data(1000)));
  std::vector<uint8_t> raw = ReadRaw(good);
  // Cut inside the deflate data, and separately just before the trailer.
  for (size_t keep : {raw.size() / 2, raw.size() - 8, raw.size() - 1}) {
    const std::string path = WritePlain(
        "cut.gz", std::vector<uint8_t>(raw.begin(), raw.begin() + keep));
    absl::StatusOr<IdxArray> array = ReadIdxFile(path);
    EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss) << keep;
    EXPECT_THAT(array.status().message(), HasSubstr(path)) << keep;
  }
}

TEST_F(IdxReaderTest, CorruptedGzipIsDataLoss) {
  const std::string good =
      WriteGz("good.gz", Concat(Header({100, 10}), Data(1000)));
  std::vector<uint8_t> raw = ReadRaw(good);
  // Flip a CRC byte (the trailer is CRC32 then size, 8 bytes).
  std::vector<uint8_t> bad_crc = raw;
  bad_crc[raw.size() - 8] ^= 0xff;
  std::string path = WritePlain("crc.gz", bad_crc);
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr(path));
  // Garble the deflate stream itself.
  std::vector<uint8_t> garbled = raw;
  for (size_t i = 12; i < 40 && i < raw.size() - 8; ++i) garbled[i] ^= 0x5a;
  path = WritePlain("garbled.gz", garbled);
  array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr(path));
}

TEST_F(IdxReaderTest, TrailingBytesAreDataLoss) {
  const std::string path = WriteGz("long.gz", Concat(Header({2, 3}), Data(9)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr("trailing bytes"));
}

}  // namespace
}  // namespace swarm
