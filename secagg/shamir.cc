#include "secagg/shamir.h"

#include <array>
#include <set>

#include "absl/strings/str_cat.h"

namespace swarm::secagg {
namespace {

// GF(2^8) with the AES polynomial x^8 + x^4 + x^3 + x + 1, through
// logarithms to the generator 3.
struct GaloisTables {
  std::array<uint8_t, 512> exp{};
  std::array<uint8_t, 256> log{};
  GaloisTables() {
    uint8_t value = 1;
    for (int i = 0; i < 255; ++i) {
      exp[i] = value;
      log[value] = static_cast<uint8_t>(i);
      // value *= 3: value * 2 (reduced) xor value.
      const uint8_t doubled = static_cast<uint8_t>(
          (value << 1) ^ ((value & 0x80) != 0 ? 0x1b : 0x00));
      value = static_cast<uint8_t>(doubled ^ value);
    }
    for (int i = 255; i < 512; ++i) exp[i] = exp[i - 255];
  }
};

const GaloisTables& Tables() {
  static const GaloisTables* const tables = new GaloisTables();
  return *tables;
}

uint8_t Mul(uint8_t a, uint8_t b) {
  if (a == 0 || b == 0) return 0;
  const GaloisTables& t = Tables();
  return t.exp[t.log[a] + t.log[b]];
}

// a / b. REQUIRES: b != 0.
uint8_t Div(uint8_t a, uint8_t b) {
  if (a == 0) return 0;
  const GaloisTables& t = Tables();
  return t.exp[t.log[a] + 255 - t.log[b]];
}

}  // namespace

absl::StatusOr<std::vector<Share>> SplitSecret(absl::string_view secret,
                                               int threshold, int count,
                                               const RandomBytes& random) {
  if (threshold < 1 || threshold > count || count > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "threshold and count: need 1 <= threshold <= count <= 255, not ",
        threshold, " of ", count));
  }
  std::vector<Share> shares(count);
  for (int i = 0; i < count; ++i) {
    shares[i].x = static_cast<uint8_t>(i + 1);
    shares[i].y.resize(secret.size());
  }
  // Per byte: coefficients 1..threshold-1 random, the constant the secret.
  std::vector<uint8_t> coefficients(threshold > 1 ? threshold - 1 : 0);
  for (size_t byte = 0; byte < secret.size(); ++byte) {
    if (!coefficients.empty()) random(absl::MakeSpan(coefficients));
    for (Share& share : shares) {
      // Horner from the highest coefficient down to the secret.
      uint8_t y = 0;
      for (size_t k = coefficients.size(); k-- > 0;) {
        y = static_cast<uint8_t>(Mul(y, share.x) ^ coefficients[k]);
      }
      y = static_cast<uint8_t>(Mul(y, share.x) ^
                               static_cast<uint8_t>(secret[byte]));
      share.y[byte] = static_cast<char>(y);
    }
  }
  return shares;
}

absl::StatusOr<std::string> CombineShares(absl::Span<const Share> shares,
                                          int threshold) {
  if (threshold < 1 || static_cast<int>(shares.size()) < threshold) {
    return absl::InvalidArgumentError(
        absl::StrCat("need ", threshold, " shares to rebuild the secret, have ",
                     shares.size()));
  }
  const absl::Span<const Share> used = shares.subspan(0, threshold);
  std::set<uint8_t> seen;
  for (const Share& share : used) {
    if (share.x == 0 || !seen.insert(share.x).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("share number ", share.x, " is 0 or appears twice"));
    }
    if (share.y.size() != used[0].y.size()) {
      return absl::InvalidArgumentError(
          "the shares are of secrets of different lengths");
    }
  }
  // Lagrange at 0: secret = sum_i y_i * prod_{j != i} x_j / (x_j - x_i);
  // in GF(2^8) subtraction is xor.
  std::vector<uint8_t> basis(used.size());
  for (size_t i = 0; i < used.size(); ++i) {
    uint8_t numerator = 1;
    uint8_t denominator = 1;
    for (size_t j = 0; j < used.size(); ++j) {
      if (j == i) continue;
      numerator = Mul(numerator, used[j].x);
      denominator = Mul(denominator, used[j].x ^ used[i].x);
    }
    basis[i] = Div(numerator, denominator);
  }
  std::string secret(used[0].y.size(), '\0');
  for (size_t byte = 0; byte < secret.size(); ++byte) {
    uint8_t value = 0;
    for (size_t i = 0; i < used.size(); ++i) {
      value ^= Mul(static_cast<uint8_t>(used[i].y[byte]), basis[i]);
    }
    secret[byte] = static_cast<char>(value);
  }
  return secret;
}

}  // namespace swarm::secagg
