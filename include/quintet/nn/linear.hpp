// linear: y = x W^T + b with W (out, in), the layout of every projection in a transformer. Keeps
// its input in the context for the weight gradient. It computes on whatever part of W this rank
// holds (its placement), which is how column_linear and row_linear reuse it.
//
// Backward comes whole (`backward`) or in two passes, as zero-bubble pipeline schedules run it:
// `backward_input` returns dx = dy W and keeps dy; `backward_weight` later accumulates
// dW += dy^T x and db += column sums of dy from the kept x and dy, and drops dy. The two passes
// give the bits of the whole backward.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/placement.hpp>
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
  // A fused projection of `output_groups` equal outputs (q, k, v: 3) stores W as
  // (groups, out / groups, in) and b as (groups, out / groups), so that a tensor-parallel split of
  // dimension 1 gives each rank the same slice of every group.
  std::int64_t output_groups = 1;
  parallel::placement weight_placement = parallel::placement::replicated();
  parallel::placement bias_placement = parallel::placement::replicated();
};

template <class T, class Device>
class linear {
 public:
  linear(parameter_registry<T, Device>& registry, const execution<Device>& exec, std::string name,
         std::int64_t in_features, std::int64_t out_features, linear_options options = {})
      : exec_(exec),
        name_(std::move(name)),
        weight_(registry.add(name_ + ".weight",
                             weight_shape(name_, in_features, out_features, options),
                             initializer::normal(options.init_stddev), options.weight_placement)),
        bias_(options.bias ? &registry.add(name_ + ".bias", bias_shape(out_features, options),
                                           initializer::constant(0.0), options.bias_placement,
                                           weight_decay::exempt)
                           : nullptr) {
    // The local matrix this rank multiplies by: (out, in) of its part of W.
    const shape local = weight_.local_shape();
    in_ = local[local.rank() - 1];
    out_ = local.numel() / in_;
  }

  // The layer keeps a reference to the execution context: it must outlive the layer.
  linear(parameter_registry<T, Device>&, const execution<Device>&&, std::string, std::int64_t,
         std::int64_t, linear_options = {}) = delete;

  // x (..., in) -> y (..., out)
  quintet::tensor<T, Device> forward(context<Device>& ctx, tensor_view<const T, Device> x) {
    check_last_dim(x.shape(), in_, "input");
    auto& saved = ctx.template save<T>(name_ + ".input", x.shape());  // (..., in)
    copy(saved, x);
    return apply(x);
  }

  // The forward of an input the caller has already saved in the context under `kept` (for its own
  // backward): the layer refers to that tensor instead of keeping a copy.
  quintet::tensor<T, Device> forward_kept(context<Device>& ctx, const std::string& kept) {
    refer_input(ctx, kept);
    return apply(ctx.template get<T>(name_ + ".input").view());
  }

  // Makes the tensor the caller keeps under `kept` this layer's input for backward, with no
  // forward: a caller that ran apply() and recomputes the input in backward (selective
  // recomputation of attention) refers the layer to it then.
  void refer_input(context<Device>& ctx, const std::string& kept) {
    ctx.alias(name_ + ".input", kept);
  }
  // Erases the kept input (a copy or a reference), for a caller that recomputed it.
  void drop_input(context<Device>& ctx) { ctx.erase(name_ + ".input"); }

  // dy (..., out) -> dx (..., in); accumulates dW += dy^T x and db += column sums of dy.
  quintet::tensor<T, Device> backward(context<Device>& ctx, tensor_view<const T, Device> dy) {
    return backward_from(ctx.template get<T>(name_ + ".input"), dy);
  }

  // The input pass: dy (..., out) -> dx (..., in). Keeps dy for backward_weight.
  quintet::tensor<T, Device> backward_input(context<Device>& ctx, tensor_view<const T, Device> dy) {
    const auto& x = ctx.template get<T>(name_ + ".input");
    check_output_gradient(x.view(), dy);
    copy(ctx.template save<T>(output_gradient_name(), dy.shape()), dy);
    return input_gradient(dy);
  }

  // The weight pass: dW and db from the kept x and dy (which it drops).
  void backward_weight(context<Device>& ctx) {
    accumulate_weight_gradient(ctx.template get<T>(name_ + ".input").view(),
                               ctx.template get<T>(output_gradient_name()).view());
    ctx.erase(output_gradient_name());
  }

  // What backward_input keeps: the output gradient dy, for a caller whose own weight (a bias added
  // after a reduction) needs it too.
  const quintet::tensor<T, Device>& kept_output_gradient(const context<Device>& ctx) const {
    return ctx.template get<T>(output_gradient_name());
  }

