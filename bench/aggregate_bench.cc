// Aggregation throughput against memcpy, and FedAvg's peak memory.
//
//   aggregate_bench [--n 8] [--size 256MiB] [--coord_size 32MiB]
//                   [--repeat 3] [--threads 0] [--offload_dir DIR]
//                   [--fedavg_only] [--accumulator compensated|f64]
//                   [--memcpy_runs 5] [--memcpy_only]
//                   [--isa portable|avx2|avx512]
//
// FedAvg of n F32 results of `size` bytes each, fed one at a time the way
// the daemon feeds them: each result streams in 1 MiB chunks into the
// aggregator's result sink (which checks the values of each chunk while it
// is in cache), is added, and is freed before the next one is created, so
// the process never holds more than one result. Timed: creating the
// aggregator, the sink's per-chunk checks, every Add and Finish; not timed:
// producing the result bytes (the network's part). Run first, so that the
// peak RSS (VmHWM) read right after it is FedAvg's own: running sum plus the
// result in flight.
//
// The limit, first: single-threaded memcpy over the same number of bytes
// (n * size, copying one size-byte buffer into another n times, buffers
// mapped like model storage and faulted in beforehand), best of
// --memcpy_runs runs, measured both in a fresh process (this binary run
// again with --memcpy_only, which prints the figure on its own too) and in
// this one before any aggregation work, while it runs no other thread. The
// higher figure is the limit every "x memcpy" divides by; a note says when
// the two differ by more than 15%. After the FedAvg runs memcpy is measured
// once more, for information only (a note when it fell far below).
//
// In the same run: FedAvg of results that did not come through the sink
// (Add scans them first), FedAvg with the F64 accumulator, and median and
// trimmed mean (smaller results by default: they write every result to disk
// and sort n values per coordinate). FedAvg is measured `repeat` times and
// the best run is used.
//
// The add's own limit (AddLimit): memcpy moves fewer bytes than FedAvg's
// add, which reads the result and reads and writes the running sum (16
// bytes per element with the compensated sum, 20 with F64, against
// memcpy's 8). A standalone kernel does the same passes over a sum of
// FedAvg's layout (allocated the same way, split over the same threads,
// built for the same vector ISA) with a plain add, in turn with the FedAvg
// runs after the first; FedAvg's adds (the Add calls alone) are reported
// against it, for full weights and for weight differences (the same Add;
// their Finish also reads the base): "fedavg add ... x the add limit" and
// fedavg_add_over_limit= / diff_add_over_limit=. Target: >= 0.8.
// --isa portable|avx2 caps the kernels' vector ISA, as on an older CPU.
//
// Last line: aggregate_ratio=<FedAvg result bytes per second / memcpy bytes
// per second>. Targets: ratio >= 0.7, and peak RSS <= 3x size with n = 8.
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "gatherer/aggregator.h"
#include "gatherer/aggregator_internal.h"
#include "gatherer/aggregator_kernels.h"
#include "model/model.h"
#include "model/tensor_sink.h"

namespace swarm {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "aggregate_bench: %s\n", message.c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> value) {
  if (!value.ok()) Die(value.status().ToString());
  return std::move(*value);
}
void OrDie(const absl::Status& status) {
  if (!status.ok()) Die(status.ToString());
}

// "256MiB", "1GiB", "64KiB", "1000000", "32MB".
bool ParseSize(absl::string_view text, uint64_t* out) {
  const std::string lower = absl::AsciiStrToLower(text);
  absl::string_view digits = lower;
  uint64_t unit = 1;
  const std::pair<absl::string_view, uint64_t> kUnits[] = {
      {"kib", 1ull << 10}, {"mib", 1ull << 20},
      {"gib", 1ull << 30}, {"kb", 1000},
      {"mb", 1000000},     {"gb", 1000000000},
      {"k", 1ull << 10},   {"m", 1ull << 20},
      {"g", 1ull << 30},   {"b", 1}};
  for (const auto& [suffix, factor] : kUnits) {
    if (digits.size() > suffix.size() &&
        digits.substr(digits.size() - suffix.size()) == suffix) {
      digits.remove_suffix(suffix.size());
      unit = factor;
      break;
    }
  }
  uint64_t value;
  if (!absl::SimpleAtoi(digits, &value)) return false;
  *out = value * unit;
  return true;
}

std::string Mib(uint64_t bytes) {
  return absl::StrFormat("%.0fMiB", bytes / 1048576.0);
}

