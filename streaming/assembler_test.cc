#include "streaming/assembler.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "gtest/gtest.h"
#include "model/test_models.h"
#include "streaming/chunker.h"
#include "streaming/range_recording_sink.h"

namespace swarm {
namespace {

using testing_models::BitIdentical;
using testing_models::MultiDtypeModel;

// The frames a sender produces for `model`.
std::vector<v1::ModelFrame> Frames(std::shared_ptr<const Model> model,
                                   uint64_t chunk_size = 4096) {
  v1::ModelHeader header;
  header.set_kind(v1::MODEL_KIND_RESULT);
  header.set_job_id("job");
  header.set_round(3);
  header.set_sender("site-a");
  auto chunker = *Chunker::Create(model, header, chunk_size);
  std::vector<v1::ModelFrame> frames(1);
  *frames[0].mutable_header() = chunker->header();
  while (auto chunk = chunker->NextChunk()) {
    v1::ModelFrame frame;
    frame.mutable_chunk()->set_tensor_index(chunk->tensor_index);
    frame.mutable_chunk()->set_offset(chunk->offset);
    frame.mutable_chunk()->set_data(std::string(chunk->data));
    frames.push_back(std::move(frame));
  }
  v1::ModelFrame trailer;
  *trailer.mutable_trailer() = chunker->Trailer();
  frames.push_back(std::move(trailer));
  return frames;
}

// Feeds frames; returns the first error, or Finish()'s result.
absl::StatusOr<Model> Feed(const std::vector<v1::ModelFrame>& frames,
                           TensorSink* sink, AssemblerOptions options = {}) {
  Assembler assembler(sink, std::move(options));
  for (const v1::ModelFrame& frame : frames) {
    absl::Status status = assembler.OnFrame(frame);
    if (!status.ok()) return status;
  }
  return assembler.Finish();
}

std::shared_ptr<const Model> SmallModel() {
  return std::make_shared<Model>(MultiDtypeModel(64 << 10, 11));
}

void ExpectError(const absl::StatusOr<Model>& result, absl::StatusCode code,
                 absl::string_view text) {
  ASSERT_FALSE(result.ok()) << "expected an error containing: " << text;
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_NE(result.status().message().find(text), absl::string_view::npos)
      << result.status();
}

TEST(AssemblerTest, MemorySinkRoundTrip) {
  auto model = SmallModel();
  MemorySink sink;
  absl::StatusOr<Model> out = Feed(Frames(model), &sink);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(BitIdentical(*model, *out));
  EXPECT_EQ(out->metadata().at("job"), "job");
  EXPECT_EQ(out->metadata().at("round"), "3");
  EXPECT_EQ(out->metadata().at("sender"), "site-a");
}

TEST(AssemblerTest, AcceptsChunksOutOfOrderWhenTheDigestMatchesThatOrder) {
  auto model = SmallModel();
  std::vector<v1::ModelFrame> frames = Frames(model);
  // Reverse the chunks and recompute the digest over the new order.
  std::reverse(frames.begin() + 1, frames.end() - 1);
  auto digest = *StreamDigest::Create(v1::DIGEST_XXH3_128);
  for (size_t i = 1; i + 1 < frames.size(); ++i) {
    digest->AddChunk(frames[i].chunk().tensor_index(),
                     frames[i].chunk().offset(), frames[i].chunk().data());
  }
  frames.back().mutable_trailer()->set_digest(digest->Finish());
  MemorySink sink;
  absl::StatusOr<Model> out = Feed(frames, &sink);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(BitIdentical(*model, *out));
}

// A filler that digests each chunk in uneven pieces, as the gRPC receive
// path does with its slices, yields the sender's digest.
TEST(AssemblerTest, PiecewiseFillerMatchesTheSendersDigest) {
  auto model = SmallModel();
  std::vector<v1::ModelFrame> frames = Frames(model);
  MemorySink sink;
  Assembler assembler(&sink, AssemblerOptions());
  ASSERT_TRUE(assembler.OnFrame(frames.front()).ok());
  for (size_t i = 1; i + 1 < frames.size(); ++i) {
    const v1::ModelChunk& chunk = frames[i].chunk();
    const std::string& data = chunk.data();
    absl::Status status = assembler.OnChunk(
        chunk.tensor_index(), chunk.offset(), data.size(),
        [&](char* dst, ChunkDigestFeed* feed) {
          for (size_t at = 0, piece = 1; at < data.size(); piece *= 3) {
            const size_t take = std::min(piece, data.size() - at);
            feed->Add(absl::string_view(data).substr(at, take));
            std::memcpy(dst + at, data.data() + at, take);
            at += take;
          }
          return absl::OkStatus();
        });
    ASSERT_TRUE(status.ok()) << status;
  }
  ASSERT_TRUE(assembler.OnFrame(frames.back()).ok());
  absl::StatusOr<Model> out = assembler.Finish();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(BitIdentical(*model, *out));
}

// A filler that digests fewer bytes than it was given to write fails the
// stream: the digest would no longer vouch for the chunk.
TEST(AssemblerTest, FillerThatSkipsTheDigestFailsTheStream) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  MemorySink sink;
  Assembler assembler(&sink, AssemblerOptions());
  ASSERT_TRUE(assembler.OnFrame(frames.front()).ok());
  const v1::ModelChunk& chunk = frames[1].chunk();
  absl::Status status = assembler.OnChunk(
      chunk.tensor_index(), chunk.offset(), chunk.data().size(),
      [&](char* dst, ChunkDigestFeed* feed) {
        feed->Add(absl::string_view(chunk.data()).substr(1));
        std::memcpy(dst, chunk.data().data(), chunk.data().size());
        return absl::OkStatus();
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  ExpectError(assembler.Finish(), absl::StatusCode::kInternal, "digested");
}

TEST(AssemblerTest, ReorderedChunksFailTheDigest) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  std::swap(frames[1], frames[2]);
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kDataLoss,
              "digest mismatch");
}

TEST(AssemblerTest, ChunkPastTensorEnd) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  const uint64_t size = frames[0].header().tensors(0).byte_size();
  frames[1].mutable_chunk()->set_offset(size - 10);
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kInvalidArgument,
              "runs past the end of tensor \"layer0.weight\"");
}

