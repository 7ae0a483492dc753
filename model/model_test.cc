#include "model/model.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "model/test_models.h"
#include "persist/safetensors.h"

namespace swarm {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) /
          (name + "." + std::to_string(getpid())))
      .string();
}

TEST(ModelTest, CreateAlignsAndZeroes) {
  std::vector<TensorSpec> specs = {*MakeTensorSpec("a", v1::DTYPE_U8, {3}),
                                   *MakeTensorSpec("b", v1::DTYPE_F64, {5})};
  absl::StatusOr<Model> model = Model::Create(specs);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->total_bytes(), 43u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(model->tensor_data(1).data()) % 64, 0u);
  for (char c : model->tensor_data(1)) EXPECT_EQ(c, 0);
  EXPECT_EQ(model->FindTensor("b"), 1);
  EXPECT_EQ(model->FindTensor("c"), -1);
}

TEST(ModelTest, FreedStorageIsRecycledAndZeroedOnRequest) {
  ReleaseIdleHeapStorage();
  const std::vector<TensorSpec> specs = {
      *MakeTensorSpec("w", v1::DTYPE_F32, {3, 1 << 20})};  // 12 MiB
  const char* first = nullptr;
  {
    Model model = *Model::Create(specs);
    first = model.tensor_data(0).data();
    std::memset(model.mutable_tensor_data(0).data(), 0x5a, 1000);
  }
  EXPECT_EQ(HeapStorageRecycledBytes(), 12u << 20);
  Model again = *Model::Create(specs);
  EXPECT_EQ(again.tensor_data(0).data(), first);  // the same block, reused
  EXPECT_EQ(HeapStorageRecycledBytes(), 0u);
  for (char c : again.tensor_data(0).substr(0, 1000)) ASSERT_EQ(c, 0);
}

// The pool keeps what was in use at once, and never maps more than that:
// a site's peak memory is what it would be without the pool.
TEST(ModelTest, ThePoolNeverMapsMoreThanWasInUseAtOnce) {
  ReleaseIdleHeapStorage();
  const std::vector<TensorSpec> specs = {
      *MakeTensorSpec("w", v1::DTYPE_F32, {3, 1 << 20})};  // 12 MiB
  std::set<const char*> blocks;
  {
    Model a = *Model::Create(specs);
    Model b = *Model::Create(specs);
    blocks = {a.tensor_data(0).data(), b.tensor_data(0).data()};
  }
  EXPECT_EQ(HeapStorageRecycledBytes(), 24u << 20);  // both kept
  {
    Model a = *Model::Create(specs);
    Model b = *Model::Create(specs);
    EXPECT_EQ(blocks.count(a.tensor_data(0).data()), 1u);
    EXPECT_EQ(blocks.count(b.tensor_data(0).data()), 1u);
    EXPECT_EQ(HeapStorageRecycledBytes(), 0u);
  }
  // A 16 MiB block while 24 MiB are idle and 24 MiB were the most in use:
  // both idle blocks are unmapped first (one would make 28 MiB).
  const std::vector<TensorSpec> larger = {
      *MakeTensorSpec("w", v1::DTYPE_F32, {4, 1 << 20})};  // 16 MiB
  {
    Model big = *Model::Create(larger);
    EXPECT_EQ(HeapStorageRecycledBytes(), 0u);
  }
  EXPECT_EQ(HeapStorageRecycledBytes(), 16u << 20);
  // Within the most in use (24 MiB): a 12 MiB block is mapped beside the
  // idle 16 MiB one only after that one is unmapped (12 + 16 > 24).
  {
    Model small = *Model::Create(specs);
    EXPECT_EQ(HeapStorageRecycledBytes(), 0u);
  }
  SetHeapStorageRecycleLimit(0);
  EXPECT_EQ(HeapStorageRecycledBytes(), 0u);
  { Model dropped = *Model::Create(specs); }
  EXPECT_EQ(HeapStorageRecycledBytes(), 0u);  // limit 0: nothing kept
  SetHeapStorageRecycleLimit(1ull << 30);
  ReleaseIdleHeapStorage();
}

