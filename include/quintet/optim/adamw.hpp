// adamw: AdamW (Loshchilov & Hutter) over a parameter registry — bias-corrected moments, weight
// decay decoupled from the gradient and applied only to the parameters that take it (weights,
// embeddings; not biases and layer-norm scales, as GPT-2 training does: see nn::weight_decay).
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/optimizer.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <vector>

namespace quintet::optim {

template <class T, class Device>
class adamw {
  using state_type = kernels::accumulator_t<T>;

 public:
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
      states_.push_back({quintet::tensor<state_type, Device>(p.value.shape()),
                         quintet::tensor<state_type, Device>(p.value.shape())});
      fill(states_.back().m, state_type(0));
      fill(states_.back().v, state_type(0));
    }
  }
  adamw(nn::parameter_registry<T, Device>&, const execution<Device>&&,
        const kernels::adamw_hyperparameters&) = delete;

  // One update of every parameter with learning rate `lr` and gradient grad_scale * grad (the
  // clipping factor).
  void step(double lr, double grad_scale = 1.0) {
    QUINTET_CHECK(registry_.size() == states_.size(),
                  "adamw: the registry holds {} parameters but the optimizer was built for {}",
                  registry_.size(), states_.size());
    ++steps_;
    std::size_t i = 0;
    for (auto& p : registry_) {
      kernels::adamw_hyperparameters hp = hyperparameters_;
      hp.lr = lr;
      if (p.decay == nn::weight_decay::exempt) hp.weight_decay = 0.0;  // biases, norms
      kernels::adamw_update(exec_, p.value, p.grad, states_[i].m, states_[i].v, hp, steps_,
                            grad_scale);
      ++i;
    }
  }

  std::int64_t steps() const { return steps_; }

 private:
  struct moments {
    quintet::tensor<state_type, Device> m, v;
  };

  nn::parameter_registry<T, Device>& registry_;
  const execution<Device>& exec_;
  kernels::adamw_hyperparameters hyperparameters_;
  std::vector<moments> states_;
  std::int64_t steps_ = 0;
};

}  // namespace quintet::optim
