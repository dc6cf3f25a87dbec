// column_linear: a linear layer whose weight is split on its output dimension over the
// tensor-parallel group (Megatron-LM). The input is replicated; each rank computes its slice of the
// output. Forward needs no communication; backward all-reduces the input gradient, to which every
// rank contributed through its slice of W.
//
//   W (out, in), tp = 2:      rank 0 holds rows [0, out/2)     y[..., 0:out/2]   = x W0^T + b0
//                             rank 1 holds rows [out/2, out)   y[..., out/2:out] = x W1^T + b1
//   dx = dy0 W0 + dy1 W1      (all-reduce over tp)
//
// With Megatron sequence parallelism (Sequence = megatron_sp) the input arrives as this rank's
// sequence block (batch, seq / tp, in): forward all-gathers it, backward reduce-scatters dx back
// to the block. Only the block is kept, and backward gathers it again for dW, so the activation
// kept per rank is 1/tp of the input (Korthikanti et al. 2022).
//
// backward = backward_input then backward_weight, bit for bit (see nn::linear).
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
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
class column_linear {
  static_assert(
      std::is_same_v<Sequence, none> || std::is_same_v<Sequence, megatron_sp>,
      "column_linear<..., Sequence>: Sequence is parallel::none or parallel::megatron_sp");
  static constexpr bool sequence_sharded = std::is_same_v<Sequence, megatron_sp>;

 public:
  // `options.output_groups` > 1 (a fused q, k, v projection) splits every group the same way, so
  // each rank holds the q, k and v of its heads.
  column_linear(nn::parameter_registry<T, Device>& registry, const execution<Device>& exec,
                Comm& tp, const std::string& name, std::int64_t in_features,
                std::int64_t out_features, nn::linear_options options = {})
      : tp_(tp),
        linear_(registry, exec, name, in_features, out_features,
                sharded_options(name, out_features, options, tp.size())) {}
  column_linear(nn::parameter_registry<T, Device>&, const execution<Device>&&, Comm&,
                const std::string&, std::int64_t, std::int64_t, nn::linear_options = {}) = delete;

  // x (..., in), the same on every tp rank -> y (..., out / tp), this rank's columns.
  // Sequence-sharded: x (batch, seq / tp, in), this rank's block -> y (batch, seq, out / tp).
  quintet::tensor<T, Device> forward(nn::context<Device>& ctx, tensor_view<const T, Device> x) {
    if constexpr (sequence_sharded) {
      copy(ctx.template save<T>(linear_.name() + ".input_block", x.shape()), x);
      return linear_.apply(gather_sequence(tp_, x).view());
    } else {
      return linear_.forward(ctx, x);
    }
  }

  // dy (..., out / tp) -> dx (..., in), summed over the tp group (sequence-sharded: reduced and
  // scattered to this rank's block).
  quintet::tensor<T, Device> backward(nn::context<Device>& ctx, tensor_view<const T, Device> dy) {
    if constexpr (sequence_sharded) {
      const auto& block = ctx.template get<T>(linear_.name() + ".input_block");
      const quintet::tensor<T, Device> x = gather_sequence(tp_, block.view());
      const quintet::tensor<T, Device> dx = linear_.backward_from(x.view(), dy);
      return reduce_scatter_sequence(tp_, dx.view());
    } else {
      quintet::tensor<T, Device> dx = linear_.backward(ctx, dy);
      tp_.all_reduce(dx, reduce_op::sum);
      return dx;
    }
  }

  // The input pass: dx as backward returns it; keeps dy for backward_weight.
  quintet::tensor<T, Device> backward_input(nn::context<Device>& ctx,
                                            tensor_view<const T, Device> dy) {
    if constexpr (sequence_sharded) {
      copy(ctx.template save<T>(linear_.name() + ".output_grad", dy.shape()), dy);
      const quintet::tensor<T, Device> dx = linear_.input_gradient(dy);
      return reduce_scatter_sequence(tp_, dx.view());
    } else {
      quintet::tensor<T, Device> dx = linear_.backward_input(ctx, dy);
      tp_.all_reduce(dx, reduce_op::sum);
      return dx;
    }
  }

  // The weight pass (sequence-sharded: gathers the kept block again, as backward does).
  void backward_weight(nn::context<Device>& ctx) {
    if constexpr (sequence_sharded) {
      const auto& block = ctx.template get<T>(linear_.name() + ".input_block");
      const quintet::tensor<T, Device> x = gather_sequence(tp_, block.view());
      linear_.accumulate_weight_gradient(
          x.view(), ctx.template get<T>(linear_.name() + ".output_grad").view());
      ctx.erase(linear_.name() + ".output_grad");
    } else {
      linear_.backward_weight(ctx);
    }
  }

  std::int64_t local_out() const { return linear_.local_out(); }

 private:
  static nn::linear_options sharded_options(const std::string& name, std::int64_t out,
                                            nn::linear_options options, int tp_size) {
    QUINTET_CHECK(options.output_groups >= 1 && out % options.output_groups == 0,
                  "column_linear '{}': {} output features do not split into {} groups", name, out,
                  options.output_groups);
    const std::int64_t per_group = out / options.output_groups;
    QUINTET_CHECK(per_group % tp_size == 0,
                  "column_linear '{}': {} output features{} do not divide over tp = {}", name,
                  per_group, options.output_groups > 1 ? " per group" : "", tp_size);
    const int dim = options.output_groups > 1 ? 1 : 0;  // the (out / groups) dimension
    options.weight_placement = options.weight_placement.sharded(mesh_axis::tp, dim);
    options.bias_placement = options.bias_placement.sharded(mesh_axis::tp, dim);
    return options;
  }

  Comm& tp_;
  nn::linear<T, Device> linear_;
};

}  // namespace quintet::parallel
