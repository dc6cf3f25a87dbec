// Host loops for mixture-of-experts routing and dispatch: the router's softmax with its
// log-sum-exp, top-k choice with capacity, the two auxiliary losses and the router's backward,
// the permutation of token rows into expert order and back, and products over variable-size
// groups of rows (one matrix per group). Arithmetic in accumulator_t<T>.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/matmul.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace quintet::kernels {

// Which of an expert's tokens are dropped when more than its capacity are routed to it.
enum class drop_order : std::uint8_t {
  lowest_probability,  // keep the tokens with the highest router probability for the expert
  position,            // keep the first tokens in token order
};

}  // namespace quintet::kernels

namespace quintet::kernels::host_impl {

struct routing_sizes {
  std::int64_t tokens, experts, k;
  std::int64_t capacity;  // tokens an expert keeps at most; 0: no limit (dropless)
  drop_order drop;
  std::int64_t first_row = 0;  // the permuted buffer's first row (a later routing group's start)
};

// probs (tokens, experts) = softmax(logits) per row and lse (tokens) = log sum exp(logits), both
// from the row maximum, so no exponent overflows.
template <class T>
void router_softmax(const T* logits, T* probs, T* lse, std::int64_t tokens, std::int64_t experts) {
  using acc = accumulator_t<T>;
  std::vector<acc> e(static_cast<std::size_t>(experts));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const T* row = logits + t * experts;
    acc peak = -std::numeric_limits<acc>::infinity();
    for (std::int64_t j = 0; j < experts; ++j) peak = std::max(peak, widen(row[j]));
    acc sum = 0;
    for (std::int64_t j = 0; j < experts; ++j) sum += e[j] = std::exp(widen(row[j]) - peak);
    for (std::int64_t j = 0; j < experts; ++j) probs[t * experts + j] = narrow<T>(e[j] / sum);
    lse[t] = narrow<T>(peak + std::log(sum));
  }
}

// For every token its k experts of highest probability (a tie goes to the lower expert index),
// in decreasing order of probability: expert (tokens, k). gate (tokens, k) is the probability
// itself when k = 1 (Switch) and the probability renormalised over the k chosen otherwise.
// routed (experts) counts the assignments to each expert before capacity; kept (experts) after.
// position (tokens, k) is the row of the assignment in the permuted buffer, or -1 when dropped:
// the buffer holds, from row n.first_row, expert 0's rows, then expert 1's, ..., each expert's in
// token order.
template <class T>
void route_top_k(const T* probs, std::int32_t* expert, T* gate, std::int32_t* position,
                 std::int64_t* routed, std::int64_t* kept, routing_sizes n) {
  using acc = accumulator_t<T>;
  std::fill(routed, routed + n.experts, std::int64_t{0});
  std::vector<char> chosen(static_cast<std::size_t>(n.experts));
  for (std::int64_t t = 0; t < n.tokens; ++t) {
    const T* p = probs + t * n.experts;
    std::fill(chosen.begin(), chosen.end(), char{0});
    acc sum = 0;
    for (std::int64_t j = 0; j < n.k; ++j) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < n.experts; ++e)  // strictly greater: ties keep the lower index
        if (!chosen[e] && (best < 0 || widen(p[e]) > widen(p[best]))) best = e;
      chosen[best] = 1;
      expert[t * n.k + j] = static_cast<std::int32_t>(best);
      sum += widen(p[best]);
      ++routed[best];
    }
    for (std::int64_t j = 0; j < n.k; ++j) {
      const acc prob = widen(p[expert[t * n.k + j]]);
      gate[t * n.k + j] = narrow<T>(n.k == 1 ? prob : prob / sum);
    }
  }
  // Each expert's assignments in token order (a token picks an expert at most once); those over
  // capacity are dropped.
  std::vector<std::vector<std::int64_t>> slots(static_cast<std::size_t>(n.experts));
  for (std::int64_t e = 0; e < n.experts; ++e)
    slots[e].reserve(static_cast<std::size_t>(routed[e]));
  for (std::int64_t i = 0; i < n.tokens * n.k; ++i) slots[expert[i]].push_back(i);
  std::vector<char> keep(static_cast<std::size_t>(n.tokens * n.k), char{1});
  std::vector<std::int64_t> order;
  for (std::int64_t e = 0; e < n.experts; ++e) {
    const auto& mine = slots[e];
    const auto count = static_cast<std::int64_t>(mine.size());
    if (n.capacity == 0 || count <= n.capacity) continue;
    order = mine;
    if (n.drop == drop_order::lowest_probability)
      // Highest probability first; equal probabilities keep the earlier token.
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
        return widen(probs[(a / n.k) * n.experts + e]) > widen(probs[(b / n.k) * n.experts + e]);
      });
    for (std::int64_t r = n.capacity; r < count; ++r) keep[order[r]] = 0;
  }
  std::int64_t row = n.first_row;
  for (std::int64_t e = 0; e < n.experts; ++e) {
    const std::int64_t first = row;
    for (const std::int64_t i : slots[e])
      position[i] = keep[i] ? static_cast<std::int32_t>(row++) : -1;
    kept[e] = row - first;
  }
}

