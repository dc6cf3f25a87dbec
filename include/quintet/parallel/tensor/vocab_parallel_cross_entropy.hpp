// Vocabulary-parallel cross-entropy (Megatron-LM): the loss of logits whose vocabulary dimension is
// split over the tensor-parallel group, without ever gathering the full logits on one rank. Each
// rank reduces its own columns to per-row statistics and two all-reduces of those combine them:
//
//   logits (rows, V_pad), tp = 2:   rank 0 holds columns [0, V_pad/2), rank 1 [V_pad/2, V_pad)
//   1. m_r   = max over own valid columns            all-reduce max  -> m   (rows)
//   2. s_r   = sum exp(logit - m), t_r = own target   all-reduce sum  -> s, t (rows, 2)
//   3. lse   = m + log s,  loss = sum (lse - t)       (identical on every rank)
//   backward: dlogits_r = scale (exp(logit - lse) - onehot) on own columns   (local)
//
// Padding columns (ids >= vocab) never enter the softmax and get zero gradient.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/operand.hpp>
#include <quintet/parallel/tensor/vocab_shard.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace quintet::parallel {

namespace detail {

template <class LogitsView>
void check_vocab_shard(const LogitsView& logits, const vocab_shard& shard, const char* function) {
  // valid is what of [begin, begin + columns) lies below vocab.
  QUINTET_CHECK(
      shard.vocab > 0 && shard.columns > 0 && shard.begin >= 0 &&
          shard.valid == std::clamp<std::int64_t>(shard.vocab - shard.begin, 0, shard.columns),
      "{}: the vocabulary shard (begin {}, valid {}, columns {}) of a vocabulary of {} "
      "ids is not a block of the padded vocabulary",
      function, shard.begin, shard.valid, shard.columns, shard.vocab);
  QUINTET_CHECK(kernels::row_length(logits) == shard.columns,
                "{}: logits of shape {} do not hold the shard's {} vocabulary columns", function,
                logits.shape(), shard.columns);
}

}  // namespace detail

// The loss of this rank's logits shard (..., shard.columns) against targets (...) (the whole
// vocabulary's ids, the same on every tp rank): the loss sum and count over the rows whose target
// is not ignore_index, identical on every rank and equal to kernels::cross_entropy_forward of the
// full, unpadded logits. lse (...) receives each row's global log-sum-exp, for the backward.
// Exactly two all-reduces on tp: max of rows * sizeof(acc) bytes, then sum of 2 rows * sizeof(acc).
template <device_tag Device, communicator Comm, class Logits, class Targets, class Lse>
kernels::cross_entropy_result vocab_parallel_cross_entropy_forward(
    const execution<Device>& exec, Comm& tp, const Logits& logits, const Targets& targets,
    Lse&& lse, std::int32_t ignore_index, const vocab_shard& shard) {
  const auto lv = kernels::input_view(logits);
  const auto sv = kernels::output_view(lse);
  using acc = kernels::accumulator_t<typename decltype(lv)::value_type>;
  detail::check_vocab_shard(lv, shard, "vocab_parallel_cross_entropy_forward");
  const shape rows = kernels::leading_shape(lv);
  std::vector<std::int64_t> pair_dims(rows.extents().begin(), rows.extents().end());
  pair_dims.push_back(2);

  quintet::tensor<acc, Device> row_max(rows);  // (...)
  kernels::cross_entropy_shard_max(exec, lv, row_max, shard.valid);
  tp.all_reduce(row_max, reduce_op::max);
  const shape pairs = shape(std::span<const std::int64_t>(pair_dims));
  quintet::tensor<acc, Device> partials(pairs);  // (..., 2)
  kernels::cross_entropy_shard_partials(exec, lv, targets, row_max, partials, shard.begin,
                                        shard.valid, ignore_index);
  tp.all_reduce(partials, reduce_op::sum);
  return kernels::cross_entropy_shard_finish(exec, targets, row_max, partials, sv, shard.vocab,
                                             ignore_index);
}

// dlogits (..., shard.columns) = scale (softmax - onehot(target)) on this rank's columns, from the
// forward's global lse (...); padding columns and ignored rows get 0. No communication.
template <device_tag Device, class Logits, class Targets, class Lse, class DLogits>
void vocab_parallel_cross_entropy_backward(const execution<Device>& exec, const Logits& logits,
                                           const Targets& targets, const Lse& lse,
                                           DLogits&& dlogits, double scale,
                                           std::int32_t ignore_index, const vocab_shard& shard) {
  const auto lv = kernels::input_view(logits);
  detail::check_vocab_shard(lv, shard, "vocab_parallel_cross_entropy_backward");
  kernels::cross_entropy_shard_backward(exec, lv, targets, lse, dlogits, scale, shard.begin,
                                        shard.valid, ignore_index);
}

}  // namespace quintet::parallel
