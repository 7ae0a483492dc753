#include "controller/lineage.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace swarm {

Lineage LineageFromProto(
    const google::protobuf::RepeatedPtrField<v1::RoundAttempt>& rounds) {
  Lineage lineage;
  for (const v1::RoundAttempt& entry : rounds) {
    if (entry.attempt() > 0) lineage[entry.round()] = entry.attempt();
  }
  return lineage;
}

void LineageToProto(
    const Lineage& lineage,
    google::protobuf::RepeatedPtrField<v1::RoundAttempt>* rounds) {
  rounds->Clear();
  for (const auto& [round, attempt] : lineage) {
    v1::RoundAttempt* entry = rounds->Add();
    entry->set_round(round);
    entry->set_attempt(attempt);
  }
}

uint32_t AttemptOf(const Lineage& lineage, uint32_t round) {
  auto it = lineage.find(round);
  return it == lineage.end() ? 0 : it->second;
}

Lineage Extend(Lineage lineage, uint32_t round, uint32_t attempt) {
  if (attempt > 0) {
    lineage[round] = attempt;
  } else {
    lineage.erase(round);
  }
  return lineage;
}

int CompareChains(const Lineage& a, const Lineage& b, uint32_t below,
                  uint32_t* round) {
  // Only rounds listed in either chain can differ; walk both in order.
  auto ia = a.begin();
  auto ib = b.begin();
  while (ia != a.end() || ib != b.end()) {
    const uint32_t next = ib == b.end()   ? ia->first
                          : ia == a.end() ? ib->first
                                          : std::min(ia->first, ib->first);
    if (next >= below) return 0;
    const uint32_t attempt_a =
        ia != a.end() && ia->first == next ? (ia++)->second : 0;
    const uint32_t attempt_b =
        ib != b.end() && ib->first == next ? (ib++)->second : 0;
    if (attempt_a != attempt_b) {
      if (round != nullptr) *round = next;
      return attempt_a < attempt_b ? -1 : 1;
    }
  }
  return 0;
}

std::string DescribeLineage(const Lineage& lineage) {
  if (lineage.empty()) return "no failover";
  std::vector<std::string> parts;
  for (const auto& [round, attempt] : lineage) {
    parts.push_back(absl::StrCat("round ", round, " at attempt ", attempt));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace swarm
