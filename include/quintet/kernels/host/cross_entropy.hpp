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

// A target is a vocabulary id or the ignore index; the error names the kernel and the batch row.
inline void check_target(const char* kernel, std::int32_t target, std::int64_t row,
                         std::int64_t vocab, std::int32_t ignore_index) {
  QUINTET_CHECK(target == ignore_index || (target >= 0 && target < vocab),
                "{}: target {} of row {} is outside the vocabulary [0, {}) and is not the ignore "
                "index {}",
                kernel, target, row, vocab, ignore_index);
}

// lse[r] = log sum_j exp(logits[r, j]) of each row.
template <class T, class Acc = accumulator_t<T>>
void cross_entropy_log_sum_exp(const T* logits, Acc* lse, std::int64_t rows, std::int64_t vocab) {
  std::vector<Acc> e(static_cast<std::size_t>(vocab));  // one row's exp(x - max)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * vocab;
    const Acc peak = lane_max<Acc>(vocab, [&](std::int64_t j) { return widen(row[j]); });
    Acc* shifted = e.data();
    lane_map(shifted, vocab, [&](std::int64_t j) { return widen(row[j]) - peak; });
    exponentials(shifted, shifted, vocab);
    lse[r] = peak + std::log(lane_sum<Acc>(vocab, [&](std::int64_t j) { return shifted[j]; }));
  }
}

// The loss summed over the counted rows in row order, from the rows' log-sum-exp; the targets
// checked.
template <class T, class Acc = accumulator_t<T>>
cross_entropy_totals cross_entropy_totals_of(const T* logits, const std::int32_t* targets,
                                             const Acc* lse, std::int64_t rows, std::int64_t vocab,
                                             std::int32_t ignore_index) {
  cross_entropy_totals totals;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t target = targets[r];
    check_target("cross_entropy_forward", target, r, vocab, ignore_index);
    if (target == ignore_index) continue;
    totals.loss_sum +=
        static_cast<double>(lse[r]) - static_cast<double>(widen(logits[r * vocab + target]));
    ++totals.count;
  }
  return totals;
}

// dlogits = scale (exp(logits - lse) - onehot(target)); rows with target == ignore_index get 0.
// The rows are rows first_row, first_row + 1, ... of the batch (as an error names them).
template <class T, class Acc = accumulator_t<T>>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, const Acc* lse,
                            T* dlogits, std::int64_t rows, std::int64_t vocab, Acc scale,
                            std::int32_t ignore_index, std::int64_t first_row = 0) {
  std::vector<Acc> e(static_cast<std::size_t>(vocab));  // one row's softmax
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * vocab;
    T* out = dlogits + r * vocab;
    const std::int32_t target = targets[r];
    if (target == ignore_index) {
      std::fill(out, out + vocab, T(0.0f));
      continue;
    }
    check_target("cross_entropy_backward", target, first_row + r, vocab, ignore_index);
    Acc* shifted = e.data();
    lane_map(shifted, vocab, [&](std::int64_t j) { return widen(row[j]) - lse[r]; });
    exponentials(shifted, shifted, vocab);
    lane_map(out, vocab, [&](std::int64_t j) { return narrow<T>(scale * shifted[j]); });
    out[target] = narrow<T>(scale * (shifted[target] - Acc(1)));
  }
}

// Vocabulary-parallel pieces: the logits rows hold `columns` ids [begin, begin + columns) of the
// vocabulary, of which only the first `valid` are real (the rest is padding and never counts).

// row_max[r] = max over the valid columns of row r; -inf when the shard holds only padding (the
// identity of the max all-reduce that follows).
template <class T, class Acc = accumulator_t<T>>
void cross_entropy_shard_max(const T* logits, Acc* row_max, std::int64_t rows, std::int64_t columns,
                             std::int64_t valid) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * columns;
    row_max[r] = lane_max<Acc>(valid, [&](std::int64_t j) { return widen(row[j]); });
  }
}

// partials[r] = {sum over valid columns of exp(logit - row_max[r]), the target's logit when this
// shard holds the target, else 0}: one buffer whose sum over the shards gives every row's
// sum_exp and target logit, so one all-reduce completes both.
template <class T, class Acc = accumulator_t<T>>
void cross_entropy_shard_partials(const T* logits, const std::int32_t* targets, const Acc* row_max,
                                  Acc* partials, std::int64_t rows, std::int64_t columns,
                                  std::int64_t begin, std::int64_t valid,
                                  std::int32_t ignore_index) {
  std::vector<Acc> e(static_cast<std::size_t>(valid));  // one row's exp(x - max)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * columns;
    Acc* shifted = e.data();
    lane_map(shifted, valid, [&](std::int64_t j) { return widen(row[j]) - row_max[r]; });
    exponentials(shifted, shifted, valid);
    partials[2 * r] = lane_sum<Acc>(valid, [&](std::int64_t j) { return shifted[j]; });
    const std::int64_t local = static_cast<std::int64_t>(targets[r]) - begin;
    const bool held = targets[r] != ignore_index && local >= 0 && local < valid;
    partials[2 * r + 1] = held ? widen(row[local]) : Acc(0);
  }
}

// From the all-reduced row_max and partials: lse[r] = max + log(sum_exp) for every row, and the
// loss lse - target logit summed (in double) over the rows whose target is not ignore_index.
// Targets are checked against the whole vocabulary here, where every rank sees the same ones.
template <class Acc>
cross_entropy_totals cross_entropy_shard_finish(const std::int32_t* targets, const Acc* row_max,
                                                const Acc* partials, Acc* lse, std::int64_t rows,
                                                std::int64_t vocab, std::int32_t ignore_index) {
  cross_entropy_totals totals;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t target = targets[r];
    check_target("vocab-parallel cross_entropy", target, r, vocab, ignore_index);
    lse[r] = row_max[r] + std::log(partials[2 * r]);
    if (target == ignore_index) continue;
    totals.loss_sum += static_cast<double>(lse[r]) - static_cast<double>(partials[2 * r + 1]);
    ++totals.count;
  }
  return totals;
}

// dlogits = scale (exp(logit - lse) - onehot(target)) on the valid columns; padding columns and
// ignored rows get 0. The onehot lands only on the shard holding the target.
template <class T, class Acc = accumulator_t<T>>
void cross_entropy_shard_backward(const T* logits, const std::int32_t* targets, const Acc* lse,
                                  T* dlogits, std::int64_t rows, std::int64_t columns,
                                  std::int64_t begin, std::int64_t valid, Acc scale,
                                  std::int32_t ignore_index) {
  std::vector<Acc> e(static_cast<std::size_t>(valid));  // one row's softmax on this shard
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * columns;
    T* out = dlogits + r * columns;
    const std::int32_t target = targets[r];
    std::fill(out + (target == ignore_index ? 0 : valid), out + columns, T(0.0f));
    if (target == ignore_index) continue;
    Acc* shifted = e.data();
    lane_map(shifted, valid, [&](std::int64_t j) { return widen(row[j]) - lse[r]; });
    exponentials(shifted, shifted, valid);
    lane_map(out, valid, [&](std::int64_t j) { return narrow<T>(scale * shifted[j]); });
    const std::int64_t local = static_cast<std::int64_t>(target) - begin;
    if (local >= 0 && local < valid) out[local] = narrow<T>(scale * (shifted[local] - Acc(1)));
  }
}

}  // namespace quintet::kernels::host_impl
