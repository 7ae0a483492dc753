// A deterministic learner for controller tests and benchmarks: no data, no
// randomness, results known in advance so a test can check aggregates and the
// best-model choice exactly (issue 4, item 5).
//
// Model: one F32 tensor "weight" of shape {size}; element i starts at
//   float(i) * init_scale + init_offset        (float arithmetic)
// or, with `tensors`, one F32 tensor per listed element count, named
// "weight", "weight_1", "weight_2", ...; their elements are numbered on
// from one tensor to the next (element j of the second tensor is element
// tensors[0] + j of the model), so the values are those of one tensor of
// the total size, split.
// Train(global, round): every F32 element of `global` plus `delta` (float
//   addition), full weights, `sample_count` samples; or with payload=diff
//   just `delta` everywhere as a PAYLOAD_KIND_WEIGHT_DIFF.
// Validate(global, round): {"accuracy": m, "loss": 1 - m} where m is the
//   scripted metric of `round`, or `default_metric` for a round not scripted.
//   The model's values are not looked at.
//
// Parameters (learner params, all strings; see ParseTestLearnerOptions):
//   size            elements of the tensor                   default 256 (1
//   KiB) init_scale      initial value step per element           default 0.001
//   tensors         elements per tensor, "603979776,67108864" (several
//                   tensors; each in 1..kMaxSize; replaces `size`)
//   init_offset     initial value of element 0               default 0
//   delta           added to every element by training       default 0.125
//   sample_count    samples reported by training             default 1
//   metrics         scripted metric per round, "0:0.50,1:0.72,2:0.61"
//   default_metric  metric of rounds not in `metrics`        default 0
//   fail_round      rounds whose training fails, "3" or "3,5" default none
//   train_ms        time training takes (cancellable)        default 0
//   payload         "full" or "diff"                         default full
// Each key may be given per site as "<key>.<site name>" (e.g. "delta.site-b"),
// which wins over the plain key; so one job config can script every site.
// Numbers accept "nan" and "inf" (for tests of non-finite handling).
#ifndef SWARM_LEARNER_TEST_LEARNER_H_
#define SWARM_LEARNER_TEST_LEARNER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "learner/learner.h"

namespace swarm {

struct TestLearnerOptions {
  std::string site;
  uint64_t size = 256;
  // With the `tensors` param: the elements of each tensor (empty: one
  // tensor of `size`).
  std::vector<uint64_t> tensor_sizes;
  float init_scale = 0.001f;
  float init_offset = 0.0f;
  float delta = 0.125f;
  uint64_t sample_count = 1;
  std::map<uint32_t, double> metrics;
  double default_metric = 0.0;
  std::set<uint32_t> fail_rounds;
  absl::Duration train_time = absl::ZeroDuration();
  bool weight_diff = false;
};

// Reads the parameters above for `site` from `params` (site params with the
// job's merged over them). A malformed value is InvalidArgument naming the
// key: `learner param "delta.site-b": "x" is not a number`. Keys this learner
// does not know are ignored (a job's params may be meant for another
// learner); UnknownTestLearnerParams lists them.
absl::StatusOr<TestLearnerOptions> ParseTestLearnerOptions(
    absl::string_view site, const std::map<std::string, std::string>& params);

// Keys of `params` that no TestLearner option reads (neither "<key>" nor
// "<key>.<any site>" of a known key).
std::set<std::string> UnknownTestLearnerParams(
    const std::map<std::string, std::string>& params);

class TestLearner final : public Learner {
 public:
  static constexpr char kTensorName[] = "weight";
  // Largest `size` accepted (4 GiB of F32).
  static constexpr uint64_t kMaxSize = 1ull << 30;

  // Checks the options (size and each of tensor_sizes in 1..kMaxSize,
  // sample_count >= 1).
  static absl::StatusOr<std::unique_ptr<TestLearner>> Create(
      TestLearnerOptions options);

  TestLearner(const TestLearner&) = delete;
  TestLearner& operator=(const TestLearner&) = delete;

  absl::StatusOr<Model> InitialModel() override;
  absl::StatusOr<Metrics> Validate(const Model& global,
                                   uint32_t round) override;
  // Fails with Internal in a fail round (after train_time), Cancelled once
  // `cancel` is set (checked on entry, every millisecond of train_time, and
  // before returning), InvalidArgument for an empty model or a tensor that is
  // not F32.
  //
  // train_time is waited by polling `cancel` every millisecond with
  // absl::SleepFor: the Learner interface hands over a bare atomic flag with
  // nothing to wait on, and this learner only serves tests. Real learners
  // check the flag between batches.
  absl::StatusOr<TrainOutput> Train(const Model& global, uint32_t round,
                                    const std::atomic<bool>& cancel) override;

  const TestLearnerOptions& options() const { return options_; }
  // The elements of each tensor of InitialModel().
  std::vector<uint64_t> TensorSizes() const;
  // Element i of InitialModel() (numbered on across tensors).
  float InitialValue(uint64_t i) const;
  // The scripted metric of `round`.
  double MetricFor(uint32_t round) const;

 private:
  explicit TestLearner(TestLearnerOptions options);

  TestLearnerOptions options_;
};

}  // namespace swarm

#endif  // SWARM_LEARNER_TEST_LEARNER_H_
