// Byte sizes on the benches' command lines: "64MiB", "3GiB", "1.5GB", "4096".
#ifndef SWARM_BENCH_BYTE_SIZE_H_
#define SWARM_BENCH_BYTE_SIZE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace swarm {
namespace bench {

// A positive size with an optional KiB/MiB/GiB (or kB/MB/GB) suffix.
inline absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  uint64_t multiplier = 1;
  for (const auto& [suffix, factor] :
       std::vector<std::pair<std::string, uint64_t>>{{"gib", 1ull << 30},
                                                     {"mib", 1ull << 20},
                                                     {"kib", 1ull << 10},
                                                     {"gb", 1000000000ull},
                                                     {"mb", 1000000ull},
                                                     {"kb", 1000ull}}) {
    if (absl::EndsWith(lower, suffix)) {
      multiplier = factor;
      lower.resize(lower.size() - suffix.size());
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(lower, &value) || value <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read \"", text, "\" as a size (e.g. 3GiB)"));
  }
  return static_cast<uint64_t>(value * static_cast<double>(multiplier));
}

// "1 KiB", "64 MiB", "3 GiB" (binary units, up to one decimal).
inline std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.4g %s", value, units[unit]);
}

}  // namespace bench
}  // namespace swarm

#endif  // SWARM_BENCH_BYTE_SIZE_H_
