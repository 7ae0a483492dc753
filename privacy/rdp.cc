#include "privacy/rdp.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace swarm::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b)) without overflow.
double LogAdd(double a, double b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  const double hi = std::max(a, b);
  const double lo = std::min(a, b);
  return hi + std::log1p(std::exp(lo - hi));
}

// log(erfc(x)); for large x erfc underflows, so the asymptotic series
// erfc(x) ~ exp(-x^2) / (x sqrt(pi)) (1 - 1/(2x^2) + 3/(4x^4) - 15/(8x^6)).
double LogErfc(double x) {
  if (x < 20.0) return std::log(std::erfc(x));
  const double inv2 = 1.0 / (x * x);
  const double series =
      1.0 - 0.5 * inv2 + 0.75 * inv2 * inv2 - 1.875 * inv2 * inv2 * inv2;
  return -x * x - std::log(x) - 0.5 * std::log(M_PI) + std::log(series);
}

bool IsInteger(double order) {
  return order == std::floor(order) && order < 1e6;
}

// log A_α for an integer α: the finite binomial sum over k of
// C(α, k) (1-q)^(α-k) q^k exp((k^2 - k) / (2σ^2)).
double LogAInteger(double q, double sigma, double order) {
  const auto alpha = static_cast<int64_t>(order);
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double two_var = 2.0 * sigma * sigma;
  double log_a = kNegInf;
  for (int64_t k = 0; k <= alpha; ++k) {
    const double kd = static_cast<double>(k);
    const double log_binom = std::lgamma(order + 1) - std::lgamma(kd + 1) -
                             std::lgamma(order - kd + 1);
    const double term = log_binom + (order - kd) * log_1mq + kd * log_q +
                        (kd * kd - kd) / two_var;
    log_a = LogAdd(log_a, term);
  }
  return log_a;
}

// A sum of signed terms kept as the logs of its positive and negative parts.
struct SignedLogSum {
  double log_pos = kNegInf;
  double log_neg = kNegInf;
  void Add(bool negative, double log_term) {
    if (negative) {
      log_neg = LogAdd(log_neg, log_term);
    } else {
      log_pos = LogAdd(log_pos, log_term);
    }
  }
};

// log A_α for a fractional α: the two series of MTZ19 section 3.3. With the
// generalised binomial coefficient c_i = C(α, i) (its sign alternates once
// i > α) and z0 = σ² log(1/q - 1) + 1/2:
//   below z0: c_i (1-q)^(α-i) q^i exp((i^2-i)/(2σ^2)) P[N(i, σ²) <= z0]
//   above z0: c_i q^(α-i) (1-q)^i exp((b^2-b)/(2σ^2)) P[N(b, σ²) > z0],
// b = α - i. StatusOr because the series must converge.
absl::StatusOr<double> LogAFractional(double q, double sigma, double order) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double two_var = 2.0 * sigma * sigma;
  const double z0 = sigma * sigma * std::log(1.0 / q - 1.0) + 0.5;
  const double scale = std::sqrt(2.0) * sigma;
  SignedLogSum sum;
  double log_coef = 0.0;  // log |c_i|
  bool coef_negative = false;
  constexpr int kMaxTerms = 200000;
  for (int i = 0; i < kMaxTerms; ++i) {
    const double id = i;
    const double b = order - id;
    const double log_s0 = log_coef + b * log_1mq + id * log_q +
                          (id * id - id) / two_var + std::log(0.5) +
                          LogErfc((id - z0) / scale);
    const double log_s1 = log_coef + b * log_q + id * log_1mq +
                          (b * b - b) / two_var + std::log(0.5) +
                          LogErfc((z0 - b) / scale);
    sum.Add(coef_negative, log_s0);
    sum.Add(coef_negative, log_s1);
    if (id > order && std::max(log_s0, log_s1) < -36.0) {
      if (sum.log_neg >= sum.log_pos) {
        return absl::InternalError(absl::StrFormat(
            "the RDP series at order %g (q=%g, sigma=%g) lost its precision",
            order, q, sigma));
      }
      return sum.log_pos + std::log1p(-std::exp(sum.log_neg - sum.log_pos));
    }
    // c_{i+1} = c_i (α - i) / (i + 1).
    log_coef += std::log(std::abs(b)) - std::log(id + 1.0);
    if (b < 0) coef_negative = !coef_negative;
  }
  return absl::InternalError(absl::StrFormat(
      "the RDP series at order %g (q=%g, sigma=%g) did not converge in %d "
      "terms",
      order, q, sigma, kMaxTerms));
}

absl::Status CheckOrdersAndRdp(absl::Span<const double> orders,
                               absl::Span<const double> rdp, double delta) {
  if (orders.empty()) {
    return absl::InvalidArgumentError("orders: must not be empty");
  }
  if (orders.size() != rdp.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rdp: one value per order is required (", orders.size(),
                     " orders, ", rdp.size(), " values)"));
  }
  if (!(delta > 0.0 && delta < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta: must be in (0, 1), got ", delta));
  }
  for (double order : orders) {
    if (!(order > 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("orders: every order must exceed 1, got ", order));
    }
  }
  return absl::OkStatus();
}

template <typename Bound>
absl::StatusOr<EpsilonAtOrder> MinimiseOverOrders(
    absl::Span<const double> orders, absl::Span<const double> rdp, double delta,
    Bound bound) {
  if (auto status = CheckOrdersAndRdp(orders, rdp, delta); !status.ok()) {
    return status;
  }
  EpsilonAtOrder best{kInf, orders[0]};
  for (size_t i = 0; i < orders.size(); ++i) {
    if (std::isnan(rdp[i]) || rdp[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rdp: must be >= 0, got ", rdp[i], " at order ", orders[i]));
    }
    const double eps = bound(orders[i], rdp[i]);
    if (eps < best.epsilon) best = {eps, orders[i]};
  }
  best.epsilon = std::max(best.epsilon, 0.0);
  return best;
}

}  // namespace

