#include "persist/safetensors.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

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

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string Le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}

// A file image: length prefix, `json`, `data`.
std::string Image(const std::string& json, const std::string& data) {
  return Le64(json.size()) + json + data;
}

// Expects `result` to fail with `code` and a message containing every one of
// `substrings`.
template <typename T>
void ExpectError(const absl::StatusOr<T>& result, absl::StatusCode code,
                 std::vector<std::string> substrings) {
  ASSERT_FALSE(result.ok()) << "unexpectedly parsed";
  EXPECT_EQ(result.status().code(), code) << result.status();
  for (const std::string& s : substrings) {
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(s));
  }
}

absl::StatusOr<SafetensorsLayout> ParseImage(const std::string& image) {
  uint64_t data_start = 0;
  return ParseSafetensors(image, &data_start);
}

// ----------------------------------------------------------------- Round trip

struct Fixture {
  std::vector<TensorDecl> decls;
  std::vector<std::string> data;
};

Fixture MakeFixture() {
  Fixture f;
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  f.decls.push_back({"layer.0.weight", v1::DTYPE_F32, {2, 3}});
  f.data.push_back(Bytes<float>({1.5f, -0.0f, kNaN, kInf, -kInf, 1e-40f}));
  f.decls.push_back({"half", v1::DTYPE_F16, {3}});
  f.data.push_back(Bytes<uint16_t>({0x3C00, 0x8001, 0x7C00}));
  f.decls.push_back({"brain", v1::DTYPE_BF16, {2, 2}});
  f.data.push_back(Bytes<uint16_t>({0x3F80, 0xC000, 0x7FC1, 0x0001}));
  f.decls.push_back({"scalar.f64", v1::DTYPE_F64, {}});
  f.data.push_back(Bytes<double>({3.141592653589793}));
  f.decls.push_back({"empty", v1::DTYPE_F32, {0, 5}});
  f.data.push_back("");
  f.decls.push_back({"ints", v1::DTYPE_I32, {4}});
  f.data.push_back(Bytes<int32_t>({0, -1, INT32_MIN, INT32_MAX}));
  f.decls.push_back({"longs", v1::DTYPE_I64, {1, 3}});
  f.data.push_back(Bytes<int64_t>({INT64_MIN, INT64_MAX, 42}));
  f.decls.push_back({"bytes", v1::DTYPE_U8, {5}});
  f.data.push_back(Bytes<uint8_t>({0, 1, 127, 128, 255}));
  f.decls.push_back({"mask", v1::DTYPE_BOOL, {3}});
  f.data.push_back(Bytes<uint8_t>({1, 0, 1}));
  f.decls.push_back({"unicodé ✓", v1::DTYPE_U8, {1}});
  f.data.push_back("x");
  return f;
}

TEST(SafetensorsTest, RoundTripBitForBit) {
  ScopedTempDir dir;
  const std::string path = dir.Child("model.safetensors");
  const Fixture f = MakeFixture();
  const std::map<std::string, std::string> metadata = {
      {"job", "mnist"}, {"round", "12"}, {"metric", "0.97"}, {"empty", ""}};
  absl::StatusOr<SafetensorsLayout> layout =
      MakeSafetensorsLayout(f.decls, metadata);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<absl::string_view> views(f.data.begin(), f.data.end());
  ASSERT_TRUE(WriteSafetensorsFile(path, *layout, views).ok());
  EXPECT_THAT(ListNames(dir.path()), ElementsAre("model.safetensors"));

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsLayout& read = (*file)->layout();
  EXPECT_EQ(read.metadata, metadata);
  EXPECT_EQ(read.data_size, layout->data_size);
  EXPECT_EQ((*file)->data_start() % 8, 0u);
  ASSERT_EQ(read.tensors.size(), f.decls.size());
  for (size_t i = 0; i < f.decls.size(); ++i) {
    SCOPED_TRACE(f.decls[i].name);
    EXPECT_EQ(read.tensors[i].name, f.decls[i].name);
    EXPECT_EQ(read.tensors[i].dtype, f.decls[i].dtype);
    EXPECT_EQ(read.tensors[i].shape, f.decls[i].shape);
    EXPECT_EQ(read.tensors[i].begin, layout->tensors[i].begin);
    EXPECT_EQ(read.tensors[i].end, layout->tensors[i].end);
    EXPECT_EQ((*file)->tensor_data(i), f.data[i]);
    EXPECT_EQ((*file)->FindTensor(f.decls[i].name), i);
  }
  EXPECT_EQ((*file)->FindTensor("nope"), std::nullopt);

  // The file is exactly prefix + tensor bytes.
  std::string expected = *EncodeSafetensorsPrefix(*layout);
  for (const std::string& d : f.data) expected += d;
  EXPECT_EQ(*ReadFileToString(path), expected);
  EXPECT_EQ((*file)->file().data(), expected);

  // The mapping can outlive the SafetensorsFile.
  std::unique_ptr<MappedFile> mapping = (*file)->ReleaseFile();
  file->reset();
  EXPECT_EQ(mapping->data(), expected);
}

