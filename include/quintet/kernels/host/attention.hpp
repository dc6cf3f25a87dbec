// Host multi-head attention on (batch, seq, heads * head_dim) rows, causal or full, keeping the
// log-sum-exp per query so backward recomputes the weights without storing a (seq, seq) matrix.
// float and double go through matrix products (CBLAS or the portable kernel) on blocks of 64
// queries, which under the causal mask see only the keys up to the block's last query (the causal
// half, plus the diagonal blocks); bf16 and half use the row-at-a-time loops below, in float.
// The block backward, delta and merge are the pieces ring attention assembles over key blocks.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/attention_layout.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/exponential.hpp>
#include <quintet/kernels/host/lanes.hpp>
#include <quintet/kernels/host/matmul.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace quintet::kernels::host_impl {

// The shared layout (kernels/attention_layout.hpp), under the names the host loops use.
using kernels::attention_sizes;
using kernels::rows3;
using kernels::visible_keys;

template <class Acc, class T>
Acc dot(const T* a, const T* b, std::int64_t n) {
  return lane_sum<Acc>(n, [&](std::int64_t c) { return widen(a[c]) * widen(b[c]); });
}

template <class Acc>
constexpr Acc no_keys_lse = -std::numeric_limits<Acc>::infinity();

// out_i = sum_{j visible} softmax_j(scale q_i . k_j) v_j per (batch, head); lse (batch, heads,
// seq) receives log sum_{j visible} exp(scale q_i . k_j). A query that sees no key (a full block
// of zero keys) gets out_i = 0 and lse_i = -inf, the empty result attention_merge accepts.
template <class T, class Acc = accumulator_t<T>>
void attention_forward_rows(rows3<const T> q, rows3<const T> k, rows3<const T> v, rows3<T> out,
                            Acc* lse, attention_sizes n, Acc scale,
                            attention_mask mask = attention_mask::causal) {
  std::vector<Acc> weights(static_cast<std::size_t>(n.keys())),
      sum(static_cast<std::size_t>(n.head_dim));
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t h = 0; h < n.heads; ++h) {
      const std::int64_t column = h * n.head_dim;
      for (std::int64_t i = 0; i < n.seq; ++i) {
        const T* qi = q.at(b, i) + column;
        const std::int64_t valid = visible_keys(mask, i, n.keys());
        Acc peak = -std::numeric_limits<Acc>::infinity();
        for (std::int64_t j = 0; j < valid; ++j) {
          weights[j] = scale * dot<Acc>(qi, k.at(b, j) + column, n.head_dim);
          peak = std::max(peak, weights[j]);
        }
        Acc total = 0;
        std::fill(sum.begin(), sum.end(), Acc(0));
        for (std::int64_t j = 0; j < valid; ++j) {
          const Acc w = std::exp(weights[j] - peak);
          total += w;
          const T* vj = v.at(b, j) + column;
          for (std::int64_t c = 0; c < n.head_dim; ++c) sum[c] += w * widen(vj[c]);
        }
        T* oi = out.at(b, i) + column;
        const Acc inv = valid == 0 ? Acc(0) : Acc(1) / total;
        for (std::int64_t c = 0; c < n.head_dim; ++c) oi[c] = narrow<T>(sum[c] * inv);
        lse[(b * n.heads + h) * n.seq + i] = valid == 0 ? no_keys_lse<Acc> : peak + std::log(total);
      }
    }
}

// delta (batch, heads, seq): D_i = dout_i . out_i per head, the term backward subtracts.
template <class T, class Acc = accumulator_t<T>>
void attention_delta_rows(rows3<const T> dout, rows3<const T> out, Acc* delta, attention_sizes n) {
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t h = 0; h < n.heads; ++h)
      for (std::int64_t i = 0; i < n.seq; ++i)
        delta[(b * n.heads + h) * n.seq + i] =
            dot<Acc>(dout.at(b, i) + h * n.head_dim, out.at(b, i) + h * n.head_dim, n.head_dim);
}