TEST(AssemblerTest, OffsetOverflowIsPastTheEnd) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  frames[1].mutable_chunk()->set_offset(UINT64_MAX - 5);
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kInvalidArgument,
              "runs past the end");
}

TEST(AssemblerTest, OverlappingChunk) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  ASSERT_EQ(frames[2].chunk().tensor_index(), 0u);
  frames[2].mutable_chunk()->set_offset(100);  // overlaps [0, 4096)
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kInvalidArgument,
              "overlaps bytes already received");
}

TEST(AssemblerTest, DuplicateChunkOverlaps) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  frames.insert(frames.begin() + 2, frames[1]);
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kInvalidArgument,
              "overlaps");
}

TEST(AssemblerTest, MissingChunk) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  frames.erase(frames.begin() + 2);
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kDataLoss,
              "tensor \"layer0.weight\" is missing bytes from offset 4096");
}

TEST(AssemblerTest, UnknownTensorIndex) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  frames[1].mutable_chunk()->set_tensor_index(99);
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kInvalidArgument,
              "unknown tensor index 99");
}

TEST(AssemblerTest, FramesAfterTrailer) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  frames.push_back(frames[1]);
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kInvalidArgument,
              "frame after the trailer");
  frames.back() = frames[frames.size() - 2];  // a second trailer
  MemorySink sink2;
  ExpectError(Feed(frames, &sink2), absl::StatusCode::kInvalidArgument,
              "frame after the trailer");
}

TEST(AssemblerTest, StreamEndsWithoutTrailer) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  frames.pop_back();
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kDataLoss,
              "stream ended without a trailer");
}

TEST(AssemblerTest, StreamEndsBeforeHeader) {
  MemorySink sink;
  ExpectError(Feed({}, &sink), absl::StatusCode::kDataLoss,
              "stream ended before the header");
}

TEST(AssemblerTest, DigestMismatch) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  (*frames[3].mutable_chunk()->mutable_data())[17] ^= 0x40;
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kDataLoss,
              "digest mismatch");
}

TEST(AssemblerTest, ChunkCountMismatch) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  frames.back().mutable_trailer()->set_chunk_count(1);
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kDataLoss,
              "trailer counts 1 chunks");
}

TEST(AssemblerTest, ChunkBeforeHeaderAndSecondHeader) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  MemorySink sink;
  ExpectError(Feed({frames[1]}, &sink), absl::StatusCode::kInvalidArgument,
              "chunk before the header");
  MemorySink sink2;
  ExpectError(Feed({frames[0], frames[0]}, &sink2),
              absl::StatusCode::kInvalidArgument, "second header");
}

TEST(AssemblerTest, EmptyChunkAndEmptyFrame) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  frames[1].mutable_chunk()->clear_data();
  MemorySink sink;
  ExpectError(Feed(frames, &sink), absl::StatusCode::kInvalidArgument,
              "empty chunk");
  MemorySink sink2;
  ExpectError(Feed({frames[0], v1::ModelFrame()}, &sink2),
              absl::StatusCode::kInvalidArgument, "empty frame");
}