// The Switch load-balancing loss experts * sum_e f_e P_e, f_e = routed_e / (tokens k), P_e the
// mean probability of expert e; and the z-loss, the mean over tokens of lse^2. Both without
// their coefficients.
struct router_loss_values {
  double load_balancing = 0, z = 0;
};
template <class T>
router_loss_values router_losses(const T* probs, const T* lse, const std::int64_t* routed,
                                 routing_sizes n) {
  using acc = accumulator_t<T>;
  router_loss_values out;
  if (n.tokens == 0) return out;
  std::vector<acc> mean(static_cast<std::size_t>(n.experts), acc(0));
  acc z = 0;
  for (std::int64_t t = 0; t < n.tokens; ++t) {
    for (std::int64_t e = 0; e < n.experts; ++e) mean[e] += widen(probs[t * n.experts + e]);
    z += widen(lse[t]) * widen(lse[t]);
  }
  const acc assignments = static_cast<acc>(n.tokens * n.k);
  acc balance = 0;
  for (std::int64_t e = 0; e < n.experts; ++e)
    balance += static_cast<acc>(routed[e]) / assignments * (mean[e] / static_cast<acc>(n.tokens));
  out.load_balancing = static_cast<double>(static_cast<acc>(n.experts) * balance);
  out.z = static_cast<double>(z / static_cast<acc>(n.tokens));
  return out;
}

// The gradient of the router's logits (tokens, experts) from the gates' gradient dgate (tokens, k)
// (0 for a dropped assignment) and the two losses times their weights: through the gate
// renormalisation, the load-balancing loss (f_e a constant, as in Switch), the softmax, and the
// z-loss (d lse / d logit = prob). Overwrites dlogits.
template <class T>
void router_backward(const T* probs, const T* lse, const std::int32_t* expert, const T* gate,
                     const T* dgate, const std::int64_t* routed, double balance_weight,
                     double z_weight, T* dlogits, routing_sizes n) {
  using acc = accumulator_t<T>;
  if (n.tokens == 0) return;
  const acc tokens = static_cast<acc>(n.tokens);
  // d(balance_weight * loss) / d prob[t, e] = balance_weight * experts * f_e / tokens.
  std::vector<acc> balance(static_cast<std::size_t>(n.experts));
  for (std::int64_t e = 0; e < n.experts; ++e)
    balance[e] = static_cast<acc>(balance_weight) * static_cast<acc>(n.experts) *
                 (static_cast<acc>(routed[e]) / static_cast<acc>(n.tokens * n.k)) / tokens;
  const acc z_scale = acc(2) * static_cast<acc>(z_weight) / tokens;
  std::vector<acc> dp(static_cast<std::size_t>(n.experts));
  for (std::int64_t t = 0; t < n.tokens; ++t) {
    const T* p = probs + t * n.experts;
    const std::int32_t* chosen = expert + t * n.k;
    const T* g = gate + t * n.k;
    const T* dg = dgate + t * n.k;
    std::copy(balance.begin(), balance.end(), dp.begin());
    if (n.k == 1) {
      dp[chosen[0]] += widen(dg[0]);
    } else {
      // g_j = p_j / S over the chosen: dp_j = (dg_j - sum_i dg_i g_i) / S.
      acc sum = 0, weighted = 0;
      for (std::int64_t j = 0; j < n.k; ++j) {
        sum += widen(p[chosen[j]]);
        weighted += widen(dg[j]) * widen(g[j]);
      }
      for (std::int64_t j = 0; j < n.k; ++j) dp[chosen[j]] += (widen(dg[j]) - weighted) / sum;
    }
    acc dot = 0;
    for (std::int64_t e = 0; e < n.experts; ++e) dot += dp[e] * widen(p[e]);
    const acc z = z_scale * widen(lse[t]);
    for (std::int64_t e = 0; e < n.experts; ++e)
      dlogits[t * n.experts + e] = narrow<T>(widen(p[e]) * (dp[e] - dot + z));
  }
}

// out (rows, width): row position[i] of out is row i / k of x (tokens, width), for every kept
// assignment i (position[i] >= 0).
template <class T>
void permute_rows(const T* x, const std::int32_t* position, T* out, std::int64_t tokens,
                  std::int64_t k, std::int64_t width) {
  for (std::int64_t i = 0; i < tokens * k; ++i)
    if (position[i] >= 0) std::copy_n(x + (i / k) * width, width, out + position[i] * width);
}

