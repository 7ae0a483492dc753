#include "streaming/partial_sum_sink.h"

#include <cstring>
#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "streaming/assembler.h"
#include "streaming/chunker.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

// An F32 model whose tensor t element i is `base + t * 1000 + i`.
std::shared_ptr<const Model> F32Model(float base,
                                      std::vector<uint64_t> sizes = {300,
                                                                     5000}) {
  std::vector<TensorSpec> specs;
  for (size_t t = 0; t < sizes.size(); ++t) {
    specs.push_back(
        {absl::StrCat("w", t), v1::DTYPE_F32, {sizes[t]}, sizes[t] * 4});
  }
  Model model = *Model::Create(specs);
  for (size_t t = 0; t < sizes.size(); ++t) {
    absl::Span<char> data = model.mutable_tensor_data(t);
    for (uint64_t i = 0; i < sizes[t]; ++i) {
      const float value = base + static_cast<float>(t * 1000 + i);
      std::memcpy(data.data() + i * 4, &value, 4);
    }
  }
  return std::make_shared<const Model>(std::move(model));
}

float At(const Model& model, size_t t, uint64_t i) {
  float value;
  std::memcpy(&value, model.tensor_data(t).data() + i * 4, 4);
  return value;
}

// Streams `partial` (with `scale`) through a hop holding `own` (weight
// `weight`); returns the hop's output assembled, or the hop's error.
absl::StatusOr<Model> PassThrough(std::shared_ptr<const Model> partial,
                                  double scale,
                                  std::shared_ptr<const Model> own,
                                  double weight, uint64_t chunk = 4096) {
  v1::ModelHeader header;
  header.set_kind(v1::MODEL_KIND_PARTIAL_SUM);
  header.set_job_id("job");
  header.set_round(2);
  header.set_sender("a");
  header.set_partial_scale(scale);
  auto chunker = *Chunker::Create(partial, header, chunk);
  MemorySink out;
  bool began = false;
  PartialSumSink sink(own, weight,
                      [&](uint32_t index, uint64_t offset,
                          absl::string_view data) -> absl::Status {
                        if (!began) {
                          began = true;
                          absl::Status status = out.Begin(header, own->specs());
                          if (!status.ok()) return status;
                        }
                        char* dst = *out.WritableRange(index, offset,
                                                       data.size());
                        std::memcpy(dst, data.data(), data.size());
                        return out.CommitRange(index, offset, data.size());
                      });
  Assembler assembler(&sink, AssemblerOptions());
  absl::Status status = assembler.OnHeader(chunker->header(), 100);
  while (status.ok()) {
    std::optional<ChunkRef> next = chunker->NextChunk();
    if (!next.has_value()) {
      status = assembler.OnTrailer(chunker->Trailer());
      break;
    }
    status = assembler.OnChunk(next->tensor_index, next->offset, next->data);
  }
  absl::StatusOr<Model> done = assembler.Finish();
  if (!status.ok()) return status;
  if (!done.ok()) return done.status();
  EXPECT_EQ(done->num_tensors(), 0u);  // Nothing kept at the hop.
  EXPECT_EQ(sink.bytes_emitted(), partial->total_bytes());
  return out.Finish();
}

TEST(PartialSumSinkTest, AddsTheWeightedResultToEveryChunk) {
  auto partial = F32Model(0.5f);
  auto own = F32Model(-2.0f);
  absl::StatusOr<Model> out = PassThrough(partial, 3, own, 4);
  ASSERT_TRUE(out.ok()) << out.status();
  for (size_t t = 0; t < 2; ++t) {
    for (uint64_t i : {uint64_t{0}, uint64_t{7}, uint64_t{255}, uint64_t{299}}) {
      EXPECT_EQ(At(*out, t, i), 3 * At(*partial, t, i) + 4 * At(*own, t, i))
          << "tensor " << t << " element " << i;
    }
  }
}

TEST(PartialSumSinkTest, ScaleZeroMeansOne) {
  auto partial = F32Model(1.0f);
  auto own = F32Model(1.0f);
  absl::StatusOr<Model> out = PassThrough(partial, 0, own, 2, 8192);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(At(*out, 1, 4999), 3 * At(*own, 1, 4999));
}

TEST(PartialSumSinkTest, RefusesAPartialWhoseTableDiffers) {
  absl::StatusOr<Model> out =
      PassThrough(F32Model(0, {300, 4000}), 1, F32Model(0), 1);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(),
              HasSubstr("partial sum's tensor 1 (w1) differs"));
  out = PassThrough(F32Model(0, {300}), 1, F32Model(0), 1);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(),
              HasSubstr("the partial sum has 1 tensors, this site's result 2"));
}

TEST(PartialSumSinkTest, CarriesF32Only) {
  std::vector<TensorSpec> specs = {{"h", v1::DTYPE_F16, {8}, 16}};
  EXPECT_THAT(CheckPartialSumLayout(specs).message(),
              HasSubstr("tensor h is DTYPE_F16: a partial sum carries F32"));
  auto f16 = std::make_shared<const Model>(*Model::Create(specs));
  absl::StatusOr<Model> out = PassThrough(f16, 1, f16, 1);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("carries F32 tensors only"));
}

TEST(PartialSumSinkTest, AnEmitFailureFailsTheStream) {
  auto own = F32Model(0);
  PartialSumSink sink(own, 1, [](uint32_t, uint64_t, absl::string_view) {
    return absl::UnavailableError("next hop gone");
  });
  v1::ModelHeader header;
  header.set_kind(v1::MODEL_KIND_PARTIAL_SUM);
  header.set_job_id("job");
  header.set_sender("a");
  auto chunker = *Chunker::Create(F32Model(1), header, 4096);
  Assembler assembler(&sink, AssemblerOptions());
  ASSERT_TRUE(assembler.OnHeader(chunker->header(), 100).ok());
  std::optional<ChunkRef> chunk = chunker->NextChunk();
  absl::Status fed =
      assembler.OnChunk(chunk->tensor_index, chunk->offset, chunk->data);
  EXPECT_EQ(fed.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(assembler.Finish().ok());
}

}  // namespace
}  // namespace swarm
