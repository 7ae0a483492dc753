// Model streams through a real gRPC server and client on loopback.
#include "rpc/grpc_stream.h"

#include <unistd.h>

#include <filesystem>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "model/test_models.h"
#include "streaming/range_recording_sink.h"

namespace swarm {
namespace {

using testing_models::BitIdentical;
using testing_models::MultiDtypeModel;

// Serves SubmitResult into a memory or disk sink and FetchModel from a model.
class TestPeer : public RawModelService {
 public:
  TestPeer() {
    AddModelUploadMethod(
        "SubmitResult",
        [this](grpc::ServerContext*,
               grpc::ServerReader<grpc::ByteBuffer>* reader, v1::Reply* reply) {
          std::unique_ptr<TensorSink> sink;
          if (disk_path_.empty()) {
            sink = std::make_unique<MemorySink>();
          } else {
            sink = std::make_unique<DiskSink>(disk_path_);
          }
          Assembler assembler(sink.get(), AssemblerOptions());
          absl::StatusOr<Model> model = ReceiveModelStream(reader, &assembler);
          absl::MutexLock lock(&mu_);
          received_status_ = model.status();
          if (model.ok()) received_ = std::move(*model);
          done_.Notify();
          if (!model.ok()) return ToGrpcStatus(model.status());
          reply->set_outcome(v1::OUTCOME_OK);
          reply->set_message("stored");
          return grpc::Status::OK;
        });
    AddModelDownloadMethod(
        "FetchModel",
        [this](grpc::ServerContext*, const v1::FetchModelRequest* request,
               grpc::ServerWriter<grpc::ByteBuffer>* writer) {
          v1::ModelHeader header;
          header.set_kind(v1::MODEL_KIND_BEST);
          header.set_job_id(request->job_id());
          auto chunker = Chunker::Create(serve_, header, 1 << 20);
          if (!chunker.ok()) return ToGrpcStatus(chunker.status());
          if (!SendModelStream(writer, chunker->get())) {
            return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "client went away");
          }
          return grpc::Status::OK;
        });
  }

  std::string disk_path_;
  std::shared_ptr<const Model> serve_;
  absl::Mutex mu_;
  absl::Status received_status_ ABSL_GUARDED_BY(mu_);
  Model received_ ABSL_GUARDED_BY(mu_);
  absl::Notification done_;
};

class GrpcStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("grpc_stream_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    ApplyModelStreamArgs(&builder, AssemblerLimits());
    builder.RegisterService(&peer_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    grpc::ChannelArguments args;
    ApplyModelStreamArgs(&args, AssemblerLimits());
    channel_ =
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                  grpc::InsecureChannelCredentials(), args);
  }
  void TearDown() override {
    server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }

  absl::StatusOr<v1::Reply> Send(std::shared_ptr<const Model> model) {
    v1::ModelHeader header;
    header.set_kind(v1::MODEL_KIND_RESULT);
    header.set_job_id("job");
    header.set_sender("site-a");
    auto chunker = Chunker::Create(model, header);
    if (!chunker.ok()) return chunker.status();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    return StreamModelToPeer(channel_.get(), "SubmitResult", &context,
                             chunker->get());
  }

  std::filesystem::path dir_;
  TestPeer peer_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(GrpcStreamTest, SixtyFourMiBIntoMemorySinkIsBitIdentical) {
  auto model = std::make_shared<Model>(MultiDtypeModel(64ull << 20, 5));
  absl::StatusOr<v1::Reply> reply = Send(model);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->message(), "stored");
  absl::MutexLock lock(&peer_.mu_);
  ASSERT_TRUE(peer_.received_status_.ok()) << peer_.received_status_;
  EXPECT_TRUE(BitIdentical(*model, peer_.received_));
}