// Starts VmHWM over from the current resident set (Linux 4.0+), so that
// PeakRss() covers only what runs from here on.
void ResetPeakRss() {
  std::ofstream clear_refs("/proc/self/clear_refs");
  clear_refs << "5";
}

// Peak resident set of the process so far, in bytes (VmHWM).
uint64_t PeakRss() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    }
  }
  return 0;
}

struct Config {
  int n = 8;
  uint64_t size = 256ull << 20;
  uint64_t coord_size = 32ull << 20;
  int repeat = 3;
  int threads = 0;
  std::string offload_dir;
  bool fedavg_only = false;
  // Runs of the memcpy limit (each copies n * size bytes); the best counts.
  int memcpy_runs = 5;
  // Only measure the memcpy limit and print memcpy_seconds= (the fresh
  // process the bench starts for its comparison; usable on its own).
  bool memcpy_only = false;
  F32Accumulator accumulator = F32Accumulator::kCompensated;
};

// F32 tensors of at most 64 MiB each, `size` bytes in all.
std::vector<TensorSpec> Layout(uint64_t size) {
  std::vector<TensorSpec> specs;
  uint64_t left = size / 4;
  for (int i = 0; left > 0; ++i) {
    const uint64_t elements = std::min<uint64_t>(left, 16ull << 20);
    specs.push_back(OrDie(MakeTensorSpec(absl::StrCat("layer", i, ".weight"),
                                         v1::DTYPE_F32, {elements})));
    left -= elements;
  }
  return specs;
}

// Bytes standing in for what the network delivers: 1 MiB of varied floats.
class Wire {
 public:
  static constexpr uint64_t kChunk = 1 << 20;
  Wire() : bytes_(kChunk) {
    std::mt19937 random(7);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    float* values = reinterpret_cast<float*>(bytes_.data());
    for (uint64_t i = 0; i < kChunk / 4; ++i) values[i] = normal(random);
  }
  // Fills `size` bytes with the chunk, varied per result.
  void Fill(char* out, uint64_t size, int result) const {
    const uint64_t shift = (static_cast<uint64_t>(result) * 4096) % kChunk;
    uint64_t done = 0;
    while (done < size) {
      const uint64_t from = (shift + done) % kChunk;
      const uint64_t n = std::min(size - done, kChunk - from);
      std::memcpy(out + done, bytes_.data() + from, n);
      done += n;
    }
  }

 private:
  std::vector<char> bytes_;
};

struct RunResult {
  double seconds = 0;  // Timed part.
  double add_seconds = 0;
  double check_seconds = 0;
  double finish_seconds = 0;
};

// Adds result `r` (sample count 1000 + 100 r), timed into `run`.
void TimedAdd(Aggregator* aggregator, const Model& result, int r,
              v1::PayloadKind kind, RunResult* run) {
  const Clock::time_point start = Clock::now();
  OrDie(aggregator->Add(result, 1000 + 100 * r, kind));
  const double add = Seconds(start);
  run->add_seconds += add;
  run->seconds += add;
}

// Finishes the aggregate, timed into `run`.
void TimedFinish(Aggregator* aggregator, RunResult* run) {
  const Clock::time_point start = Clock::now();
  Model next = OrDie(aggregator->Finish());
  run->finish_seconds = Seconds(start);
  run->seconds += run->finish_seconds;
}

// Streams `n` results through the aggregator's sink chunk by chunk and adds
// each; see the file comment for what is timed.
RunResult RunThroughSinks(
    const Config& config, const AggregatorOptions& options,
    const std::shared_ptr<const Model>& base, const Wire& wire,
    v1::PayloadKind kind = v1::PAYLOAD_KIND_FULL_WEIGHTS) {
  const std::vector<TensorSpec>& specs = base->specs();
  RunResult run;
  Clock::time_point start = Clock::now();
  std::unique_ptr<Aggregator> aggregator =
      OrDie(Aggregator::Create(options, base));
  run.seconds += Seconds(start);
  v1::ModelHeader header;
  header.set_kind(v1::MODEL_KIND_RESULT);
  for (int r = 0; r < config.n; ++r) {
    std::unique_ptr<TensorSink> sink = OrDie(aggregator->NewResultSink());
    OrDie(sink->Begin(header, specs));
    for (uint32_t t = 0; t < specs.size(); ++t) {
      for (uint64_t offset = 0; offset < specs[t].byte_size;
           offset += Wire::kChunk) {
        const uint64_t n = std::min(Wire::kChunk, specs[t].byte_size - offset);
        char* out = OrDie(sink->WritableRange(t, offset, n));
        wire.Fill(out, n, r);  // The network's part: not timed.
        start = Clock::now();
        OrDie(sink->CommitRange(t, offset, n));
        const double check = Seconds(start);
        run.check_seconds += check;
        run.seconds += check;
      }
    }
    Model result = OrDie(sink->Finish());
    TimedAdd(aggregator.get(), result, r, kind, &run);
  }
  TimedFinish(aggregator.get(), &run);
  return run;
}

