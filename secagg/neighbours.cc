#include "secagg/neighbours.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"

namespace swarm::secagg {

absl::StatusOr<std::vector<std::string>> Neighbours(
    const std::vector<std::string>& trainers, const std::string& self,
    int degree, uint64_t seed) {
  std::vector<std::string> ring = trainers;
  std::sort(ring.begin(), ring.end());
  ring.erase(std::unique(ring.begin(), ring.end()), ring.end());
  auto me = std::find(ring.begin(), ring.end(), self);
  if (me == ring.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(self, " is not one of the round's trainers"));
  }
  const int others = static_cast<int>(ring.size()) - 1;
  std::vector<std::string> neighbours;
  if (degree == 0 || degree >= others) {
    for (const std::string& name : ring) {
      if (name != self) neighbours.push_back(name);
    }
    return neighbours;
  }
  if (degree < 2 || degree % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "neighbour degree: must be 0 (every trainer) or even and at least 2, "
        "not ",
        degree));
  }
  // The same shuffle at every site: a fixed generator and distribution
  // implementation (std::mt19937_64 is specified; the shuffle is ours).
  std::mt19937_64 engine(seed);
  for (size_t i = ring.size() - 1; i > 0; --i) {
    const size_t j = static_cast<size_t>(engine() % (i + 1));
    std::swap(ring[i], ring[j]);
  }
  const int n = static_cast<int>(ring.size());
  const int at = static_cast<int>(std::find(ring.begin(), ring.end(), self) -
                                  ring.begin());
  for (int step = 1; step <= degree / 2; ++step) {
    neighbours.push_back(ring[(at + step) % n]);
    neighbours.push_back(ring[(at - step + n) % n]);
  }
  std::sort(neighbours.begin(), neighbours.end());
  neighbours.erase(std::unique(neighbours.begin(), neighbours.end()),
                   neighbours.end());
  return neighbours;
}

}  // namespace swarm::secagg