TEST_F(GrpcStreamTest, SixtyFourMiBIntoDiskSinkIsBitIdentical) {
  peer_.disk_path_ = (dir_ / "result.safetensors").string();
  auto model = std::make_shared<Model>(MultiDtypeModel(64ull << 20, 6));
  absl::StatusOr<v1::Reply> reply = Send(model);
  ASSERT_TRUE(reply.ok()) << reply.status();
  {
    absl::MutexLock lock(&peer_.mu_);
    ASSERT_TRUE(peer_.received_status_.ok()) << peer_.received_status_;
    EXPECT_TRUE(BitIdentical(*model, peer_.received_));
  }
  absl::StatusOr<Model> reread = Model::LoadSafetensors(peer_.disk_path_);
  ASSERT_TRUE(reread.ok()) << reread.status();
  EXPECT_TRUE(BitIdentical(*model, *reread));
}

TEST_F(GrpcStreamTest, FetchModelStreamsToTheClient) {
  peer_.serve_ = std::make_shared<Model>(MultiDtypeModel(8ull << 20, 9));
  grpc::ClientContext context;
  v1::FetchModelRequest request;
  request.set_job_id("job");
  MemorySink sink;
  AssemblerOptions options;
  options.expected_kind = v1::MODEL_KIND_BEST;
  Assembler assembler(&sink, options);
  absl::StatusOr<Model> model =
      FetchModelFromPeer(channel_.get(), &context, request, &assembler);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(BitIdentical(*peer_.serve_, *model));
}

TEST_F(GrpcStreamTest, CorruptChunkIsRefusedWithDataLoss) {
  auto model = std::make_shared<Model>(MultiDtypeModel(2ull << 20, 3));
  v1::ModelHeader header;
  header.set_job_id("job");
  auto chunker = *Chunker::Create(model, header, 64 << 10);
  grpc::ClientContext context;
  const std::string path = PeerMethodPath("SubmitResult");
  grpc::internal::RpcMethod rpc(path.c_str(),
                                grpc::internal::RpcMethod::CLIENT_STREAMING);
  v1::Reply reply;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          channel_.get(), rpc, &context, &reply));
  writer->Write(EncodeHeaderFrame(chunker->header()));
  int n = 0;
  std::string corrupted;
  while (auto chunk = chunker->NextChunk()) {
    if (n++ == 5) {
      corrupted = std::string(chunk->data);
      corrupted[100] ^= 1;
      chunk->data = corrupted;
    }
    writer->Write(EncodeChunkFrame(*chunk, nullptr));
  }
  writer->Write(EncodeTrailerFrame(chunker->Trailer()));
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_NE(status.error_message().find("digest mismatch"), std::string::npos)
      << status.error_message();
}

TEST_F(GrpcStreamTest, StreamCutOffMidwayLeavesNoFile) {
  peer_.disk_path_ = (dir_ / "cut.safetensors").string();
  auto model = std::make_shared<Model>(MultiDtypeModel(4ull << 20, 4));
  auto chunker = *Chunker::Create(model, v1::ModelHeader(), 64 << 10);
  grpc::ClientContext context;
  const std::string path = PeerMethodPath("SubmitResult");
  grpc::internal::RpcMethod rpc(path.c_str(),
                                grpc::internal::RpcMethod::CLIENT_STREAMING);
  v1::Reply reply;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
          channel_.get(), rpc, &context, &reply));
  writer->Write(EncodeHeaderFrame(chunker->header()));
  for (int i = 0; i < 10; ++i) {
    writer->Write(EncodeChunkFrame(*chunker->NextChunk(), nullptr));
  }
  context.TryCancel();
  writer->Finish().IgnoreError();
  peer_.done_.WaitForNotification();
  absl::MutexLock lock(&peer_.mu_);
  EXPECT_FALSE(peer_.received_status_.ok());
  EXPECT_EQ(peer_.received_status_.code(), absl::StatusCode::kDataLoss)
      << peer_.received_status_;
  size_t files = 0;
  for (auto& entry : std::filesystem::directory_iterator(dir_)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 0u);
}