// Resident pages of this process (/proc/self/statm), in bytes.
uint64_t ResidentBytes() {
  FILE* statm = std::fopen("/proc/self/statm", "r");
  unsigned long size = 0, resident = 0;
  if (statm != nullptr) {
    if (std::fscanf(statm, "%lu %lu", &size, &resident) != 2) resident = 0;
    std::fclose(statm);
  }
  return static_cast<uint64_t>(resident) * sysconf(_SC_PAGESIZE);
}

TEST(ModelTest, MappedModelGivesItsPagesBackAndReadsThemAgain) {
  const std::string path = std::string(::testing::TempDir()) + "/release_" +
                           std::to_string(getpid()) + ".safetensors";
  const std::vector<TensorSpec> specs = {
      *MakeTensorSpec("w", v1::DTYPE_F32, {8, 1 << 20})};  // 32 MiB
  {
    Model written = *Model::Create(specs);
    std::memset(written.mutable_tensor_data(0).data(), 0x3c, 32u << 20);
    ASSERT_TRUE(written.SaveSafetensors(path).ok());
  }
  Model mapped = *Model::LoadSafetensors(path);
  std::filesystem::remove(path);  // The mapping keeps the contents.
  uint64_t sum = 0;
  for (char c : mapped.tensor_data(0)) sum += static_cast<uint8_t>(c);
  const uint64_t touched = ResidentBytes();
  mapped.storage()->ReleaseResidentPages();
  const uint64_t released = ResidentBytes();
  EXPECT_GE(touched - released, 24u << 20)
      << "touched " << touched << " released " << released;
  uint64_t again = 0;
  for (char c : mapped.tensor_data(0)) again += static_cast<uint8_t>(c);
  EXPECT_EQ(again, sum);
  EXPECT_EQ(sum, 0x3cull * (32u << 20));
}

// /proc/self/status's RssAnon: anonymous memory resident now.
uint64_t AnonymousBytes() {
  FILE* status = std::fopen("/proc/self/status", "r");
  char line[256];
  unsigned long kib = 0;
  while (status != nullptr && std::fgets(line, sizeof(line), status)) {
    if (std::sscanf(line, "RssAnon: %lu kB", &kib) == 1) break;
  }
  if (status != nullptr) std::fclose(status);
  return static_cast<uint64_t>(kib) * 1024;
}

TEST(ModelTest, CreateInFileKeepsTheLayoutInAnUnlinkedFile) {
  const std::string dir = TempPath("scratch");
  ASSERT_TRUE(std::filesystem::create_directories(dir));
  const std::vector<TensorSpec> specs = {
      *MakeTensorSpec("a", v1::DTYPE_U8, {3}),
      *MakeTensorSpec("w", v1::DTYPE_F32, {8, 1 << 20})};  // 32 MiB
  const uint64_t anon_before = AnonymousBytes();
  {
    absl::StatusOr<Model> model = Model::CreateInFile(specs, dir);
    ASSERT_TRUE(model.ok()) << model.status();
    // Nothing to see in the directory, even while the model lives.
    EXPECT_TRUE(std::filesystem::is_empty(dir));
    ASSERT_TRUE(model->writable());
    EXPECT_EQ(model->total_bytes(), 3u + (32u << 20));
    Model in_memory = *Model::Create(specs);
    EXPECT_EQ(
        model->tensor_data(1).data() - model->tensor_data(0).data(),
        in_memory.tensor_data(1).data() - in_memory.tensor_data(0).data());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(model->tensor_data(1).data()) % 64,
              0u);
    uint64_t zeros = 0;
    for (char c : model->tensor_data(1)) zeros += c == 0;
    EXPECT_EQ(zeros, 32u << 20);
    std::memset(model->mutable_tensor_data(1).data(), 0x5a, 32u << 20);
    // The written pages are the file's, not anonymous memory.
    EXPECT_LT(AnonymousBytes(), anon_before + (16u << 20));
    const uint64_t touched = ResidentBytes();
    model->storage()->ReleaseResidentPages();
    EXPECT_GE(touched - ResidentBytes(), 24u << 20);
    uint64_t sum = 0;
    for (char c : model->tensor_data(1)) sum += static_cast<uint8_t>(c);
    EXPECT_EQ(sum, 0x5aull * (32u << 20));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
  // No directory: the error names it.
  absl::StatusOr<Model> missing = Model::CreateInFile(specs, dir);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir), std::string::npos)
      << missing.status();
}

