// cross_entropy_forward / cross_entropy_backward: softmax cross-entropy over the last dimension
// of logits (..., vocab) with int32 targets (...), skipping rows whose target is ignore_index
// (padding). Forward returns the loss sum and the counted rows (a data-parallel mean divides the
// global sum by the global count) and saves each row's log-sum-exp; backward writes
// scale * (softmax - onehot), scale being the caller's dloss/dsum (1 / count for the mean). Host
// here; cuda in <quintet/kernels/cuda/cross_entropy.cuh>.
//
// The vocabulary-parallel pieces (cross_entropy_shard_*) compute the same loss when each rank holds
// only columns [begin, begin + columns) of the vocabulary, `valid` of them real and the rest
// padding, in two all-reduces the caller makes (parallel/tensor/vocab_parallel_cross_entropy.hpp):
//   cross_entropy_shard_max       row_max (...)         all-reduce max
//   cross_entropy_shard_partials  partials (..., 2)     all-reduce sum: {sum_exp, target logit}
//   cross_entropy_shard_finish    lse (...), the loss   (no communication)
//   cross_entropy_shard_backward  dlogits (..., columns) (no communication)
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/cross_entropy.hpp>
#include <quintet/kernels/operand.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace quintet::kernels {

// The loss of the counted rows: sum and count; mean() is what a training step reports.
struct cross_entropy_result {
  double loss_sum = 0.0;
  std::int64_t count = 0;
  double mean() const { return count == 0 ? 0.0 : loss_sum / static_cast<double>(count); }
};

// The default padding target (no vocabulary id is negative).
inline constexpr std::int32_t no_target = -1;

template <class Device>
struct cross_entropy_engine {
  static_assert(quintet::detail::always_false<Device>,
                "cross_entropy on this device needs its implementation: for quintet::cuda include "
                "<quintet/kernels/cuda/cross_entropy.cuh> in a translation unit compiled by nvcc");
};

template <>
struct cross_entropy_engine<host> {
  // The rows' log-sum-exp over the threads, then the loss summed in row order (the same bits for
  // any number of threads).
  template <class T, class Acc>
  static cross_entropy_result forward(const execution<host>& exec, const T* logits,
                                      const std::int32_t* targets, Acc* lse, std::int64_t rows,
                                      std::int64_t vocab, std::int32_t ignore_index) {
    const std::int64_t grain = execution<host>::grain_for(vocab);  // rows
    exec.parallel_rows<T>(rows, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::cross_entropy_log_sum_exp(logits + begin * vocab, lse + begin, end - begin, vocab);
    });
    const auto totals =
        host_impl::cross_entropy_totals_of(logits, targets, lse, rows, vocab, ignore_index);
    return {totals.loss_sum, totals.count};
  }
  template <class T, class Acc>
  static void backward(const execution<host>& exec, const T* logits, const std::int32_t* targets,
                       const Acc* lse, T* dlogits, std::int64_t rows, std::int64_t vocab, Acc scale,
                       std::int32_t ignore_index) {
    const std::int64_t grain = execution<host>::grain_for(vocab);  // rows
    exec.parallel_rows<T>(rows, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::cross_entropy_backward(logits + begin * vocab, targets + begin, lse + begin,
                                        dlogits + begin * vocab, end - begin, vocab, scale,
                                        ignore_index, begin);
    });
  }
  template <class T, class Acc>
  static void shard_max(const execution<host>& exec, const T* logits, Acc* row_max,
                        std::int64_t rows, std::int64_t columns, std::int64_t valid) {
    exec.run_rows<T>(
        [&] { host_impl::cross_entropy_shard_max(logits, row_max, rows, columns, valid); });
  }
  template <class T, class Acc>
  static void shard_partials(const execution<host>& exec, const T* logits,
                             const std::int32_t* targets, const Acc* row_max, Acc* partials,
                             std::int64_t rows, std::int64_t columns, std::int64_t begin,
                             std::int64_t valid, std::int32_t ignore_index) {
    exec.run_rows<T>([&] {
      host_impl::cross_entropy_shard_partials(logits, targets, row_max, partials, rows, columns,
                                              begin, valid, ignore_index);
    });
  }
  template <class Acc>
  static cross_entropy_result shard_finish(const execution<host>&, const std::int32_t* targets,
                                           const Acc* row_max, const Acc* partials, Acc* lse,
                                           std::int64_t rows, std::int64_t vocab,
                                           std::int32_t ignore_index) {
    const auto totals = host_impl::cross_entropy_shard_finish(targets, row_max, partials, lse, rows,
                                                              vocab, ignore_index);
    return {totals.loss_sum, totals.count};
  }
  template <class T, class Acc>
  static void shard_backward(const execution<host>& exec, const T* logits,
                             const std::int32_t* targets, const Acc* lse, T* dlogits,
                             std::int64_t rows, std::int64_t columns, std::int64_t begin,
                             std::int64_t valid, Acc scale, std::int32_t ignore_index) {
    exec.run_rows<T>([&] {
      host_impl::cross_entropy_shard_backward(logits, targets, lse, dlogits, rows, columns, begin,
                                              valid, scale, ignore_index);
    });
  }
};

