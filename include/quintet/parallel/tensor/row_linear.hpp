// row_linear: a linear layer whose weight is split on its input dimension over the
// tensor-parallel group (Megatron-LM). Each rank holds a slice of the input (what a column_linear
// produced) and computes a partial product; forward all-reduces it, backward needs no
// communication. The bias is replicated and added once, after the reduction.
//
//   W (out, in), tp = 2:      rank 0 holds columns [0, in/2)    y = x0 W0^T + x1 W1^T + b
//                             rank 1 holds columns [in/2, in)   (all-reduce over tp, then + b)
//   dx_r = dy W_r             (local)
//
// With Megatron sequence parallelism (Sequence = megatron_sp) forward reduce-scatters instead,
// leaving each rank its sequence block (batch, seq / tp, out) of the sum, and backward all-gathers
// the block gradients. The bias is then added to, and its gradient taken from, the block only: a
// partial gradient, summed over tp with the other replicated parameters'
// (parallel::synchronize_gradients).
//
// backward = backward_input then backward_weight, bit for bit (see nn::linear).
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/sequence/sequence_collectives.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string>
#include <type_traits>

namespace quintet::parallel {

template <class T, class Device, communicator Comm, class Sequence = none>
class row_linear {
  static_assert(std::is_same_v<Sequence, none> || std::is_same_v<Sequence, megatron_sp>,
                "row_linear<..., Sequence>: Sequence is parallel::none or parallel::megatron_sp");
  static constexpr bool sequence_sharded = std::is_same_v<Sequence, megatron_sp>;

 public:
  row_linear(nn::parameter_registry<T, Device>& registry, const execution<Device>& exec, Comm& tp,
             const std::string& name, std::int64_t in_features, std::int64_t out_features,
             nn::linear_options options = {})
      : exec_(exec),
        tp_(tp),
        linear_(registry, exec, name, in_features, out_features,
                sharded_options(name, in_features, options, tp.size())),
        bias_(options.bias ? &registry.add(name + ".bias", shape{out_features},
                                           nn::initializer::constant(0.0), options.bias_placement,
                                           nn::weight_decay::exempt)
                           : nullptr) {}
  row_linear(nn::parameter_registry<T, Device>&, const execution<Device>&&, Comm&,
             const std::string&, std::int64_t, std::int64_t, nn::linear_options = {}) = delete;

  // x (..., in / tp), this rank's slice -> y (..., out), the same on every tp rank.
  // Sequence-sharded: x (batch, seq, in / tp) -> y (batch, seq / tp, out), this rank's block.
  quintet::tensor<T, Device> forward(nn::context<Device>& ctx, tensor_view<const T, Device> x) {
    return reduce(linear_.forward(ctx, x));
  }

  // The forward of an input already saved in the context under `kept` (see nn::linear).
  quintet::tensor<T, Device> forward_kept(nn::context<Device>& ctx, const std::string& kept) {
    return reduce(linear_.forward_kept(ctx, kept));
  }

  // The forward without keeping x, for a caller that recomputes x in backward and then refers the
  // layer to it (refer_input), as nn::linear's apply and refer_input.
  quintet::tensor<T, Device> apply(tensor_view<const T, Device> x) {
    return reduce(linear_.apply(x));
  }
  void refer_input(nn::context<Device>& ctx, const std::string& kept) {
    linear_.refer_input(ctx, kept);
  }
  void drop_input(nn::context<Device>& ctx) { linear_.drop_input(ctx); }

  // dy (..., out), the same on every tp rank -> dx (..., in / tp).
  // Sequence-sharded: dy (batch, seq / tp, out), this rank's block -> dx (batch, seq, in / tp).
  quintet::tensor<T, Device> backward(nn::context<Device>& ctx, tensor_view<const T, Device> dy) {
    // Without sequence sharding every rank sees the whole dy, so the replicated bias gets the same
    // gradient everywhere; with it, each rank's block gives a partial gradient.
    if (bias_ != nullptr) kernels::bias_grad(exec_, dy, bias_->grad);
    if constexpr (sequence_sharded) {
      return linear_.backward(ctx, gather_sequence(tp_, dy).view());
    } else {
      return linear_.backward(ctx, dy);
    }
  }

  // The input pass: dx as backward returns it. Keeps what backward_weight needs: the (gathered) dy
  // the linear keeps, and under sequence sharding this rank's block of dy for the bias.
  quintet::tensor<T, Device> backward_input(nn::context<Device>& ctx,
                                            tensor_view<const T, Device> dy) {
    if constexpr (sequence_sharded) {
      if (bias_ != nullptr) copy(ctx.template save<T>(bias_gradient_name(), dy.shape()), dy);
      return linear_.backward_input(ctx, gather_sequence(tp_, dy).view());
    } else {
      return linear_.backward_input(ctx, dy);
    }
  }

  // The weight pass: the bias from its dy, then the weight.
  void backward_weight(nn::context<Device>& ctx) {
    if (bias_ != nullptr) {
      if constexpr (sequence_sharded) {
        kernels::bias_grad(exec_, ctx.template get<T>(bias_gradient_name()), bias_->grad);
        ctx.erase(bias_gradient_name());
      } else {
        kernels::bias_grad(exec_, linear_.kept_output_gradient(ctx), bias_->grad);
      }
    }
    linear_.backward_weight(ctx);
  }

 private:
  std::string bias_gradient_name() const { return linear_.name() + ".bias_output_grad"; }

  // The partial products summed over tp (sequence-sharded: and scattered), plus the bias.
  quintet::tensor<T, Device> reduce(quintet::tensor<T, Device> y) {
    if constexpr (sequence_sharded) {
      y = reduce_scatter_sequence(tp_, y.view());
    } else {
      tp_.all_reduce(y, reduce_op::sum);
    }
    if (bias_ != nullptr) kernels::bias_add(exec_, y, bias_->value);
    return y;
  }

  static nn::linear_options sharded_options(const std::string& name, std::int64_t in,
                                            nn::linear_options options, int tp_size) {
    QUINTET_CHECK(options.output_groups == 1,
                  "row_linear '{}': a row-parallel projection has no output groups", name);
    QUINTET_CHECK(in % tp_size == 0,
                  "row_linear '{}': {} input features do not divide over tp = {}", name, in,
                  tp_size);
    options.bias = false;  // added by row_linear after the reduction
    options.weight_placement = options.weight_placement.sharded(mesh_axis::tp, 1);
    return options;
  }

  const execution<Device>& exec_;
  Comm& tp_;
  nn::linear<T, Device> linear_;
  nn::parameter<T, Device>* bias_;  // (out), replicated
};

}  // namespace quintet::parallel
