// stream_bench: streams a model from a gRPC client to a gRPC server on
// loopback, end to end (chunking, digest, assembly into the sink, digest
// check), into the memory sink and the disk sink; and, in the same run, raw
// loopback TCP throughput for the same byte count (two threads, a plain
// socket, 1 MiB writes). With --tls the gRPC channel uses mTLS, and raw
// loopback TLS (the same socket test through OpenSSL directly, no gRPC) is
// measured too, as the reference for what TLS itself costs here. The server
// runs in a child process, as a peer site does (--same-process keeps it in
// this one). Prints, for each, MB/s and the CPU seconds both ends spent per
// GiB; with --tls, tls_stream_ratio=<gRPC memory-sink MB/s / raw TLS MB/s>;
// and, last,
//   stream_ratio=<gRPC memory-sink MB/s / raw TCP MB/s>
// The raw limits are measured twice: first, before the receiver and gRPC
// start (nothing else runs in either process), and then interleaved with the
// gRPC runs. Ratios divide by the higher of the two medians; a note says
// when they differ by more than 15%.
//
// The model is eight F32 tensors sharing --size; with --one-tensor it is a
// single F32 tensor of --size bytes (rounded down to whole elements), which
// exercises one tensor past 2 GiB / 4 GiB end to end.
//
//   stream_bench [--size 1GiB] [--chunk 1MiB] [--repeat 3]
//                [--sinks memory,disk] [--dir /tmp] [--digest xxh3|sha256]
//                [--tls] [--same-process] [--one-tensor]
// Each figure is the median of --repeat runs after one cold run.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/byte_size.h"
#include "common/status_macros.h"
#include "rpc/grpc_stream.h"
#include "rpc/tls.h"
#include "security/certificates.h"
#include "security/sha256_digest.h"

namespace swarm {
namespace {

struct Options {
  uint64_t size = 1ull << 30;
  uint64_t chunk = 1ull << 20;
  int repeat = 3;
  bool memory = true;
  bool disk = true;
  std::string dir = "/tmp";
  v1::DigestAlgorithm digest = v1::DIGEST_XXH3_128;
  // mTLS between client and server (certificates made in memory).
  bool tls = false;
  // Run the receiving server in this process instead of a child process.
  bool same_process = false;
  // The whole --size as one F32 tensor instead of eight.
  bool one_tensor = false;
};

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    auto value = [&]() -> absl::StatusOr<absl::string_view> {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      }
      return absl::string_view(argv[++i]);
    };
    if (arg == "--size") {
      SWARM_ASSIGN_OR_RETURN(absl::string_view v, value());
      SWARM_ASSIGN_OR_RETURN(options.size, bench::ParseBytes(v));
    } else if (arg == "--chunk") {
      SWARM_ASSIGN_OR_RETURN(absl::string_view v, value());
      SWARM_ASSIGN_OR_RETURN(options.chunk, bench::ParseBytes(v));
    } else if (arg == "--repeat") {
      SWARM_ASSIGN_OR_RETURN(absl::string_view v, value());
      if (!absl::SimpleAtoi(v, &options.repeat) || options.repeat < 1) {
        return absl::InvalidArgumentError(
            "--repeat must be a positive integer");
      }
    } else if (arg == "--sinks") {
      SWARM_ASSIGN_OR_RETURN(absl::string_view v, value());
      options.memory = options.disk = false;
      for (absl::string_view sink : absl::StrSplit(v, ',')) {
        if (sink == "memory") {
          options.memory = true;
        } else if (sink == "disk") {
          options.disk = true;
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("unknown sink \"", sink, "\" (memory, disk)"));
        }
      }
    } else if (arg == "--dir") {
      SWARM_ASSIGN_OR_RETURN(absl::string_view v, value());
      options.dir = std::string(v);
    } else if (arg == "--digest") {
      SWARM_ASSIGN_OR_RETURN(absl::string_view v, value());
      if (v == "xxh3") {
        options.digest = v1::DIGEST_XXH3_128;
      } else if (v == "sha256") {
        options.digest = v1::DIGEST_SHA256;
      } else {
        return absl::InvalidArgumentError("--digest is xxh3 or sha256");
      }
    } else if (arg == "--tls") {
      options.tls = true;
    } else if (arg == "--same-process") {
      options.same_process = true;
    } else if (arg == "--one-tensor") {
      options.one_tensor = true;
    } else if (arg == "--help" || arg == "-h") {
      std::printf(
          "stream_bench [--size 1GiB] [--chunk 1MiB] [--repeat 3] "
          "[--sinks memory,disk] [--dir /tmp] [--digest xxh3|sha256] "
          "[--tls] [--same-process] [--one-tensor]\n");
      std::exit(0);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    }
  }
  return options;
}