// Results made directly as models (not through the sink): Add scans them.
RunResult RunUncheckedModels(const Config& config,
                             const AggregatorOptions& options,
                             const std::shared_ptr<const Model>& base,
                             const Wire& wire) {
  const std::vector<TensorSpec>& specs = base->specs();
  RunResult run;
  Clock::time_point start = Clock::now();
  std::unique_ptr<Aggregator> aggregator =
      OrDie(Aggregator::Create(options, base));
  run.seconds += Seconds(start);
  for (int r = 0; r < config.n; ++r) {
    Model result =
        OrDie(Model::Create(specs, HeapStorage::Init::kUninitialized));
    for (size_t t = 0; t < specs.size(); ++t) {
      wire.Fill(result.mutable_tensor_data(t).data(), specs[t].byte_size, r);
    }
    TimedAdd(aggregator.get(), result, r, v1::PAYLOAD_KIND_FULL_WEIGHTS,
             &run);
  }
  TimedFinish(aggregator.get(), &run);
  return run;
}

// ---------------------------------------------------------------------------
// The memory-traffic limit of FedAvg's add: per element of a result, the
// least work that moves the same bytes as FedAvg's Add. It reads the F32
// result and read-modify-writes a running sum of FedAvg's layout (an F32
// head in a model's storage plus a BF16 term per element in a second buffer
// with the same 64-byte-aligned per-tensor offsets; or, with the F64
// accumulator, one double per element), with a plain add and no error-free
// transformation. Like FedAvg, the first of the n passes writes the sum
// without reading it. Built for the same vector ISA as FedAvg's kernels
// (chosen at run time the same way) and run on the same threads, work split
// and memory kind, so that what separates FedAvg from it is the arithmetic.

template <typename Sum>
__attribute__((always_inline)) inline void LimitBody(const char* x,
                                                     uint64_t n, float w,
                                                     bool first,
                                                     float* __restrict hi,
                                                     Sum* __restrict lo) {
  if (first) {
    for (uint64_t i = 0; i < n; ++i) {
      hi[i] = w * LoadRaw<float>(x, i);
      lo[i] = 0;
    }
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    hi[i] += w * LoadRaw<float>(x, i);
    lo[i] += 1;
  }
}
// The F64 layout: one double per element (hi unused).
__attribute__((always_inline)) inline void LimitBodyF64(const char* x,
                                                        uint64_t n, double w,
                                                        bool first,
                                                        double* __restrict acc) {
  if (first) {
    for (uint64_t i = 0; i < n; ++i) acc[i] = w * LoadRaw<float>(x, i);
    return;
  }
  for (uint64_t i = 0; i < n; ++i) acc[i] += w * LoadRaw<float>(x, i);
}