namespace detail {

template <class LogitsView, class TargetsView, class LseView>
void check_cross_entropy_operands(const LogitsView& logits, const TargetsView& targets,
                                  const LseView& lse, const char* kernel) {
  static_assert(std::same_as<typename TargetsView::value_type, std::int32_t>,
                "cross_entropy: targets are int32 token ids");
  static_assert(
      std::same_as<typename LseView::value_type, accumulator_t<typename LogitsView::value_type>>,
      "cross_entropy: lse holds accumulator_t<T> (float, or double for double logits)");
  require_rank_at_least(logits, 1, kernel, "logits");
  QUINTET_CHECK(row_length(logits) > 0, "{}: logits of shape {} have an empty vocabulary", kernel,
                logits.shape());
  require_contiguous(logits, kernel, "logits");
  require_contiguous(targets, kernel, "targets");
  require_contiguous(lse, kernel, "lse");
  require_shape(targets, leading_shape(logits), kernel, "targets");
  require_shape(lse, leading_shape(logits), kernel, "lse");
  check_same_device(logits, targets, kernel);
  check_same_device(logits, lse, kernel);
}

// The vocabulary range of a logits shard: `valid` real columns of `columns`, starting at id begin.
inline void check_vocab_columns(std::int64_t columns, std::int64_t begin, std::int64_t valid,
                                const char* kernel) {
  QUINTET_CHECK(begin >= 0 && valid >= 0 && valid <= columns,
                "{}: a shard of {} columns cannot hold {} valid vocabulary ids from id {}", kernel,
                columns, valid, begin);
}

// A per-row statistic of logits: (...) or, with `width`, (..., width); accumulator_t<T>,
// contiguous.
template <class LogitsView, class StatView>
void check_row_statistic(const LogitsView& logits, const StatView& stat, std::int64_t width,
                         const char* kernel, const char* operand) {
  static_assert(
      std::same_as<typename StatView::value_type, accumulator_t<typename LogitsView::value_type>>,
      "cross_entropy: row statistics hold accumulator_t<T> (float, or double for double logits)");
  require_contiguous(stat, kernel, operand);
  shape expected = leading_shape(logits);
  if (width > 0) {
    const auto extents = expected.extents();
    std::vector<std::int64_t> dims(extents.begin(), extents.end());
    dims.push_back(width);
    expected = shape(std::span<const std::int64_t>(dims));
  }
  require_shape(stat, expected, kernel, operand);
  check_same_device(logits, stat, kernel);
}

}  // namespace detail

// Mean-ready loss of logits (..., vocab) against targets (...); lse (...) receives each row's
// log-sum-exp (for every row, ignored ones included).
template <device_tag Device, class Logits, class Targets, class Lse>
cross_entropy_result cross_entropy_forward(const execution<Device>& exec, const Logits& logits,
                                           const Targets& targets, Lse&& lse,
                                           std::int32_t ignore_index = no_target) {
  const auto lv = input_view(logits);
  const auto tv = input_view(targets);
  const auto sv = output_view(lse);
  detail::check_operand_types<Device, decltype(lv)>();
  detail::check_cross_entropy_operands(lv, tv, sv, "cross_entropy_forward");
  return cross_entropy_engine<Device>::forward(exec, lv.data(), tv.data(), sv.data(), row_count(lv),
                                               row_length(lv), ignore_index);
}

