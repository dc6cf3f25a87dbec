// column_linear: a linear layer whose weight is split on its output dimension over the
// tensor-parallel group (Megatron-LM). The input is replicated; each rank computes its slice of the
// output. Forward needs no communication; backward all-reduces the input gradient, to which every
// rank contributed through its slice of W.
//
//   W (out, in), tp = 2:      rank 0 holds rows [0, out/2)     y[..., 0:out/2]   = x W0^T + b0
//                             rank 1 holds rows [out/2, out)   y[..., out/2:out] = x W1^T + b1
//   dx = dy0 W0 + dy1 W1      (all-reduce over tp)
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/nn/context.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/placement.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <string>

namespace quintet::parallel {

template <class T, class Device, communicator Comm>
class column_linear {
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
  quintet::tensor<T, Device> forward(nn::context<Device>& ctx, tensor_view<const T, Device> x) {
    return linear_.forward(ctx, x);
  }

  // dy (..., out / tp) -> dx (..., in), summed over the tp group.
  quintet::tensor<T, Device> backward(nn::context<Device>& ctx, tensor_view<const T, Device> dy) {
    quintet::tensor<T, Device> dx = linear_.backward(ctx, dy);
    tp_.all_reduce(dx, reduce_op::sum);
    return dx;
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
    options.weight_placement = placement::replicated().sharded(mesh_axis::tp, dim);
    options.bias_placement = placement::replicated().sharded(mesh_axis::tp, dim);
    return options;
  }

  Comm& tp_;
  nn::linear<T, Device> linear_;
};

}  // namespace quintet::parallel