  // The forward without keeping x, for callers that keep (or recompute) it themselves: a
  // sequence-parallel column_linear keeps its sequence shard and gathers it again in backward.
  quintet::tensor<T, Device> apply(tensor_view<const T, Device> x) {
    check_last_dim(x.shape(), in_, "input");
    quintet::tensor<T, Device> y(x.shape().with_extent(x.rank() - 1, out_));  // (..., out)
    kernels::matmul(exec_, x, matrix(weight_.value), y, {.transpose_b = true});
    if (bias_ != nullptr) kernels::bias_add(exec_, y, vector(bias_->value));
    return y;
  }

  // The backward from the forward's input x (..., in), however the caller kept it.
  quintet::tensor<T, Device> backward_from(tensor_view<const T, Device> x,
                                           tensor_view<const T, Device> dy) {
    check_output_gradient(x, dy);
    accumulate_weight_gradient(x, dy);
    return input_gradient(dy);
  }

  // dx = dy W: dy (..., out) -> dx (..., in).
  quintet::tensor<T, Device> input_gradient(tensor_view<const T, Device> dy) {
    check_last_dim(dy.shape(), out_, "output gradient");
    quintet::tensor<T, Device> dx(dy.shape().with_extent(dy.rank() - 1, in_));  // (..., in)
    kernels::matmul(exec_, dy, matrix(weight_.value), dx);
    return dx;
  }

  // dW += dy^T x and db += column sums of dy, from x (..., in) and dy (..., out).
  void accumulate_weight_gradient(tensor_view<const T, Device> x, tensor_view<const T, Device> dy) {
    check_output_gradient(x, dy);
    const std::int64_t rows = x.numel() / in_;
    kernels::matmul(exec_, reshape(dy, shape{rows, out_}), reshape(x, shape{rows, in_}),
                    matrix(weight_.grad), {.transpose_a = true, .beta = 1.0});
    if (bias_ != nullptr) kernels::bias_grad(exec_, dy, vector(bias_->grad));
  }

  parameter<T, Device>& weight() { return weight_; }
  parameter<T, Device>* bias() { return bias_; }
  std::int64_t local_in() const { return in_; }
  std::int64_t local_out() const { return out_; }
  const std::string& name() const { return name_; }

 private:
  // (out, in), or (groups, out / groups, in) for a fused projection.
  static shape weight_shape(const std::string& name, std::int64_t in, std::int64_t out,
                            const linear_options& options) {
    QUINTET_CHECK(in > 0 && out > 0, "linear '{}': features {} -> {} must be positive", name, in,
                  out);
    QUINTET_CHECK(options.output_groups >= 1 && out % options.output_groups == 0,
                  "linear '{}': {} output features do not split into {} groups", name, out,
                  options.output_groups);
    const std::int64_t groups = options.output_groups;
    return groups == 1 ? shape{out, in} : shape{groups, out / groups, in};
  }
  static shape bias_shape(std::int64_t out, const linear_options& options) {
    const std::int64_t groups = options.output_groups;
    return groups == 1 ? shape{out} : shape{groups, out / groups};
  }
  tensor_view<T, Device> matrix(tensor_view<T, Device> w) const {
    return reshape(w, shape{out_, in_});
  }
  tensor_view<T, Device> vector(tensor_view<T, Device> b) const { return reshape(b, shape{out_}); }
  std::string output_gradient_name() const { return name_ + ".output_grad"; }

  void check_output_gradient(tensor_view<const T, Device> x,
                             tensor_view<const T, Device> dy) const {
    check_last_dim(dy.shape(), out_, "output gradient");
    QUINTET_CHECK(dy.shape() == x.shape().with_extent(x.rank() - 1, out_),
                  "linear '{}': output gradient {} does not match the saved input {}", name_,
                  dy.shape(), x.shape());
  }

  void check_last_dim(const shape& s, std::int64_t expected, const char* what) const {
    QUINTET_CHECK(s.rank() >= 1 && s[s.rank() - 1] == expected,
                  "linear '{}': {} has shape {}, its last dimension must be {}", name_, what, s,
                  expected);
  }

  const execution<Device>& exec_;
  std::string name_;
  parameter<T, Device>& weight_;   // (out, in) or (groups, out / groups, in); this rank's part
  parameter<T, Device>* bias_;     // (out) or (groups, out / groups), or none
  std::int64_t in_ = 0, out_ = 0;  // of the local matrix
};

}  // namespace quintet::nn
