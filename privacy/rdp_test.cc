// Known-answer tests of the RDP accountant: published figures, closed forms,
// and an independent numerical integration (testdata/rdp_reference.py, run
// with /usr/bin/python3 and NumPy; the test fails, not skips, without them).
#include "privacy/rdp.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

#ifndef SWARM_SOURCE_DIR
#error "SWARM_SOURCE_DIR must name the source tree"
#endif

namespace swarm::privacy {
namespace {

constexpr double kDelta = 1e-5;

// Within `rel` of `expected`, relatively.
void ExpectNear(double actual, double expected, double rel,
                const std::string& what) {
  EXPECT_NEAR(actual, expected, rel * std::abs(expected))
      << what << ": " << actual << " vs " << expected;
}

std::vector<double> IntegerOrders(int from, int to) {
  std::vector<double> orders;
  for (int k = from; k <= to; ++k) orders.push_back(k);
  return orders;
}

TEST(RdpTest, WithoutSamplingIsTheGaussianMechanism) {
  for (double order : {1.5, 2.0, 7.25, 64.0}) {
    absl::StatusOr<double> rdp = SubsampledGaussianRdp(1.0, 2.0, order);
    ASSERT_TRUE(rdp.ok()) << rdp.status();
    EXPECT_DOUBLE_EQ(*rdp, order / 8.0);
  }
}

TEST(RdpTest, NoSamplingCostsNothing) {
  absl::StatusOr<double> rdp = SubsampledGaussianRdp(0.0, 1.0, 3.5);
  ASSERT_TRUE(rdp.ok());
  EXPECT_EQ(*rdp, 0.0);
}

// At order 2 the integer sum has a closed form:
// A_2 = (1-q)^2 + 2q(1-q) + q^2 e^{1/σ²} = 1 + q² (e^{1/σ²} - 1).
TEST(RdpTest, OrderTwoClosedForm) {
  const double q = 0.02, sigma = 1.3;
  absl::StatusOr<double> rdp = SubsampledGaussianRdp(q, sigma, 2.0);
  ASSERT_TRUE(rdp.ok());
  EXPECT_NEAR(*rdp, std::log1p(q * q * std::expm1(1.0 / (sigma * sigma))),
              1e-15);
}

// The fractional series and the integer sum meet: orders just beside an
// integer give nearly its value (RDP is continuous and increasing in α).
TEST(RdpTest, FractionalSeriesAgreesWithIntegerSum) {
  for (double sigma : {0.7, 1.1, 4.0}) {
    for (double order : {2.0, 5.0, 17.0}) {
      absl::StatusOr<double> at = SubsampledGaussianRdp(0.01, sigma, order);
      absl::StatusOr<double> below =
          SubsampledGaussianRdp(0.01, sigma, order - 1e-6);
      absl::StatusOr<double> above =
          SubsampledGaussianRdp(0.01, sigma, order + 1e-6);
      ASSERT_TRUE(at.ok() && below.ok() && above.ok());
      EXPECT_LE(*below, *at * (1 + 1e-4));
      EXPECT_GE(*above, *at * (1 - 1e-4));
      ExpectNear(*below, *at, 1e-4, absl::StrCat("sigma ", sigma));
    }
  }
}

TEST(RdpTest, RefusesBadArguments) {
  EXPECT_FALSE(SubsampledGaussianRdp(-0.1, 1.0, 2.0).ok());
  EXPECT_FALSE(SubsampledGaussianRdp(1.1, 1.0, 2.0).ok());
  EXPECT_FALSE(SubsampledGaussianRdp(0.1, 0.0, 2.0).ok());
  EXPECT_FALSE(SubsampledGaussianRdp(0.1, 1.0, 1.0).ok());
  absl::Status bad = SubsampledGaussianRdp(0.1, -1, 2.0).status();
  EXPECT_NE(bad.message().find("noise multiplier"), std::string::npos) << bad;
  std::vector<double> orders = {2.0};
  std::vector<double> rdp = {0.1};
  EXPECT_FALSE(RdpToEpsilon(orders, rdp, 0.0).ok());
  EXPECT_FALSE(RdpToEpsilon(orders, rdp, 1.0).ok());
  EXPECT_FALSE(RdpToEpsilon(orders, {}, 1e-5).ok());
}

// Abadi et al. 2016, section 3.1: q = 0.01, σ = 4, δ = 1e-5, T = 10000 gives
// ε ≈ 1.26 with the moments accountant (log moments at λ = 1..32, i.e.
// integer orders 2..33, and the classic conversion).
TEST(RdpTest, AbadiMomentsAccountantFigure) {
  const std::vector<double> orders = IntegerOrders(2, 33);
  absl::StatusOr<std::vector<double>> rdp = ComposedRdp(0.01, 4, 10000, orders);
  ASSERT_TRUE(rdp.ok());
  absl::StatusOr<EpsilonAtOrder> eps =
      RdpToEpsilonClassic(orders, *rdp, kDelta);
  ASSERT_TRUE(eps.ok());
  ExpectNear(eps->epsilon, 1.26, 0.01, "Abadi et al. 2016");
  // The tighter conversion and fractional orders only lower it.
  absl::StatusOr<double> tight = DpSgdEpsilon(0.01, 4, 10000, kDelta);
  ASSERT_TRUE(tight.ok());
  EXPECT_LT(*tight, eps->epsilon);
}

// Bu, Dong, Long, Su 2020 ("Deep learning with Gaussian differential
// privacy", figure 4): MNIST, q = 256/60000, δ = 1e-5, moments accountant
// (RDP, classic conversion): σ = 1.3 for 20 epochs gives ε = 1.34, σ = 0.7
// for 70 epochs ε = 8.68. Steps = ceil(epochs / q).
TEST(RdpTest, GaussianDpPaperFigures) {
  const double q = 256.0 / 60000.0;
  struct Case {
    double sigma;
    int epochs;
    double published;
  };
  for (const Case& c : {Case{1.3, 20, 1.34}, Case{0.7, 70, 8.68}}) {
    const auto steps = static_cast<uint64_t>(std::ceil(c.epochs / q));
    absl::StatusOr<std::vector<double>> rdp =
        ComposedRdp(q, c.sigma, steps, DefaultOrders());
    ASSERT_TRUE(rdp.ok());
    absl::StatusOr<EpsilonAtOrder> eps =
        RdpToEpsilonClassic(DefaultOrders(), *rdp, kDelta);
    ASSERT_TRUE(eps.ok());
    ExpectNear(eps->epsilon, c.published, 0.01,
               absl::StrCat("sigma ", c.sigma));
  }
}

// What the accountant's callers rely on: ε grows with steps and sampling,
// falls with noise.
TEST(RdpTest, EpsilonIsMonotone) {
  const double base = *DpSgdEpsilon(0.01, 1.0, 1000, kDelta);
  EXPECT_GT(*DpSgdEpsilon(0.01, 1.0, 2000, kDelta), base);
  EXPECT_GT(*DpSgdEpsilon(0.02, 1.0, 1000, kDelta), base);
  EXPECT_LT(*DpSgdEpsilon(0.01, 1.5, 1000, kDelta), base);
  EXPECT_GT(*DpSgdEpsilon(0.01, 1.0, 1000, 1e-7), base);
}

TEST(RdpTest, NoiseMultiplierForEpsilonHitsTheTarget) {
  const double q = 0.01;
  const uint64_t steps = 5000;
  for (double target : {1.0, 3.0, 8.0}) {
    absl::StatusOr<double> sigma =
        NoiseMultiplierForEpsilon(q, steps, target, kDelta);
    ASSERT_TRUE(sigma.ok()) << sigma.status();
    const double eps = *DpSgdEpsilon(q, *sigma, steps, kDelta);
    EXPECT_LE(eps, target);
    EXPECT_GT(eps, target * 0.99) << "sigma " << *sigma;
  }
  // Nothing left: a spent budget cannot be met at any noise.
  absl::StatusOr<std::vector<double>> spent =
      ComposedRdp(q, 0.6, 20000, DefaultOrders());
  ASSERT_TRUE(spent.ok());
  absl::StatusOr<double> none =
      NoiseMultiplierForEpsilon(q, steps, 1.0, kDelta, *spent);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition)
      << none.status();
}

// --- The independent reference -------------------------------------------

struct Config {
  double q;
  double sigma;
  uint64_t steps;
  double delta;
};

// The configurations of the tests above, of the MLP learner's defaults, and
// a few off the beaten track (large sampling rate, few steps, small δ).
std::vector<Config> ReferenceConfigs() {
  const double mnist = 256.0 / 60000.0;
  return {{0.01, 4.0, 10000, 1e-5},  {mnist, 1.3, 4688, 1e-5},
          {mnist, 0.7, 16407, 1e-5}, {mnist, 1.1, 14063, 1e-5},
          {0.0213, 1.0, 1000, 1e-5}, {0.05, 0.8, 500, 1e-5},
          {0.1, 2.0, 10, 1e-6},      {0.3, 1.5, 100, 1e-5},
          {0.004, 0.5, 3000, 1e-5},  {1.0, 5.0, 20, 1e-5}};
}

// Runs the reference script; the test fails when it cannot.
nlohmann::json RunReference(const std::vector<Config>& configs) {
  std::string command = absl::StrCat(
      "/usr/bin/python3 ", SWARM_SOURCE_DIR,
      "/privacy/testdata/rdp_reference.py ",
      absl::StrJoin(DefaultOrders(), ",", [](std::string* out, double order) {
        absl::StrAppend(out, absl::StrFormat("%.17g", order));
      }));
  for (const Config& c : configs) {
    absl::StrAppend(&command, absl::StrFormat(" %.17g,%.17g,%d,%.17g", c.q,
                                              c.sigma, c.steps, c.delta));
  }
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return nullptr;
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0)
    out.append(buffer, n);
  if (pclose(pipe) != 0) return nullptr;
  return nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
}

