// trainer_bench: the trainer link's model hand-off against a raw Unix-socket
// copy of the same bytes, in the same run.
//
// Hand-off: an ExternalLearner in launch mode starts this program as a C++
// echo trainer (--echo), which attaches over the link's Unix socket, maps
// each task's model file and writes it back unchanged as its result. One
// measured round trip is one Learner::Train call on the daemon side: the
// daemon writes the model file, the trainer maps it and writes the result
// file, the daemon maps the result and checks it (table, finite values).
//
// Raw: the same bytes over a socketpair to a child process that reads them
// into a buffer and writes them back (1 MiB reads and writes), read back into
// a buffer by the parent.
//
// Prints both times (median of --repeat runs after a warm-up each) and, last,
//   trainer_handoff_ratio=<raw seconds / hand-off seconds>
// (>= 1 means the hand-off is at least as fast as the raw socket copy).
//
//   trainer_bench [--size 1GiB] [--repeat 3] [--dir /tmp]
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/trainer_link.grpc.pb.h"
#include "model/model.h"
#include "trainerlink/external_learner.h"
#include "trainerlink/model_files.h"

namespace swarm {
namespace {

constexpr size_t kIo = 1 << 20;

int Echo() {
  const char* socket = getenv(trainerlink::kSocketEnv);
  if (socket == nullptr) {
    std::fprintf(stderr, "echo trainer: %s not set\n", trainerlink::kSocketEnv);
    return 2;
  }
  auto stub = v1::TrainerLink::NewStub(grpc::CreateChannel(
      absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()));
  v1::AttachRequest attach;
  attach.set_protocol_version(trainerlink::kProtocolVersion);
  attach.set_trainer_name("echo");
  attach.set_pid(getpid());
  v1::AttachReply attached;
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  grpc::Status status = stub->Attach(&context, attach, &attached);
  if (!status.ok()) {
    std::fprintf(stderr, "echo trainer: attach: %s\n",
                 status.error_message().c_str());
    return 1;
  }
  while (true) {
    v1::NextTaskRequest next;
    next.set_session_id(attached.session_id());
    next.set_wait_ms(1000);
    v1::NextTaskReply reply;
    grpc::ClientContext next_context;
    status = stub->NextTask(&next_context, next, &reply);
    if (!status.ok()) return 0;  // The daemon went away.
    const v1::TrainerTask& task = reply.task();
    if (task.kind() != v1::TRAINER_TASK_TRAIN) {
      v1::HeartbeatRequest beat;
      beat.set_session_id(attached.session_id());
      v1::HeartbeatReply beat_reply;
      grpc::ClientContext beat_context;
      stub->Heartbeat(&beat_context, beat, &beat_reply);
      continue;
    }
    absl::StatusOr<Model> model = Model::LoadSafetensors(task.model_path());
    v1::SubmitResultRequest submit;
    submit.set_session_id(attached.session_id());
    submit.set_task_id(task.task_id());
    submit.set_sample_count(1);
    absl::Status written =
        model.ok() ? trainerlink::WriteHandoffFile(*model, task.result_path())
                   : model.status();
    if (!written.ok()) submit.set_failure(std::string(written.message()));
    v1::LinkReply link_reply;
    grpc::ClientContext submit_context;
    stub->SubmitResult(&submit_context, submit, &link_reply);
  }
}

bool WriteAll(int fd, const char* data, uint64_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, std::min<uint64_t>(size, kIo));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= n;
  }
  return true;
}

bool ReadAll(int fd, char* data, uint64_t size) {
  while (size > 0) {
    const ssize_t n = read(fd, data, std::min<uint64_t>(size, kIo));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= n;
  }
  return true;
}

// Raw: parent -> child -> parent over a socketpair; the child keeps the whole
// model in a buffer between reading and writing back, as a trainer would.
absl::StatusOr<absl::Duration> RawRoundTrip(const Model& model,
                                            std::vector<char>* back) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    return absl::InternalError("socketpair failed");
  }
  const uint64_t size = model.total_bytes();
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    std::vector<char> buffer(size);  // Touched (zeroed) before "ready".
    const char ready = 'r';
    const bool ok = WriteAll(fds[1], &ready, 1) && ReadAll(fds[1], buffer.data(), size) &&
                    WriteAll(fds[1], buffer.data(), size);
    _exit(ok ? 0 : 1);
  }
  close(fds[1]);
  // The child allocates its buffer before timing starts.
  char ready = 0;
  if (!ReadAll(fds[0], &ready, 1)) return absl::InternalError("raw echo died");
  const absl::Time start = absl::Now();
  std::thread writer([&] { WriteAll(fds[0], model.tensor_data(0).data(), size); });
  const bool ok = ReadAll(fds[0], back->data(), size);
  writer.join();
  const absl::Duration took = absl::Now() - start;
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError("raw echo failed");
  }
  return took;
}

