// layer_norm: normalisation over the last dimension with a learned scale and shift (GPT's pre-LN
// blocks and final norm). Keeps its input and each row's mean and 1/std for the backward, which
// comes whole or as an input pass (dx; keeps dy) and a weight pass (dgamma, dbeta; drops dy) with
// the same bits.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/layer_norm.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string>

namespace quintet::nn {

template <class T, class Device>
class layer_norm {
  using stat_type = kernels::accumulator_t<T>;

 public:
  layer_norm(parameter_registry<T, Device>& registry, const execution<Device>& exec,
             std::string name, std::int64_t features, double eps = 1e-5)
      : exec_(exec),
        name_(std::move(name)),
        features_(features),
        eps_(eps),
        gamma_(registry.add(name_ + ".weight", shape{features}, initializer::constant(1.0),
                            parallel::placement::replicated(), weight_decay::exempt)),
        beta_(registry.add(name_ + ".bias", shape{features}, initializer::constant(0.0),
                           parallel::placement::replicated(), weight_decay::exempt)) {}
  layer_norm(parameter_registry<T, Device>&, const execution<Device>&&, std::string, std::int64_t,
             double = 1e-5) = delete;

  // x (..., features) -> y (..., features)
  quintet::tensor<T, Device> forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    QUINTET_CHECK(x.rank() >= 1 && x.shape()[x.rank() - 1] == features_,
                  "layer_norm '{}': input has shape {}, its last dimension must be {}", name_,
                  x.shape(), features_);
    auto& input = ctx.template save<T>(name_ + ".input", x.shape());
    copy(input, x);
    const shape rows = x.shape().with_extent(x.rank() - 1, 1);  // (..., 1)
    auto& mean = ctx.template save<stat_type>(name_ + ".mean", rows);
    auto& rstd = ctx.template save<stat_type>(name_ + ".rstd", rows);
    quintet::tensor<T, Device> y(x.shape());
    kernels::layer_norm_forward(exec_, input, gamma_.value, beta_.value, y, mean_view(mean),
                                mean_view(rstd), eps_);
    return y;
  }

  // dy (..., features) -> dx (..., features); accumulates dgamma and dbeta.
  quintet::tensor<T, Device> backward(context<Device>& ctx, tensor_view<const T, Device> dy) {
    const auto& input = ctx.template get<T>(name_ + ".input");
    auto& mean = ctx.template get<stat_type>(name_ + ".mean");
    auto& rstd = ctx.template get<stat_type>(name_ + ".rstd");
    quintet::tensor<T, Device> dx(input.shape());
    kernels::layer_norm_backward(exec_, input, gamma_.value, mean_view(mean), mean_view(rstd), dy,
                                 dx, gamma_.grad, beta_.grad);
    return dx;
  }

  // The input pass: dy -> dx; keeps dy for backward_weight.
  quintet::tensor<T, Device> backward_input(context<Device>& ctx, tensor_view<const T, Device> dy) {
    const auto& input = ctx.template get<T>(name_ + ".input");
    auto& mean = ctx.template get<stat_type>(name_ + ".mean");
    auto& rstd = ctx.template get<stat_type>(name_ + ".rstd");
    quintet::tensor<T, Device> dx(input.shape());
    kernels::layer_norm_backward_input(exec_, input, gamma_.value, mean_view(mean), mean_view(rstd),
                                       dy, dx);
    copy(ctx.template save<T>(name_ + ".output_grad", dy.shape()), dy);
    return dx;
  }

  // The weight pass: dgamma and dbeta from the kept input, statistics and dy (which it drops).
  void backward_weight(context<Device>& ctx) {
    const auto& input = ctx.template get<T>(name_ + ".input");
    auto& mean = ctx.template get<stat_type>(name_ + ".mean");
    auto& rstd = ctx.template get<stat_type>(name_ + ".rstd");
    kernels::layer_norm_backward_weight(exec_, input, mean_view(mean), mean_view(rstd),
                                        ctx.template get<T>(name_ + ".output_grad"), gamma_.grad,
                                        beta_.grad);
    ctx.erase(name_ + ".output_grad");
  }

 private:
  // The statistics are kept as (..., 1) and handed to the kernel as (...), x's shape without n.
  tensor_view<stat_type, Device> mean_view(quintet::tensor<stat_type, Device>& stats) const {
    const shape& s = stats.shape();
    const shape rows(s.extents().first(s.rank() - 1));
    return reshape(stats, rows);
  }

  const execution<Device>& exec_;
  std::string name_;
  std::int64_t features_;
  double eps_;
  parameter<T, Device>& gamma_;  // (features)
  parameter<T, Device>& beta_;   // (features)
};

}  // namespace quintet::nn
