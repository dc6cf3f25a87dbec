// synchronize_gradients<Plan>: after the backward of a step's micro-batches, sums the gradients
// that sequence parallelism leaves partial, so every rank holds its part of the serial model's
// gradient (what clipping and the optimizer expect).
//
//   sequence<megatron_sp>   parameters replicated over tp (layer norms, position table, row
//                           biases) saw only this rank's sequence block: summed over tp.
//   sequence<ulysses|ring>  every parameter saw only this rank's sequence rows: summed over sp.
//
// One all-reduce per axis over a flat buffer of all such gradients: after the last micro-batch,
// not after each (gradients accumulate across micro-batches, and summing twice would count the
// earlier ones twice). Other plans have nothing to synchronise (data parallelism will add dp).
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/reshape.hpp>
#include <quintet/tensor/slice.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace quintet::parallel {

namespace detail {

// Sums the gradients of `parameters` over `group` with one all-reduce.
template <class T, class Device, communicator Comm>
void all_reduce_gradients(const std::vector<nn::parameter<T, Device>*>& parameters, Comm& group) {
  if (group.size() == 1 || parameters.empty()) return;
  std::int64_t total = 0;
  for (const auto* p : parameters) total += p->grad.numel();
  quintet::tensor<T, Device> flat(shape{total});
  std::int64_t offset = 0;
  for (const auto* p : parameters) {
    const std::int64_t n = p->grad.numel();
    copy(slice(flat, 0, offset, offset + n), reshape(p->grad, shape{n}));
    offset += n;
  }
  group.all_reduce(flat, reduce_op::sum);
  offset = 0;
  for (auto* p : parameters) {
    const std::int64_t n = p->grad.numel();
    copy(reshape(p->grad, shape{n}), slice(flat, 0, offset, offset + n));
    offset += n;
  }
}

}  // namespace detail

template <class Plan, class T, class Device, class Mesh>
void synchronize_gradients(nn::parameter_registry<T, Device>& registry, Mesh& mesh) {
  using sequence_style = typename Plan::template style<strategy::sequence>;
  if constexpr (std::is_same_v<sequence_style, megatron_sp>) {
    std::vector<nn::parameter<T, Device>*> partial;
    for (auto& p : registry)
      if (!p.placement.is_sharded(mesh_axis::tp)) partial.push_back(&p);
    detail::all_reduce_gradients(partial, mesh.tp());
  } else if constexpr (std::is_same_v<sequence_style, ulysses> ||
                       std::is_same_v<sequence_style, ring>) {
    std::vector<nn::parameter<T, Device>*> partial;
    for (auto& p : registry) partial.push_back(&p);
    detail::all_reduce_gradients(partial, mesh.sp());
  }
}

}  // namespace quintet::parallel