// Two throughput figures of the same thing differ notably when one is below
// this share of the other.
constexpr double kFarBelow = 0.85;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// A raw loopback limit: measured before anything else runs (`before`, one
// figure per run) and alongside the gRPC runs (`alongside`, their median).
struct RawLimit {
  std::vector<double> before;
  double alongside = 0;

  // Prints both and returns the limit the ratios divide by: the higher
  // median, so that a raw figure slowed by whatever else ran in this process
  // cannot inflate a ratio.
  double Print(const char* name) const {
    const double first = Median(before);
    const double limit = std::max(first, alongside);
    std::printf(
        "%s limit: %.1f MB/s (median before the receiver and gRPC "
        "started %.1f, alongside the gRPC runs %.1f)\n",
        name, limit, first, alongside);
    if (alongside < kFarBelow * first) {
      std::printf(
          "note: %s alongside the gRPC runs is %.0f%% below its "
          "figure before them: something else ran meanwhile (here or on the "
          "machine)\n",
          name, (1 - alongside / first) * 100);
    } else if (first < kFarBelow * alongside) {
      std::printf(
          "note: %s before the gRPC runs is %.0f%% below its figure "
          "alongside them: the machine is busy, figures are noisy\n",
          name, (1 - first / alongside) * 100);
    }
    return limit;
  }
};