// The backward of one block of keys, given the queries' final lse and delta (batch, heads, seq)
// over every key block. With p_ij = exp(scale q_i . k_j - lse_i) for the visible j:
//   dv_j += sum_i p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - D_i),
//   dq_i += scale sum_j ds_ij k_j,  dk_j += scale sum_i ds_ij q_i.
// Sums are kept in Acc and added to dq, dk, dv once per call.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_block_rows(rows3<const T> q, rows3<const T> k, rows3<const T> v,
                                   rows3<const T> dout, const Acc* lse, const Acc* delta,
                                   rows3<T> dq, rows3<T> dk, rows3<T> dv, attention_sizes n,
                                   Acc scale, attention_mask mask) {
  const std::int64_t d = n.head_dim, keys = n.keys();
  std::vector<Acc> dq_row(static_cast<std::size_t>(d)), dk_all(static_cast<std::size_t>(keys * d)),
      dv_all(static_cast<std::size_t>(keys * d));
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t h = 0; h < n.heads; ++h) {
      const std::int64_t column = h * d;
      std::fill(dk_all.begin(), dk_all.end(), Acc(0));
      std::fill(dv_all.begin(), dv_all.end(), Acc(0));
      for (std::int64_t i = 0; i < n.seq; ++i) {
        const T* qi = q.at(b, i) + column;
        const T* doi = dout.at(b, i) + column;
        const Acc lse_i = lse[(b * n.heads + h) * n.seq + i];
        const Acc delta_i = delta[(b * n.heads + h) * n.seq + i];
        std::fill(dq_row.begin(), dq_row.end(), Acc(0));
        const std::int64_t valid = visible_keys(mask, i, keys);
        for (std::int64_t j = 0; j < valid; ++j) {
          const T* kj = k.at(b, j) + column;
          const Acc p = std::exp(scale * dot<Acc>(qi, kj, d) - lse_i);
          const Acc ds = p * (dot<Acc>(doi, v.at(b, j) + column, d) - delta_i);
          Acc* dkj = dk_all.data() + j * d;
          Acc* dvj = dv_all.data() + j * d;
          for (std::int64_t c = 0; c < d; ++c) {
            dvj[c] += p * widen(doi[c]);
            dq_row[c] += ds * widen(kj[c]);
            dkj[c] += ds * widen(qi[c]);
          }
        }
        T* dqi = dq.at(b, i) + column;
        for (std::int64_t c = 0; c < d; ++c) dqi[c] = narrow<T>(widen(dqi[c]) + scale * dq_row[c]);
      }
      for (std::int64_t j = 0; j < keys; ++j) {
        T* dkj = dk.at(b, j) + column;
        T* dvj = dv.at(b, j) + column;
        for (std::int64_t c = 0; c < d; ++c) {
          dkj[c] = narrow<T>(widen(dkj[c]) + scale * dk_all[j * d + c]);
          dvj[c] = narrow<T>(widen(dvj[c]) + dv_all[j * d + c]);
        }
      }
    }
}

// Zeroes the heads * head_dim columns of rows [0, seq) of a (batch, seq, width) operand.
template <class T>
void zero_rows(rows3<T> x, std::int64_t batch, std::int64_t seq, std::int64_t width) {
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t s = 0; s < seq; ++s) std::fill(x.at(b, s), x.at(b, s) + width, T(0));
}

// The whole causal backward: delta, then one block holding every key. dq, dk, dv overwritten.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_rows(rows3<const T> q, rows3<const T> k, rows3<const T> v,
                             rows3<const T> out, const Acc* lse, rows3<const T> dout, rows3<T> dq,
                             rows3<T> dk, rows3<T> dv, attention_sizes n, Acc scale) {
  const std::int64_t width = n.heads * n.head_dim;
  zero_rows(dq, n.batch, n.seq, width);
  zero_rows(dk, n.batch, n.seq, width);
  zero_rows(dv, n.batch, n.seq, width);
  std::vector<Acc> delta(static_cast<std::size_t>(n.batch * n.heads * n.seq));
  attention_delta_rows<T>(dout, out, delta.data(), n);
  attention_backward_block_rows<T>(q, k, v, dout, lse, delta.data(), dq, dk, dv, n, scale,
                                   attention_mask::causal);
}

// Queries per block of the product-based kernels: a (64, keys) block of scores stays in L2.
inline constexpr std::int64_t attention_query_block = 64;