TEST(RdpTest, AgreesWithNumericalIntegration) {
  const std::vector<Config> configs = ReferenceConfigs();
  const nlohmann::json reference = RunReference(configs);
  ASSERT_TRUE(reference.is_object())
      << "the reference needs /usr/bin/python3 with NumPy "
         "(apt-get install -y python3-numpy)";
  ASSERT_EQ(reference["configs"].size(), configs.size());
  const std::vector<double>& orders = DefaultOrders();
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    const nlohmann::json& ref = reference["configs"][i];
    const std::string what = absl::StrFormat("q=%g sigma=%g steps=%d delta=%g",
                                             c.q, c.sigma, c.steps, c.delta);
    absl::StatusOr<std::vector<double>> rdp =
        ComposedRdp(c.q, c.sigma, c.steps, orders);
    ASSERT_TRUE(rdp.ok()) << what << ": " << rdp.status();
    absl::StatusOr<EpsilonAtOrder> eps = RdpToEpsilon(orders, *rdp, c.delta);
    absl::StatusOr<EpsilonAtOrder> classic =
        RdpToEpsilonClassic(orders, *rdp, c.delta);
    ASSERT_TRUE(eps.ok() && classic.ok()) << what;
    ExpectNear(eps->epsilon, ref["epsilon"].get<double>(), 0.01, what);
    ExpectNear(classic->epsilon, ref["epsilon_classic"].get<double>(), 0.01,
               what);
    // One step's RDP at every order where it is not negligible.
    for (size_t k = 0; k < orders.size(); ++k) {
      const double expected = ref["rdp"][k].get<double>();
      if (expected < 1e-9 || expected > 1e3) continue;
      ExpectNear((*rdp)[k] / static_cast<double>(c.steps), expected, 0.01,
                 absl::StrCat(what, " order ", orders[k]));
    }
    std::printf("%s: epsilon %.4f (reference %.4f), classic %.4f (%.4f)\n",
                what.c_str(), eps->epsilon, ref["epsilon"].get<double>(),
                classic->epsilon, ref["epsilon_classic"].get<double>());
  }
}

}  // namespace
}  // namespace swarm::privacy
