// Secure aggregation's per-value costs on one core (issue 31), each beside
// its limit measured in the same run:
//   - the mask PRG (AES-256-CTR keystream added mod 2^32 into the values)
//     against OpenSSL's bare AES-256-CTR over the same bytes (what
//     `openssl speed -evp aes-256-ctr` measures);
//   - the fixed-point encoding of F32 values and the decoding of a sum;
//   - a trainer's whole masking of one update with n-1 pairwise masks and
//     its self mask, and the aggregator's unmasking with d trainers dropped.
// Prints GB/s of model bytes (4 bytes per value) and the time per model.
//
//   secagg_bench [--mib 64] [--trainers 8] [--dropped 1] [--repeat 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "secagg/fixed_point.h"
#include "secagg/masking.h"
#include "security/secagg_crypto.h"

namespace swarm {
namespace {

struct Flags {
  int mib = 64;
  int trainers = 8;
  int dropped = 1;
  int repeat = 5;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    int* target = nullptr;
    if (arg == "--mib") target = &flags->mib;
    if (arg == "--trainers") target = &flags->trainers;
    if (arg == "--dropped") target = &flags->dropped;
    if (arg == "--repeat") target = &flags->repeat;
    if (target == nullptr || i + 1 >= argc ||
        !absl::SimpleAtoi(argv[++i], target) || *target < 0) {
      std::fprintf(stderr,
                   "usage: secagg_bench [--mib N] [--trainers N] "
                   "[--dropped N] [--repeat N]\n(bad or unknown: %s)\n",
                   arg.c_str());
      return false;
    }
  }
  if (flags->mib < 1 || flags->trainers < 3 || flags->repeat < 1 ||
      flags->dropped >= flags->trainers - 1) {
    std::fprintf(stderr,
                 "need --mib >= 1, --trainers >= 3, --repeat >= 1 and "
                 "--dropped < trainers - 1\n");
    return false;
  }
  return true;
}

// The best of `repeat` runs of `work`, in seconds.
double Best(int repeat, const std::function<void()>& work) {
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    work();
    const std::chrono::duration<double> took =
        std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return best;
}

void Print(const char* what, double bytes, double seconds,
           const std::string& note) {
  std::printf("%-44s %8.2f GB/s  %8.1f ms/model  %s\n", what,
              bytes / seconds / 1e9, seconds * 1e3, note.c_str());
}

secagg::Seed SeedOf(std::mt19937& engine) {
  secagg::Seed seed;
  for (uint8_t& b : seed) b = static_cast<uint8_t>(engine() & 0xFF);
  return seed;
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  const size_t words = static_cast<size_t>(flags.mib) << 18;  // 4 B each
  const double bytes = static_cast<double>(words) * 4;
  std::printf(
      "secure aggregation, one core: %d MiB model (%zu F32 values), "
      "%d trainers, %d dropped, best of %d\n",
      flags.mib, words, flags.trainers, flags.dropped, flags.repeat);
  std::mt19937 engine(1);
  std::vector<float> values(words);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  for (float& v : values) v = normal(engine);
  std::vector<uint32_t> encoded(words);
  std::vector<uint8_t> raw(words * 4, 0);

  const std::string key(32, '\x5a');
  const double aes = Best(flags.repeat, [&] {
    if (!security::AesCtrXor(key, std::string(16, '\0'), absl::MakeSpan(raw))
             .ok()) {
      std::abort();
    }
  });
  Print("limit: OpenSSL AES-256-CTR over the bytes", bytes, aes, "");
  const security::AesCtrMaskGenerator prg;
  const secagg::Seed seed = SeedOf(engine);
  const double mask = Best(flags.repeat, [&] {
    if (!prg.Apply(seed, false, 0, absl::MakeSpan(encoded)).ok()) std::abort();
  });
  Print("one mask (keystream added mod 2^32)", bytes, mask,
        absl::StrFormat("%.2f x the limit", aes / mask));

  absl::StatusOr<secagg::FixedPointCodec> codec =
      secagg::FixedPointCodec::Create(1.0, 1 << 20, 64,
                                      static_cast<uint32_t>(flags.trainers));
  if (!codec.ok()) {
    std::fprintf(stderr, "%s\n", codec.status().ToString().c_str());
    return 1;
  }
  const double encode = Best(flags.repeat, [&] {
    if (!codec->Encode(values, 7, absl::MakeSpan(encoded)).ok()) std::abort();
  });
  Print("fixed-point encode (clip, scale, weight)", bytes, encode, "");
  std::vector<float> decoded(words);
  const double decode = Best(flags.repeat, [&] {
    codec->DecodeMean(encoded, 7, absl::MakeSpan(decoded));
  });
  Print("fixed-point decode of the sum", bytes, decode, "");

  // A trainer: its self mask and one pairwise mask per other trainer.
  std::vector<secagg::PairSeed> pairs;
  for (int j = 1; j < flags.trainers; ++j) {
    pairs.push_back({absl::StrCat("site-", j), SeedOf(engine)});
  }
  const secagg::Seed self_seed = SeedOf(engine);
  const double trainer = Best(flags.repeat, [&] {
    if (!secagg::MaskUpdate(prg, "site-0", self_seed, pairs, 0,
                            absl::MakeSpan(encoded))
             .ok())
      std::abort();
  });
  Print("trainer: mask one update", bytes, trainer,
        absl::StrCat(flags.trainers, " masks"));
  // The aggregator: the self masks of the counted trainers, and the pairs
  // between each counted trainer and each dropped one.
  secagg::Unmasking unmasking;
  const int counted = flags.trainers - flags.dropped;
  for (int i = 0; i < counted; ++i) {
    unmasking.self_seeds.push_back(SeedOf(engine));
    for (int d = 0; d < flags.dropped; ++d) {
      unmasking.dropped_pairs.push_back({absl::StrCat("site-", i),
                                         absl::StrCat("site-", counted + d),
                                         SeedOf(engine)});
    }
  }
  const double aggregator = Best(flags.repeat, [&] {
    if (!secagg::UnmaskSum(prg, unmasking, 0, absl::MakeSpan(encoded)).ok())
      std::abort();
  });
  Print("aggregator: unmask the sum", bytes, aggregator,
        absl::StrCat(counted + counted * flags.dropped, " masks"));
  return 0;
}

}  // namespace
}  // namespace swarm

int main(int argc, char** argv) { return swarm::Main(argc, argv); }