TEST(FeedFrameTest, NonCanonicalChunkEncodingTakesTheParsingPath) {
  auto model = std::make_shared<Model>(MultiDtypeModel(1 << 16, 2));
  auto chunker = *Chunker::Create(model, v1::ModelHeader(), 4096);
  MemorySink sink;
  Assembler assembler(&sink, AssemblerOptions());
  grpc::ByteBuffer header = EncodeHeaderFrame(chunker->header());
  ASSERT_TRUE(FeedFrame(&header, &assembler).ok());
  while (auto chunk = chunker->NextChunk()) {
    // Fields in reverse order: data, offset, tensor_index.
    std::string inner;
    inner.push_back(0x1a);
    uint64_t size = chunk->data.size();
    while (size >= 0x80) {
      inner.push_back(static_cast<char>(size | 0x80));
      size >>= 7;
    }
    inner.push_back(static_cast<char>(size));
    inner.append(chunk->data.data(), chunk->data.size());
    v1::ModelChunk tail;
    tail.set_offset(chunk->offset);
    tail.set_tensor_index(chunk->tensor_index);
    inner += tail.SerializeAsString();
    std::string wire;
    wire.push_back(0x12);
    uint64_t n = inner.size();
    while (n >= 0x80) {
      wire.push_back(static_cast<char>(n | 0x80));
      n >>= 7;
    }
    wire.push_back(static_cast<char>(n));
    wire += inner;
    grpc::Slice slice(wire.data(), wire.size());
    grpc::ByteBuffer buffer(&slice, 1);
    ASSERT_TRUE(FeedFrame(&buffer, &assembler).ok());
  }
  grpc::ByteBuffer trailer = EncodeTrailerFrame(chunker->Trailer());
  ASSERT_TRUE(FeedFrame(&trailer, &assembler).ok());
  absl::StatusOr<Model> out = assembler.Finish();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(BitIdentical(*model, *out));
}

TEST(FeedFrameTest, ChunkOffsetPastFourGiBSurvivesTheSingleCopyPath) {
  constexpr uint64_t kTensorBytes = 5ull << 30;
  v1::ModelHeader header;
  *header.add_tensors() = TensorSpecToInfo(
      *MakeTensorSpec("big", v1::DTYPE_F32, {kTensorBytes / 4}));
  header.set_total_bytes(kTensorBytes);
  RangeRecordingSink sink;
  Assembler assembler(&sink, AssemblerOptions());
  grpc::ByteBuffer header_frame = EncodeHeaderFrame(header);
  ASSERT_TRUE(FeedFrame(&header_frame, &assembler).ok());
  auto data = std::make_shared<std::string>(4096, 'z');
  for (uint64_t offset :
       std::vector<uint64_t>{kTensorBytes - 4096, 0, 1ull << 32}) {
    ChunkRef chunk;
    chunk.offset = offset;
    chunk.data = *data;
    grpc::ByteBuffer frame = EncodeChunkFrame(chunk, data);
    ASSERT_TRUE(FeedFrame(&frame, &assembler).ok()) << offset;
    EXPECT_EQ(sink.scratch, *data);
  }
  std::vector<uint64_t> offsets;
  for (const RangeRecordingSink::Range& range : sink.ranges) {
    offsets.push_back(range.offset);
  }
  EXPECT_EQ(offsets,
            (std::vector<uint64_t>{kTensorBytes - 4096, 0, 1ull << 32}));
}

TEST(FeedFrameTest, GarbageIsRefused) {
  MemorySink sink;
  Assembler assembler(&sink, AssemblerOptions());
  const std::string junk = "\xff\xff\xff\xff\x0f garbage";
  grpc::Slice slice(junk.data(), junk.size());
  grpc::ByteBuffer buffer(&slice, 1);
  absl::Status status = FeedFrame(&buffer, &assembler);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("malformed frame"), std::string::npos);
}

}  // namespace
}  // namespace swarm
