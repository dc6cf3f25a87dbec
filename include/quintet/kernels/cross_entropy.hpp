// cross_entropy_forward / cross_entropy_backward: softmax cross-entropy over the last dimension
// of logits (..., vocab) with int32 targets (...), skipping rows whose target is ignore_index
// (padding). Forward returns the loss sum and the counted rows (a data-parallel mean divides the
// global sum by the global count) and saves each row's log-sum-exp; backward writes
// scale * (softmax - onehot), scale being the caller's dloss/dsum (1 / count for the mean). Host
// only.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/cross_entropy.hpp>
#include <quintet/kernels/operand.hpp>

#include <concepts>
#include <cstdint>

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
                "cross_entropy_forward and cross_entropy_backward have only a host implementation: "
                "their CUDA twin is not written yet");
};

template <>
struct cross_entropy_engine<host> {
  template <class T, class Acc>
  static cross_entropy_result forward(const execution<host>&, const T* logits,
                                      const std::int32_t* targets, Acc* lse, std::int64_t rows,
                                      std::int64_t vocab, std::int32_t ignore_index) {
    const auto totals =
        host_impl::cross_entropy_forward(logits, targets, lse, rows, vocab, ignore_index);
    return {totals.loss_sum, totals.count};
  }
  template <class T, class Acc>
  static void backward(const execution<host>&, const T* logits, const std::int32_t* targets,
                       const Acc* lse, T* dlogits, std::int64_t rows, std::int64_t vocab, Acc scale,
                       std::int32_t ignore_index) {
    host_impl::cross_entropy_backward(logits, targets, lse, dlogits, rows, vocab, scale,
                                      ignore_index);
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

}  // namespace detail

// Mean-ready loss of logits (..., vocab) against targets (...); lse (...) receives each row's
// log-sum-exp (for every row, ignored ones included).
template <device_tag Device, class Logits, class Targets, class Lse>
cross_entropy_result cross_entropy_forward(const execution<Device>& ctx, const Logits& logits,
                                           const Targets& targets, Lse&& lse,
                                           std::int32_t ignore_index = no_target) {
  const auto lv = input_view(logits);
  const auto tv = input_view(targets);
  const auto sv = output_view(lse);
  detail::check_operand_types<Device, decltype(lv)>();
  detail::check_cross_entropy_operands(lv, tv, sv, "cross_entropy_forward");
  return cross_entropy_engine<Device>::forward(ctx, lv.data(), tv.data(), sv.data(), row_count(lv),
                                               row_length(lv), ignore_index);
}

// dlogits = scale (softmax(logits) - onehot(target)) per row, zero for ignored rows, from the
// forward's lse. For the mean loss, scale = 1 / count (times the upstream gradient).
template <device_tag Device, class Logits, class Targets, class Lse, class DLogits>
void cross_entropy_backward(const execution<Device>& ctx, const Logits& logits,
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
  cross_entropy_engine<Device>::backward(ctx, lv.data(), tv.data(), sv.data(), dv.data(),
                                         row_count(lv), row_length(lv), static_cast<acc>(scale),
                                         ignore_index);
}

}  // namespace quintet::kernels