TEST(SafetensorsTest, EmptyModels) {
  for (const std::map<std::string, std::string>& metadata :
       {std::map<std::string, std::string>{},
        std::map<std::string, std::string>{{"job", "j"}}}) {
    absl::StatusOr<SafetensorsLayout> layout =
        MakeSafetensorsLayout({}, metadata);
    ASSERT_TRUE(layout.ok());
    absl::StatusOr<std::string> prefix = EncodeSafetensorsPrefix(*layout);
    ASSERT_TRUE(prefix.ok());
    EXPECT_EQ(prefix->size() % 8, 0u);
    absl::StatusOr<SafetensorsLayout> parsed = ParseImage(*prefix);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(parsed->tensors.empty());
    EXPECT_EQ(parsed->metadata, metadata);
  }
  EXPECT_TRUE(ParseImage(Image("{}", "")).ok());
  EXPECT_TRUE(ParseSafetensorsHeader("{}", 0).ok());
}

TEST(SafetensorsTest, AcceptsSpacePaddingAndAnyKeyOrder) {
  const std::string json =
      R"({"b":{"data_offsets":[4,8],"shape":[1],"dtype":"F32"},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}    )";
  absl::StatusOr<SafetensorsLayout> layout =
      ParseImage(Image(json, std::string(8, '\1')));
  ASSERT_TRUE(layout.ok()) << layout.status();
  ASSERT_EQ(layout->tensors.size(), 2u);
  EXPECT_EQ(layout->tensors[0].name, "a");  // Sorted by offset.
  EXPECT_EQ(layout->tensors[1].name, "b");
}