// Rows [first, first + rows) of a block of scores (rows, cols), scores[r][j] = scale q_i . k_j
// (i = first + r), turned in place into the softmax p_ij over the visible j, 0 beyond; lse_i is
// written.
template <class T>
void softmax_weights(T* scores, std::int64_t first, std::int64_t rows, std::int64_t cols, T* lse,
                     attention_mask mask) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = scores + r * cols;
    const std::int64_t i = first + r, valid = visible_keys(mask, i, cols);
    const T peak = lane_max<T>(valid, [&](std::int64_t j) { return row[j]; });
    lane_map(row, valid, [&](std::int64_t j) { return row[j] - peak; });
    exponentials(row, row, valid);
    const T total = lane_sum<T>(valid, [&](std::int64_t j) { return row[j]; });
    lse[i] = peak + std::log(total);
    const T inv = T(1) / total;
    lane_map(row, valid, [&](std::int64_t j) { return row[j] * inv; });
    for (std::int64_t j = valid; j < cols; ++j) row[j] = T(0);
  }
}

// The same weights recomputed from a saved lse: p_ij = exp(s_ij - lse_i), 0 beyond the visible j.
template <class T>
void recomputed_weights(T* scores, std::int64_t first, std::int64_t rows, std::int64_t cols,
                        const T* lse, attention_mask mask) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = scores + r * cols;
    const std::int64_t i = first + r, valid = visible_keys(mask, i, cols);
    const T shift = lse[i];
    lane_map(row, valid, [&](std::int64_t j) { return row[j] - shift; });
    exponentials(row, row, valid);
    for (std::int64_t j = valid; j < cols; ++j) row[j] = T(0);
  }
}

// Keys a block of queries [i0, i0 + rows) reads: under the causal mask only those up to its last
// query, else all of them.
inline std::int64_t block_keys(attention_mask mask, std::int64_t i0, std::int64_t rows,
                               std::int64_t keys) {
  return mask == attention_mask::causal ? i0 + rows : keys;
}

// (batch, head) pairs are independent: the product kernels split them over the context's threads,
// each part running its small products on one thread (BLAS would run a 64 x 64 x 64 product on
// one thread anyway, leaving the other cores idle). A part holds at least this many score
// elements times head_dim of work, so that waking a worker pays.
inline constexpr std::int64_t attention_pair_work = std::int64_t{1} << 21;

template <class Body>
void for_each_head_pair(const execution<host>& exec, attention_sizes n, std::int64_t keys,
                        const Body& body) {
  const std::int64_t pairs = n.batch * n.heads;
  const std::int64_t work = std::max<std::int64_t>(1, n.seq * keys * n.head_dim);
  const std::int64_t grain = std::max<std::int64_t>(1, attention_pair_work / work);
  exec.parallel_for(pairs, grain, [&](std::int64_t begin, std::int64_t end) {
    const execution<host> part(1, exec.isa());
    body(part, begin, end);
  });
}

// float / double through matrix products. Per (batch, head) and block of queries [i0, i1):
//   S = scale Q[i0:i1] K[0:cols]^T,  P = masked softmax(S) (lse saved),  O[i0:i1] = P V[0:cols].
template <class T>
void attention_forward_products(const execution<host>& exec, rows3<const T> q, rows3<const T> k,
                                rows3<const T> v, rows3<T> out, T* lse, attention_sizes n, T scale,
                                attention_mask mask = attention_mask::causal) {
  const std::int64_t d = n.head_dim, block = attention_query_block, keys = n.keys();
  if (n.seq == 0 || d == 0) return;
  if (keys == 0) {  // a full block of no keys: the empty result
    zero_rows(out, n.batch, n.seq, n.heads * d);
    std::fill(lse, lse + n.batch * n.heads * n.seq, no_keys_lse<T>);
    return;
  }
  for_each_head_pair(
      exec, n, keys, [&](const execution<host>& one, std::int64_t first, std::int64_t last) {
        std::vector<T> scores(static_cast<std::size_t>(std::min(block, n.seq) * keys));
        for (std::int64_t pair = first; pair < last; ++pair) {
          const std::int64_t b = pair / n.heads, h = pair % n.heads;
          const T* qh = q.at(b, 0) + h * d;
          const T* kh = k.at(b, 0) + h * d;
          const T* vh = v.at(b, 0) + h * d;
          T* oh = out.at(b, 0) + h * d;
          T* lse_h = lse + pair * n.seq;
          for (std::int64_t i0 = 0; i0 < n.seq; i0 += block) {
            const std::int64_t rows = std::min(block, n.seq - i0),
                               cols = block_keys(mask, i0, rows, keys);
            gemm<T>(one, default_gemm_backend, false, true, rows, cols, d, scale,
                    qh + i0 * q.seq_stride, q.seq_stride, kh, k.seq_stride, T(0), scores.data(),
                    cols);
            one.run_rows<T>([&] { softmax_weights(scores.data(), i0, rows, cols, lse_h, mask); });
            gemm<T>(one, default_gemm_backend, false, false, rows, d, cols, T(1), scores.data(),
                    cols, vh, v.seq_stride, T(0), oh + i0 * out.seq_stride, out.seq_stride);
          }
        }
      });
}

