#include "secagg/reveal_ledger.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "persist/atomic_file.h"

namespace swarm::secagg {

const char* RevealName(Reveal reveal) {
  switch (reveal) {
    case Reveal::kSelfShare:
      return "self-share";
    case Reveal::kPairSeed:
      return "pair-seed";
  }
  return "?";
}

absl::Status RevealLedger::Check(uint32_t round, const std::string& peer,
                                 Reveal reveal) const {
  auto it = entries_.find({round, peer});
  if (it == entries_.end() || it->second.reveal == reveal) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "secure aggregation: a trainer never reveals both a peer's self-mask "
      "share and their pairwise seed for one round; round ",
      round, ": the ", RevealName(it->second.reveal), " of ", peer, " went to ",
      it->second.aggregator, " at attempt ", it->second.attempt, ", so its ",
      RevealName(reveal), " is refused"));
}

absl::Status RevealLedger::Record(uint32_t round, uint32_t attempt,
                                  const std::string& peer, Reveal reveal,
                                  const std::string& aggregator) {
  if (absl::Status allowed = Check(round, peer, reveal); !allowed.ok()) {
    return allowed;
  }
  entries_.try_emplace({round, peer}, Entry{reveal, attempt, aggregator});
  return absl::OkStatus();
}

std::string RevealLedger::Serialize() const {
  std::string out;
  for (const auto& [key, entry] : entries_) {
    absl::StrAppend(&out, key.first, " ", entry.attempt, " ",
                    RevealName(entry.reveal), " ", key.second, " ",
                    entry.aggregator, "\n");
  }
  return out;
}

absl::StatusOr<RevealLedger> RevealLedger::Parse(absl::string_view text) {
  RevealLedger ledger;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (line.empty()) continue;
    const std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    uint32_t round = 0;
    uint32_t attempt = 0;
    Reveal reveal = Reveal::kSelfShare;
    const bool kind_ok = fields.size() == 5 && (fields[2] == "self-share" ||
                                                fields[2] == "pair-seed");
    if (kind_ok) {
      reveal =
          fields[2] == "self-share" ? Reveal::kSelfShare : Reveal::kPairSeed;
    }
    if (!kind_ok || !absl::SimpleAtoi(fields[0], &round) ||
        !absl::SimpleAtoi(fields[1], &attempt) || fields[3].empty() ||
        fields[4].empty()) {
      return absl::DataLossError(
          absl::StrCat("reveal ledger line ", number,
                       ": expected \"round attempt self-share|pair-seed peer "
                       "aggregator\", got \"",
                       line, "\""));
    }
    absl::Status recorded = ledger.Record(
        round, attempt, std::string(fields[3]), reveal, std::string(fields[4]));
    if (!recorded.ok()) {
      return absl::DataLossError(
          absl::StrCat("reveal ledger line ", number,
                       " breaks the rule it keeps: ", recorded.message()));
    }
  }
  return ledger;
}

absl::StatusOr<RevealLedger> LoadRevealLedger(const std::string& path) {
  absl::StatusOr<std::string> text = persist::ReadFileToString(path);
  if (absl::IsNotFound(text.status())) return RevealLedger();
  if (!text.ok()) return text.status();
  absl::StatusOr<RevealLedger> ledger = RevealLedger::Parse(*text);
  if (!ledger.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", ledger.status().message()));
  }
  return ledger;
}

absl::Status SaveRevealLedger(const std::string& path,
                              const RevealLedger& ledger) {
  return persist::WriteFileAtomically(path, ledger.Serialize());
}

}  // namespace swarm::secagg