TEST(AssemblerTest, BadHeaders) {
  const v1::ModelFrame good = Frames(SmallModel())[0];
  struct Case {
    std::function<void(v1::ModelHeader*)> mutate;
    const char* error;
  };
  const Case cases[] = {
      {[](v1::ModelHeader* h) {
         h->mutable_tensors(1)->set_name("layer0.weight");
       },
       "duplicate tensor name \"layer0.weight\""},
      {[](v1::ModelHeader* h) { h->mutable_tensors(2)->set_byte_size(5); },
       "tensor \"layer2.weight\": byte_size 5 differs"},
      {[](v1::ModelHeader* h) {
         h->mutable_tensors(0)->set_dtype(static_cast<v1::DType>(99));
       },
       "unknown dtype value 99"},
      {[](v1::ModelHeader* h) { h->mutable_tensors(0)->clear_name(); },
       "empty name"},
      {[](v1::ModelHeader* h) { h->set_total_bytes(h->total_bytes() + 1); },
       "differs from the tensors' sum"},
      {[](v1::ModelHeader* h) {
         h->set_digest_algorithm(static_cast<v1::DigestAlgorithm>(9));
       },
       "unknown digest algorithm"},
      {[](v1::ModelHeader* h) {
         h->mutable_tensors(0)->add_shape(1ull << 40);
         h->mutable_tensors(0)->add_shape(1ull << 40);
       },
       "overflows"},
  };
  for (const Case& c : cases) {
    v1::ModelFrame frame = good;
    c.mutate(frame.mutable_header());
    MemorySink sink;
    ExpectError(Feed({frame}, &sink), absl::StatusCode::kInvalidArgument,
                c.error);
  }
}

TEST(AssemblerTest, LimitsAreEnforced) {
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  AssemblerOptions small_model;
  small_model.limits.max_model_bytes = 1000;
  MemorySink sink;
  ExpectError(Feed(frames, &sink, small_model),
              absl::StatusCode::kInvalidArgument, "exceeds the limit of 1000");
  AssemblerOptions small_header;
  small_header.limits.max_header_bytes = 50;
  MemorySink sink2;
  ExpectError(Feed(frames, &sink2, small_header),
              absl::StatusCode::kInvalidArgument, "header of");
}

TEST(AssemblerTest, ExpectedLayoutMismatchNamesTheTensor) {
  auto model = SmallModel();
  std::vector<TensorSpec> expected = model->specs();
  expected[3].shape[0] += 1;
  expected[3].byte_size += expected[3].shape[1] * DTypeSize(expected[3].dtype);
  AssemblerOptions options;
  options.expected_specs = expected;
  MemorySink sink;
  ExpectError(Feed(Frames(model), &sink, options),
              absl::StatusCode::kInvalidArgument,
              "tensor \"layer3.weight\" differs in dtype or shape");
  expected = model->specs();
  expected.pop_back();
  options.expected_specs = expected;
  MemorySink sink2;
  ExpectError(Feed(Frames(model), &sink2, options),
              absl::StatusCode::kInvalidArgument,
              "tensor \"empty\" is not in the round's model");
  // Trailing tensors under the allowed prefix pass; others still do not.
  options.extra_tensor_prefix = "emp";
  MemorySink sink3;
  EXPECT_TRUE(Feed(Frames(model), &sink3, options).ok());
  options.extra_tensor_prefix = "layer";
  MemorySink sink4;
  ExpectError(Feed(Frames(model), &sink4, options),
              absl::StatusCode::kInvalidArgument,
              "tensor \"empty\" is not in the round's model");
}

class DiskSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("disk_sink_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  size_t FilesInDir() const {
    size_t n = 0;
    for (auto& entry : std::filesystem::directory_iterator(dir_)) {
      (void)entry;
      ++n;
    }
    return n;
  }
  std::filesystem::path dir_;
};

TEST_F(DiskSinkTest, WritesSafetensorsAndMapsItBack) {
  auto model = SmallModel();
  const std::string path = (dir_ / "m.safetensors").string();
  DiskSink sink(path);
  absl::StatusOr<Model> out = Feed(Frames(model), &sink);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(BitIdentical(*model, *out));
  EXPECT_FALSE(out->writable());
  absl::StatusOr<Model> reread = Model::LoadSafetensors(path);
  ASSERT_TRUE(reread.ok()) << reread.status();
  EXPECT_TRUE(BitIdentical(*model, *reread));
  EXPECT_EQ(reread->metadata().at("sender"), "site-a");
  EXPECT_EQ(FilesInDir(), 1u);
}