TEST(SafetensorsTest, ZeroSizeTensorsShareOffsets) {
  const std::string json =
      R"({"z1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("z0":{"dtype":"I64","shape":[3,0],"data_offsets":[4,4]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  absl::StatusOr<SafetensorsLayout> layout = ParseSafetensorsHeader(json, 8);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<std::string> names;
  for (const SafetensorsTensor& t : layout->tensors) names.push_back(t.name);
  EXPECT_THAT(names, ElementsAre("a", "z0", "z1", "b"));
}

// --------------------------------------------------------------- Bad inputs

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kDataLoss = absl::StatusCode::kDataLoss;

TEST(SafetensorsBadInputTest, FileShorterThanLengthPrefix) {
  ExpectError(ParseImage("abc"), kDataLoss,
              {"truncated", "3 bytes", "8-byte header length"});
  ExpectError(ParseImage(""), kDataLoss, {"truncated", "0 bytes"});
}

TEST(SafetensorsBadInputTest, DataSectionShorterThanHeaderClaims) {
  const std::string json =
      R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  ExpectError(
      ParseImage(Image(json, std::string(10, 'x'))), kDataLoss,
      {"data section truncated", "\"w\"", "ends at byte 16", "only 10 bytes"});
}

TEST(SafetensorsBadInputTest, TruncatedFileOnDiskNamesPath) {
  ScopedTempDir dir;
  const std::string path = dir.Child("t.safetensors");
  absl::StatusOr<SafetensorsLayout> layout =
      MakeSafetensorsLayout({{"w", v1::DTYPE_F64, {4}}}, {});
  ASSERT_TRUE(layout.ok());
  std::string image = *EncodeSafetensorsPrefix(*layout) + std::string(32, 'a');
  ASSERT_TRUE(ParseImage(image).ok());
  image.resize(image.size() - 1);
  WriteRaw(path, image);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(path);
  ExpectError(file, kDataLoss, {path, "data section truncated"});
}

TEST(SafetensorsBadInputTest, HeaderLengthExceedsFile) {
  ExpectError(ParseImage(Le64(100) + "{}"), kDataLoss,
              {"header length 100", "exceeds the 2 bytes"});
}

TEST(SafetensorsBadInputTest, OversizeHeader) {
  // Only the 8-byte length: the limit is checked before anything is read.
  ExpectError(ParseImage(Le64(kMaxSafetensorsHeaderBytes + 1)), kInvalid,
              {"oversize header", "100000001"});
  ExpectError(ParseImage(Le64(UINT64_MAX) + "{}"), kInvalid,
              {"oversize header"});
}

TEST(SafetensorsBadInputTest, MalformedJson) {
  ExpectError(ParseImage(Image(R"({"w": {"dtype": )", "")), kInvalid,
              {"malformed JSON", "parse error"});
  ExpectError(ParseSafetensorsHeader(R"({"a":1} x)", 0), kInvalid,
              {"malformed JSON"});
  ExpectError(ParseSafetensorsHeader("{\"a\xff\":1}", 0), kInvalid,
              {"malformed JSON"});
  ExpectError(ParseSafetensorsHeader(std::string("{\"a\":\0}", 7), 0), kInvalid,
              {"malformed JSON"});
}

TEST(SafetensorsBadInputTest, HeaderNotAnObject) {
  ExpectError(ParseSafetensorsHeader("[1, 2]", 0), kInvalid,
              {"does not start with '{'"});
  ExpectError(ParseSafetensorsHeader(" {}", 0), kInvalid,
              {"does not start with '{'"});
  ExpectError(ParseSafetensorsHeader("", 0), kInvalid,
              {"does not start with '{'"});
}

TEST(SafetensorsBadInputTest, DeepNesting) {
  ExpectError(ParseSafetensorsHeader("{\"a\":" + std::string(100000, '['), 0),
              kInvalid, {"nests deeper than"});
}

TEST(SafetensorsBadInputTest, OverlappingOffsets) {
  const std::string json =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  ExpectError(ParseSafetensorsHeader(json, 12), kInvalid,
              {"tensor \"b\"", "[4, 12]", "overlap", "tensor \"a\"", "[0, 8]"});
}

TEST(SafetensorsBadInputTest, ZeroSizeTensorInsideAnotherOverlaps) {
  const std::string json =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  ExpectError(ParseSafetensorsHeader(json, 8), kInvalid,
              {"tensor \"z\"", "overlap"});
}

TEST(SafetensorsBadInputTest, OutOfBoundsOffsets) {
  const std::string json =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  ExpectError(ParseSafetensorsHeader(json, 12), kInvalid,
              {"tensor \"b\"", "[8, 16]", "out of bounds", "12-byte"});
  const std::string huge =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,)"
      R"(18446744073709551615]}})";
  ExpectError(ParseSafetensorsHeader(huge, 1), kInvalid, {"gap of"});
}

TEST(SafetensorsBadInputTest, GapBetweenTensors) {
  const std::string json =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})";
  ExpectError(
      ParseSafetensorsHeader(json, 24), kInvalid,
      {"gap of 8 bytes", "tensor \"a\"", "tensor \"b\"", "begins at 16"});
}

TEST(SafetensorsBadInputTest, GapBeforeFirstTensor) {
  const std::string json =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  ExpectError(ParseSafetensorsHeader(json, 16), kInvalid,
              {"gap of 8 bytes", "before the first", "tensor \"a\""});
}

TEST(SafetensorsBadInputTest, GapAfterLastTensor) {
  const std::string json =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ExpectError(ParseSafetensorsHeader(json, 12), kInvalid,
              {"gap of 4 bytes", "after the last", "tensor \"a\""});
  ExpectError(ParseImage(Image(json, std::string(12, 'x'))), kInvalid,
              {"gap of 4 bytes", "after the last"});
  ExpectError(ParseImage(Image("{}", "x")), kInvalid,
              {"gap of 1 bytes", "no tensor covers them"});
}

TEST(SafetensorsBadInputTest, ByteRangeDoesNotMatchShapeTimesDtype) {
  const std::string json =
      R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})";
  ExpectError(ParseSafetensorsHeader(json, 12), kInvalid,
              {"tensor \"w\"", "span 12 bytes", "shape [2, 2] of F32",
               "needs 16 bytes"});
}

