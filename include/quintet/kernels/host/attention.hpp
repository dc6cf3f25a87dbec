// Host loops for causal multi-head attention on (batch, seq, heads * head_dim) rows: one query at
// a time, two passes over its keys (scores and their maximum, then weights and the weighted sum
// of values), keeping log-sum-exp per query so backward recomputes the weights without storing
// the (seq, seq) matrix.
#pragma once

#include <quintet/kernels/accumulator.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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
  Acc sum = 0;
  for (std::int64_t c = 0; c < n; ++c) sum += widen(a[c]) * widen(b[c]);
  return sum;
}

// out_i = sum_{j <= i} softmax_j(scale q_i . k_j) v_j per (batch, head); lse (batch, heads, seq)
// receives log sum_{j <= i} exp(scale q_i . k_j).
template <class T, class Acc = accumulator_t<T>>
void attention_forward(rows3<const T> q, rows3<const T> k, rows3<const T> v, rows3<T> out, Acc* lse,
                       attention_sizes n, Acc scale) {
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
void attention_backward(rows3<const T> q, rows3<const T> k, rows3<const T> v, rows3<const T> out,
                        const Acc* lse, rows3<const T> dout, rows3<T> dq, rows3<T> dk, rows3<T> dv,
                        attention_sizes n, Acc scale) {
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

}  // namespace quintet::kernels::host_impl
