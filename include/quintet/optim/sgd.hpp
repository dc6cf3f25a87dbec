// sgd: stochastic gradient descent with optional momentum and L2 weight decay over a parameter
// registry (decay only on the parameters that take it, as for AdamW).
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/optimizer.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/tensor.hpp>

#include <vector>

namespace quintet::optim {

template <class T, class Device>
class sgd {
  using state_type = kernels::accumulator_t<T>;

 public:
  sgd(nn::parameter_registry<T, Device>& registry, const execution<Device>& exec,
      const kernels::sgd_hyperparameters& hyperparameters)
      : registry_(registry), exec_(exec), hyperparameters_(hyperparameters) {
    QUINTET_CHECK(hyperparameters.momentum >= 0 && hyperparameters.momentum < 1,
                  "sgd: momentum {} must lie in [0, 1)", hyperparameters.momentum);
    QUINTET_CHECK(hyperparameters.weight_decay >= 0, "sgd: weight decay {} is negative",
                  hyperparameters.weight_decay);
    for (auto& p : registry_) {
      momentum_.emplace_back(p.local_shape());
      fill(momentum_.back(), state_type(0));
    }
  }
  sgd(nn::parameter_registry<T, Device>&, const execution<Device>&&,
      const kernels::sgd_hyperparameters&) = delete;

  void step(double lr, double grad_scale = 1.0) {
    QUINTET_CHECK(registry_.size() == momentum_.size(),
                  "sgd: the registry holds {} parameters but the optimizer was built for {}",
                  registry_.size(), momentum_.size());
    std::vector<kernels::sgd_operands<T, Device>> list;
    list.reserve(registry_.size());
    std::size_t i = 0;
    for (auto& p : registry_)  // weight decay not on biases and norms
      list.push_back({p.value, p.grad, momentum_[i++], p.decay != nn::weight_decay::exempt});
    kernels::sgd_hyperparameters hp = hyperparameters_;
    hp.lr = lr;
    kernels::sgd_update(exec_, list, hp, grad_scale);  // one pass over every parameter
  }

 private:
  nn::parameter_registry<T, Device>& registry_;
  const execution<Device>& exec_;
  kernels::sgd_hyperparameters hyperparameters_;
  std::vector<quintet::tensor<state_type, Device>> momentum_;
};

}  // namespace quintet::optim
