// Host loops for softmax cross-entropy on logits rows: log-sum-exp with the row maximum
// subtracted (stable for any logit scale), the loss summed in double, and the gradient
// softmax - onehot recomputed from the saved log-sum-exp.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/host/exponential.hpp>
#include <quintet/kernels/host/lanes.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace quintet::kernels::host_impl {

struct cross_entropy_totals {
  double loss_sum = 0.0;   // sum over counted rows of lse - logit[target]
  std::int64_t count = 0;  // rows whose target is not ignore_index
};

template <class T, class Acc = accumulator_t<T>>
cross_entropy_totals cross_entropy_forward(const T* logits, const std::int32_t* targets, Acc* lse,
                                           std::int64_t rows, std::int64_t vocab,
                                           std::int32_t ignore_index) {
  cross_entropy_totals totals;
  std::vector<Acc> e(static_cast<std::size_t>(vocab));  // one row's exp(x - max)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * vocab;
    const std::int32_t target = targets[r];
    QUINTET_CHECK(target == ignore_index || (target >= 0 && target < vocab),
                  "cross_entropy_forward: target {} of row {} is outside the vocabulary [0, {}) "
                  "and is not the ignore index {}",
                  target, r, vocab, ignore_index);
    Acc peak = -std::numeric_limits<Acc>::infinity();
    for (std::int64_t j = 0; j < vocab; ++j) peak = std::max(peak, widen(row[j]));
    Acc* shifted = e.data();
    lane_map(shifted, vocab, [&](std::int64_t j) { return widen(row[j]) - peak; });
    exponentials(shifted, shifted, vocab);
    lse[r] = peak + std::log(lane_sum<Acc>(vocab, [&](std::int64_t j) { return shifted[j]; }));
    if (target == ignore_index) continue;
    totals.loss_sum += static_cast<double>(lse[r]) - static_cast<double>(widen(row[target]));
    ++totals.count;
  }
  return totals;
}

// dlogits = scale (exp(logits - lse) - onehot(target)); rows with target == ignore_index get 0.
template <class T, class Acc = accumulator_t<T>>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, const Acc* lse,
                            T* dlogits, std::int64_t rows, std::int64_t vocab, Acc scale,
                            std::int32_t ignore_index) {
  std::vector<Acc> e(static_cast<std::size_t>(vocab));  // one row's softmax
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * vocab;
    T* out = dlogits + r * vocab;
    const std::int32_t target = targets[r];
    if (target == ignore_index) {
      std::fill(out, out + vocab, T(0.0f));
      continue;
    }
    QUINTET_CHECK(target >= 0 && target < vocab,
                  "cross_entropy_backward: target {} of row {} is outside the vocabulary [0, {})",
                  target, r, vocab);
    Acc* shifted = e.data();
    lane_map(shifted, vocab, [&](std::int64_t j) { return widen(row[j]) - lse[r]; });
    exponentials(shifted, shifted, vocab);
    lane_map(out, vocab, [&](std::int64_t j) { return narrow<T>(scale * shifted[j]); });
    out[target] = narrow<T>(scale * (shifted[target] - Acc(1)));
  }
}

}  // namespace quintet::kernels::host_impl
