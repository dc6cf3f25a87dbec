// The communication at the two vocabulary-parallel ends of the model, chosen by the plan
// (Megatron-LM calls such functions mappings). Layers in nn/ call these instead of a collective, so
// one layer source serves every plan:
//
//   complete_partial_rows   (b, s, h) partial sums of a vocabulary-parallel lookup or product:
//                           none (no tp) | all-reduce over tp | reduce-scatter to this rank's
//                           sequence block (megatron_sp)
//   with_whole_rows         the (b, s, h) rows a vocabulary-parallel op reads: as kept, or under
//                           megatron_sp gathered from the tp group's sequence blocks
//   sum_partial_over_tp     (n, h) partial sums of a layer whose tp ranks all hold the same rows
//                           (experts split over tp, nn::moe): none (no tp) | all-reduce over tp,
//                           in place
// (The loss of a rank's rows becomes the micro-batch's through sequence_of<Plan>::complete_loss.)
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/sequence/sequence_collectives.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace quintet::parallel {

// partial (b, s, h) on each tp rank -> its sum (b, s, h), or under megatron_sp this rank's
// sequence block of the sum (b, s / tp, h).
template <class Plan, class Mesh, class T, class Device>
quintet::tensor<T, Device> complete_partial_rows(Mesh* mesh, quintet::tensor<T, Device> partial) {
  if constexpr (shards_sequence_on_tp<Plan>) {
    return reduce_scatter_sequence(mesh->tp(), partial.view());
  } else if constexpr (uses_tensor_parallel<Plan>) {
    mesh->tp().all_reduce(partial, reduce_op::sum);
    return partial;
  } else {
    return partial;
  }
}

// f(rows (b, s, h)) with the rows a vocabulary-parallel op reads: `kept` itself, or under
// megatron_sp the sequence gathered from the tp group's blocks (b, s / tp, h).
template <class Plan, class Mesh, class View, class F>
void with_whole_rows(Mesh* mesh, const View& kept, F&& f) {
  if constexpr (shards_sequence_on_tp<Plan>) {
    f(gather_sequence(mesh->tp(), view_of(kept)).view());
  } else {
    f(view_of(kept));
  }
}

// partial (n, h), the same rows on every tp rank -> their sum over tp, in place. (Only for rows
// whole on every tp rank: under megatron_sp at tp > 1 a layer gathers its rows and reduce-scatters
// its partial sums instead, as nn::moe does.)
template <class Plan, class Mesh, class T, class Device>
void sum_partial_over_tp(Mesh* mesh, quintet::tensor<T, Device>& partial) {
  if constexpr (uses_tensor_parallel<Plan>) {
    mesh->tp().all_reduce(partial, reduce_op::sum);
  } else {
    (void)mesh, (void)partial;
  }
}

}  // namespace quintet::parallel