// out[t] = sum_j gate[t, j] rows[position[t, j]] over the kept assignments, in slot order (so the
// sum does not depend on how the rows were ordered); gate null means 1. A token with none kept
// gets zeros. Overwrites out (tokens, width).
template <class T>
void unpermute_rows(const T* rows, const std::int32_t* position, const T* gate, T* out,
                    std::int64_t tokens, std::int64_t k, std::int64_t width) {
  using acc = accumulator_t<T>;
  std::vector<acc> sum(static_cast<std::size_t>(width));
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::fill(sum.begin(), sum.end(), acc(0));
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t at = position[t * k + j];
      if (at < 0) continue;
      const acc g = gate == nullptr ? acc(1) : widen(gate[t * k + j]);
      const T* row = rows + at * width;
      for (std::int64_t c = 0; c < width; ++c) sum[c] += g * widen(row[c]);
    }
    for (std::int64_t c = 0; c < width; ++c) out[t * width + c] = narrow<T>(sum[c]);
  }
}

// The backward of unpermute_rows with gates: drows[position[t, j]] = gate[t, j] dout[t] and
// dgate[t, j] = dout[t] . rows[position[t, j]], 0 for a dropped assignment. Overwrites both.
template <class T>
void unpermute_rows_backward(const T* dout, const T* rows, const std::int32_t* position,
                             const T* gate, T* drows, T* dgate, std::int64_t tokens, std::int64_t k,
                             std::int64_t width) {
  using acc = accumulator_t<T>;
  for (std::int64_t i = 0; i < tokens * k; ++i) {
    const std::int32_t at = position[i];
    if (at < 0) {
      dgate[i] = T(0);
      continue;
    }
    const T* d = dout + (i / k) * width;
    const T* row = rows + at * width;
    T* dr = drows + at * width;
    const acc g = widen(gate[i]);
    acc dot = 0;
    for (std::int64_t c = 0; c < width; ++c) {
      dot += widen(d[c]) * widen(row[c]);
      dr[c] = narrow<T>(g * widen(d[c]));
    }
    dgate[i] = narrow<T>(dot);
  }
}

// One product per group of rows: c[o_g : o_g+1] = alpha a[o_g : o_g+1] op(b_g) + beta c[...],
// a (rows, k), c (rows, n), b_g (k, n), or (n, k) when transposed. Empty groups do nothing.
template <class T>
void grouped_matmul(const execution<host>& exec, const T* a, const std::int64_t* offsets,
                    const T* const* b, T* c, std::int64_t groups, std::int64_t k, std::int64_t n,
                    bool transpose_b, double alpha, double beta) {
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t m = offsets[g + 1] - offsets[g];
    if (m == 0) continue;
    gemm_widening<T>(exec, default_gemm_backend, false, transpose_b, m, n, k, alpha,
                     a + offsets[g] * k, b[g], beta, c + offsets[g] * n);
  }
}

// dw_g (out, in) += dy_g^T x_g for each group of rows of dy (rows, out) and x (rows, in): the
// weight gradients of a grouped linear. An empty group leaves its dw_g unchanged.
template <class T>
void grouped_weight_gradient(const execution<host>& exec, const T* dy, const T* x,
                             const std::int64_t* offsets, T* const* dw, std::int64_t groups,
                             std::int64_t out, std::int64_t in) {
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::int64_t m = offsets[g + 1] - offsets[g];
    if (m == 0) continue;
    gemm_widening<T>(exec, default_gemm_backend, true, false, out, in, m, 1.0,
                     dy + offsets[g] * out, x + offsets[g] * in, 1.0, dw[g]);
  }
}

// y[o_g : o_g+1] += bias_g (n) for each group of rows of y (rows, n).
template <class T>
void grouped_bias_add(T* y, const std::int64_t* offsets, const T* const* bias, std::int64_t groups,
                      std::int64_t n) {
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t r = offsets[g]; r < offsets[g + 1]; ++r)
      for (std::int64_t c = 0; c < n; ++c)
        y[r * n + c] = narrow<T>(widen(y[r * n + c]) + widen(bias[g][c]));
}

// dbias_g (n) += column sums of the group's rows of dy (rows, n).
template <class T>
void grouped_bias_grad(const T* dy, const std::int64_t* offsets, T* const* dbias,
                       std::int64_t groups, std::int64_t n) {
  using acc = accumulator_t<T>;
  std::vector<acc> sums(static_cast<std::size_t>(n));
  for (std::int64_t g = 0; g < groups; ++g) {
    std::fill(sums.begin(), sums.end(), acc(0));
    for (std::int64_t r = offsets[g]; r < offsets[g + 1]; ++r)
      for (std::int64_t c = 0; c < n; ++c) sums[c] += widen(dy[r * n + c]);
    for (std::int64_t c = 0; c < n; ++c) dbias[g][c] = narrow<T>(widen(dbias[g][c]) + sums[c]);
  }
}

}  // namespace quintet::kernels::host_impl