const std::vector<double>& DefaultOrders() {
  static const std::vector<double>* const orders = [] {
    auto* out = new std::vector<double>;
    for (int tenth = 11; tenth <= 109; ++tenth) out->push_back(tenth / 10.0);
    for (int k = 11; k <= 64; ++k) out->push_back(k);
    for (double k : {80.0, 96.0, 128.0, 256.0, 512.0}) out->push_back(k);
    return out;
  }();
  return *orders;
}

absl::StatusOr<double> SubsampledGaussianRdp(double q, double sigma,
                                             double order) {
  if (!(q >= 0.0 && q <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling rate q: must be in [0, 1], got ", q));
  }
  if (!(sigma > 0.0) || std::isinf(sigma)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "noise multiplier sigma: must be positive and finite, got ", sigma));
  }
  if (!(order > 1.0) || std::isinf(order)) {
    return absl::InvalidArgumentError(
        absl::StrCat("order: must be finite and exceed 1, got ", order));
  }
  if (q == 0.0) return 0.0;
  // Without subsampling: the Gaussian mechanism, α / (2σ²).
  if (q == 1.0) return order / (2.0 * sigma * sigma);
  double log_a;
  if (IsInteger(order)) {
    log_a = LogAInteger(q, sigma, order);
  } else {
    absl::StatusOr<double> frac = LogAFractional(q, sigma, order);
    if (!frac.ok()) return frac.status();
    log_a = *frac;
  }
  if (std::isnan(log_a)) return kInf;
  return std::max(log_a, 0.0) / (order - 1.0);
}

absl::StatusOr<std::vector<double>> ComposedRdp(
    double q, double sigma, uint64_t steps, absl::Span<const double> orders) {
  std::vector<double> out;
  out.reserve(orders.size());
  for (double order : orders) {
    absl::StatusOr<double> one = SubsampledGaussianRdp(q, sigma, order);
    if (!one.ok()) return one.status();
    out.push_back(*one * static_cast<double>(steps));
  }
  return out;
}

absl::StatusOr<EpsilonAtOrder> RdpToEpsilon(absl::Span<const double> orders,
                                            absl::Span<const double> rdp,
                                            double delta) {
  const double log_delta = std::log(delta);
  return MinimiseOverOrders(
      orders, rdp, delta, [log_delta](double alpha, double value) {
        return value + std::log1p(-1.0 / alpha) -
               (log_delta + std::log(alpha)) / (alpha - 1.0);
      });
}

absl::StatusOr<EpsilonAtOrder> RdpToEpsilonClassic(
    absl::Span<const double> orders, absl::Span<const double> rdp,
    double delta) {
  const double log_delta = std::log(delta);
  return MinimiseOverOrders(orders, rdp, delta,
                            [log_delta](double alpha, double value) {
                              return value - log_delta / (alpha - 1.0);
                            });
}

absl::StatusOr<double> DpSgdEpsilon(double q, double sigma, uint64_t steps,
                                    double delta) {
  absl::StatusOr<std::vector<double>> rdp =
      ComposedRdp(q, sigma, steps, DefaultOrders());
  if (!rdp.ok()) return rdp.status();
  absl::StatusOr<EpsilonAtOrder> eps =
      RdpToEpsilon(DefaultOrders(), *rdp, delta);
  if (!eps.ok()) return eps.status();
  return eps->epsilon;
}

namespace {

// ε of `spent` plus `steps` steps at (q, sigma).
absl::StatusOr<double> EpsilonOnTop(double q, double sigma, uint64_t steps,
                                    double delta,
                                    absl::Span<const double> spent) {
  absl::StatusOr<std::vector<double>> rdp =
      ComposedRdp(q, sigma, steps, DefaultOrders());
  if (!rdp.ok()) return rdp.status();
  for (size_t i = 0; i < spent.size(); ++i) (*rdp)[i] += spent[i];
  absl::StatusOr<EpsilonAtOrder> eps =
      RdpToEpsilon(DefaultOrders(), *rdp, delta);
  if (!eps.ok()) return eps.status();
  return eps->epsilon;
}

}  // namespace

absl::StatusOr<double> NoiseMultiplierForEpsilon(
    double q, uint64_t steps, double target_epsilon, double delta,
    absl::Span<const double> spent_rdp) {
  if (!(target_epsilon > 0.0) || std::isinf(target_epsilon)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target epsilon: must be positive and finite, got ", target_epsilon));
  }
  if (!spent_rdp.empty() && spent_rdp.size() != DefaultOrders().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spent rdp: one value per default order is required, got ",
                     spent_rdp.size()));
  }
  constexpr double kMaxSigma = 1e4;
  absl::StatusOr<double> at_max =
      EpsilonOnTop(q, kMaxSigma, steps, delta, spent_rdp);
  if (!at_max.ok()) return at_max.status();
  if (*at_max > target_epsilon) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no noise multiplier up to %g keeps epsilon within %g (delta %g): "
        "the budget is spent",
        kMaxSigma, target_epsilon, delta));
  }
  double lo = 0.05;
  double hi = kMaxSigma;
  absl::StatusOr<double> at_lo = EpsilonOnTop(q, lo, steps, delta, spent_rdp);
  if (at_lo.ok() && *at_lo <= target_epsilon) return lo;
  while (hi / lo > 1.001) {
    const double mid = std::sqrt(lo * hi);
    absl::StatusOr<double> eps = EpsilonOnTop(q, mid, steps, delta, spent_rdp);
    if (eps.ok() && *eps <= target_epsilon) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi;
}

}  // namespace swarm::privacy