TEST(ModelTest, RefusesDuplicateNamesAndWrongSizes) {
  std::vector<TensorSpec> dup = {*MakeTensorSpec("a", v1::DTYPE_U8, {3}),
                                 *MakeTensorSpec("a", v1::DTYPE_U8, {3})};
  absl::StatusOr<Model> model = Model::Create(dup);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("duplicate tensor name \"a\""),
            std::string::npos);
  TensorSpec wrong = *MakeTensorSpec("w", v1::DTYPE_F32, {3});
  wrong.byte_size = 11;
  model = Model::Create({wrong});
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("\"w\""), std::string::npos);
}

TEST(ModelTest, SafetensorsRoundTripIsBitIdentical) {
  Model model = testing_models::MultiDtypeModel(1 << 20, 7);
  model.metadata()["job"] = "j1";
  const std::string path = TempPath("model.safetensors");
  ASSERT_TRUE(model.SaveSafetensors(path).ok());
  absl::StatusOr<Model> loaded = Model::LoadSafetensors(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->writable());
  EXPECT_TRUE(testing_models::BitIdentical(model, *loaded));
  EXPECT_EQ(loaded->metadata().at("job"), "j1");
  absl::StatusOr<Model> copy = loaded->Clone();
  ASSERT_TRUE(copy.ok());
  EXPECT_TRUE(copy->writable());
  EXPECT_TRUE(testing_models::BitIdentical(model, *copy));
  std::filesystem::remove(path);
}

// A sparse safetensors file: a small tensor, one of 5 GiB, and one that
// starts past 5 GiB. Only the marked pages are ever read.
TEST(ModelTest, LoadsSafetensorsWithATensorPastFourGiB) {
  constexpr uint64_t kBig = 5ull << 30;
  absl::StatusOr<persist::SafetensorsLayout> layout =
      persist::MakeSafetensorsLayout({{"head", v1::DTYPE_U8, {8}},
                                      {"big", v1::DTYPE_F32, {kBig / 4}},
                                      {"tail", v1::DTYPE_U8, {4}}},
                                     {{"round", "1"}});
  ASSERT_TRUE(layout.ok()) << layout.status();
  absl::StatusOr<std::string> prefix =
      persist::EncodeSafetensorsPrefix(*layout);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  const uint64_t data = prefix->size();
  const std::string path = TempPath("big.safetensors");
  const int fd =
      open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(data + layout->data_size)), 0);
  ASSERT_EQ(pwrite(fd, prefix->data(), prefix->size(), 0),
            static_cast<ssize_t>(prefix->size()));
  ASSERT_EQ(pwrite(fd, "headhead", 8, static_cast<off_t>(data)), 8);
  ASSERT_EQ(pwrite(fd, "LAST", 4, static_cast<off_t>(data + 8 + kBig - 4)), 4);
  ASSERT_EQ(pwrite(fd, "tail", 4, static_cast<off_t>(data + 8 + kBig)), 4);
  close(fd);

  absl::StatusOr<Model> model = Model::LoadSafetensors(path);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->num_tensors(), 3u);
  EXPECT_EQ(model->total_bytes(), 8 + kBig + 4);
  EXPECT_EQ(model->spec(1).byte_size, kBig);
  EXPECT_EQ(model->tensor_data(0), "headhead");
  EXPECT_EQ(model->tensor_data(1).size(), kBig);
  EXPECT_EQ(model->tensor_data(1).data(), model->tensor_data(0).data() + 8);
  EXPECT_EQ(model->tensor_data(1).substr(kBig - 4), "LAST");
  EXPECT_EQ(model->tensor_data(2), "tail");
  EXPECT_EQ(model->metadata().at("round"), "1");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace swarm