// dlogits = scale (softmax(logits) - onehot(target)) per row, zero for ignored rows, from the
// forward's lse. For the mean loss, scale = 1 / count (times the upstream gradient).
template <device_tag Device, class Logits, class Targets, class Lse, class DLogits>
void cross_entropy_backward(const execution<Device>& exec, const Logits& logits,
                            const Targets& targets, const Lse& lse, DLogits&& dlogits, double scale,
                            std::int32_t ignore_index = no_target) {
  const auto lv = input_view(logits);
  const auto tv = input_view(targets);
  const auto sv = input_view(lse);
  const auto dv = output_view(dlogits);
  detail::check_operand_types<Device, decltype(lv), decltype(dv)>();
  detail::check_cross_entropy_operands(lv, tv, sv, "cross_entropy_backward");
  require_contiguous(dv, "cross_entropy_backward", "dlogits");
  check_same_shape(lv, dv, "cross_entropy_backward");
  check_same_device(lv, dv, "cross_entropy_backward");
  using acc = typename decltype(sv)::value_type;
  cross_entropy_engine<Device>::backward(exec, lv.data(), tv.data(), sv.data(), dv.data(),
                                         row_count(lv), row_length(lv), static_cast<acc>(scale),
                                         ignore_index);
}

// --- vocabulary-parallel pieces -----------------------------------------------------------------

// row_max (...) = the maximum of each row of logits (..., columns) over its first `valid` columns;
// -inf when valid is 0 (a shard holding only padding).
template <device_tag Device, class Logits, class RowMax>
void cross_entropy_shard_max(const execution<Device>& exec, const Logits& logits, RowMax&& row_max,
                             std::int64_t valid) {
  const auto lv = input_view(logits);
  const auto mv = output_view(row_max);
  detail::check_operand_types<Device, decltype(lv)>();
  constexpr const char* kernel = "cross_entropy_shard_max";
  require_rank_at_least(lv, 1, kernel, "logits");
  require_contiguous(lv, kernel, "logits");
  detail::check_vocab_columns(row_length(lv), 0, valid, kernel);
  detail::check_row_statistic(lv, mv, 0, kernel, "row_max");
  cross_entropy_engine<Device>::shard_max(exec, lv.data(), mv.data(), row_count(lv), row_length(lv),
                                          valid);
}

// partials (..., 2) = {sum over the valid columns of exp(logit - row_max), the logit of the
// target when its id is in [begin, begin + valid) and it is not ignore_index, else 0}, row_max
// (...) being the all-reduced (global) maximum. Summed over the shards, it holds each row's
// sum_exp and target logit.
template <device_tag Device, class Logits, class Targets, class RowMax, class Partials>
void cross_entropy_shard_partials(const execution<Device>& exec, const Logits& logits,
                                  const Targets& targets, const RowMax& row_max,
                                  Partials&& partials, std::int64_t begin, std::int64_t valid,
                                  std::int32_t ignore_index = no_target) {
  const auto lv = input_view(logits);
  const auto tv = input_view(targets);
  const auto mv = input_view(row_max);
  const auto pv = output_view(partials);
  detail::check_operand_types<Device, decltype(lv)>();
  constexpr const char* kernel = "cross_entropy_shard_partials";
  detail::check_cross_entropy_operands(lv, tv, mv, kernel);
  detail::check_vocab_columns(row_length(lv), begin, valid, kernel);
  detail::check_row_statistic(lv, pv, 2, kernel, "partials");
  cross_entropy_engine<Device>::shard_partials(exec, lv.data(), tv.data(), mv.data(), pv.data(),
                                               row_count(lv), row_length(lv), begin, valid,
                                               ignore_index);
}

