#include "model/model.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "gtest/gtest.h"
#include "model/test_models.h"

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
  const std::vector<TensorSpec> specs = {
      *MakeTensorSpec("w", v1::DTYPE_F32, {3, 1 << 20})};  // 12 MiB
  const char* first = nullptr;
  {
    Model model = *Model::Create(specs);
    first = model.tensor_data(0).data();
    std::memset(model.mutable_tensor_data(0).data(), 0x5a, 1000);
  }
  EXPECT_GE(HeapStorageRecycledBytes(), 12u << 20);
  Model again = *Model::Create(specs);
  EXPECT_EQ(again.tensor_data(0).data(), first);  // the same block, reused
  for (char c : again.tensor_data(0).substr(0, 1000)) ASSERT_EQ(c, 0);
  // One idle block per size: a second freed block of that size is unmapped.
  {
    Model a = *Model::Create(specs);
    Model b = *Model::Create(specs);
  }
  EXPECT_EQ(HeapStorageRecycledBytes(), 12u << 20);
  SetHeapStorageRecycleLimit(0);
  EXPECT_EQ(HeapStorageRecycledBytes(), 0u);
  { Model dropped = *Model::Create(specs); }
  EXPECT_EQ(HeapStorageRecycledBytes(), 0u);  // limit 0: nothing kept
  SetHeapStorageRecycleLimit(1ull << 30);
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

}  // namespace
}  // namespace swarm
