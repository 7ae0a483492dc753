#include "gatherer/server_optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "gatherer/aggregator_internal.h"
#include "gatherer/aggregator_kernels.h"
#include "model/dtype_kernels.h"

namespace swarm {
namespace {

using agg_internal::LoadRangeAsDouble;
using agg_internal::StorageOffsets;
using agg_internal::StoreRangeFromDouble;

constexpr char kFirstMoment[] = "m/";
constexpr char kSecondMoment[] = "v/";
constexpr char kStepName[] = "step";

std::string StateName(absl::string_view moment, absl::string_view tensor) {
  return absl::StrCat(kServerOptimizerPrefix, moment, tensor);
}

bool HasSecondMoment(v1::ServerOptimizer kind) {
  return kind == v1::SERVER_OPTIMIZER_ADAM || kind == v1::SERVER_OPTIMIZER_YOGI;
}

// Elements per block of the step's passes (doubles: 4 arrays of 32 KiB).
constexpr uint64_t kBlock = 4096;

// The state `base` holds, by tensor name: where each moment's bytes are.
struct StateIn {
  std::map<std::string, absl::string_view, std::less<>> m;
  std::map<std::string, absl::string_view, std::less<>> v;
  int64_t step = 0;
};

absl::StatusOr<StateIn> ReadState(const Model& base, const Model& trainable,
                                  v1::ServerOptimizer kind) {
  StateIn state;
  bool any = false;
  for (size_t i = 0; i < base.num_tensors(); ++i) {
    const TensorSpec& spec = base.spec(i);
    if (!IsServerOptimizerTensor(spec.name)) continue;
    any = true;
    absl::string_view rest =
        absl::string_view(spec.name).substr(sizeof(kServerOptimizerPrefix) - 1);
    if (rest == kStepName) {
      if (spec.dtype != v1::DTYPE_I64 || spec.byte_size != sizeof(int64_t)) {
        return absl::InvalidArgumentError(absl::StrCat(
            spec.name, ": the step counter must be one I64 value"));
      }
      state.step = LoadRaw<int64_t>(base.tensor_data(i).data(), 0);
      if (state.step < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(spec.name, ": negative step count ", state.step));
      }
      continue;
    }
    const bool first = absl::StartsWith(rest, kFirstMoment);
    const bool second = absl::StartsWith(rest, kSecondMoment);
    if (!first && !second) {
      return absl::InvalidArgumentError(absl::StrCat(
          spec.name, ": not a state tensor of any server optimizer"));
    }
    if (second && !HasSecondMoment(kind)) {
      return absl::InvalidArgumentError(absl::StrCat(
          spec.name, ": a second moment, which ", ServerOptimizerName(kind),
          " does not keep (the model's state is another optimizer's)"));
    }
    const std::string owner(rest.substr(2));
    const int t = trainable.FindTensor(owner);
    if (t < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.name, ": the model has no tensor \"", owner, "\""));
    }
    const TensorSpec& owner_spec = trainable.spec(t);
    if (!IsFloatDType(owner_spec.dtype) || spec.dtype != v1::DTYPE_F32 ||
        spec.shape != owner_spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          spec.name, ": must be F32 of the shape of float tensor \"", owner,
          "\""));
    }
    (first ? state.m : state.v)[owner] = base.tensor_data(i);
  }
  if (!any) return state;
  // A stateful model holds every moment of every float tensor.
  for (const TensorSpec& spec : trainable.specs()) {
    if (!IsFloatDType(spec.dtype)) continue;
    if (!state.m.count(spec.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(StateName(kFirstMoment, spec.name), ": missing"));
    }
    if (HasSecondMoment(kind) && !state.v.count(spec.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(StateName(kSecondMoment, spec.name), ": missing"));
    }
  }
  return state;
}

