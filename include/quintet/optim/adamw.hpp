// adamw: AdamW (Loshchilov & Hutter) over a parameter registry — bias-corrected moments, weight
// decay decoupled from the gradient and applied only to the parameters that take it (weights,
// embeddings; not biases and layer-norm scales, as GPT-2 training does: see nn::weight_decay).
//
// The state is keyed by parameter name and covers a range of the flattened parameter: the whole
// of it by default, or the range this rank owns (own(), what ZeRO gives each data-parallel rank),
// in which case the update touches only that range and the moments are that range's size. ZeRO
// keeps the reduced gradient of that range apart from the parameter's (its shard of the bucket):
// own(name, range, gradient) reads it from there; ZeRO-3 keeps the range's values apart too (the
// whole parameter exists only while a layer uses it): own(name, range, gradient, value).
//
// The moments are allocated when first used (the first step, or a checkpoint saving or restoring
// them) and zeroed over the context's threads: building the optimizer touches no memory, and a
// rank that owns a range never holds the whole parameter's moments.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/optimizer.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/flat_sharding.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace quintet::optim {

template <class T, class Device>
class adamw {
  using state_type = kernels::accumulator_t<T>;

 public:
  // One parameter's moments over `range` of its flattened elements (the whole: shaped like it);
  // m and v are empty until first used.
  struct moments {
    quintet::tensor<state_type, Device> m, v;
    quintet::shape shape;  // of m and v once allocated
    bool allocated = false;
    parallel::flat_range range;
    bool whole = true;
    tensor_view<T, Device> gradient{};  // the range's gradient, when not the parameter's own
    tensor_view<T, Device> value{};     // the range's values, when not the parameter's own
  };

  adamw(nn::parameter_registry<T, Device>& registry, const execution<Device>& exec,
        const kernels::adamw_hyperparameters& hyperparameters)
      : registry_(registry), exec_(exec), hyperparameters_(hyperparameters) {
    QUINTET_CHECK(hyperparameters.beta1 >= 0 && hyperparameters.beta1 < 1 &&
                      hyperparameters.beta2 >= 0 && hyperparameters.beta2 < 1,
                  "adamw: betas ({}, {}) must lie in [0, 1)", hyperparameters.beta1,
                  hyperparameters.beta2);
    QUINTET_CHECK(hyperparameters.eps > 0, "adamw: eps {} must be positive", hyperparameters.eps);
    QUINTET_CHECK(hyperparameters.weight_decay >= 0, "adamw: weight decay {} is negative",
                  hyperparameters.weight_decay);
    for (auto& p : registry_) {
      moments& state = states_[p.name];
      state.shape = p.local_shape();
      state.range = {0, state.shape.numel()};
    }
  }
  adamw(nn::parameter_registry<T, Device>&, const execution<Device>&&,
        const kernels::adamw_hyperparameters&) = delete;

  // From now on this rank updates only `range` of parameter `name`'s flattened elements; its
  // moments restart at zero over that range (call before the first step).
  // `gradient` (range.size() elements), when given, holds that range's gradient from then on;
  // `value`, when given, that range's values (which the update then writes there).
  void own(std::string_view name, parallel::flat_range range, tensor_view<T, Device> gradient = {},
           tensor_view<T, Device> value = {}) {
    moments& state = lookup(name);
    const shape local = registry_.find(name).local_shape();
    const std::int64_t numel = local.numel();
    QUINTET_CHECK(0 <= range.begin && range.begin <= range.end && range.end <= numel,
                  "adamw: range [{}, {}) is outside parameter '{}' of {} elements", range.begin,
                  range.end, name, numel);
    QUINTET_CHECK(steps_ == 0, "adamw: parameter '{}' changes owner after {} steps", name, steps_);
    QUINTET_CHECK(gradient.data() == nullptr || gradient.numel() == range.size(),
                  "adamw: a gradient of {} elements for the range [{}, {}) of parameter '{}'",
                  gradient.numel(), range.begin, range.end, name);
    QUINTET_CHECK(value.data() == nullptr || value.numel() == range.size(),
                  "adamw: values of {} elements for the range [{}, {}) of parameter '{}'",
                  value.numel(), range.begin, range.end, name);
    state.range = range;
    state.gradient = gradient.data() == nullptr ? tensor_view<T, Device>{}
                                                : reshape(gradient, shape{range.size()});
    state.value =
        value.data() == nullptr ? tensor_view<T, Device>{} : reshape(value, shape{range.size()});
    state.whole = range.begin == 0 && range.end == numel && state.gradient.data() == nullptr &&
                  state.value.data() == nullptr;
    // The whole parameter keeps moments of its shape (the update sees them beside the value).
    state.shape = state.whole ? local : shape{range.size()};
    state.m = {};
    state.v = {};
    state.allocated = false;
  }