void LimitPortable(const char* x, uint64_t n, float w, bool first, float* hi,
                   uint16_t* lo, double* acc) {
  if (acc != nullptr) return LimitBodyF64(x, n, w, first, acc);
  LimitBody(x, n, w, first, hi, lo);
}
__attribute__((target("avx2,fma"))) void LimitAvx2(const char* x, uint64_t n,
                                                   float w, bool first,
                                                   float* hi, uint16_t* lo,
                                                   double* acc) {
  if (acc != nullptr) return LimitBodyF64(x, n, w, first, acc);
  LimitBody(x, n, w, first, hi, lo);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma"))) void
LimitAvx512(const char* x, uint64_t n, float w, bool first, float* hi,
            uint16_t* lo, double* acc) {
  if (acc != nullptr) return LimitBodyF64(x, n, w, first, acc);
  LimitBody(x, n, w, first, hi, lo);
}

// The limit kernel's state: one result of `specs`' layout and a sum of
// FedAvg's layout for `accumulator`, allocated like FedAvg's (the head in a
// model's storage, as acc_; the wide terms at 64-byte-aligned per-tensor
// offsets, as wide_), and the same split over threads as FedAvg's Add.
class AddLimit {
 public:
  AddLimit(const std::vector<TensorSpec>& specs, int threads,
           F32Accumulator accumulator, const Wire& wire)
      : compensated_(accumulator == F32Accumulator::kCompensated),
        wide_element_(compensated_ ? sizeof(uint16_t) : sizeof(double)),
        result_(OrDie(
            Model::Create(specs, HeapStorage::Init::kUninitialized))),
        head_(OrDie(Model::Create(
            compensated_ ? specs : std::vector<TensorSpec>{},
            HeapStorage::Init::kUninitialized))) {
    for (size_t t = 0; t < specs.size(); ++t) {
      wire.Fill(result_.mutable_tensor_data(t).data(), specs[t].byte_size, 0);
    }
    std::vector<uint64_t> elements, cost;
    uint64_t wide_bytes = 0;
    uint64_t total_cost = 0;
    for (const TensorSpec& spec : specs) {
      elements.push_back(spec.byte_size / 4);
      cost.push_back(4 + 2 * (compensated_ ? 6 : 8));  // FedAvg's cost_.
      total_cost += elements.back() * cost.back();
      wide_offsets_.push_back(wide_bytes);
      wide_bytes += (elements.back() * wide_element_ + 63) / 64 * 64;
    }
    wide_ = OrDie(
        HeapStorage::Allocate(wide_bytes, HeapStorage::Init::kUninitialized));
    work_ = agg_internal::SplitWork(
        elements, cost,
        total_cost >= agg_internal::kMinParallelBytes ? threads : 1);
  }

  int threads() const { return static_cast<int>(work_.size()); }

  // Seconds for n passes (the first writes the sum without reading it).
  double Run(int n) {
    const KernelIsa isa = DetectedKernelIsa();
    const Clock::time_point start = Clock::now();
    for (int r = 0; r < n; ++r) {
      const float w = 1.0f + 0.1f * r;
      agg_internal::RunParallel(threads(), [&](int part) {
        for (const agg_internal::Range& range : work_[part]) {
          Pass(isa, range, w, r == 0);
        }
      });
    }
    const double seconds = Seconds(start);
    asm volatile("" : : "r"(wide_->mutable_data()) : "memory");
    return seconds;
  }

 private:
  void Pass(KernelIsa isa, const agg_internal::Range& range, float w,
            bool first) {
    const char* x =
        result_.tensor_data(range.tensor).data() + range.begin * 4;
    char* wide_at = wide_->mutable_data() + wide_offsets_[range.tensor] +
                    range.begin * wide_element_;
    float* hi = compensated_
                    ? reinterpret_cast<float*>(
                          head_.mutable_tensor_data(range.tensor).data()) +
                          range.begin
                    : nullptr;
    uint16_t* lo =
        compensated_ ? reinterpret_cast<uint16_t*>(wide_at) : nullptr;
    double* acc = compensated_ ? nullptr : reinterpret_cast<double*>(wide_at);
    const uint64_t count = range.end - range.begin;
    switch (isa) {
      case KernelIsa::kAvx512:
        LimitAvx512(x, count, w, first, hi, lo, acc);
        break;
      case KernelIsa::kAvx2:
        LimitAvx2(x, count, w, first, hi, lo, acc);
        break;
      default:
        LimitPortable(x, count, w, first, hi, lo, acc);
        break;
    }
  }

  const bool compensated_;
  const uint64_t wide_element_;
  Model result_;
  Model head_;
  std::shared_ptr<HeapStorage> wide_;
  std::vector<uint64_t> wide_offsets_;
  std::vector<std::vector<agg_internal::Range>> work_;
};

// `size` bytes of anonymous memory laid out like model storage (HeapStorage:
// huge pages advised for large buffers), so that memcpy and the aggregators
// work on the same kind of memory.
char* MapBytes(uint64_t size) {
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) Die("mmap failed");
  if (size >= (4ull << 20)) madvise(data, size, MADV_HUGEPAGE);  // A hint.
  return static_cast<char*>(data);
}

// The fastest run of a memcpy measurement: wall seconds, and the share of
// them the copying thread was on a core (its CPU time / wall time; below 1
// when other processes took the core, or the hypervisor did).
struct CopyTiming {
  double seconds = 0;
  double on_core = 0;
};

double ThreadCpuSeconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec / 1e9;
}

