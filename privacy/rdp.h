// Rényi differential privacy (RDP) of the Poisson-subsampled Gaussian
// mechanism, the mechanism of DP-SGD, and its conversion to (ε, δ)-DP.
//
// One DP-SGD step samples each example independently with probability `q`
// (Poisson sampling), clips each sampled example's gradient to L2 norm C, sums
// them and adds N(0, (σ C)^2) noise per coordinate. Under add-or-remove-one
// adjacency its RDP at order α is (Mironov, Talwar, Zhang 2019, "Rényi
// Differential Privacy of the Sampled Gaussian Mechanism"):
//   ε_α = log(A_α) / (α - 1),
//   A_α = E_{z ~ μ0} [ ((1 - q) + q μ1(z) / μ0(z))^α ],
// with μ0 = N(0, σ²) and μ1 = N(1, σ²). For an integer α the binomial
// expansion is a finite sum (their section 3.2); for a fractional α it is the
// two infinite series of their section 3.3, split at the point z0 where
// q μ1 = (1 - q) μ0. RDP composes additively over steps at each order.
//
// (ε, δ): for every order α,
//   ε = ε_α + log((α - 1) / α) - (log δ + log α) / (α - 1)
// (Balle, Barthe, Gaboardi, Hsu, Sato 2020, Theorem 21; Canonne, Kamath,
// Steinke 2020, Proposition 12), minimised over a grid of orders. The older
// bound ε = ε_α + log(1/δ) / (α - 1) (Mironov 2017, Proposition 3) is kept
// to reproduce published figures computed with it.
#ifndef SWARM_PRIVACY_RDP_H_
#define SWARM_PRIVACY_RDP_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace swarm::privacy {

// The orders the accountant evaluates: 1.1 to 10.9 by 0.1, the integers 11 to
// 64, and 80, 96, 128, 256, 512.
const std::vector<double>& DefaultOrders();

// RDP at `order` of one step of the Poisson-subsampled Gaussian with sampling
// rate `q` in [0, 1] and noise multiplier `sigma` > 0. `order` > 1.
// InvalidArgument naming the argument and the rule otherwise; +inf when the
// value overflows (a tiny sigma).
absl::StatusOr<double> SubsampledGaussianRdp(double q, double sigma,
                                             double order);

// The same at every order of `orders`, times `steps`.
absl::StatusOr<std::vector<double>> ComposedRdp(
    double q, double sigma, uint64_t steps, absl::Span<const double> orders);

struct EpsilonAtOrder {
  double epsilon = 0;  // >= 0; +inf when no order gives a finite value.
  double order = 0;    // The order that gave it.
};

// Tight conversion (see the file comment) of `rdp` (one value per order of
// `orders`) to ε for `delta` in (0, 1).
absl::StatusOr<EpsilonAtOrder> RdpToEpsilon(absl::Span<const double> orders,
                                            absl::Span<const double> rdp,
                                            double delta);

// The older conversion ε = ε_α + log(1/δ)/(α - 1), for comparisons with
// published figures that used it.
absl::StatusOr<EpsilonAtOrder> RdpToEpsilonClassic(
    absl::Span<const double> orders, absl::Span<const double> rdp,
    double delta);

// ε after `steps` steps at (q, sigma) for `delta`, over DefaultOrders().
absl::StatusOr<double> DpSgdEpsilon(double q, double sigma, uint64_t steps,
                                    double delta);

// The smallest noise multiplier (to 0.1% relative) for which `steps` steps at
// rate `q` stay within `target_epsilon` for `delta`, on top of `spent_rdp`
// (per order of DefaultOrders(); empty: nothing spent yet). InvalidArgument
// when the arguments are out of range; FailedPrecondition when no multiplier
// up to 1e4 reaches the target (the budget is already spent).
absl::StatusOr<double> NoiseMultiplierForEpsilon(
    double q, uint64_t steps, double target_epsilon, double delta,
    absl::Span<const double> spent_rdp = {});

}  // namespace swarm::privacy

#endif  // SWARM_PRIVACY_RDP_H_