// As gRPC sets on its sockets: no Nagle delay for a stream's last bytes.
void SetNoDelay(int fd) {
  const int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

// One end of a raw loopback stream over a connected socket.
class RawEnd {
 public:
  virtual ~RawEnd() = default;
  // Takes over `fd` (the handshake, if any); false on failure.
  virtual bool Open(int fd) = 0;
  // As read(2)/write(2): bytes moved, or <= 0 on failure.
  virtual ssize_t Read(char* data, size_t size) = 0;
  virtual ssize_t Write(const char* data, size_t size) = 0;
  // Before the socket is closed.
  virtual void Close() {}
  // What went wrong, for an error message.
  virtual std::string LastError() { return std::strerror(errno); }
};

class TcpEnd final : public RawEnd {
 public:
  bool Open(int fd) override {
    fd_ = fd;
    return true;
  }
  ssize_t Read(char* data, size_t size) override {
    return read(fd_, data, size);
  }
  ssize_t Write(const char* data, size_t size) override {
    return write(fd_, data, size);
  }

 private:
  int fd_ = -1;
};

// One thread writes `bytes` through `writer` in 1 MiB pieces, another reads
// them through `reader`; timed from the end of the writer's handshake until
// the reader has everything.
absl::StatusOr<double> RawLoopbackMBps(uint64_t bytes, RawEnd* writer,
                                       RawEnd* reader) {
  constexpr size_t kPiece = 1 << 20;
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 ||
      bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string error = std::strerror(errno);
    if (listener >= 0) close(listener);
    return absl::InternalError(absl::StrCat("loopback listener: ", error));
  }
  std::atomic<uint64_t> received{0};
  std::thread reading([&] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;  // The writer could not connect.
    SetNoDelay(fd);
    std::vector<char> buffer(kPiece);
    uint64_t got = 0;
    if (reader->Open(fd)) {
      while (got < bytes) {
        const ssize_t n = reader->Read(buffer.data(), buffer.size());
        if (n <= 0) break;
        got += n;
      }
    }
    received = got;
    reader->Close();
    close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  absl::Time start = absl::Now();
  if (fd >= 0) SetNoDelay(fd);
  if (fd >= 0 &&
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      writer->Open(fd)) {
    start = absl::Now();
    std::vector<char> buffer(kPiece, 'x');
    uint64_t sent = 0;
    while (sent < bytes) {
      const ssize_t n = writer->Write(buffer.data(),
                                      std::min<uint64_t>(kPiece, bytes - sent));
      if (n <= 0) break;
      sent += n;
    }
  } else {
    shutdown(listener, SHUT_RDWR);  // Wakes the reader's accept().
  }
  // The reader must have everything before this end closes: unread bytes
  // here (a TLS session ticket) would turn the close into a reset.
  reading.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const std::string error = writer->LastError();
  writer->Close();
  if (fd >= 0) close(fd);
  close(listener);
  if (received != bytes) {
    return absl::DataLossError(absl::StrCat("moved ", received.load(), " of ",
                                            bytes, " bytes: ", error));
  }
  return bytes / seconds / 1e6;
}

// Raw loopback TCP: a plain socket.
absl::StatusOr<double> RawTcpMBps(uint64_t bytes) {
  TcpEnd writer;
  TcpEnd reader;
  return RawLoopbackMBps(bytes, &writer, &reader);
}

// An OpenSSL context for one end of the raw TLS measurement: TLS 1.3 with
// OpenSSL's default cipher suites (the same ones gRPC's channel offers and
// accepts), presenting `key_pem`/`cert_pem` and requiring a peer
// certificate signed by `ca_pem`, as the gRPC channel does.
absl::StatusOr<std::shared_ptr<SSL_CTX>> RawTlsContext(
    bool server, const std::string& key_pem, const std::string& cert_pem,
    const std::string& ca_pem) {
  std::shared_ptr<SSL_CTX> ctx(
      SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()),
      SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new failed");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  if (server) SSL_CTX_set_num_tickets(ctx.get(), 0);
  // Many records per read() instead of two reads per record.
  SSL_CTX_set_read_ahead(ctx.get(), 1);
  SSL_CTX_set_default_read_buffer_len(ctx.get(), 256 << 10);
  auto read_pem = [](const std::string& pem, auto reader) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(
        BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
    return reader(bio.get(), nullptr, nullptr, nullptr);
  };
  EVP_PKEY* key = read_pem(key_pem, PEM_read_bio_PrivateKey);
  X509* cert = read_pem(cert_pem, PEM_read_bio_X509);
  X509* ca = read_pem(ca_pem, PEM_read_bio_X509);
  const bool ok =
      key != nullptr && cert != nullptr && ca != nullptr &&
      SSL_CTX_use_certificate(ctx.get(), cert) == 1 &&
      SSL_CTX_use_PrivateKey(ctx.get(), key) == 1 &&
      X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), ca) == 1;
  EVP_PKEY_free(key);
  X509_free(cert);
  X509_free(ca);
  if (!ok) return absl::InternalError("cannot load the bench certificates");
  SSL_CTX_set_verify(
      ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

// One end of a TLS connection through OpenSSL directly.
class TlsEnd final : public RawEnd {
 public:
  TlsEnd(SSL_CTX* ctx, bool server) : ctx_(ctx), server_(server) {}
  ~TlsEnd() override { SSL_free(ssl_); }

  bool Open(int fd) override {
    ssl_ = SSL_new(ctx_);
    return ssl_ != nullptr && SSL_set_fd(ssl_, fd) == 1 &&
           (server_ ? SSL_accept(ssl_) : SSL_connect(ssl_)) == 1;
  }
  ssize_t Read(char* data, size_t size) override {
    return SSL_read(ssl_, data, static_cast<int>(size));
  }
  ssize_t Write(const char* data, size_t size) override {
    return SSL_write(ssl_, data, static_cast<int>(size));
  }
  void Close() override {
    if (ssl_ != nullptr) SSL_shutdown(ssl_);
  }
  std::string LastError() override {
    char error[256] = "no OpenSSL error";
    if (unsigned long code = ERR_get_error(); code != 0) {
      ERR_error_string_n(code, error, sizeof(error));
    }
    return error;
  }

 private:
  SSL_CTX* ctx_;
  bool server_;
  SSL* ssl_ = nullptr;
};

// Raw loopback TLS: the same through OpenSSL directly (no gRPC), the
// reference for what TLS itself costs on this machine.
absl::StatusOr<double> RawTlsMBps(uint64_t bytes, SSL_CTX* server_ctx,
                                  SSL_CTX* client_ctx) {
  TlsEnd writer(client_ctx, /*server=*/false);
  TlsEnd reader(server_ctx, /*server=*/true);
  return RawLoopbackMBps(bytes, &writer, &reader);
}

// The receiving site: assembles SubmitResult streams into the sink the
// client names in the "bench-sink" metadata: empty for memory, else the path
// of a disk sink (removed again after each stream).
class BenchPeer : public RawModelService {
 public:
  BenchPeer() {
    AddModelUploadMethod(
        "SubmitResult",
        [](grpc::ServerContext* context,
           grpc::ServerReader<grpc::ByteBuffer>* reader, v1::Reply* reply) {
          std::string path;
          auto it = context->client_metadata().find(kSinkMetadata);
          if (it != context->client_metadata().end()) {
            path = std::string(it->second.data(), it->second.size());
          }
          std::unique_ptr<TensorSink> sink;
          if (path.empty()) {
            sink = std::make_unique<MemorySink>();
          } else {
            sink = std::make_unique<DiskSink>(path);
          }
          Assembler assembler(sink.get(), AssemblerOptions());
          absl::StatusOr<Model> model = ReceiveModelStream(reader, &assembler);
          if (!path.empty()) std::filesystem::remove(path);
          if (!model.ok()) return ToGrpcStatus(model.status());
          reply->set_message(absl::StrCat(model->total_bytes()));
          return grpc::Status::OK;  // The model is dropped here.
        });
  }
  static constexpr char kSinkMetadata[] = "bench-sink";
};

// PEM material for both ends, made in memory as swarmctl provision would.
struct TlsMaterial {
  std::string ca_cert;
  security::KeyAndCert server;
  security::KeyAndCert client;
};

absl::StatusOr<TlsMaterial> MakeTlsMaterial() {
  SWARM_ASSIGN_OR_RETURN(security::KeyAndCert ca,
                         security::CreateCa("bench CA"));
  security::CertRequest request;
  request.role = security::kSiteRole;
  request.ip_addresses = {"127.0.0.1"};
  request.common_name = "bench-server";
  TlsMaterial material;
  material.ca_cert = ca.cert_pem;
  SWARM_ASSIGN_OR_RETURN(material.server,
                         security::IssueCertificate(ca, request));
  request.common_name = "bench-client";
  SWARM_ASSIGN_OR_RETURN(material.client,
                         security::IssueCertificate(ca, request));
  return material;
}

// Starts the receiving server on a free loopback port; sets *port.
std::unique_ptr<grpc::Server> StartServer(BenchPeer* peer,
                                          const std::optional<TlsMaterial>& tls,
                                          int* port) {
  std::shared_ptr<grpc::ServerCredentials> credentials =
      tls.has_value() ? security::ServerCredentials(
                            {tls->server.key_pem, tls->server.cert_pem,
                             tls->ca_cert, "bench-server", ""})
                      : grpc::InsecureServerCredentials();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", credentials, port);
  ApplyModelStreamArgs(&builder, AssemblerLimits());
  builder.RegisterService(peer);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) return nullptr;
  return server;
}

