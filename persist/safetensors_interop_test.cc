// Cross-checks the safetensors code against an independent Python reader and
// writer (persist/testdata/*.py: json + numpy, no safetensors package).
// Requires /usr/bin/python3 with python3-numpy; without them the test fails.
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "persist/atomic_file.h"
#include "persist/safetensors.h"
#include "persist/test_util.h"

#ifndef SWARM_SOURCE_DIR
#error "SWARM_SOURCE_DIR must name the source tree"
#endif

namespace swarm::persist {
namespace {

using Json = nlohmann::json;
using testutil::ScopedTempDir;

constexpr char kPython[] = "/usr/bin/python3";
constexpr char kInstallHint[] =
    "the safetensors interop test needs Debian's /usr/bin/python3 with NumPy: "
    "install python3-numpy (apt-get install -y python3-numpy)";

std::string ScriptPath(const std::string& name) {
  return std::string(SWARM_SOURCE_DIR) + "/persist/testdata/" + name;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs /usr/bin/python3 with `args`; never throws.
RunResult RunPython(const std::vector<std::string>& args,
                    const ScopedTempDir& dir) {
  RunResult result;
  const std::string err_path = dir.Child("python.stderr");
  std::string command = ShellQuote(kPython);
  for (const std::string& arg : args) command += " " + ShellQuote(arg);
  command += " 2>" + ShellQuote(err_path);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    result.err = "popen failed for: " + command;
    return result;
  }
  char buffer[65536];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    result.out.append(buffer, n);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  absl::StatusOr<std::string> err = ReadFileToString(err_path);
  if (err.ok()) result.err = *err;
  return result;
}

// Fails the test (not skips) when Python or NumPy is missing.
void RequirePythonWithNumpy(const ScopedTempDir& dir) {
  ASSERT_EQ(access(kPython, X_OK), 0)
      << kPython << " not found: " << kInstallHint;
  RunResult probe = RunPython({"-c", "import numpy"}, dir);
  ASSERT_EQ(probe.exit_code, 0)
      << "cannot import numpy in " << kPython << ": " << kInstallHint << "\n"
      << probe.err;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

double HalfToDouble(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) {
    return mantissa == 0 ? sign * std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  }
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

double Bf16ToDouble(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// The reader script's JSON form of a float: a number, or "nan"/"inf"/"-inf".
Json FloatJson(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

uint64_t DoubleBits(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// Compares one value printed by the reader script with the expected one,
// bit for bit for floats (so -0.0 != 0.0).
void ExpectSameValue(const Json& expected, const Json& actual,
                     const std::string& where) {
  if (expected.is_number_float()) {
    ASSERT_TRUE(actual.is_number()) << where << ": " << actual.dump();
    EXPECT_EQ(DoubleBits(expected.get<double>()),
              DoubleBits(actual.get<double>()))
        << where << ": expected " << expected.dump() << ", got "
        << actual.dump();
  } else if (expected.is_number_integer()) {
    ASSERT_TRUE(actual.is_number_integer()) << where << ": " << actual.dump();
    if (expected.is_number_unsigned() || actual.is_number_unsigned()) {
      EXPECT_EQ(expected.get<uint64_t>(), actual.get<uint64_t>()) << where;
    } else {
      EXPECT_EQ(expected.get<int64_t>(), actual.get<int64_t>()) << where;
    }
  } else {
    EXPECT_EQ(expected, actual) << where;  // Strings ("nan") and booleans.
  }
}

struct WrittenTensor {
  TensorDecl decl;
  std::string bytes;
  Json values;  // As the reader script prints them.
};

std::vector<WrittenTensor> CppTensors() {
  std::vector<WrittenTensor> t;
  const float kInf = std::numeric_limits<float>::infinity();
  {
    std::vector<float> v = {1.5f, -0.0f, std::nanf(""), kInf, -kInf, 1e-40f};
    Json values = Json::array();
    for (float x : v) values.push_back(FloatJson(x));
    t.push_back({{"layer.0.weight", v1::DTYPE_F32, {2, 3}}, Bytes(v), values});
  }
  {
    std::vector<uint16_t> v = {0x3C00, 0x8001, 0x7C00, 0xC000, 0x7BFF, 0x8000};
    Json values = Json::array();
    for (uint16_t x : v) values.push_back(FloatJson(HalfToDouble(x)));
    t.push_back({{"half", v1::DTYPE_F16, {3, 2}}, Bytes(v), values});
  }
  {
    std::vector<uint16_t> v = {0x3F80, 0xC000, 0x7F80, 0x0001, 0x8000};
    Json values = Json::array();
    for (uint16_t x : v) values.push_back(FloatJson(Bf16ToDouble(x)));
    t.push_back({{"brain", v1::DTYPE_BF16, {5}}, Bytes(v), values});
  }
  {
    std::vector<double> v = {3.141592653589793};
    t.push_back(
        {{"scalar.f64", v1::DTYPE_F64, {}}, Bytes(v), Json::array({v[0]})});
  }
  {
    std::vector<double> v = {-1e308, 5e-324, 0.1, -0.0};
    Json values = Json::array();
    for (double x : v) values.push_back(FloatJson(x));
    t.push_back({{"f64", v1::DTYPE_F64, {2, 2}}, Bytes(v), values});
  }
  t.push_back({{"empty", v1::DTYPE_F32, {0, 5}}, "", Json::array()});
  {
    std::vector<int32_t> v = {0, -1, INT32_MIN, INT32_MAX};
    Json values = Json::array();
    for (int32_t x : v) values.push_back(x);
    t.push_back({{"ints", v1::DTYPE_I32, {4}}, Bytes(v), values});
  }
  {
    std::vector<int64_t> v = {INT64_MIN, INT64_MAX, 42};
    Json values = Json::array();
    for (int64_t x : v) values.push_back(x);
    t.push_back({{"longs", v1::DTYPE_I64, {1, 3}}, Bytes(v), values});
  }
  {
    std::vector<uint8_t> v = {0, 1, 127, 128, 255};
    Json values = Json::array();
    for (uint8_t x : v) values.push_back(static_cast<int>(x));
    t.push_back({{"bytes", v1::DTYPE_U8, {5}}, Bytes(v), values});
  }
  {
    std::vector<uint8_t> v = {1, 0, 1};
    t.push_back({{"mask", v1::DTYPE_BOOL, {3}},
                 Bytes(v),
                 Json::array({true, false, true})});
  }
  {
    std::vector<float> v(1000);
    Json values = Json::array();
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<float>(i) * 0.37f - 123.0f;
      values.push_back(static_cast<double>(v[i]));
    }
    t.push_back(
        {{"w\xc3\xa9ight.big", v1::DTYPE_F32, {20, 50}}, Bytes(v), values});
  }
  return t;
}

TEST(SafetensorsInteropTest, PythonReadsWhatCppWrites) {
  ScopedTempDir dir;
  RequirePythonWithNumpy(dir);
  const std::vector<WrittenTensor> tensors = CppTensors();
  std::vector<TensorDecl> decls;
  std::vector<absl::string_view> data;
  for (const WrittenTensor& t : tensors) {
    decls.push_back(t.decl);
    data.push_back(t.bytes);
  }
  const std::map<std::string, std::string> metadata = {{"job", "mnist"},
                                                       {"round", "12"},
                                                       {"note",
                                                        "\xc3\xbcn\xc3\xaf"
                                                        "code \xe2\x9c\x93"}};
  absl::StatusOr<SafetensorsLayout> layout =
      MakeSafetensorsLayout(decls, metadata);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const std::string path = dir.Child("cpp.safetensors");
  ASSERT_TRUE(WriteSafetensorsFile(path, *layout, data).ok());

  RunResult run = RunPython({ScriptPath("read_safetensors.py"), path}, dir);
  ASSERT_EQ(run.exit_code, 0) << "read_safetensors.py failed:\n" << run.err;
  Json dump = Json::parse(run.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(dump.is_discarded()) << "unparseable output:\n" << run.out;
  ASSERT_TRUE(dump.is_object());

  EXPECT_EQ(dump["data_start"], (*SafetensorsFile::Open(path))->data_start());
  Json expected_metadata = Json::object();
  for (const auto& [k, v] : metadata) expected_metadata[k] = v;
  EXPECT_EQ(dump["metadata"], expected_metadata);

  const Json& read = dump["tensors"];
  ASSERT_TRUE(read.is_array());
  ASSERT_EQ(read.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WrittenTensor& want = tensors[i];
    const Json& got = read[i];
    SCOPED_TRACE(want.decl.name);
    ASSERT_TRUE(got.is_object());
    EXPECT_EQ(got["name"], want.decl.name);
    EXPECT_EQ(got["dtype"], std::string(DTypeName(want.decl.dtype)));
    EXPECT_EQ(got["shape"], Json(want.decl.shape));
    EXPECT_EQ(got["data_offsets"],
              Json::array({layout->tensors[i].begin, layout->tensors[i].end}));
    const Json& values = got["values"];
    ASSERT_TRUE(values.is_array());
    ASSERT_EQ(values.size(), want.values.size());
    for (size_t j = 0; j < values.size(); ++j) {
      ExpectSameValue(want.values[j], values[j],
                      want.decl.name + "[" + std::to_string(j) + "]");
    }
  }
}

struct ExpectedTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::string bytes;
};

// Exactly what persist/testdata/write_safetensors.py writes.
std::vector<ExpectedTensor> PythonTensors() {
  const float kInf = std::numeric_limits<float>::infinity();
  std::vector<ExpectedTensor> t;
  t.push_back(
      {"f32",
       v1::DTYPE_F32,
       {2, 3},
       Bytes<float>({1.5f, -0.0f, kInf, -kInf, 1e-40f, 3.4028235e38f})});
  t.push_back({"f32_nan",
               v1::DTYPE_F32,
               {2},
               Bytes<uint32_t>({0x7FC00001u, 0xFFC00000u})});
  // 1.0, -2.0, 65504.0, 2^-24, -0.0
  t.push_back({"f16",
               v1::DTYPE_F16,
               {5},
               Bytes<uint16_t>({0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000})});
  t.push_back({"f64",
               v1::DTYPE_F64,
               {2, 2},
               Bytes<double>({M_PI, -1e308, 5e-324, 0.1})});
  t.push_back({"i64",
               v1::DTYPE_I64,
               {4},
               Bytes<int64_t>({INT64_MIN, INT64_MAX, 0, -1})});
  t.push_back({"i32",
               v1::DTYPE_I32,
               {2, 3},
               Bytes<int32_t>({1, -2, 3, INT32_MAX, INT32_MIN, 0})});
  t.push_back({"u8", v1::DTYPE_U8, {3}, Bytes<uint8_t>({0, 255, 7})});
  t.push_back({"bool", v1::DTYPE_BOOL, {4}, Bytes<uint8_t>({1, 0, 1, 1})});
  t.push_back({"bf16",
               v1::DTYPE_BF16,
               {4},
               Bytes<uint16_t>({0x3F80, 0xC000, 0x7F80, 0x0001})});
  t.push_back({"scalar", v1::DTYPE_F32, {}, Bytes<float>({2.5f})});
  t.push_back({"empty", v1::DTYPE_F32, {0, 3}, ""});
  std::vector<float> big(1000);
  for (size_t i = 0; i < big.size(); ++i) {
    big[i] = static_cast<float>(i) * 0.25f - 100.0f;
  }
  t.push_back({"w\xc3\xa9ight.big", v1::DTYPE_F32, {10, 100}, Bytes(big)});
  return t;
}

TEST(SafetensorsInteropTest, CppReadsWhatPythonWrites) {
  ScopedTempDir dir;
  RequirePythonWithNumpy(dir);
  const std::string path = dir.Child("numpy.safetensors");
  RunResult run = RunPython({ScriptPath("write_safetensors.py"), path}, dir);
  ASSERT_EQ(run.exit_code, 0) << "write_safetensors.py failed:\n" << run.err;

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsLayout& layout = (*file)->layout();
  const std::map<std::string, std::string> metadata = {{"job", "interop"},
                                                       {"round", "3"},
                                                       {"note",
                                                        "\xc3\xbcn\xc3\xaf"
                                                        "code \xe2\x9c\x93"}};
  EXPECT_EQ(layout.metadata, metadata);

  const std::vector<ExpectedTensor> expected = PythonTensors();
  ASSERT_EQ(layout.tensors.size(), expected.size());
  // The script writes the data in reverse order of its list.
  EXPECT_EQ(layout.tensors.front().name, expected.back().name);
  for (const ExpectedTensor& want : expected) {
    SCOPED_TRACE(want.name);
    std::optional<size_t> i = (*file)->FindTensor(want.name);
    ASSERT_TRUE(i.has_value());
    const SafetensorsTensor& got = layout.tensors[*i];
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.shape, want.shape);
    EXPECT_EQ((*file)->tensor_data(*i), want.bytes);  // Bit for bit.
  }

  // And the writer's output re-encodes to a file Python can read back.
  std::vector<absl::string_view> data;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    data.push_back((*file)->tensor_data(i));
  }
  const std::string copy = dir.Child("copy.safetensors");
  ASSERT_TRUE(WriteSafetensorsFile(copy, layout, data).ok());
  RunResult reread = RunPython({ScriptPath("read_safetensors.py"), copy}, dir);
  EXPECT_EQ(reread.exit_code, 0) << reread.err;
}

TEST(SafetensorsInteropTest, PythonReaderRejectsWhatCppRejects) {
  // Sanity check of the independent reader itself: a torn file must fail.
  ScopedTempDir dir;
  RequirePythonWithNumpy(dir);
  absl::StatusOr<SafetensorsLayout> layout =
      MakeSafetensorsLayout({{"w", v1::DTYPE_F32, {4}}}, {});
  ASSERT_TRUE(layout.ok());
  const std::string torn =
      *EncodeSafetensorsPrefix(*layout) + std::string(15, '\0');
  const std::string path = dir.Child("torn.safetensors");
  testutil::WriteRaw(path, torn);
  EXPECT_EQ(SafetensorsFile::Open(path).status().code(),
            absl::StatusCode::kDataLoss);
  RunResult run = RunPython({ScriptPath("read_safetensors.py"), path}, dir);
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  EXPECT_THAT(run.err, ::testing::HasSubstr("bad data_offsets"));
}

}  // namespace
}  // namespace swarm::persist