// The per-element step over one block. x, d (= mean - x on entry), m, v
// are doubles; x, m and v are updated in place.
void StepBlock(const ServerOptimizerOptions& o, double bias1, double bias2,
               uint64_t n, double* x, const double* mean, double* m,
               double* v) {
  const double lr = o.learning_rate, b1 = o.beta1, b2 = o.beta2;
  switch (o.kind) {
    case v1::SERVER_OPTIMIZER_MOMENTUM:
      for (uint64_t i = 0; i < n; ++i) {
        const double d = mean[i] - x[i];
        m[i] = b1 * m[i] + d;
        x[i] += lr * m[i];
      }
      return;
    case v1::SERVER_OPTIMIZER_ADAM:
      for (uint64_t i = 0; i < n; ++i) {
        const double d = mean[i] - x[i];
        m[i] = b1 * m[i] + (1 - b1) * d;
        v[i] = b2 * v[i] + (1 - b2) * d * d;
        x[i] += lr * (m[i] / bias1) / (std::sqrt(v[i] / bias2) + o.epsilon);
      }
      return;
    case v1::SERVER_OPTIMIZER_YOGI:
      for (uint64_t i = 0; i < n; ++i) {
        const double d = mean[i] - x[i];
        const double d2 = d * d;
        m[i] = b1 * m[i] + (1 - b1) * d;
        const double diff = v[i] - d2;
        const double sign = diff > 0 ? 1.0 : (diff < 0 ? -1.0 : 0.0);
        v[i] = v[i] - (1 - b2) * d2 * sign;
        x[i] += lr * (m[i] / bias1) / (std::sqrt(v[i] / bias2) + o.epsilon);
      }
      return;
    default:
      return;
  }
}

// The output's layout: the trainable tensors, then m (and v) per float
// tensor in the same order, then the step counter.
struct OutputLayout {
  std::vector<TensorSpec> specs;
  // By trainable tensor: the index in `specs` of its moment (-1: none).
  std::vector<int> m_index;
  std::vector<int> v_index;
  int step_index = -1;
};

absl::StatusOr<OutputLayout> OutputLayoutFor(const Model& trainable,
                                             bool second) {
  OutputLayout layout;
  std::vector<TensorSpec>& specs = layout.specs;
  specs = trainable.specs();
  layout.m_index.assign(trainable.num_tensors(), -1);
  layout.v_index.assign(trainable.num_tensors(), -1);
  // One state tensor per float tensor, named `moment`/<tensor>; its index
  // in `specs` goes to (*index)[t].
  auto append_moment = [&](absl::string_view moment,
                           std::vector<int>* index) -> absl::Status {
    for (size_t t = 0; t < trainable.num_tensors(); ++t) {
      const TensorSpec& spec = trainable.spec(t);
      if (!IsFloatDType(spec.dtype)) continue;
      SWARM_ASSIGN_OR_RETURN(TensorSpec state_spec,
                             MakeTensorSpec(StateName(moment, spec.name),
                                            v1::DTYPE_F32, spec.shape));
      (*index)[t] = static_cast<int>(specs.size());
      specs.push_back(std::move(state_spec));
    }
    return absl::OkStatus();
  };
  SWARM_RETURN_IF_ERROR(append_moment(kFirstMoment, &layout.m_index));
  if (second) {
    SWARM_RETURN_IF_ERROR(append_moment(kSecondMoment, &layout.v_index));
  }
  SWARM_ASSIGN_OR_RETURN(
      TensorSpec step_spec,
      MakeTensorSpec(absl::StrCat(kServerOptimizerPrefix, kStepName),
                     v1::DTYPE_I64, {1}));
  layout.step_index = static_cast<int>(specs.size());
  specs.push_back(std::move(step_spec));
  return layout;
}

// The step's blocks of doubles: x, the mean, m and v.
struct StepBlocks {
  std::vector<double> x = std::vector<double>(kBlock);
  std::vector<double> mu = std::vector<double>(kBlock);
  std::vector<double> m = std::vector<double>(kBlock);
  std::vector<double> v = std::vector<double>(kBlock);
};