// From the all-reduced row_max (...) and partials (..., 2): lse (...) = row_max + log(sum_exp) for
// every row, and the loss sum of lse - target logit and the count over the rows whose target is
// not ignore_index. Throws when a target is neither in [0, vocab) nor ignore_index.
template <device_tag Device, class Targets, class RowMax, class Partials, class Lse>
cross_entropy_result cross_entropy_shard_finish(const execution<Device>& exec,
                                                const Targets& targets, const RowMax& row_max,
                                                const Partials& partials, Lse&& lse,
                                                std::int64_t vocab,
                                                std::int32_t ignore_index = no_target) {
  const auto tv = input_view(targets);
  const auto mv = input_view(row_max);
  const auto pv = input_view(partials);
  const auto sv = output_view(lse);
  using acc = typename decltype(sv)::value_type;
  static_assert(std::same_as<typename decltype(tv)::value_type, std::int32_t>,
                "cross_entropy: targets are int32 token ids");
  static_assert(std::same_as<acc, float> || std::same_as<acc, double>,
                "cross_entropy_shard_finish: lse holds accumulator_t<T> (float or double)");
  static_assert(std::same_as<typename decltype(mv)::value_type, acc> &&
                    std::same_as<typename decltype(pv)::value_type, acc>,
                "cross_entropy_shard_finish: row_max, partials and lse share one element type");
  static_assert(std::same_as<typename decltype(sv)::device_type, Device>,
                "the execution context and the operands must be on the same device kind");
  constexpr const char* kernel = "cross_entropy_shard_finish";
  require_contiguous(tv, kernel, "targets");
  require_contiguous(mv, kernel, "row_max");
  require_contiguous(pv, kernel, "partials");
  require_contiguous(sv, kernel, "lse");
  require_shape(mv, tv.shape(), kernel, "row_max");
  require_shape(sv, tv.shape(), kernel, "lse");
  QUINTET_CHECK(
      pv.numel() == 2 * tv.numel() && pv.rank() == tv.rank() + 1 && pv.shape()[pv.rank() - 1] == 2,
      "{}: partials has shape {}, expected the targets' shape {} with a last extent 2", kernel,
      pv.shape(), tv.shape());
  QUINTET_CHECK(vocab > 0, "{}: the vocabulary has {} ids", kernel, vocab);
  check_same_device(tv, mv, kernel);
  check_same_device(tv, pv, kernel);
  check_same_device(tv, sv, kernel);
  return cross_entropy_engine<Device>::shard_finish(exec, tv.data(), mv.data(), pv.data(),
                                                    sv.data(), tv.numel(), vocab, ignore_index);
}

// dlogits (..., columns) = scale (exp(logit - lse) - onehot(target)) on the first `valid`
// columns, the onehot only where the target's id is in [begin, begin + valid); 0 on padding
// columns and on ignored rows. lse (...) is the global log-sum-exp from cross_entropy_shard_finish
// (which also checked the targets).
template <device_tag Device, class Logits, class Targets, class Lse, class DLogits>
void cross_entropy_shard_backward(const execution<Device>& exec, const Logits& logits,
                                  const Targets& targets, const Lse& lse, DLogits&& dlogits,
                                  double scale, std::int64_t begin, std::int64_t valid,
                                  std::int32_t ignore_index = no_target) {
  const auto lv = input_view(logits);
  const auto tv = input_view(targets);
  const auto sv = input_view(lse);
  const auto dv = output_view(dlogits);
  detail::check_operand_types<Device, decltype(lv), decltype(dv)>();
  constexpr const char* kernel = "cross_entropy_shard_backward";
  detail::check_cross_entropy_operands(lv, tv, sv, kernel);
  detail::check_vocab_columns(row_length(lv), begin, valid, kernel);
  require_contiguous(dv, kernel, "dlogits");
  check_same_shape(lv, dv, kernel);
  check_same_device(lv, dv, kernel);
  using acc = typename decltype(sv)::value_type;
  cross_entropy_engine<Device>::shard_backward(exec, lv.data(), tv.data(), sv.data(), dv.data(),
                                               row_count(lv), row_length(lv), begin, valid,
                                               static_cast<acc>(scale), ignore_index);
}

}  // namespace quintet::kernels