// The receiver in its own process, as a peer site is: serves until the
// parent closes its end of `stop_fd` (or dies). Writes the port, or 0 on
// failure, to `port_fd`. Must be called before this process starts any
// thread (it is forked).
[[noreturn]] void ServeInChild(const std::optional<TlsMaterial>& tls,
                               int port_fd, int stop_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  TuneMallocForModelStreams();
  BenchPeer peer;
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartServer(&peer, tls, &port);
  if (write(port_fd, &port, sizeof(port)) != sizeof(port) ||
      server == nullptr) {
    _exit(1);
  }
  char byte;
  while (read(stop_fd, &byte, 1) < 0 && errno == EINTR) {
  }
  server->Shutdown();
  _exit(0);
}

std::shared_ptr<const Model> MakeModel(uint64_t size, bool one_tensor) {
  // Eight F32 tensors (or one); xorshift contents so the digest sees real
  // data.
  const uint64_t elements = size / 4;
  const int tensors = one_tensor ? 1 : 8;
  std::vector<TensorSpec> specs;
  uint64_t left = elements;
  for (int i = 0; i < tensors && left > 0; ++i) {
    const uint64_t n =
        i == tensors - 1 ? left : std::min(left, elements / tensors);
    specs.push_back(*MakeTensorSpec(absl::StrCat("layer", i, ".weight"),
                                    v1::DTYPE_F32, {n}));
    left -= n;
  }
  Model model = *Model::Create(std::move(specs));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (size_t t = 0; t < model.num_tensors(); ++t) {
    absl::Span<char> bytes = model.mutable_tensor_data(t);
    uint64_t* words = reinterpret_cast<uint64_t*>(bytes.data());
    for (size_t w = 0; w < bytes.size() / 8; ++w) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      words[w] = state;
    }
  }
  return std::make_shared<Model>(std::move(model));
}

