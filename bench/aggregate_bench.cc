// Aggregation throughput against memcpy, and FedAvg's peak memory.
//
//   aggregate_bench [--n 8] [--size 256MiB] [--coord_size 32MiB]
//                   [--repeat 3] [--threads 0] [--offload_dir DIR]
//                   [--fedavg_only] [--accumulator compensated|f64]
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
// In the same run: single-threaded memcpy over the same number of bytes
// (n * size), FedAvg of results that did not come through the sink (Add
// scans them first), FedAvg with the F64 accumulator, and median and trimmed
// mean (smaller results by default: they write every result to disk and
// sort n values per coordinate). FedAvg and memcpy are measured `repeat`
// times and the best of each is used.
//
// Last line: aggregate_ratio=<FedAvg result bytes per second / memcpy bytes
// per second>. Targets: ratio >= 0.7, and peak RSS <= 3x size with n = 8.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "gatherer/aggregator.h"
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
              RunResult* run) {
  const Clock::time_point start = Clock::now();
  OrDie(aggregator->Add(result, 1000 + 100 * r, v1::PAYLOAD_KIND_FULL_WEIGHTS));
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
RunResult RunThroughSinks(const Config& config,
                          const AggregatorOptions& options,
                          const std::shared_ptr<const Model>& base,
                          const Wire& wire) {
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
    TimedAdd(aggregator.get(), result, r, &run);
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
    TimedAdd(aggregator.get(), result, r, &run);
  }
  TimedFinish(aggregator.get(), &run);
  return run;
}

char* MapBytes(uint64_t size) {
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) Die("mmap failed");
  return static_cast<char*>(data);
}

// Single-threaded memcpy of `size` bytes, `n` times, between two buffers
// that are already faulted in. Returns seconds.
double MeasureMemcpy(uint64_t size, int n, const Wire& wire) {
  char* from = MapBytes(size);
  char* to = MapBytes(size);
  wire.Fill(from, size, 0);
  std::memset(to, 1, size);
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < n; ++i) {
    std::memcpy(to, from, size);
    // Keep the copy observable.
    asm volatile("" : : "r"(to) : "memory");
  }
  const double seconds = Seconds(start);
  munmap(from, size);
  munmap(to, size);
  return seconds;
}

double GBps(double bytes, double seconds) { return bytes / seconds / 1e9; }

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
    } else if (arg == "--accumulator") {
      const absl::string_view name = value();
      if (name == "compensated") {
        config.accumulator = F32Accumulator::kCompensated;
      } else if (name == "f64") {
        config.accumulator = F32Accumulator::kFloat64;
      } else {
        Die("--accumulator is compensated or f64");
      }
    } else {
      Die(absl::StrCat("unknown argument ", arg,
                       " (--n --size --coord_size --repeat --threads "
                       "--offload_dir --fedavg_only --accumulator)"));
    }
  }
  config.size = config.size / 4 * 4;
  config.coord_size = config.coord_size / 4 * 4;
  const double total = static_cast<double>(config.n) * config.size;
  const Wire wire;

  AggregatorOptions fedavg;
  fedavg.num_threads = config.threads;
  fedavg.f32_accumulator = config.accumulator;
  const char* accumulator_name =
      config.accumulator == F32Accumulator::kCompensated
          ? "compensated F32+BF16"
          : "F64 accumulator";
  std::printf(
      "aggregate_bench: n=%d size=%s F32, threads=%d (0 = up to 2), "
      "%ld cores online, kernels %s\n",
      config.n, Mib(config.size).c_str(), config.threads,
      sysconf(_SC_NPROCESSORS_ONLN), agg_internal::KernelIsaName());

  // The round's base model, zero (full-weights FedAvg never reads it), kept
  // for all runs like a daemon keeps its global model.
  const auto base =
      std::make_shared<const Model>(OrDie(Model::Create(Layout(config.size))));
  // FedAvg first: its peak RSS is read before anything else allocates.
  RunResult best = RunThroughSinks(config, fedavg, base, wire);
  const uint64_t peak = PeakRss();
  const RunResult cold = best;
  double best_memcpy = MeasureMemcpy(config.size, config.n, wire);
  for (int rep = 1; rep < config.repeat; ++rep) {
    const RunResult run = RunThroughSinks(config, fedavg, base, wire);
    if (run.seconds < best.seconds) best = run;
    best_memcpy =
        std::min(best_memcpy, MeasureMemcpy(config.size, config.n, wire));
  }
  const double memcpy_rate = total / best_memcpy;
  const double fedavg_rate = total / best.seconds;
  std::printf("memcpy (1 thread): %.2f GB/s over %s (best of %d)\n",
              GBps(total, best_memcpy), Mib(total).c_str(), config.repeat);
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

  if (config.fedavg_only) {
    std::printf("aggregate_ratio=%.3f\n", fedavg_rate / memcpy_rate);
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

  std::printf("aggregate_ratio=%.3f\n", fedavg_rate / memcpy_rate);
  return 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Main(argc, argv); }