int Run(int argc, char** argv) {
  uint64_t size = 1ull << 30;
  int repeat = 3;
  std::string dir = "/tmp";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--echo") return Echo();
    if (arg == "--size" && i + 1 < argc) {
      std::string v = argv[++i];
      uint64_t scale = 1;
      if (absl::EndsWith(v, "GiB")) scale = 1ull << 30;
      else if (absl::EndsWith(v, "MiB")) scale = 1ull << 20;
      if (scale > 1) v = v.substr(0, v.size() - 3);
      if (!absl::SimpleAtoi(v, &size)) {
        std::fprintf(stderr, "bad --size\n");
        return 2;
      }
      size *= scale;
    } else if (arg == "--repeat" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &repeat) || repeat < 1) return 2;
    } else if (arg == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: trainer_bench [--size 1GiB] [--repeat 3] "
                   "[--dir /tmp]\n");
      return 2;
    }
  }
  size = size / 4 * 4;
  std::string workspace = absl::StrCat(dir, "/trainer-bench-XXXXXX");
  if (mkdtemp(workspace.data()) == nullptr) {
    std::fprintf(stderr, "mkdtemp in %s failed\n", dir.c_str());
    return 1;
  }
  absl::StatusOr<TensorSpec> spec =
      MakeTensorSpec("weight", v1::DTYPE_F32, {size / 4});
  absl::StatusOr<Model> model =
      Model::Create({*spec}, HeapStorage::Init::kUninitialized);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::memset(model->mutable_tensor_data(0).data(), 0x3f, size);  // 0.747f

  v1::SiteConfig config;
  config.set_name("bench");
  config.set_workspace(workspace);
  config.mutable_learner()->set_kind("external");
  config.mutable_trainer()->set_mode("launch");
  config.mutable_trainer()->add_command(
      std::filesystem::read_symlink("/proc/self/exe").string());
  config.mutable_trainer()->add_command("--echo");
  config.mutable_trainer()->set_lease_ms(30000);
  absl::StatusOr<std::unique_ptr<trainerlink::ExternalLearner>> learner =
      trainerlink::ExternalLearner::Create(config);
  if (!learner.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(learner.status().message()).c_str());
    return 1;
  }
  std::vector<char> back(size);
  std::vector<double> handoff, raw;
  std::atomic<bool> cancel{false};
  for (int i = 0; i <= repeat; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<TrainOutput> out = (*learner)->Train(*model, i, cancel);
    const absl::Duration took = absl::Now() - start;
    if (!out.ok()) {
      std::fprintf(stderr, "hand-off: %s\n",
                   std::string(out.status().message()).c_str());
      return 1;
    }
    if (out->model.tensor_data(0) != model->tensor_data(0)) {
      std::fprintf(stderr, "hand-off: the echoed model differs\n");
      return 1;
    }
    absl::StatusOr<absl::Duration> raw_took = RawRoundTrip(*model, &back);
    if (!raw_took.ok()) {
      std::fprintf(stderr, "%s\n",
                   std::string(raw_took.status().message()).c_str());
      return 1;
    }
    if (std::memcmp(back.data(), model->tensor_data(0).data(), size) != 0) {
      std::fprintf(stderr, "raw: the echoed bytes differ\n");
      return 1;
    }
    std::printf("run %d%s: hand-off %.3f s, raw socket %.3f s\n", i,
                i == 0 ? " (warm-up)" : "", absl::ToDoubleSeconds(took),
                absl::ToDoubleSeconds(*raw_took));
    std::fflush(stdout);
    if (i > 0) {
      handoff.push_back(absl::ToDoubleSeconds(took));
      raw.push_back(absl::ToDoubleSeconds(*raw_took));
    }
  }
  (*learner)->Shutdown();
  learner->reset();
  std::filesystem::remove_all(workspace);
  std::sort(handoff.begin(), handoff.end());
  std::sort(raw.begin(), raw.end());
  const double h = handoff[handoff.size() / 2];
  const double r = raw[raw.size() / 2];
  const double gib = static_cast<double>(size) / (1ull << 30);
  std::printf("model %.3f GiB F32, daemon -> trainer -> daemon, median of %d\n",
              gib, repeat);
  std::printf("handoff_seconds=%.3f (%.2f GiB/s each way)\n", h, 2 * gib / h);
  std::printf("raw_unix_socket_seconds=%.3f (%.2f GiB/s each way)\n", r,
              2 * gib / r);
  std::printf("trainer_handoff_ratio=%.2f\n", r / h);
  return 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Run(argc, argv); }