// Streams `model` to the receiver, into the memory sink when `disk_path`
// is empty, else into a disk sink at that path.
absl::StatusOr<double> StreamMBps(grpc::Channel* channel,
                                  const std::shared_ptr<const Model>& model,
                                  const Options& options,
                                  const std::string& disk_path) {
  v1::ModelHeader header;
  header.set_kind(v1::MODEL_KIND_RESULT);
  header.set_job_id("bench");
  header.set_sender("bench-client");
  header.set_digest_algorithm(options.digest);
  const absl::Time start = absl::Now();
  SWARM_ASSIGN_OR_RETURN(std::unique_ptr<Chunker> chunker,
                         Chunker::Create(model, header, options.chunk));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::hours(1));
  if (!disk_path.empty())
    context.AddMetadata(BenchPeer::kSinkMetadata, disk_path);
  SWARM_ASSIGN_OR_RETURN(
      v1::Reply reply,
      StreamModelToPeer(channel, "SubmitResult", &context, chunker.get()));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (reply.message() != absl::StrCat(model->total_bytes())) {
    return absl::DataLossError("server assembled a different size");
  }
  return model->total_bytes() / seconds / 1e6;
}

// CPU seconds (user + system) used so far by this process (`self`) and by
// the receiver process `child` (0 when there is none).
struct CpuUse {
  double self = 0;
  double child = 0;
};

CpuUse CpuSeconds(pid_t child) {
  CpuUse use;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  use.self = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 +
             usage.ru_stime.tv_sec + usage.ru_stime.tv_usec / 1e6;
  if (child <= 0) return use;
  std::ifstream stat(absl::StrCat("/proc/", child, "/stat"));
  std::string line;
  std::getline(stat, line);
  // utime and stime (fields 14 and 15, in clock ticks) counted from the
  // state field that follows the ")" ending the command name.
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return use;
  std::vector<std::string> fields = absl::StrSplit(line.substr(paren + 2), ' ');
  double utime = 0;
  double stime = 0;
  if (fields.size() > 12 && absl::SimpleAtod(fields[11], &utime) &&
      absl::SimpleAtod(fields[12], &stime)) {
    use.child = (utime + stime) / sysconf(_SC_CLK_TCK);
  }
  return use;
}

