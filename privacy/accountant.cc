#include "privacy/accountant.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "persist/atomic_file.h"
#include "privacy/rdp.h"

namespace swarm::privacy {
namespace {

using Json = nlohmann::json;
constexpr int kLedgerVersion = 1;

absl::StatusOr<std::vector<double>> CostRdp(const v1::PrivacyCost& cost) {
  return ComposedRdp(cost.sampling_rate(), cost.noise_multiplier(),
                     cost.steps(), DefaultOrders());
}

absl::StatusOr<double> Convert(const std::vector<double>& rdp, double delta) {
  SWARM_ASSIGN_OR_RETURN(EpsilonAtOrder eps,
                         RdpToEpsilon(DefaultOrders(), rdp, delta));
  return eps.epsilon;
}

absl::StatusOr<Accountant::Charge> ChargeFromJson(const Json& entry,
                                                  size_t index) {
  const std::string where = absl::StrCat("charges[", index, "]");
  if (!entry.is_object()) {
    return absl::DataLossError(absl::StrCat(where, ": not an object"));
  }
  for (const char* key :
       {"round", "sampling_rate", "noise_multiplier", "steps"}) {
    if (!entry.contains(key) || !entry[key].is_number()) {
      return absl::DataLossError(
          absl::StrCat(where, ".", key, ": missing or not a number"));
    }
  }
  if (!entry["round"].is_number_unsigned() ||
      !entry["steps"].is_number_unsigned()) {
    return absl::DataLossError(
        absl::StrCat(where, ": round and steps must be unsigned integers"));
  }
  Accountant::Charge charge;
  charge.round = entry["round"].get<uint32_t>();
  charge.cost.set_sampling_rate(entry["sampling_rate"].get<double>());
  charge.cost.set_noise_multiplier(entry["noise_multiplier"].get<double>());
  charge.cost.set_steps(entry["steps"].get<uint64_t>());
  if (absl::Status valid = ValidateCost(charge.cost); !valid.ok()) {
    return absl::DataLossError(absl::StrCat(where, ": ", valid.message()));
  }
  return charge;
}

}  // namespace

absl::Status ValidateCost(const v1::PrivacyCost& cost) {
  if (!(cost.sampling_rate() > 0.0 && cost.sampling_rate() <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("privacy.sampling_rate: must be in (0, 1], got ",
                     cost.sampling_rate()));
  }
  if (!(cost.noise_multiplier() > 0.0) || std::isinf(cost.noise_multiplier())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "privacy.noise_multiplier: must be positive and finite, got ",
        cost.noise_multiplier()));
  }
  if (cost.steps() == 0) {
    return absl::InvalidArgumentError("privacy.steps: must be at least 1");
  }
  return absl::OkStatus();
}

Accountant::Accountant() : rdp_(DefaultOrders().size(), 0.0) {}

absl::Status Accountant::Add(uint32_t round, const v1::PrivacyCost& cost) {
  SWARM_RETURN_IF_ERROR(ValidateCost(cost));
  SWARM_ASSIGN_OR_RETURN(std::vector<double> rdp, CostRdp(cost));
  for (size_t i = 0; i < rdp_.size(); ++i) rdp_[i] += rdp[i];
  charges_.push_back(Charge{round, cost});
  return absl::OkStatus();
}

absl::StatusOr<double> Accountant::Epsilon(double delta) const {
  if (charges_.empty()) {
    if (!(delta > 0.0 && delta < 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("delta: must be in (0, 1), got ", delta));
    }
    return 0.0;
  }
  return Convert(rdp_, delta);
}

absl::StatusOr<double> Accountant::EpsilonWith(const v1::PrivacyCost& next,
                                               double delta) const {
  SWARM_RETURN_IF_ERROR(ValidateCost(next));
  SWARM_ASSIGN_OR_RETURN(std::vector<double> rdp, CostRdp(next));
  for (size_t i = 0; i < rdp.size(); ++i) rdp[i] += rdp_[i];
  return Convert(rdp, delta);
}

uint64_t Accountant::steps() const {
  uint64_t total = 0;
  for (const Charge& charge : charges_) total += charge.cost.steps();
  return total;
}

std::string Accountant::ToJson() const {
  Json charges = Json::array();
  for (const Charge& charge : charges_) {
    charges.push_back({{"round", charge.round},
                       {"sampling_rate", charge.cost.sampling_rate()},
                       {"noise_multiplier", charge.cost.noise_multiplier()},
                       {"steps", charge.cost.steps()}});
  }
  Json root = {{"version", kLedgerVersion}, {"charges", std::move(charges)}};
  return root.dump(1) + "\n";
}

absl::StatusOr<Accountant> Accountant::FromJson(absl::string_view json) {
  Json root = Json::parse(json.begin(), json.end(), nullptr,
                          /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::DataLossError("privacy ledger: not a JSON object");
  }
  if (!root.contains("version") || root["version"] != kLedgerVersion) {
    return absl::DataLossError(
        absl::StrCat("privacy ledger: version must be ", kLedgerVersion));
  }
  if (!root.contains("charges") || !root["charges"].is_array()) {
    return absl::DataLossError("privacy ledger: charges must be an array");
  }
  Accountant accountant;
  const Json& charges = root["charges"];
  for (size_t i = 0; i < charges.size(); ++i) {
    SWARM_ASSIGN_OR_RETURN(Charge charge, ChargeFromJson(charges[i], i));
    SWARM_RETURN_IF_ERROR(accountant.Add(charge.round, charge.cost));
  }
  return accountant;
}

absl::StatusOr<Accountant> Accountant::Load(const std::string& path) {
  absl::StatusOr<std::string> text = persist::ReadFileToString(path);
  if (absl::IsNotFound(text.status())) return Accountant();
  if (!text.ok()) return text.status();
  absl::StatusOr<Accountant> loaded = FromJson(*text);
  if (!loaded.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", loaded.status().message()));
  }
  return loaded;
}

absl::Status Accountant::Save(const std::string& path) const {
  return persist::WriteFileAtomically(path, ToJson());
}

}  // namespace swarm::privacy
