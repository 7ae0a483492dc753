// Writes the seed corpora of the fuzz targets (run once; the output is
// committed under tests/fuzz/corpus/):
//   make_seed_corpus OUT_DIR
#include <cstdio>
#include <fstream>
#include <string>

#include "persist/safetensors.h"
#include "streaming/chunker.h"
#include "rpc/grpc_stream.h"

namespace {

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  buffer.Dump(&slices);
  std::string out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

void AppendFrame(std::string* stream, const std::string& frame) {
  stream->push_back(static_cast<char>(frame.size() & 0xff));
  stream->push_back(static_cast<char>((frame.size() >> 8) & 0xff));
  stream->append(frame);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seed_corpus OUT_DIR\n");
    return 2;
  }
  const std::string out = argv[1];
  using swarm::v1::DType;
  std::vector<swarm::TensorSpec> specs = {
      *swarm::MakeTensorSpec("w", swarm::v1::DTYPE_F32, {4, 8}),
      *swarm::MakeTensorSpec("b", swarm::v1::DTYPE_BF16, {8}),
      *swarm::MakeTensorSpec("s", swarm::v1::DTYPE_I64, {}),
      *swarm::MakeTensorSpec("e", swarm::v1::DTYPE_U8, {0})};
  auto model = std::make_shared<swarm::Model>(*swarm::Model::Create(specs));
  for (size_t i = 0; i < model->num_tensors(); ++i) {
    auto bytes = model->mutable_tensor_data(i);
    for (size_t j = 0; j < bytes.size(); ++j)
      bytes[j] = static_cast<char>(j * 7 + i);
  }
  model->metadata()["job"] = "seed";
  // Safetensors: a valid file, written through our writer.
  const std::string st = out + "/safetensors/valid.safetensors";
  if (!model->SaveSafetensors(st).ok()) return 1;
  // Assembler: a whole valid stream with 16-byte chunks... (chunk size is at
  // least 4 KiB, so the small model goes in one chunk per tensor).
  swarm::v1::ModelHeader header;
  header.set_kind(swarm::v1::MODEL_KIND_RESULT);
  header.set_job_id("seed");
  header.set_sender("site-a");
  auto chunker = *swarm::Chunker::Create(model, header, 4096);
  std::string stream;
  AppendFrame(&stream, Flatten(swarm::EncodeHeaderFrame(chunker->header())));
  while (auto chunk = chunker->NextChunk()) {
    AppendFrame(&stream, Flatten(swarm::EncodeChunkFrame(*chunk, nullptr)));
  }
  AppendFrame(&stream, Flatten(swarm::EncodeTrailerFrame(chunker->Trailer())));
  Write(out + "/assembler/valid_stream", stream);
  return 0;
}
