// whole_sequence: what a plan without a sequence policy does with the sequence — every rank holds
// all of it — and the base the sequence styles refine. Layers ask a plan's sequence behaviour
// (parallel::sequence_of<Plan>, in plan.hpp) these questions:
//
//   shards_activations_on_tp   the activations between the linears hold the tp group's sequence
//                              block (megatron_sp), so the vocabulary ends scatter and gather;
//                              linear_sequence: the style the tensor-parallel linears then take
//   splits_tokens_over_sp      each sp rank's activations hold its own positions (ulysses, ring),
//                              so a layer deciding over all tokens (a MoE router) gathers them
//   input_layout(mesh, seq)    the rows of tokens and targets this rank embeds and scores
//   activation_layout(...)     the rows the activations between blocks hold
//   to_attention / from_attention   what attention does to q, k, v around its kernel (Ulysses
//                              trades sequence rows for heads) and back; head_split
//   attention_forward/backward the attention kernel, or ring attention over sp
//   complete_loss(mesh, loss)  the loss of this rank's rows -> the micro-batch's
#pragma once

#include <quintet/comm/all_reduce_from_host.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/parallel/sequence/sequence_layout.hpp>
#include <quintet/parallel/strategy.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <utility>

namespace quintet::parallel {

struct whole_sequence {
  static constexpr bool shards_activations_on_tp = false;
  static constexpr bool splits_tokens_over_sp = false;
  // The sequence style the tensor-parallel linears take part in (column_linear, row_linear).
  using linear_sequence = none;
  // Attention's output is the output projection's input as it stands (no exchange after it), so
  // the projection may refer to the tensor attention keeps instead of copying it.
  static constexpr bool attention_output_is_projection_input = true;

  template <class Mesh>
  static sequence_layout input_layout(Mesh*, std::int64_t seq) {
    return sequence_layout::whole(seq);
  }
  template <class Mesh>
  static sequence_layout activation_layout(Mesh*, std::int64_t seq) {
    return sequence_layout::whole(seq);
  }

  // Ranks that split one tp rank's heads between them (each attends with heads / tp / split).
  template <class Mesh>
  static std::int64_t head_split(Mesh*) {
    return 1;
  }
  template <class Mesh, class T, class Device>
  static quintet::tensor<T, Device> to_attention(Mesh*, quintet::tensor<T, Device> x,
                                                 std::int64_t /*groups*/) {
    return x;
  }
  template <class Mesh, class T, class Device>
  static quintet::tensor<T, Device> from_attention(Mesh*, quintet::tensor<T, Device> x,
                                                   std::int64_t /*groups*/) {
    return x;
  }

  template <class Mesh, class Device, class... Operands>
  static void attention_forward(const execution<Device>& exec, Mesh*, Operands&&... operands) {
    kernels::attention_forward(exec, std::forward<Operands>(operands)...);
  }
  template <class Mesh, class Device, class... Operands>
  static void attention_backward(const execution<Device>& exec, Mesh*, Operands&&... operands) {
    kernels::attention_backward(exec, std::forward<Operands>(operands)...);
  }

  template <class Mesh>
  static kernels::cross_entropy_result complete_loss(Mesh*, kernels::cross_entropy_result loss) {
    return loss;
  }
};

// The (sum, count) of a loss summed over `group`: every rank scored its own rows.
template <communicator Comm>
kernels::cross_entropy_result sum_loss_over(Comm& group, kernels::cross_entropy_result local) {
  quintet::tensor<double, host> totals(shape{2});
  totals(0) = local.loss_sum;
  totals(1) = static_cast<double>(local.count);
  all_reduce_from_host(group, totals, reduce_op::sum);
  return {.loss_sum = totals(0), .count = static_cast<std::int64_t>(totals(1))};
}

}  // namespace quintet::parallel