// Steps elements [begin, end) of float tensor `spec` (values `x_in`, round
// mean `mean_in`, its moments in `state`) a block at a time: their new
// values to `to`, their new moments to `m_out` and `v_out` (null when the
// optimizer keeps no second moment). Element i depends on element i alone,
// so ranges may run on different threads, each with its own `blocks`.
void StepRange(const ServerOptimizerOptions& opts, double bias1, double bias2,
               const StateIn& state, const TensorSpec& spec, const char* x_in,
               const char* mean_in, char* to, char* m_out, char* v_out,
               uint64_t begin, uint64_t end, StepBlocks* blocks) {
  const bool second = v_out != nullptr;
  std::vector<double>& x = blocks->x;
  std::vector<double>& mu = blocks->mu;
  std::vector<double>& m = blocks->m;
  std::vector<double>& v = blocks->v;
  auto m_in = state.m.find(spec.name);
  auto v_in = state.v.find(spec.name);
  for (uint64_t at = begin; at < end; at += kBlock) {
    const uint64_t len = std::min(kBlock, end - at);
    const uint64_t x_off = at * DTypeSize(spec.dtype);
    const uint64_t s_off = at * sizeof(float);
    LoadRangeAsDouble(spec.dtype, x_in + x_off, len, x.data());
    LoadRangeAsDouble(spec.dtype, mean_in + x_off, len, mu.data());
    if (m_in != state.m.end()) {
      LoadRangeAsDouble(v1::DTYPE_F32, m_in->second.data() + s_off, len,
                        m.data());
    } else {
      std::fill_n(m.data(), len, 0.0);
    }
    if (second) {
      if (v_in != state.v.end()) {
        LoadRangeAsDouble(v1::DTYPE_F32, v_in->second.data() + s_off, len,
                          v.data());
      } else {
        std::fill_n(v.data(), len, 0.0);
      }
    }
    StepBlock(opts, bias1, bias2, len, x.data(), mu.data(), m.data(), v.data());
    StoreRangeFromDouble(spec.dtype, x.data(), len, to + x_off);
    StoreRangeFromDouble(v1::DTYPE_F32, m.data(), len, m_out + s_off);
    if (second) {
      StoreRangeFromDouble(v1::DTYPE_F32, v.data(), len, v_out + s_off);
    }
  }
}

}  // namespace

ServerOptimizerOptions ServerOptimizerOptions::FromJobConfig(
    const v1::JobConfig& config) {
  ServerOptimizerOptions o;
  o.kind = config.server_optimizer();
  o.learning_rate =
      config.has_server_learning_rate()
          ? config.server_learning_rate()
          : (o.kind == v1::SERVER_OPTIMIZER_MOMENTUM ? 1.0 : 0.03);
  // Momentum's default decay is lower than Adam's: quality_bench measured
  // 0.5 best at Dirichlet 0.1 and 0.5 (0.9 overshoots in 20 rounds).
  if (o.kind == v1::SERVER_OPTIMIZER_MOMENTUM) o.beta1 = 0.5;
  if (config.has_server_beta1()) o.beta1 = config.server_beta1();
  if (config.has_server_beta2()) o.beta2 = config.server_beta2();
  if (config.has_server_epsilon()) o.epsilon = config.server_epsilon();
  return o;
}

absl::string_view ServerOptimizerName(v1::ServerOptimizer kind) {
  switch (kind) {
    case v1::SERVER_OPTIMIZER_NONE:
      return "none";
    case v1::SERVER_OPTIMIZER_MOMENTUM:
      return "momentum";
    case v1::SERVER_OPTIMIZER_ADAM:
      return "adam";
    case v1::SERVER_OPTIMIZER_YOGI:
      return "yogi";
    default:
      return "unknown";
  }
}

bool IsServerOptimizerTensor(absl::string_view name) {
  return absl::StartsWith(name, kServerOptimizerPrefix);
}

Model TrainableViewOf(const Model& stateful) {
  std::vector<TensorSpec> specs;
  std::vector<uint64_t> offsets;
  const std::vector<uint64_t> all = StorageOffsets(stateful);
  for (size_t i = 0; i < stateful.num_tensors(); ++i) {
    if (IsServerOptimizerTensor(stateful.spec(i).name)) continue;
    specs.push_back(stateful.spec(i));
    offsets.push_back(all[i]);
  }
  // FromStorage only fails on a layout outside the storage, and these are
  // offsets of a model over the same storage.
  absl::StatusOr<Model> view = Model::FromStorage(
      std::move(specs), std::move(offsets), stateful.storage());
  Model out = view.ok() ? *std::move(view) : Model();
  out.metadata() = stateful.metadata();
  return out;
}

std::shared_ptr<const Model> TrainableView(
    std::shared_ptr<const Model> stateful) {
  if (stateful == nullptr) return stateful;
  bool any = false;
  for (const TensorSpec& spec : stateful->specs()) {
    any |= IsServerOptimizerTensor(spec.name);
  }
  if (!any) return stateful;
  return std::make_shared<const Model>(TrainableViewOf(*stateful));
}