// Single-threaded memcpy of `size` bytes, `n` times per run, between two
// buffers that are faulted in before the first run; `runs` runs. Returns the
// fastest run. REQUIRES: no other thread of the process is busy (the
// caller's job: the figure is a limit).
CopyTiming BestMemcpy(uint64_t size, int n, int runs, const Wire& wire) {
  char* from = MapBytes(size);
  char* to = MapBytes(size);
  wire.Fill(from, size, 0);
  std::memset(to, 1, size);
  CopyTiming best;
  for (int run = 0; run < runs; ++run) {
    const double cpu_start = ThreadCpuSeconds();
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < n; ++i) {
      std::memcpy(to, from, size);
      // Keep the copy observable.
      asm volatile("" : : "r"(to) : "memory");
    }
    const double seconds = Seconds(start);
    if (run == 0 || seconds < best.seconds) {
      best.seconds = seconds;
      best.on_core = (ThreadCpuSeconds() - cpu_start) / seconds;
    }
  }
  munmap(from, size);
  munmap(to, size);
  return best;
}

// The value after `key` ("key=value\n") in `text`, or false.
bool FindValue(const std::string& text, const std::string& key, double* value) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return false;
  const size_t begin = at + key.size();
  const size_t end = text.find('\n', begin);
  return absl::SimpleAtod(
      absl::StripAsciiWhitespace(absl::string_view(text).substr(
          begin, end == std::string::npos ? end : end - begin)),
      value);
}

// The same measurement in a fresh process: this binary run again with
// --memcpy_only, so nothing this process did (allocations, freed memory,
// threads) can affect it.
absl::StatusOr<CopyTiming> FreshProcessMemcpy(const Config& config) {
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  const std::string n = absl::StrCat(config.n);
  const std::string size = absl::StrCat(config.size);
  const std::string runs = absl::StrCat(config.memcpy_runs);
  const char* argv[] = {"aggregate_bench", "--memcpy_only", "--n",
                        n.c_str(),         "--size",        size.c_str(),
                        "--memcpy_runs",   runs.c_str(),    nullptr};
  std::fflush(stdout);
  const pid_t child = fork();
  if (child < 0) return absl::InternalError("fork failed");
  if (child == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execv("/proc/self/exe", const_cast<char* const*>(argv));
    std::fprintf(stderr, "aggregate_bench: cannot run /proc/self/exe: %s\n",
                 std::strerror(errno));
    _exit(127);
  }
  close(out[1]);
  // Bounded: the child copies a few GB; 10 minutes is far beyond that.
  std::string text;
  const Clock::time_point deadline = Clock::now() + std::chrono::minutes(10);
  bool timed_out = false;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd poll_fd = {out[0], POLLIN, 0};
    if (poll(&poll_fd, 1, static_cast<int>(left.count())) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    char buffer[512];
    const ssize_t got = read(out[0], buffer, sizeof(buffer));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    text.append(buffer, got);
  }
  close(out[0]);
  if (timed_out) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  if (timed_out) {
    return absl::DeadlineExceededError("memcpy child took over 10 minutes");
  }
  CopyTiming timing;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      !FindValue(text, "memcpy_seconds=", &timing.seconds) ||
      !FindValue(text, "memcpy_on_core=", &timing.on_core) ||
      timing.seconds <= 0) {
    return absl::InternalError(
        absl::StrCat("memcpy child failed (status ", status, "): ", text));
  }
  return timing;
}

double GBps(double bytes, double seconds) { return bytes / seconds / 1e9; }

// Two throughput figures of the same thing differ notably when one is below
// this share of the other.
constexpr double kFarBelow = 0.85;
// A copy that was on a core less than this share of its time was slowed by
// other processes.
constexpr double kFullCore = 0.9;

// The last line. FedAvg reads every result byte at least once, memcpy reads
// and writes each byte, so at the same bandwidth per core FedAvg on up to
// two threads stays below 2x memcpy (its sum adds more traffic still): a
// higher ratio means a wrong limit.
void PrintRatio(double ratio, const Config& config) {
  if (ratio > 2 && config.threads <= 2) {
    std::printf(
        "note: FedAvg on up to 2 threads above 2x memcpy is not credible (it "
        "reads every result byte, memcpy reads and writes each): the machine "
        "was busier while the limit was measured than later\n");
  }
  std::printf("aggregate_ratio=%.3f\n", ratio);
}

// "0.52 0.31 0.20" from /proc/loadavg (1, 5, 15 minutes).
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return absl::StrCat(one, " ", five, " ", fifteen);
}

