// Host causal multi-head attention on (batch, seq, heads * head_dim) rows, keeping the
// log-sum-exp per query so backward recomputes the weights without storing a (seq, seq) matrix.
// float and double go through matrix products (CBLAS or the portable kernel) on blocks of 64
// queries, which see only the keys up to the block's last query (the causal half, plus the
// diagonal blocks); bf16 and half use the row-at-a-time loops below, in float.
#pragma once

#include <quintet/kernels/accumulator.hpp>
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

// Where element (b, s, c) of a (batch, seq, width) operand lives: data[b * batch_stride +
// s * seq_stride + c]; the width is contiguous.
template <class T>
struct rows3 {
  T* data;
  std::int64_t batch_stride, seq_stride;
  T* at(std::int64_t b, std::int64_t s) const { return data + b * batch_stride + s * seq_stride; }
};

struct attention_sizes {
  std::int64_t batch, seq, heads, head_dim;
};

template <class Acc, class T>
Acc dot(const T* a, const T* b, std::int64_t n) {
  return lane_sum<Acc>(n, [&](std::int64_t c) { return widen(a[c]) * widen(b[c]); });
}

// out_i = sum_{j <= i} softmax_j(scale q_i . k_j) v_j per (batch, head); lse (batch, heads, seq)
// receives log sum_{j <= i} exp(scale q_i . k_j).
template <class T, class Acc = accumulator_t<T>>
void attention_forward_rows(rows3<const T> q, rows3<const T> k, rows3<const T> v, rows3<T> out,
                            Acc* lse, attention_sizes n, Acc scale) {
  std::vector<Acc> weights(static_cast<std::size_t>(n.seq)),
      sum(static_cast<std::size_t>(n.head_dim));
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t h = 0; h < n.heads; ++h) {
      const std::int64_t column = h * n.head_dim;
      for (std::int64_t i = 0; i < n.seq; ++i) {
        const T* qi = q.at(b, i) + column;
        Acc peak = -std::numeric_limits<Acc>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) {
          weights[j] = scale * dot<Acc>(qi, k.at(b, j) + column, n.head_dim);
          peak = std::max(peak, weights[j]);
        }
        Acc total = 0;
        std::fill(sum.begin(), sum.end(), Acc(0));
        for (std::int64_t j = 0; j <= i; ++j) {
          const Acc w = std::exp(weights[j] - peak);
          total += w;
          const T* vj = v.at(b, j) + column;
          for (std::int64_t c = 0; c < n.head_dim; ++c) sum[c] += w * widen(vj[c]);
        }
        T* oi = out.at(b, i) + column;
        for (std::int64_t c = 0; c < n.head_dim; ++c) oi[c] = narrow<T>(sum[c] / total);
        lse[(b * n.heads + h) * n.seq + i] = peak + std::log(total);
      }
    }
}

// With p_ij = exp(scale q_i . k_j - lse_i) and D_i = dout_i . out_i (= sum_j p_ij dout_i . v_j):
//   dv_j = sum_i p_ij dout_i,  ds_ij = p_ij (dout_i . v_j - D_i),
//   dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i   (j <= i). dq, dk, dv overwritten.
template <class T, class Acc = accumulator_t<T>>
void attention_backward_rows(rows3<const T> q, rows3<const T> k, rows3<const T> v,
                             rows3<const T> out, const Acc* lse, rows3<const T> dout, rows3<T> dq,
                             rows3<T> dk, rows3<T> dv, attention_sizes n, Acc scale) {
  const std::int64_t d = n.head_dim;
  std::vector<Acc> dq_row(static_cast<std::size_t>(d)), dk_all(static_cast<std::size_t>(n.seq * d)),
      dv_all(static_cast<std::size_t>(n.seq * d));
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t h = 0; h < n.heads; ++h) {
      const std::int64_t column = h * d;
      std::fill(dk_all.begin(), dk_all.end(), Acc(0));
      std::fill(dv_all.begin(), dv_all.end(), Acc(0));
      for (std::int64_t i = 0; i < n.seq; ++i) {
        const T* qi = q.at(b, i) + column;
        const T* doi = dout.at(b, i) + column;
        const Acc lse_i = lse[(b * n.heads + h) * n.seq + i];
        const Acc delta = dot<Acc>(doi, out.at(b, i) + column, d);
        std::fill(dq_row.begin(), dq_row.end(), Acc(0));
        for (std::int64_t j = 0; j <= i; ++j) {
          const T* kj = k.at(b, j) + column;
          const Acc p = std::exp(scale * dot<Acc>(qi, kj, d) - lse_i);
          const Acc ds = p * (dot<Acc>(doi, v.at(b, j) + column, d) - delta);
          Acc* dkj = dk_all.data() + j * d;
          Acc* dvj = dv_all.data() + j * d;
          for (std::int64_t c = 0; c < d; ++c) {
            dvj[c] += p * widen(doi[c]);
            dq_row[c] += ds * widen(kj[c]);
            dkj[c] += ds * widen(qi[c]);
          }
        }
        T* dqi = dq.at(b, i) + column;
        for (std::int64_t c = 0; c < d; ++c) dqi[c] = narrow<T>(scale * dq_row[c]);
      }
      for (std::int64_t j = 0; j < n.seq; ++j) {
        T* dkj = dk.at(b, j) + column;
        T* dvj = dv.at(b, j) + column;
        for (std::int64_t c = 0; c < d; ++c) {
          dkj[c] = narrow<T>(scale * dk_all[j * d + c]);
          dvj[c] = narrow<T>(dv_all[j * d + c]);
        }
      }
    }
}