int Run(const Options& options) {
  std::optional<TlsMaterial> tls;
  if (options.tls) {
    absl::StatusOr<TlsMaterial> material = MakeTlsMaterial();
    if (!material.ok()) {
      std::fprintf(stderr, "cannot make certificates: %s\n",
                   material.status().ToString().c_str());
      return 1;
    }
    tls = *std::move(material);
  }
  std::shared_ptr<SSL_CTX> raw_tls_server;
  std::shared_ptr<SSL_CTX> raw_tls_client;
  if (tls.has_value()) {
    absl::StatusOr<std::shared_ptr<SSL_CTX>> server_ctx = RawTlsContext(
        true, tls->server.key_pem, tls->server.cert_pem, tls->ca_cert);
    absl::StatusOr<std::shared_ptr<SSL_CTX>> client_ctx = RawTlsContext(
        false, tls->client.key_pem, tls->client.cert_pem, tls->ca_cert);
    if (!server_ctx.ok() || !client_ctx.ok()) {
      std::fprintf(stderr, "raw TLS: %s\n",
                   (server_ctx.ok() ? client_ctx.status() : server_ctx.status())
                       .ToString()
                       .c_str());
      return 1;
    }
    raw_tls_server = *server_ctx;
    raw_tls_client = *client_ctx;
  }
  // The raw limits once more, before anything else runs: no receiver, no
  // gRPC threads, nothing streamed yet. A ratio divides by the higher of
  // this and the figure measured alongside the gRPC runs, so nothing the
  // gRPC parts leave running can inflate it.
  // Like every measurement, one cold run first that does not count.
  RawLimit tcp_limit;
  RawLimit tls_limit;
  for (int i = 0; i <= options.repeat; ++i) {
    absl::StatusOr<double> mbps = RawTcpMBps(options.size);
    if (!mbps.ok()) {
      std::fprintf(stderr, "raw loopback TCP: %s\n",
                   mbps.status().ToString().c_str());
      return 1;
    }
    if (i > 0) tcp_limit.before.push_back(*mbps);
    if (tls.has_value()) {
      mbps =
          RawTlsMBps(options.size, raw_tls_server.get(), raw_tls_client.get());
      if (!mbps.ok()) {
        std::fprintf(stderr, "raw loopback TLS: %s\n",
                     mbps.status().ToString().c_str());
        return 1;
      }
      if (i > 0) tls_limit.before.push_back(*mbps);
    }
  }

  // The receiver: a child process (as a peer site is), forked before this
  // process starts any thread; or, with --same-process, a server here.
  BenchPeer peer;
  std::unique_ptr<grpc::Server> local_server;
  int port = 0;
  int stop_fd = -1;
  pid_t child = -1;
  if (options.same_process) {
    local_server = StartServer(&peer, tls, &port);
  } else {
    int port_pipe[2];
    int stop_pipe[2];
    if (pipe(port_pipe) != 0 || pipe(stop_pipe) != 0) {
      std::perror("pipe");
      return 1;
    }
    child = fork();
    if (child < 0) {
      std::perror("fork");
      return 1;
    }
    if (child == 0) {
      close(port_pipe[0]);
      close(stop_pipe[1]);
      ServeInChild(tls, port_pipe[1], stop_pipe[0]);
    }
    close(port_pipe[1]);
    close(stop_pipe[0]);
    stop_fd = stop_pipe[1];
    if (read(port_pipe[0], &port, sizeof(port)) != sizeof(port)) port = 0;
    close(port_pipe[0]);
  }
  if (port == 0) {
    std::fprintf(stderr, "cannot start the gRPC server on loopback\n");
    return 1;
  }
  auto stop_receiver = [&] {
    if (local_server != nullptr) local_server->Shutdown();
    if (child > 0) {
      close(stop_fd);
      waitpid(child, nullptr, 0);
    }
  };

  TuneMallocForModelStreams();
  std::printf(
      "stream_bench: %.1f MiB model in %s, %.0f KiB chunks, %s digest, %s, "
      "receiver in %s, median of %d\n",
      options.size / 1048576.0,
      options.one_tensor ? "one tensor" : "eight tensors",
      options.chunk / 1024.0,
      options.digest == v1::DIGEST_SHA256 ? "sha256" : "xxh3-128",
      options.tls ? "mTLS" : "plaintext",
      options.same_process ? "this process" : "a child process",
      options.repeat);
  std::fflush(stdout);
  std::shared_ptr<const Model> model =
      MakeModel(options.size, options.one_tensor);

  std::shared_ptr<grpc::ChannelCredentials> channel_credentials =
      tls.has_value() ? security::ClientCredentials(
                            {tls->client.key_pem, tls->client.cert_pem,
                             tls->ca_cert, "bench-client", ""})
                      : grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  ApplyModelStreamArgs(&args, AssemblerLimits());
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), channel_credentials, args);

  // Each measurement runs once cold (reported, not counted: the first touch
  // of fresh memory, connection set-up), then --repeat times; the runs of
  // the different measurements are interleaved so that drift in the
  // machine's load affects all of them alike. Figures are medians.
  struct Measurement {
    const char* name;
    std::function<absl::StatusOr<double>()> run;
    // Whether the receiver process takes part (the gRPC measurements).
    bool uses_receiver = true;
    std::vector<double> figures = {};
    double cold = 0;
    // CPU seconds over the counted runs: this process (the sender, and the
    // raw measurements' reader thread) and the receiver process.
    CpuUse cpu = {};
  };
  const std::string disk_path =
      (std::filesystem::path(options.dir) /
       absl::StrCat("stream_bench.", getpid(), ".safetensors"))
          .string();
  std::vector<Measurement> measurements;
  measurements.push_back(
      {"raw loopback TCP", [&] { return RawTcpMBps(options.size); }, false});
  if (tls.has_value()) {
    measurements.push_back({"raw loopback TLS",
                            [&] {
                              return RawTlsMBps(options.size,
                                                raw_tls_server.get(),
                                                raw_tls_client.get());
                            },
                            false});
  }
  const size_t raw_tls_index = measurements.size() - 1;
  const size_t memory_index = measurements.size();
  if (options.memory) {
    measurements.push_back(
        {"gRPC -> memory sink",
         [&] { return StreamMBps(channel.get(), model, options, ""); }});
  }
  if (options.disk) {
    measurements.push_back(
        {"gRPC -> disk sink",
         [&] { return StreamMBps(channel.get(), model, options, disk_path); }});
  }
  // The disk sink goes last, on its own: its writeback would slow the others.
  auto run_all = [&](size_t first, size_t last) -> bool {
    for (int i = 0; i <= options.repeat; ++i) {
      for (size_t k = first; k < last; ++k) {
        Measurement& m = measurements[k];
        const CpuUse before = CpuSeconds(child);
        absl::StatusOr<double> mbps = m.run();
        if (i > 0) {
          const CpuUse after = CpuSeconds(child);
          m.cpu.self += after.self - before.self;
          // The idle receiver's few ticks are not the raw measurements' own.
          if (m.uses_receiver) m.cpu.child += after.child - before.child;
        }
        if (!mbps.ok()) {
          std::fprintf(stderr, "%s: %s\n", m.name,
                       mbps.status().ToString().c_str());
          return false;
        }
        if (i == 0) {
          m.cold = *mbps;
        } else {
          m.figures.push_back(*mbps);
        }
      }
    }
    return true;
  };
  const size_t in_memory =
      options.disk ? measurements.size() - 1 : measurements.size();
  if (!run_all(0, in_memory) || !run_all(in_memory, measurements.size())) {
    stop_receiver();
    return 1;
  }
  for (const Measurement& m : measurements) {
    const double gib =
        static_cast<double>(options.size) * options.repeat / (1ull << 30);
    std::printf("%-22s %9.1f MB/s  %5.2f CPU-s/GiB", m.name, Median(m.figures),
                (m.cpu.self + m.cpu.child) / gib);
    if (m.cpu.child > 0) {
      std::printf(" (sender %.2f, receiver %.2f)", m.cpu.self / gib,
                  m.cpu.child / gib);
    }
    std::printf("  (cold %.0f; runs:", m.cold);
    for (double f : m.figures) std::printf(" %.0f", f);
    std::printf(")\n");
  }
  tcp_limit.alongside = Median(measurements[0].figures);
  const double tcp = tcp_limit.Print("raw loopback TCP");
  double raw_tls = 0;
  if (tls.has_value()) {
    tls_limit.alongside = Median(measurements[raw_tls_index].figures);
    raw_tls = tls_limit.Print("raw loopback TLS");
  }
  if (options.disk) {
    std::printf("disk_ratio=%.3f\n", Median(measurements.back().figures) / tcp);
  }
  if (options.memory && tls.has_value()) {
    // How much of TLS's own throughput the gRPC stream keeps.
    std::printf("tls_stream_ratio=%.3f\n",
                Median(measurements[memory_index].figures) / raw_tls);
  }
  if (options.memory) {
    std::printf("stream_ratio=%.3f\n",
                Median(measurements[memory_index].figures) / tcp);
  }
  stop_receiver();
  return 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) {
  absl::StatusOr<swarm::Options> options = swarm::ParseOptions(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "stream_bench: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  swarm::security::RegisterSha256StreamDigest();  // For --digest sha256.
  return swarm::Run(*options);
}