TEST(SafetensorsBadInputTest, UnknownDtype) {
  const std::string json =
      R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})";
  ExpectError(ParseSafetensorsHeader(json, 4), kInvalid,
              {"tensor \"w\"", "unknown dtype \"F33\""});
}

TEST(SafetensorsBadInputTest, DuplicateTensorNames) {
  const std::string json =
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  ExpectError(ParseSafetensorsHeader(json, 8), kInvalid,
              {"duplicate tensor name \"w\""});
}

TEST(SafetensorsBadInputTest, DuplicateFieldInEntry) {
  const std::string json =
      R"({"w":{"dtype":"F32","dtype":"F64","shape":[1],"data_offsets":[0,4]}})";
  ExpectError(ParseSafetensorsHeader(json, 4), kInvalid,
              {"duplicate field \"dtype\"", "\"w\""});
}

TEST(SafetensorsBadInputTest, BadMetadata) {
  ExpectError(ParseSafetensorsHeader(R"({"__metadata__":[1]})", 0), kInvalid,
              {"__metadata__ is not a JSON object"});
  ExpectError(ParseSafetensorsHeader(R"({"__metadata__":null})", 0), kInvalid,
              {"__metadata__ is not a JSON object"});
  ExpectError(ParseSafetensorsHeader(R"({"__metadata__":{"round":12}})", 0),
              kInvalid,
              {"__metadata__ value of key \"round\" is not a string"});
  ExpectError(
      ParseSafetensorsHeader(R"({"__metadata__":{"a":"1","a":"2"}})", 0),
      kInvalid, {"duplicate field \"a\"", "__metadata__"});
}

TEST(SafetensorsBadInputTest, OverflowingShape) {
  const std::string json =
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
      R"("data_offsets":[0,0]}})";
  ExpectError(ParseSafetensorsHeader(json, 0), kInvalid,
              {"tensor \"w\"", "overflows 64 bits"});
  const std::string bytes_overflow =
      R"({"w":{"dtype":"F64","shape":[2305843009213693952],)"
      R"("data_offsets":[0,0]}})";
  ExpectError(ParseSafetensorsHeader(bytes_overflow, 0), kInvalid,
              {"tensor \"w\"", "overflows 64 bits"});
  // Beyond uint64: the JSON number is not an integer any more.
  const std::string too_big =
      R"({"w":{"dtype":"F32","shape":[18446744073709551616],)"
      R"("data_offsets":[0,0]}})";
  ExpectError(ParseSafetensorsHeader(too_big, 0), kInvalid,
              {"\"shape\" element 0", "not a non-negative integer"});
}

TEST(SafetensorsBadInputTest, EntryNotAnObject) {
  ExpectError(ParseSafetensorsHeader(R"({"w":[1,2]})", 0), kInvalid,
              {"tensor \"w\"", "entry is not a JSON object"});
}

TEST(SafetensorsBadInputTest, MissingField) {
  ExpectError(ParseSafetensorsHeader(R"({"w":{"dtype":"F32","shape":[1]}})", 0),
              kInvalid, {"tensor \"w\"", "missing field \"data_offsets\""});
}

TEST(SafetensorsBadInputTest, ExtraField) {
  ExpectError(
      ParseSafetensorsHeader(
          R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4),
      kInvalid, {"tensor \"w\"", "unexpected field \"x\""});
}