// Queries per block of the product-based kernels: a (64, seq) block of scores stays in L2.
inline constexpr std::int64_t attention_query_block = 64;

// For rows [first, first + rows) of a block of scores (rows, cols), scores[r][j] = scale q_i . k_j
// turned in place into p_ij = exp(s_ij - lse_i) for j <= i and 0 beyond (i = first + r).
// Forward (compute_lse) also writes lse_i; backward reads it.
template <class T>
void causal_weights(T* scores, std::int64_t first, std::int64_t rows, std::int64_t cols, T* lse,
                    bool compute_lse) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = scores + r * cols;
    const std::int64_t i = first + r, valid = i + 1;
    T shift = 0;
    if (compute_lse) {
      T peak = -std::numeric_limits<T>::infinity();
      for (std::int64_t j = 0; j < valid; ++j) peak = std::max(peak, row[j]);
      lane_map(row, valid, [&](std::int64_t j) { return row[j] - peak; });
      exponentials(row, row, valid);
      const T total = lane_sum<T>(valid, [&](std::int64_t j) { return row[j]; });
      lse[i] = peak + std::log(total);
      const T inv = T(1) / total;
      lane_map(row, valid, [&](std::int64_t j) { return row[j] * inv; });
    } else {
      shift = lse[i];
      lane_map(row, valid, [&](std::int64_t j) { return row[j] - shift; });
      exponentials(row, row, valid);
    }
    for (std::int64_t j = valid; j < cols; ++j) row[j] = T(0);
  }
}

// float / double through matrix products. Per (batch, head) and block of queries [i0, i1):
//   S = scale Q[i0:i1] K[0:i1]^T,  P = causal softmax(S) (lse saved),  O[i0:i1] = P V[0:i1].
template <class T>
void attention_forward_products(const execution<host>& ctx, rows3<const T> q, rows3<const T> k,
                                rows3<const T> v, rows3<T> out, T* lse, attention_sizes n,
                                T scale) {
  const std::int64_t d = n.head_dim, block = attention_query_block;
  if (n.seq == 0 || d == 0) return;
  std::vector<T> scores(static_cast<std::size_t>(std::min(block, n.seq) * n.seq));
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t h = 0; h < n.heads; ++h) {
      const T* qh = q.at(b, 0) + h * d;
      const T* kh = k.at(b, 0) + h * d;
      const T* vh = v.at(b, 0) + h * d;
      T* oh = out.at(b, 0) + h * d;
      T* lse_h = lse + (b * n.heads + h) * n.seq;
      for (std::int64_t i0 = 0; i0 < n.seq; i0 += block) {
        const std::int64_t rows = std::min(block, n.seq - i0), cols = i0 + rows;
        gemm<T>(ctx, default_gemm_backend, false, true, rows, cols, d, scale,
                qh + i0 * q.seq_stride, q.seq_stride, kh, k.seq_stride, T(0), scores.data(), cols);
        causal_weights(scores.data(), i0, rows, cols, lse_h, true);
        gemm<T>(ctx, default_gemm_backend, false, false, rows, d, cols, T(1), scores.data(), cols,
                vh, v.seq_stride, T(0), oh + i0 * out.seq_stride, out.seq_stride);
      }
    }
}