uint64_t ServerOptimizerStateBytes(const Model& trainable,
                                   v1::ServerOptimizer kind) {
  if (kind == v1::SERVER_OPTIMIZER_NONE) return 0;
  uint64_t elements = 0;
  for (const TensorSpec& spec : trainable.specs()) {
    if (IsFloatDType(spec.dtype))
      elements += spec.byte_size / DTypeSize(spec.dtype);
  }
  return elements * sizeof(float) * (HasSecondMoment(kind) ? 2 : 1) +
         sizeof(int64_t);
}

absl::StatusOr<Model> ApplyServerOptimizer(const ServerOptimizerOptions& opts,
                                           const Model& base, const Model& mean,
                                           const std::string& scratch_dir) {
  if (opts.kind == v1::SERVER_OPTIMIZER_NONE ||
      !v1::ServerOptimizer_IsValid(opts.kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server_optimizer: no step for ", ServerOptimizerName(opts.kind)));
  }
  const Model trainable = TrainableViewOf(base);
  if (!trainable.SameLayout(mean)) {
    return absl::InvalidArgumentError(
        "server optimizer: the round's mean is not laid out like its global "
        "model");
  }
  SWARM_ASSIGN_OR_RETURN(StateIn state, ReadState(base, trainable, opts.kind));
  const bool second = HasSecondMoment(opts.kind);

  SWARM_ASSIGN_OR_RETURN(OutputLayout layout,
                         OutputLayoutFor(trainable, second));
  absl::StatusOr<Model> made =
      scratch_dir.empty()
          ? Model::Create(std::move(layout.specs),
                          HeapStorage::Init::kUninitialized)
          : Model::CreateInFile(std::move(layout.specs), scratch_dir);
  if (!made.ok()) return made.status();
  Model out = *std::move(made);

  const int64_t step = state.step + 1;
  const double bias1 = 1 - std::pow(opts.beta1, static_cast<double>(step));
  const double bias2 = 1 - std::pow(opts.beta2, static_cast<double>(step));
  // Integers and bools take the mean, as under FedAvg; float tensors are
  // stepped, their elements cut into one share per thread.
  std::vector<uint64_t> elements(trainable.num_tensors(), 0);
  std::vector<uint64_t> cost(trainable.num_tensors(), 0);
  uint64_t float_bytes = 0;
  for (size_t t = 0; t < trainable.num_tensors(); ++t) {
    const TensorSpec& spec = trainable.spec(t);
    if (!IsFloatDType(spec.dtype)) {
      std::memcpy(out.mutable_tensor_data(t).data(), mean.tensor_data(t).data(),
                  spec.byte_size);
      continue;
    }
    elements[t] = spec.byte_size / DTypeSize(spec.dtype);
    cost[t] = 1;
    float_bytes += spec.byte_size;
  }
  const int threads = opts.num_threads > 0
                          ? opts.num_threads
                          : static_cast<int>(std::clamp(
                                std::thread::hardware_concurrency(), 1u, 2u));
  const std::vector<std::vector<agg_internal::Range>> shares =
      agg_internal::SplitWork(
          elements, cost,
          float_bytes >= agg_internal::kMinParallelBytes ? threads : 1);
  agg_internal::RunParallel(static_cast<int>(shares.size()), [&](int i) {
    StepBlocks blocks;
    for (const agg_internal::Range& range : shares[i]) {
      const size_t t = range.tensor;
      char* v_out =
          second ? out.mutable_tensor_data(layout.v_index[t]).data() : nullptr;
      StepRange(opts, bias1, bias2, state, trainable.spec(t),
                trainable.tensor_data(t).data(), mean.tensor_data(t).data(),
                out.mutable_tensor_data(t).data(),
                out.mutable_tensor_data(layout.m_index[t]).data(), v_out,
                range.begin, range.end, &blocks);
    }
  });
  StoreRaw<int64_t>(step, out.mutable_tensor_data(layout.step_index).data(), 0);
  out.metadata() = mean.metadata();
  out.metadata()["server_optimizer"] =
      std::string(ServerOptimizerName(opts.kind));
  out.metadata()["server_optimizer_step"] = absl::StrCat(step);
  return out;
}

}  // namespace swarm