TEST_F(DiskSinkTest, UnlinkWhenMappedLeavesNoFileAndAReadableModel) {
  auto model = SmallModel();
  DiskSink sink((dir_ / "task.safetensors").string(),
                DiskSink::Keep::kUnlinkWhenMapped);
  absl::StatusOr<Model> out = Feed(Frames(model), &sink);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(FilesInDir(), 0u);
  EXPECT_TRUE(BitIdentical(*model, *out));
  out->storage()->ReleaseResidentPages();  // Read back from the file.
  EXPECT_TRUE(BitIdentical(*model, *out));
}

TEST(AssemblerTest, OffsetsPastFourGiBInOneTensorStayDistinct) {
  constexpr uint64_t kTensorBytes = 5ull << 30;
  constexpr uint64_t kFourGiB = 4ull << 30;
  v1::ModelHeader header;
  *header.add_tensors() = TensorSpecToInfo(
      *MakeTensorSpec("big", v1::DTYPE_F32, {kTensorBytes / 4}));
  header.set_total_bytes(kTensorBytes);
  RangeRecordingSink sink;
  Assembler assembler(&sink, AssemblerOptions());
  ASSERT_TRUE(assembler.OnHeader(header, header.ByteSizeLong()).ok());
  const std::string piece(4096, 'x');
  // 0 and 4 GiB alias when an offset is cut to 32 bits.
  ASSERT_TRUE(assembler.OnChunk(0, kFourGiB, piece).ok());
  ASSERT_TRUE(assembler.OnChunk(0, 0, piece).ok());
  ASSERT_TRUE(assembler.OnChunk(0, kTensorBytes - piece.size(), piece).ok());
  ASSERT_EQ(sink.ranges.size(), 3u);
  EXPECT_EQ(sink.ranges[0].offset, kFourGiB);
  EXPECT_EQ(sink.ranges[1].offset, 0u);
  EXPECT_EQ(sink.ranges[2].offset, kTensorBytes - piece.size());
  EXPECT_EQ(assembler.bytes_received(), 3 * piece.size());
  // The same range again overlaps; one byte past the end does not fit.
  Assembler again(&sink, AssemblerOptions());
  ASSERT_TRUE(again.OnHeader(header, header.ByteSizeLong()).ok());
  ASSERT_TRUE(again.OnChunk(0, kFourGiB + 4096, piece).ok());
  absl::Status overlap = again.OnChunk(0, kFourGiB + 8191, piece);
  EXPECT_EQ(overlap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.message().find("[4294975487, 4294979583)"),
            std::string::npos)
      << overlap;
  Assembler past(&sink, AssemblerOptions());
  ASSERT_TRUE(past.OnHeader(header, header.ByteSizeLong()).ok());
  absl::Status beyond = past.OnChunk(0, kTensorBytes - 4095, piece);
  EXPECT_EQ(beyond.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.message().find("runs past the end"), std::string::npos)
      << beyond;
  // The trailer names the first missing byte with its full 64-bit offset.
  v1::ModelTrailer trailer;
  trailer.set_chunk_count(3);
  absl::Status missing = assembler.OnTrailer(trailer);
  EXPECT_EQ(missing.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(
      missing.message().find("missing bytes from offset 4096 (" +
                             std::to_string(kTensorBytes) + " bytes expected)"),
      std::string::npos)
      << missing;
}

TEST_F(DiskSinkTest, FailedStreamLeavesNoFileAndKeepsTheOldOne) {
  auto old_model = std::make_shared<Model>(MultiDtypeModel(16 << 10, 1));
  const std::string path = (dir_ / "m.safetensors").string();
  ASSERT_TRUE(old_model->SaveSafetensors(path).ok());
  std::vector<v1::ModelFrame> frames = Frames(SmallModel());
  (*frames[2].mutable_chunk()->mutable_data())[0] ^= 1;
  DiskSink sink(path);
  ExpectError(Feed(frames, &sink), absl::StatusCode::kDataLoss,
              "digest mismatch");
  EXPECT_EQ(FilesInDir(), 1u);  // no temporary left behind
  absl::StatusOr<Model> reread = Model::LoadSafetensors(path);
  ASSERT_TRUE(reread.ok()) << reread.status();
  EXPECT_TRUE(BitIdentical(*old_model, *reread));

  frames = Frames(SmallModel());
  frames.resize(frames.size() / 2);  // cut off in the middle
  DiskSink sink2(path);
  ExpectError(Feed(frames, &sink2), absl::StatusCode::kDataLoss,
              "without a trailer");
  EXPECT_EQ(FilesInDir(), 1u);
}

}  // namespace
}  // namespace swarm