// Per (batch, head) and block of queries [i0, i1), with P recomputed from lse:
//   dV[0:i1] += P^T dO[i0:i1],  dP = dO[i0:i1] V[0:i1]^T,  dS = P (dP - D),  D_i = dO_i . O_i,
//   dQ[i0:i1] = scale dS K[0:i1],  dK[0:i1] += scale dS^T Q[i0:i1].
template <class T>
void attention_backward_products(const execution<host>& ctx, rows3<const T> q, rows3<const T> k,
                                 rows3<const T> v, rows3<const T> out, const T* lse,
                                 rows3<const T> dout, rows3<T> dq, rows3<T> dk, rows3<T> dv,
                                 attention_sizes n, T scale) {
  const std::int64_t d = n.head_dim, block = attention_query_block;
  if (n.seq == 0 || d == 0) return;
  const std::size_t scratch = static_cast<std::size_t>(std::min(block, n.seq) * n.seq);
  std::vector<T> weights(scratch), dweights(scratch);
  std::vector<T> lse_row(static_cast<std::size_t>(n.seq));
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t h = 0; h < n.heads; ++h) {
      const std::int64_t column = h * d;
      const T* qh = q.at(b, 0) + column;
      const T* kh = k.at(b, 0) + column;
      const T* vh = v.at(b, 0) + column;
      const T* doh = dout.at(b, 0) + column;
      T* dqh = dq.at(b, 0) + column;
      T* dkh = dk.at(b, 0) + column;
      T* dvh = dv.at(b, 0) + column;
      for (std::int64_t j = 0; j < n.seq; ++j) {
        std::fill(dkh + j * dk.seq_stride, dkh + j * dk.seq_stride + d, T(0));
        std::fill(dvh + j * dv.seq_stride, dvh + j * dv.seq_stride + d, T(0));
      }
      const T* lse_h = lse + (b * n.heads + h) * n.seq;
      std::copy(lse_h, lse_h + n.seq, lse_row.begin());
      for (std::int64_t i0 = 0; i0 < n.seq; i0 += block) {
        const std::int64_t rows = std::min(block, n.seq - i0), cols = i0 + rows;
        T* p = weights.data();
        T* dp = dweights.data();
        gemm<T>(ctx, default_gemm_backend, false, true, rows, cols, d, scale,
                qh + i0 * q.seq_stride, q.seq_stride, kh, k.seq_stride, T(0), p, cols);
        causal_weights(p, i0, rows, cols, lse_row.data(), false);
        gemm<T>(ctx, default_gemm_backend, true, false, cols, d, rows, T(1), p, cols,
                doh + i0 * dout.seq_stride, dout.seq_stride, T(1), dvh, dv.seq_stride);
        gemm<T>(ctx, default_gemm_backend, false, true, rows, cols, d, T(1),
                doh + i0 * dout.seq_stride, dout.seq_stride, vh, v.seq_stride, T(0), dp, cols);
        for (std::int64_t r = 0; r < rows; ++r) {
          const std::int64_t i = i0 + r;
          const T delta = dot<T>(dout.at(b, i) + column, out.at(b, i) + column, d);
          T* dp_row = dp + r * cols;
          const T* p_row = p + r * cols;
          lane_map(dp_row, cols, [&](std::int64_t j) { return p_row[j] * (dp_row[j] - delta); });
        }
        gemm<T>(ctx, default_gemm_backend, false, false, rows, d, cols, scale, dp, cols, kh,
                k.seq_stride, T(0), dqh + i0 * dq.seq_stride, dq.seq_stride);
        gemm<T>(ctx, default_gemm_backend, true, false, cols, d, rows, scale, dp, cols,
                qh + i0 * q.seq_stride, q.seq_stride, T(1), dkh, dk.seq_stride);
      }
    }
}

template <class T, class Acc = accumulator_t<T>>
void attention_forward(const execution<host>& ctx, rows3<const T> q, rows3<const T> k,
                       rows3<const T> v, rows3<T> out, Acc* lse, attention_sizes n, Acc scale) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    attention_forward_products<T>(ctx, q, k, v, out, lse, n, scale);
  } else {
    attention_forward_rows<T>(q, k, v, out, lse, n, scale);
  }
}

template <class T, class Acc = accumulator_t<T>>
void attention_backward(const execution<host>& ctx, rows3<const T> q, rows3<const T> k,
                        rows3<const T> v, rows3<const T> out, const Acc* lse, rows3<const T> dout,
                        rows3<T> dq, rows3<T> dk, rows3<T> dv, attention_sizes n, Acc scale) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    attention_backward_products<T>(ctx, q, k, v, out, lse, dout, dq, dk, dv, n, scale);
  } else {
    attention_backward_rows<T>(q, k, v, out, lse, dout, dq, dk, dv, n, scale);
  }
}

}  // namespace quintet::kernels::host_impl