// The block backward through products. Per (batch, head) and block of queries [i0, i1), with P
// recomputed from the final lse and D the final delta:
//   dV[0:cols] += P^T dO[i0:i1],  dP = dO[i0:i1] V[0:cols]^T,  dS = P (dP - D),
//   dQ[i0:i1] += scale dS K[0:cols],  dK[0:cols] += scale dS^T Q[i0:i1].
template <class T>
void attention_backward_block_products(const execution<host>& exec, rows3<const T> q,
                                       rows3<const T> k, rows3<const T> v, rows3<const T> dout,
                                       const T* lse, const T* delta, rows3<T> dq, rows3<T> dk,
                                       rows3<T> dv, attention_sizes n, T scale,
                                       attention_mask mask) {
  const std::int64_t d = n.head_dim, block = attention_query_block, keys = n.keys();
  if (n.seq == 0 || d == 0 || keys == 0) return;
  const std::size_t scratch = static_cast<std::size_t>(std::min(block, n.seq) * keys);
  for_each_head_pair(
      exec, n, keys, [&](const execution<host>& one, std::int64_t first, std::int64_t last) {
        std::vector<T> weights(scratch), dweights(scratch);
        for (std::int64_t pair = first; pair < last; ++pair) {
          const std::int64_t b = pair / n.heads, column = (pair % n.heads) * d;
          const T* qh = q.at(b, 0) + column;
          const T* kh = k.at(b, 0) + column;
          const T* vh = v.at(b, 0) + column;
          const T* doh = dout.at(b, 0) + column;
          T* dqh = dq.at(b, 0) + column;
          T* dkh = dk.at(b, 0) + column;
          T* dvh = dv.at(b, 0) + column;
          const T* lse_h = lse + pair * n.seq;
          const T* delta_h = delta + pair * n.seq;
          for (std::int64_t i0 = 0; i0 < n.seq; i0 += block) {
            const std::int64_t rows = std::min(block, n.seq - i0),
                               cols = block_keys(mask, i0, rows, keys);
            T* p = weights.data();
            T* dp = dweights.data();
            gemm<T>(one, default_gemm_backend, false, true, rows, cols, d, scale,
                    qh + i0 * q.seq_stride, q.seq_stride, kh, k.seq_stride, T(0), p, cols);
            one.run_rows<T>([&] { recomputed_weights(p, i0, rows, cols, lse_h, mask); });
            gemm<T>(one, default_gemm_backend, true, false, cols, d, rows, T(1), p, cols,
                    doh + i0 * dout.seq_stride, dout.seq_stride, T(1), dvh, dv.seq_stride);
            gemm<T>(one, default_gemm_backend, false, true, rows, cols, d, T(1),
                    doh + i0 * dout.seq_stride, dout.seq_stride, vh, v.seq_stride, T(0), dp, cols);
            one.run_rows<T>([&] {
              for (std::int64_t r = 0; r < rows; ++r) {
                const T delta_i = delta_h[i0 + r];
                T* dp_row = dp + r * cols;
                const T* p_row = p + r * cols;
                lane_map(dp_row, cols,
                         [&](std::int64_t j) { return p_row[j] * (dp_row[j] - delta_i); });
              }
            });
            gemm<T>(one, default_gemm_backend, false, false, rows, d, cols, scale, dp, cols, kh,
                    k.seq_stride, T(1), dqh + i0 * dq.seq_stride, dq.seq_stride);
            gemm<T>(one, default_gemm_backend, true, false, cols, d, rows, scale, dp, cols,
                    qh + i0 * q.seq_stride, q.seq_stride, T(1), dkh, dk.seq_stride);
          }
        }
      });
}