  // One update of every parameter's owned range with learning rate `lr` and gradient
  // grad_scale * grad (the clipping factor): one pass over them all (kernels::adamw_update's list).
  void step(double lr, double grad_scale = 1.0) {
    QUINTET_CHECK(registry_.size() == states_.size(),
                  "adamw: the registry holds {} parameters but the optimizer was built for {}",
                  registry_.size(), states_.size());
    ++steps_;
    std::vector<kernels::adamw_operands<T, Device>> list;
    list.reserve(registry_.size());
    for (auto& p : registry_) {
      moments& state = find(p.name);
      const bool decays = p.decay != nn::weight_decay::exempt;  // not biases and norms
      if (state.whole) {
        list.push_back({p.value, p.grad, state.m, state.v, decays});
      } else if (state.range.size() > 0) {
        list.push_back(
            {state.value.data() != nullptr ? state.value : range_of(p.value, state.range),
             state.gradient.data() != nullptr ? state.gradient : range_of(p.grad, state.range),
             state.m, state.v, decays});
      }
    }
    kernels::adamw_hyperparameters hp = hyperparameters_;
    hp.lr = lr;
    kernels::adamw_update(exec_, list, hp, steps_, grad_scale);
  }

  // The moments as they stand, for a checkpoint to save or restore them (allocated here if the
  // first step has not: zero).
  moments& state(std::string_view name) { return find(name); }
  // The same without allocating: m and v are empty until the first step or the call above.
  const moments& state(std::string_view name) const {
    const auto found = states_.find(name);
    QUINTET_CHECK(found != states_.end(), "adamw: no state for parameter '{}'", name);
    return found->second;
  }
  std::int64_t steps() const { return steps_; }
  // Continue as if `steps` updates had been taken (the moments restored by the caller).
  void restore_steps(std::int64_t steps) {
    QUINTET_CHECK(steps >= 0, "adamw: {} steps taken is negative", steps);
    steps_ = steps;
  }
  // Bytes of the moments this optimizer keeps (both, every parameter's owned range), whether or
  // not they are allocated yet.
  std::int64_t state_bytes() const {
    std::int64_t bytes = 0;
    for (const auto& [name, state] : states_)
      bytes += 2 * state.shape.numel() * static_cast<std::int64_t>(sizeof(state_type));
    return bytes;
  }

 private:
  moments& lookup(std::string_view name) {
    const auto found = states_.find(name);
    QUINTET_CHECK(found != states_.end(), "adamw: no state for parameter '{}'", name);
    return found->second;
  }
  // A parameter's moments, allocated and zeroed if they were not yet.
  moments& find(std::string_view name) {
    moments& state = lookup(name);
    if (!state.allocated) {
      state.m = quintet::tensor<state_type, Device>(state.shape);
      state.v = quintet::tensor<state_type, Device>(state.shape);
      kernels::fill(exec_, state.m, state_type(0));
      kernels::fill(exec_, state.v, state_type(0));
      state.allocated = true;
    }
    return state;
  }
  static tensor_view<T, Device> range_of(tensor_view<T, Device> t, parallel::flat_range range) {
    return slice(reshape(t, shape{t.numel()}), 0, range.begin, range.end);
  }

  nn::parameter_registry<T, Device>& registry_;
  const execution<Device>& exec_;
  kernels::adamw_hyperparameters hyperparameters_;
  std::map<std::string, moments, std::less<>> states_;
  std::int64_t steps_ = 0;
};

}  // namespace quintet::optim