int Main(int argc, char** argv) {
  Config config;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    auto value = [&]() -> absl::string_view {
      if (i + 1 >= argc) Die(absl::StrCat(arg, " needs a value"));
      return argv[++i];
    };
    if (arg == "--n") {
      if (!absl::SimpleAtoi(value(), &config.n) || config.n < 1) {
        Die("--n must be a positive integer");
      }
    } else if (arg == "--size") {
      if (!ParseSize(value(), &config.size) || config.size < 4) {
        Die("bad --size (e.g. 256MiB)");
      }
    } else if (arg == "--coord_size") {
      if (!ParseSize(value(), &config.coord_size) || config.coord_size < 4) {
        Die("bad --coord_size (e.g. 32MiB)");
      }
    } else if (arg == "--repeat") {
      if (!absl::SimpleAtoi(value(), &config.repeat) || config.repeat < 1) {
        Die("--repeat must be a positive integer");
      }
    } else if (arg == "--threads") {
      if (!absl::SimpleAtoi(value(), &config.threads) || config.threads < 0) {
        Die("--threads must be >= 0");
      }
    } else if (arg == "--offload_dir") {
      config.offload_dir = std::string(value());
    } else if (arg == "--fedavg_only") {
      config.fedavg_only = true;
    } else if (arg == "--memcpy_runs") {
      if (!absl::SimpleAtoi(value(), &config.memcpy_runs) ||
          config.memcpy_runs < 1) {
        Die("--memcpy_runs must be a positive integer");
      }
    } else if (arg == "--memcpy_only") {
      config.memcpy_only = true;
    } else if (arg == "--accumulator") {
      const absl::string_view name = value();
      if (name == "compensated") {
        config.accumulator = F32Accumulator::kCompensated;
      } else if (name == "f64") {
        config.accumulator = F32Accumulator::kFloat64;
      } else {
        Die("--accumulator is compensated or f64");
      }
    } else if (arg == "--isa") {
      // Caps the kernels' vector ISA (as on a CPU without the wider ones).
      const absl::string_view name = value();
      if (name == "portable") {
        LimitKernelIsaForTesting(0);
      } else if (name == "avx2") {
        LimitKernelIsaForTesting(1);
      } else if (name != "avx512") {
        Die("--isa is portable, avx2 or avx512");
      }
    } else {
      Die(absl::StrCat("unknown argument ", arg,
                       " (--n --size --coord_size --repeat --threads "
                       "--offload_dir --fedavg_only --accumulator "
                       "--memcpy_runs --memcpy_only --isa)"));
    }
  }
  config.size = config.size / 4 * 4;
  config.coord_size = config.coord_size / 4 * 4;
  const double total = static_cast<double>(config.n) * config.size;
  const Wire wire;

  if (config.memcpy_only) {
    const CopyTiming copy =
        BestMemcpy(config.size, config.n, config.memcpy_runs, wire);
    std::printf(
        "memcpy (1 thread): %.2f GB/s over %s (best of %d, on a core %.0f%% "
        "of the time)\n",
        GBps(total, copy.seconds), Mib(total).c_str(), config.memcpy_runs,
        copy.on_core * 100);
    std::printf("memcpy_seconds=%.9f\nmemcpy_on_core=%.4f\n", copy.seconds,
                copy.on_core);
    return 0;
  }

  AggregatorOptions fedavg;
  fedavg.num_threads = config.threads;
  fedavg.f32_accumulator = config.accumulator;
  const char* accumulator_name =
      config.accumulator == F32Accumulator::kCompensated
          ? "compensated F32+BF16"
          : "F64 accumulator";
  std::printf(
      "aggregate_bench: n=%d size=%s F32, threads=%d (0 = up to 2), "
      "%ld cores online, kernels %s, load average %s\n",
      config.n, Mib(config.size).c_str(), config.threads,
      sysconf(_SC_NPROCESSORS_ONLN), KernelIsaName(),
      LoadAverage().c_str());

  // The memcpy limit, before any aggregation work and while this process
  // runs no other thread: in a fresh process (this binary again) and here,
  // best of --memcpy_runs each; the higher figure is the limit.
  const CopyTiming fresh = OrDie(FreshProcessMemcpy(config));
  const CopyTiming here =
      BestMemcpy(config.size, config.n, config.memcpy_runs, wire);
  const CopyTiming& limit = fresh.seconds < here.seconds ? fresh : here;
  const CopyTiming& other = fresh.seconds < here.seconds ? here : fresh;
  const double memcpy_rate = total / limit.seconds;
  std::printf(
      "memcpy (1 thread): %.2f GB/s over %s (best of %d; in a fresh process "
      "%.2f, on a core %.0f%% of the time; in this process before "
      "aggregating %.2f, %.0f%%)\n",
      GBps(total, limit.seconds), Mib(total).c_str(), config.memcpy_runs,
      GBps(total, fresh.seconds), fresh.on_core * 100,
      GBps(total, here.seconds), here.on_core * 100);
  if (other.seconds * kFarBelow > limit.seconds) {
    const char* slower =
        &other == &here ? "in this process" : "in a fresh process";
    if (other.on_core < kFullCore) {
      std::printf(
          "note: memcpy %s was %.0f%% slower and had a core only %.0f%% of "
          "the time: other processes are running, figures are noisy\n",
          slower, (1 - limit.seconds / other.seconds) * 100,
          other.on_core * 100);
    } else {
      std::printf(
          "note: memcpy %s was %.0f%% slower although it had a core all the "
          "time: %s\n",
          slower, (1 - limit.seconds / other.seconds) * 100,
          &other == &here ? "something in this process slows copying"
                          : "memory is busy (other processes)");
    }
  }
  std::fflush(stdout);

  // The round's base model, zero (full-weights FedAvg never reads it), kept
  // for all runs like a daemon keeps its global model.
  const auto base =
      std::make_shared<const Model>(OrDie(Model::Create(Layout(config.size))));
  // FedAvg first: its peak RSS is read before anything else allocates (the
  // memcpy buffers are gone; the peak starts over from here).
  ResetPeakRss();
  RunResult best = RunThroughSinks(config, fedavg, base, wire);
  const uint64_t peak = PeakRss();
  const RunResult cold = best;
  // The add's own limit (AddLimit) and FedAvg of weight differences (the
  // same Add; Finish also reads the base), measured in turn with the FedAvg
  // runs so that a change in the machine's speed reaches all three alike.
  // The adds alone: the fastest run's Add time (a run's adds may be fastest
  // in another run than its total).
  auto add_limit = std::make_unique<AddLimit>(
      base->specs(),
      config.threads > 0
          ? config.threads
          : static_cast<int>(
                std::clamp(std::thread::hardware_concurrency(), 1u, 2u)),
      config.accumulator, wire);
  double best_add = best.add_seconds;
  double limit_seconds = add_limit->Run(config.n);  // Also faults it in.
  RunResult diff;
  double diff_add = 0;
  for (int rep = 0; rep < config.repeat; ++rep) {
    if (rep > 0) {
      const RunResult run = RunThroughSinks(config, fedavg, base, wire);
      if (run.seconds < best.seconds) best = run;
      best_add = std::min(best_add, run.add_seconds);
    }
    limit_seconds = std::min(limit_seconds, add_limit->Run(config.n));
    const RunResult run = RunThroughSinks(config, fedavg, base, wire,
                                          v1::PAYLOAD_KIND_WEIGHT_DIFF);
    if (rep == 0 || run.seconds < diff.seconds) diff = run;
    diff_add = rep == 0 ? run.add_seconds : std::min(diff_add, run.add_seconds);
  }
  const int limit_threads = add_limit->threads();
  add_limit.reset();
  // Not used for the ratio: shows whether the aggregation runs left this
  // process copying slower than before them.
  const CopyTiming after = BestMemcpy(config.size, config.n, 1, wire);
  const double fedavg_rate = total / best.seconds;
  std::printf(
      "memcpy again after the FedAvg runs (this process, 1 run, not used for "
      "ratios): %.2f GB/s, on a core %.0f%% of the time%s\n",
      GBps(total, after.seconds), after.on_core * 100,
      after.seconds * kFarBelow <= limit.seconds ? ""
      : after.on_core < kFullCore
          ? " (note: far below the limit; other processes took the core)"
          : " (note: far below the limit although it had a core all the "
            "time: this process or the machine's memory slows copying)");
  std::printf(
      "fedavg (%s, results via sink): %.2f GB/s of result bytes, %.3f s = "
      "check %.3f + add %.3f + finish %.3f (best of %d), %.2f x memcpy\n",
      accumulator_name, GBps(total, best.seconds), best.seconds,
      best.check_seconds, best.add_seconds, best.finish_seconds, config.repeat,
      fedavg_rate / memcpy_rate);
  std::printf(
      "fedavg first (cold) run: %.2f GB/s, %.3f s (new memory for the sum is "
      "faulted in; later rounds reuse freed model memory)\n",
      GBps(total, cold.seconds), cold.seconds);
  std::printf("fedavg peak RSS: %s = %.2f x size (n=%d; target <= 3)\n",
              Mib(peak).c_str(), static_cast<double>(peak) / config.size,
              config.n);

  {
    const double limit_rate = total / limit_seconds;
    std::printf(
        "add limit (%s layout: reads the F32 result, read-modify-writes the "
        "sum with a plain add; %s, %d thread%s, first pass writes only, like "
        "FedAvg; in turn with the FedAvg runs): %.2f GB/s of result bytes, "
        "%.3f s (best of %d)\n",
        config.accumulator == F32Accumulator::kCompensated
            ? "F32 head + BF16 term"
            : "F64 sum",
        agg_internal::KernelIsaName(), limit_threads,
        limit_threads == 1 ? "" : "s", GBps(total, limit_seconds),
        limit_seconds, config.repeat + 1);
    std::printf(
        "fedavg add (%s, full weights): %.2f GB/s of result bytes, %.3f s = "
        "%.2f x the add limit; whole run %.2f GB/s = %.2f x\n",
        accumulator_name, GBps(total, best_add), best_add,
        total / best_add / limit_rate, GBps(total, best.seconds),
        total / best.seconds / limit_rate);
    std::printf(
        "fedavg add (%s, weight differences): %.2f GB/s of result bytes, "
        "%.3f s = %.2f x the add limit; whole run %.2f GB/s = %.2f x (check "
        "%.3f + add %.3f + finish %.3f)\n",
        accumulator_name, GBps(total, diff_add), diff_add,
        total / diff_add / limit_rate, GBps(total, diff.seconds),
        total / diff.seconds / limit_rate, diff.check_seconds,
        diff.add_seconds, diff.finish_seconds);
    std::printf("fedavg_add_over_limit=%.3f\ndiff_add_over_limit=%.3f\n",
                total / best_add / limit_rate, total / diff_add / limit_rate);
  }

  if (config.fedavg_only) {
    PrintRatio(fedavg_rate / memcpy_rate, config);
    return 0;
  }

  // Variants, for comparison.
  {
    const RunResult run = RunUncheckedModels(config, fedavg, base, wire);
    std::printf(
        "fedavg (%s, unchecked models: scan + accumulate): %.2f GB/s "
        "(%.3f s), %.2f x memcpy\n",
        accumulator_name, GBps(total, run.seconds), run.seconds,
        total / run.seconds / memcpy_rate);
  }
  {
    AggregatorOptions other = fedavg;
    other.f32_accumulator = config.accumulator == F32Accumulator::kCompensated
                                ? F32Accumulator::kFloat64
                                : F32Accumulator::kCompensated;
    // Twice: the first run also pays for faulting in memory for its sum.
    RunResult run = RunThroughSinks(config, other, base, wire);
    const RunResult again = RunThroughSinks(config, other, base, wire);
    if (again.seconds < run.seconds) run = again;
    std::printf(
        "fedavg (%s, results via sink, best of 2): %.2f GB/s (%.3f s), %.2f x "
        "memcpy\n",
        other.f32_accumulator == F32Accumulator::kCompensated
            ? "compensated F32+BF16"
            : "F64 accumulator",
        GBps(total, run.seconds), run.seconds,
        total / run.seconds / memcpy_rate);
  }

  // Median and trimmed mean, through disk.
  std::string offload_dir = config.offload_dir;
  bool remove_dir = false;
  if (offload_dir.empty()) {
    char pattern[] = "/tmp/aggregate_bench.XXXXXX";
    if (mkdtemp(pattern) == nullptr) Die("mkdtemp failed");
    offload_dir = pattern;
    remove_dir = true;
  }
  const double coord_total = static_cast<double>(config.n) * config.coord_size;
  for (v1::AggregationMethod method :
       {v1::AGGREGATION_MEDIAN, v1::AGGREGATION_TRIMMED_MEAN}) {
    AggregatorOptions options;
    options.method = method;
    options.trim_fraction = 0.125;
    options.offload_dir = offload_dir;
    options.num_threads = config.threads;
    const auto coord_base = std::make_shared<const Model>(
        OrDie(Model::Create(Layout(config.coord_size))));
    const RunResult run = RunThroughSinks(config, options, coord_base, wire);
    std::printf(
        "%s: n=%d size=%s (smaller default than FedAvg's: every result goes "
        "to disk and each coordinate sorts n values): %.2f GB/s of result "
        "bytes overall (%.3f s), finish %.2f GB/s (%.3f s)\n",
        method == v1::AGGREGATION_MEDIAN ? "median" : "trimmed_mean(0.125)",
        config.n, Mib(config.coord_size).c_str(),
        GBps(coord_total, run.seconds), run.seconds,
        GBps(coord_total, run.finish_seconds), run.finish_seconds);
  }
  if (remove_dir) rmdir(offload_dir.c_str());

  PrintRatio(fedavg_rate / memcpy_rate, config);
  return 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Main(argc, argv); }