// The whole causal backward through products: delta, then one block holding every key.
template <class T>
void attention_backward_products(const execution<host>& exec, rows3<const T> q, rows3<const T> k,
                                 rows3<const T> v, rows3<const T> out, const T* lse,
                                 rows3<const T> dout, rows3<T> dq, rows3<T> dk, rows3<T> dv,
                                 attention_sizes n, T scale) {
  const std::int64_t width = n.heads * n.head_dim;
  zero_rows(dq, n.batch, n.seq, width);
  zero_rows(dk, n.batch, n.seq, width);
  zero_rows(dv, n.batch, n.seq, width);
  std::vector<T> delta(static_cast<std::size_t>(n.batch * n.heads * n.seq));
  attention_delta_rows<T>(dout, out, delta.data(), n);
  attention_backward_block_products<T>(exec, q, k, v, dout, lse, delta.data(), dq, dk, dv, n, scale,
                                       attention_mask::causal);
}

// Online-softmax merge of a partial result over another block of keys into the running one, in
// place, per (batch, head, query): lse' = logaddexp(lse, block_lse),
//   out = out exp(lse - lse') + block_out exp(block_lse - lse').
// lse = -inf marks a query that has seen no key yet (its out is ignored and replaced); a block
// with block_lse = -inf changes nothing.
template <class T, class Acc = accumulator_t<T>>
void attention_merge_rows(rows3<T> out, Acc* lse, rows3<const T> block_out, const Acc* block_lse,
                          attention_sizes n) {
  const Acc empty = no_keys_lse<Acc>;
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t h = 0; h < n.heads; ++h)
      for (std::int64_t i = 0; i < n.seq; ++i) {
        const std::int64_t at = (b * n.heads + h) * n.seq + i;
        const Acc mine = lse[at], theirs = block_lse[at];
        T* o = out.at(b, i) + h * n.head_dim;
        const T* bo = block_out.at(b, i) + h * n.head_dim;
        if (theirs == empty) continue;
        if (mine == empty) {
          std::copy(bo, bo + n.head_dim, o);
          lse[at] = theirs;
          continue;
        }
        // log(e^a + e^b) = max + log1p(e^-|a - b|): no overflow, exact when one term dominates.
        const Acc merged = std::max(mine, theirs) + std::log1p(std::exp(-std::abs(mine - theirs)));
        const Acc keep = std::exp(mine - merged), take = std::exp(theirs - merged);
        for (std::int64_t c = 0; c < n.head_dim; ++c)
          o[c] = narrow<T>(keep * widen(o[c]) + take * widen(bo[c]));
        lse[at] = merged;
      }
}

template <class T, class Acc = accumulator_t<T>>
void attention_forward(const execution<host>& exec, rows3<const T> q, rows3<const T> k,
                       rows3<const T> v, rows3<T> out, Acc* lse, attention_sizes n, Acc scale,
                       attention_mask mask = attention_mask::causal) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    attention_forward_products<T>(exec, q, k, v, out, lse, n, scale, mask);
  } else {
    attention_forward_rows<T>(q, k, v, out, lse, n, scale, mask);
  }
}

template <class T, class Acc = accumulator_t<T>>
void attention_backward(const execution<host>& exec, rows3<const T> q, rows3<const T> k,
                        rows3<const T> v, rows3<const T> out, const Acc* lse, rows3<const T> dout,
                        rows3<T> dq, rows3<T> dk, rows3<T> dv, attention_sizes n, Acc scale) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    attention_backward_products<T>(exec, q, k, v, out, lse, dout, dq, dk, dv, n, scale);
  } else {
    attention_backward_rows<T>(q, k, v, out, lse, dout, dq, dk, dv, n, scale);
  }
}

template <class T, class Acc = accumulator_t<T>>
void attention_backward_block(const execution<host>& exec, rows3<const T> q, rows3<const T> k,
                              rows3<const T> v, rows3<const T> dout, const Acc* lse,
                              const Acc* delta, rows3<T> dq, rows3<T> dk, rows3<T> dv,
                              attention_sizes n, Acc scale, attention_mask mask) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    attention_backward_block_products<T>(exec, q, k, v, dout, lse, delta, dq, dk, dv, n, scale,
                                         mask);
  } else {
    attention_backward_block_rows<T>(q, k, v, dout, lse, delta, dq, dk, dv, n, scale, mask);
  }
}

}  // namespace quintet::kernels::host_impl
