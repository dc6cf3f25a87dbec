// linear: y = x W^T + b with W (out, in), the layout of every projection in a transformer. Keeps
// its input in the context for the weight gradient.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <string>

namespace quintet::nn {

struct linear_options {
  bool bias = true;
  double init_stddev = 0.02;  // GPT-2's initialisation of every projection
};

template <class T, class Device>
class linear {
 public:
  linear(parameter_registry<T, Device>& registry, const execution<Device>& exec, std::string name,
         std::int64_t in_features, std::int64_t out_features, linear_options options = {})
      : exec_(exec),
        name_(std::move(name)),
        in_(in_features),
        out_(out_features),
        weight_(registry.add(name_ + ".weight", shape{out_features, in_features},
                             initializer::normal(options.init_stddev))),
        bias_(options.bias
                  ? &registry.add(name_ + ".bias", shape{out_features}, initializer::constant(0.0))
                  : nullptr) {
    QUINTET_CHECK(in_features > 0 && out_features > 0,
                  "linear '{}': features {} -> {} must be "
                  "positive",
                  name_, in_features, out_features);
  }

  // The layer keeps a reference to the execution context: it must outlive the layer.
  linear(parameter_registry<T, Device>&, const execution<Device>&&, std::string, std::int64_t,
         std::int64_t, linear_options = {}) = delete;

  // x (..., in) -> y (..., out)
  quintet::tensor<T, Device> forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    check_last_dim(x.shape(), in_, "input");
    auto& saved = ctx.template save<T>(name_ + ".input", x.shape());  // (..., in)
    copy(saved, x);
    quintet::tensor<T, Device> y(x.shape().with_extent(x.rank() - 1, out_));  // (..., out)
    kernels::matmul(exec_, x, weight_.value, y, {.transpose_b = true});
    if (bias_ != nullptr) kernels::bias_add(exec_, y, bias_->value);
    return y;
  }

  // dy (..., out) -> dx (..., in); accumulates dW += dy^T x and db += column sums of dy.
  quintet::tensor<T, Device> backward(context<Device>& ctx, tensor_view<const T, Device> dy) {
    check_last_dim(dy.shape(), out_, "output gradient");
    const auto& x = ctx.template get<T>(name_ + ".input");
    QUINTET_CHECK(dy.numel() / out_ == x.numel() / in_,
                  "linear '{}': output gradient {} does not match the saved input {}", name_,
                  dy.shape(), x.shape());
    const std::int64_t rows = x.numel() / in_;
    kernels::matmul(exec_, reshape(dy, shape{rows, out_}), reshape(x, shape{rows, in_}),
                    weight_.grad, {.transpose_a = true, .beta = 1.0});
    if (bias_ != nullptr) kernels::bias_grad(exec_, dy, bias_->grad);
    quintet::tensor<T, Device> dx(x.shape());  // (..., in)
    kernels::matmul(exec_, dy, weight_.value, dx);
    return dx;
  }

  parameter<T, Device>& weight() { return weight_; }
  parameter<T, Device>* bias() { return bias_; }

 private:
  void check_last_dim(const shape& s, std::int64_t expected, const char* what) const {
    QUINTET_CHECK(s.rank() >= 1 && s[s.rank() - 1] == expected,
                  "linear '{}': {} has shape {}, its last dimension must be {}", name_, what, s,
                  expected);
  }

  const execution<Device>& exec_;
  std::string name_;
  std::int64_t in_, out_;
  parameter<T, Device>& weight_;  // (out, in)
  parameter<T, Device>* bias_;    // (out), or none
};

}  // namespace quintet::nn