TEST(SafetensorsBadInputTest, WrongFieldTypes) {
  ExpectError(ParseSafetensorsHeader(
                  R"({"w":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", 4),
              kInvalid, {"tensor \"w\"", "\"dtype\" is not a string"});
  ExpectError(ParseSafetensorsHeader(
                  R"({"w":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", 4),
              kInvalid, {"\"shape\" is not an array"});
  ExpectError(
      ParseSafetensorsHeader(
          R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
      kInvalid, {"\"shape\" element 0 (-1) is not a non-negative integer"});
  ExpectError(
      ParseSafetensorsHeader(
          R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4),
      kInvalid, {"\"shape\" element 0", "not a non-negative integer"});
  ExpectError(
      ParseSafetensorsHeader(
          R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4),
      kInvalid, {"\"data_offsets\" is not an array [begin, end]"});
  ExpectError(
      ParseSafetensorsHeader(
          R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", 4),
      kInvalid, {"\"data_offsets\" is not an array [begin, end]"});
  ExpectError(
      ParseSafetensorsHeader(
          R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
      kInvalid, {"\"data_offsets\" is not an array [begin, end]"});
}

TEST(SafetensorsBadInputTest, BeginAfterEnd) {
  ExpectError(
      ParseSafetensorsHeader(
          R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8),
      kInvalid, {"tensor \"w\"", "[8, 4]", "begin > end"});
}

// Hostile input: random corruptions of a valid image are refused or parsed,
// never crash, and whatever parses again tiles the data section exactly.
TEST(SafetensorsBadInputTest, RandomCorruptionsNeverCrash) {
  const Fixture f = MakeFixture();
  absl::StatusOr<SafetensorsLayout> layout =
      MakeSafetensorsLayout(f.decls, {{"job", "j"}});
  ASSERT_TRUE(layout.ok());
  std::string valid = *EncodeSafetensorsPrefix(*layout);
  for (const std::string& d : f.data) valid += d;
  std::mt19937_64 rng(12345);
  int parsed = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::string image = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % image.size();
      switch (rng() % 4) {
        case 0:
          image[pos] = static_cast<char>(rng());
          break;
        case 1:
          image.erase(pos, 1 + rng() % 8);
          break;
        case 2:
          image.insert(pos, 1, "{}[]\",:0123456789-"[rng() % 18]);
          break;
        default:
          image.resize(pos);
          break;
      }
      if (image.empty()) break;
    }
    uint64_t data_start = 0;
    absl::StatusOr<SafetensorsLayout> result =
        ParseSafetensors(image, &data_start);
    if (!result.ok()) {
      EXPECT_TRUE(result.status().code() ==
                      absl::StatusCode::kInvalidArgument ||
                  result.status().code() == absl::StatusCode::kDataLoss)
          << result.status();
      continue;
    }
    ++parsed;
    EXPECT_EQ(data_start + result->data_size, image.size());
    uint64_t position = 0;
    for (const SafetensorsTensor& t : result->tensors) {
      EXPECT_EQ(t.begin, position);
      position = t.end;
    }
    EXPECT_EQ(position, result->data_size);
  }
  EXPECT_GT(parsed, 0);  // Edits inside tensor bytes keep the file valid.
}

// ------------------------------------------------------------ Writing rules

TEST(SafetensorsWriteTest, RejectsBadLayouts) {
  ExpectError(MakeSafetensorsLayout(
                  {{"w", v1::DTYPE_F32, {1}}, {"w", v1::DTYPE_F32, {1}}}, {}),
              kInvalid, {"duplicate tensor name \"w\""});
  ExpectError(MakeSafetensorsLayout({{"__metadata__", v1::DTYPE_F32, {1}}}, {}),
              kInvalid, {"reserved"});
  ExpectError(MakeSafetensorsLayout({{"bad\xff", v1::DTYPE_F32, {1}}}, {}),
              kInvalid, {"not valid UTF-8"});
  ExpectError(MakeSafetensorsLayout({{"w", v1::DTYPE_UNSPECIFIED, {1}}}, {}),
              kInvalid, {"tensor \"w\"", "unknown dtype value 0"});
  ExpectError(MakeSafetensorsLayout(
                  {{"w", v1::DTYPE_U8, {1ull << 32, 1ull << 32}}}, {}),
              kInvalid, {"tensor \"w\"", "overflows 64 bits"});
  ExpectError(MakeSafetensorsLayout({{"a", v1::DTYPE_U8, {1ull << 63}},
                                     {"b", v1::DTYPE_U8, {1ull << 63}}},
                                    {}),
              kInvalid, {"tensor \"b\"", "overflows 64 bits"});
  ExpectError(MakeSafetensorsLayout({}, {{"k", "bad\xc0"}}), kInvalid,
              {"__metadata__ entry \"k\"", "not valid UTF-8"});
}

TEST(SafetensorsWriteTest, EncodeValidatesLayout) {
  absl::StatusOr<SafetensorsLayout> layout = MakeSafetensorsLayout(
      {{"a", v1::DTYPE_F32, {2}}, {"b", v1::DTYPE_F32, {2}}}, {});
  ASSERT_TRUE(layout.ok());
  SafetensorsLayout overlap = *layout;
  overlap.tensors[1].begin = 4;
  overlap.tensors[1].end = 12;
  overlap.data_size = 12;
  ExpectError(EncodeSafetensorsPrefix(overlap), kInvalid, {"overlap"});
  SafetensorsLayout short_data = *layout;
  short_data.data_size = 12;
  ExpectError(EncodeSafetensorsPrefix(short_data), kInvalid, {"out of bounds"});
  SafetensorsLayout gap = *layout;
  gap.data_size = 20;
  ExpectError(EncodeSafetensorsPrefix(gap), kInvalid, {"gap of 4 bytes"});
  SafetensorsLayout mismatch = *layout;
  mismatch.tensors[1].shape = {3};
  ExpectError(EncodeSafetensorsPrefix(mismatch), kInvalid,
              {"tensor \"b\"", "needs 12 bytes"});
}

TEST(SafetensorsWriteTest, WrongDataSizeWritesNothing) {
  ScopedTempDir dir;
  const std::string path = dir.Child("m.safetensors");
  absl::StatusOr<SafetensorsLayout> layout =
      MakeSafetensorsLayout({{"a", v1::DTYPE_F32, {2}}}, {});
  ASSERT_TRUE(layout.ok());
  const std::string short_data(7, 'x');
  std::vector<absl::string_view> views = {short_data};
  ExpectError(absl::StatusOr<int>(WriteSafetensorsFile(path, *layout, views)),
              kInvalid, {"tensor \"a\"", "7 bytes", "needs 8"});
  ExpectError(absl::StatusOr<int>(WriteSafetensorsFile(path, *layout, {})),
              kInvalid, {"0 data buffers for 1 tensors"});
  EXPECT_TRUE(ListNames(dir.path()).empty());
}

TEST(SafetensorsWriteTest, PrefixIsPaddedWithSpaces) {
  for (int n = 1; n <= 9; ++n) {
    absl::StatusOr<SafetensorsLayout> layout = MakeSafetensorsLayout(
        {{std::string(n, 'n'), v1::DTYPE_U8, {static_cast<uint64_t>(n)}}}, {});
    ASSERT_TRUE(layout.ok());
    absl::StatusOr<std::string> prefix = EncodeSafetensorsPrefix(*layout);
    ASSERT_TRUE(prefix.ok());
    EXPECT_EQ(prefix->size() % 8, 0u);
    EXPECT_EQ(prefix->at(8), '{');
    const size_t close = prefix->rfind('}');
    EXPECT_EQ(prefix->find_first_not_of(' ', close + 1), std::string::npos);
    uint64_t data_start = 0;
    ASSERT_TRUE(
        ParseSafetensors(*prefix + std::string(n, 'd'), &data_start).ok());
    EXPECT_EQ(data_start, prefix->size());
  }
}

TEST(SafetensorsTest, OffsetsPastFourGiBRoundTripThroughTheHeader) {
  constexpr uint64_t kBig = 5ull << 30;
  absl::StatusOr<SafetensorsLayout> layout =
      MakeSafetensorsLayout({{"head", v1::DTYPE_U8, {16}},
                             {"big", v1::DTYPE_F32, {kBig / 4}},
                             {"tail", v1::DTYPE_U8, {8}}},
                            {});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->data_size, 16 + kBig + 8);
  absl::StatusOr<std::string> prefix = EncodeSafetensorsPrefix(*layout);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_THAT(*prefix, HasSubstr("[16,5368709136]"));
  absl::StatusOr<SafetensorsLayout> parsed =
      ParseSafetensorsHeader(prefix->substr(8), layout->data_size);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 3u);
  EXPECT_EQ(parsed->tensors[1].name, "big");
  EXPECT_EQ(parsed->tensors[1].begin, 16u);
  EXPECT_EQ(parsed->tensors[1].end, 16 + kBig);
  EXPECT_THAT(parsed->tensors[1].shape, ElementsAre(kBig / 4));
  EXPECT_EQ(parsed->tensors[2].begin, 16 + kBig);
  EXPECT_EQ(parsed->tensors[2].end, 16 + kBig + 8);
  // One byte short of the data section is a truncation, not a wrap-around.
  EXPECT_FALSE(
      ParseSafetensorsHeader(prefix->substr(8), layout->data_size - 1).ok());
}

}  // namespace
}  // namespace swarm::persist
