// attention_forward / attention_backward: multi-head scaled dot-product attention, causal or full;
// and the pieces that assemble it over blocks of keys (ring attention): attention_backward_block,
// attention_delta and attention_merge.
//
// Layout: q, k, v, out and their gradients are (batch, seq, heads * head_dim), head h owning
// columns [h * head_dim, (h + 1) * head_dim). The width must be contiguous but batch and seq may
// be strided, so q, k and v can be slices of one fused (batch, seq, 3 * width) projection and
// dq, dk, dv slices of its gradient: no transposition to (batch, heads, seq, head_dim) is needed,
// and out feeds the output projection directly.
//
// Numerics: softmax over the visible keys of scale q_i . k_j with the row maximum subtracted;
// forward saves lse (batch, heads, seq) = log sum_j exp(scale q_i . k_j) so backward recomputes
// the weights exactly (p_ij = exp(scale q_i . k_j - lse_i)) without storing a (seq, seq) matrix.
//
// Blocks of keys: a query's result over keys split into blocks is the attention_merge of its
// per-block (out, lse); its gradients are the sum over blocks of attention_backward_block, each
// given the final lse and delta = rowsum(dout * out) of the merged output. Host here; cuda (tiled
// online-softmax kernels) in <quintet/kernels/cuda/attention.cuh>.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/attention_layout.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/attention.hpp>
#include <quintet/kernels/operand.hpp>

#include <cmath>
#include <concepts>

namespace quintet::kernels {

template <class Device>
struct attention_engine {
  static_assert(quintet::detail::always_false<Device>,
                "attention on this device needs its implementation: for quintet::cuda include "
                "<quintet/kernels/cuda/attention.cuh> in a translation unit compiled by nvcc");
};

template <>
struct attention_engine<host> {
  template <class T, class Acc>
  static void forward(const execution<host>& exec, host_impl::rows3<const T> q,
                      host_impl::rows3<const T> k, host_impl::rows3<const T> v,
                      host_impl::rows3<T> out, Acc* lse, host_impl::attention_sizes n, Acc scale,
                      attention_mask mask) {
    host_impl::attention_forward(exec, q, k, v, out, lse, n, scale, mask);
  }
  template <class T, class Acc>
  static void backward(const execution<host>& exec, host_impl::rows3<const T> q,
                       host_impl::rows3<const T> k, host_impl::rows3<const T> v,
                       host_impl::rows3<const T> out, const Acc* lse,
                       host_impl::rows3<const T> dout, host_impl::rows3<T> dq,
                       host_impl::rows3<T> dk, host_impl::rows3<T> dv, host_impl::attention_sizes n,
                       Acc scale) {
    host_impl::attention_backward(exec, q, k, v, out, lse, dout, dq, dk, dv, n, scale);
  }
  template <class T, class Acc>
  static void backward_block(const execution<host>& exec, host_impl::rows3<const T> q,
                             host_impl::rows3<const T> k, host_impl::rows3<const T> v,
                             host_impl::rows3<const T> dout, const Acc* lse, const Acc* delta,
                             host_impl::rows3<T> dq, host_impl::rows3<T> dk, host_impl::rows3<T> dv,
                             host_impl::attention_sizes n, Acc scale, attention_mask mask) {
    host_impl::attention_backward_block(exec, q, k, v, dout, lse, delta, dq, dk, dv, n, scale,
                                        mask);
  }
  template <class T, class Acc>
  static void delta(const execution<host>&, host_impl::rows3<const T> dout,
                    host_impl::rows3<const T> out, Acc* delta, host_impl::attention_sizes n) {
    host_impl::attention_delta_rows<T>(dout, out, delta, n);
  }
  template <class T, class Acc>
  static void merge(const execution<host>&, host_impl::rows3<T> out, Acc* lse,
                    host_impl::rows3<const T> block_out, const Acc* block_lse,
                    host_impl::attention_sizes n) {
    host_impl::attention_merge_rows<T>(out, lse, block_out, block_lse, n);
  }
};

namespace detail {

// A (batch, seq, width) operand with a contiguous width.
template <class View>
host_impl::rows3<typename View::element_type> attention_rows(const View& v, const char* kernel,
                                                             const char* operand) {
  QUINTET_CHECK(v.rank() == 3, "{}: {} has shape {}; (batch, seq, heads * head_dim) is needed",
                kernel, operand, v.shape());
  QUINTET_CHECK(v.strides()[2] == 1 || v.shape()[2] <= 1,
                "{}: the last dimension of {} (shape {}) must be contiguous, its stride is {}",
                kernel, operand, v.shape(), v.strides()[2]);
  return {v.data(), v.strides()[0], v.strides()[1]};
}

template <class View>
host_impl::attention_sizes attention_sizes_of(const View& q, std::int64_t heads,
                                              const char* kernel) {
  QUINTET_CHECK(q.rank() == 3, "{}: q has shape {}; (batch, seq, heads * head_dim) is needed",
                kernel, q.shape());
  const std::int64_t width = q.shape()[2];
  QUINTET_CHECK(heads > 0 && width % heads == 0,
                "{}: {} heads do not divide the width {} of q (shape {})", kernel, heads, width,
                q.shape());
  return {q.shape()[0], q.shape()[1], heads, width / heads};
}

// k (and v, checked against k) (batch, keys, width) beside q (batch, queries, width): the same
// batch and width; under the causal mask also as many keys as queries. Sets n.key_seq.
template <class QView, class KView>
void check_keys(const QView& q, const KView& k, attention_mask mask, host_impl::attention_sizes& n,
                const char* kernel) {
  QUINTET_CHECK(k.rank() == 3 && k.shape()[0] == q.shape()[0] && k.shape()[2] == q.shape()[2],
                "{}: k has shape {} but q has shape {}; they need the same batch and width", kernel,
                k.shape(), q.shape());
  QUINTET_CHECK(mask == attention_mask::full || k.shape()[1] == q.shape()[1],
                "{}: the causal mask needs as many keys as queries, but q has shape {} and k {} "
                "(a block of keys that precedes the queries takes attention_mask::full)",
                kernel, q.shape(), k.shape());
  n.key_seq = k.shape()[1];
}

template <class Scale, class Sizes>
Scale attention_scale(const Sizes& n) {
  return n.head_dim == 0 ? Scale(1) : Scale(1) / std::sqrt(static_cast<Scale>(n.head_dim));
}

}  // namespace detail

// out (batch, seq, heads * head_dim) = softmax(q k^T / sqrt(head_dim)) v per head over the keys
// the mask lets each query see; lse (batch, heads, seq), of accumulator_t<T>, receives each
// query's log-sum-exp for backward. causal (the default): k and v have q's shape. full: k and v
// are (batch, keys, width) for any number of keys; out is like q.
template <device_tag Device, class Q, class K, class V, class Out, class Lse>
void attention_forward(const execution<Device>& exec, const Q& q, const K& k, const V& v, Out&& out,
                       Lse&& lse, std::int64_t heads,
                       attention_mask mask = attention_mask::causal) {
  const char* kernel = "attention_forward";
  const auto qv = input_view(q);
  const auto kv = input_view(k);
  const auto vv = input_view(v);
  const auto ov = output_view(out);
  const auto lv = output_view(lse);
  detail::check_operand_types<Device, decltype(qv), decltype(kv), decltype(vv), decltype(ov)>();
  using T = typename decltype(qv)::value_type;
  using acc = accumulator_t<T>;
  static_assert(std::same_as<typename decltype(lv)::value_type, acc>,
                "attention: lse holds accumulator_t<T> (float, or double for double)");
  auto n = detail::attention_sizes_of(qv, heads, kernel);
  detail::check_keys(qv, kv, mask, n, kernel);
  check_same_shape(kv, vv, kernel);
  check_same_shape(qv, ov, kernel);
  require_shape(lv, shape{n.batch, n.heads, n.seq}, kernel, "lse");
  require_contiguous(lv, kernel, "lse");
  check_same_device(qv, kv, kernel);
  check_same_device(qv, vv, kernel);
  check_same_device(qv, ov, kernel);
  check_same_device(qv, lv, kernel);
  attention_engine<Device>::forward(
      exec, detail::attention_rows(qv, kernel, "q"), detail::attention_rows(kv, kernel, "k"),
      detail::attention_rows(vv, kernel, "v"), detail::attention_rows(ov, kernel, "out"), lv.data(),
      n, detail::attention_scale<acc>(n), mask);
}

// From the forward's q, k, v, out, lse and the output gradient dout: dq, dk, dv are overwritten
// (they may be slices of one fused gradient tensor).
template <device_tag Device, class Q, class K, class V, class Out, class Lse, class DOut, class DQ,
          class DK, class DV>
void attention_backward(const execution<Device>& exec, const Q& q, const K& k, const V& v,
                        const Out& out, const Lse& lse, const DOut& dout, DQ&& dq, DK&& dk, DV&& dv,
                        std::int64_t heads) {
  const char* kernel = "attention_backward";
  const auto qv = input_view(q);
  const auto kv = input_view(k);
  const auto vv = input_view(v);
  const auto ov = input_view(out);
  const auto lv = input_view(lse);
  const auto dov = input_view(dout);
  const auto dqv = output_view(dq);
  const auto dkv = output_view(dk);
  const auto dvv = output_view(dv);
  detail::check_operand_types<Device, decltype(qv), decltype(kv), decltype(vv), decltype(ov),
                              decltype(dov), decltype(dqv), decltype(dkv), decltype(dvv)>();
  using acc = accumulator_t<typename decltype(qv)::value_type>;
  static_assert(std::same_as<typename decltype(lv)::value_type, acc>,
                "attention: lse holds accumulator_t<T> (float, or double for double)");
  const auto n = detail::attention_sizes_of(qv, heads, kernel);
  for (const auto* other : {&kv, &vv, &ov, &dov}) check_same_shape(qv, *other, kernel);
  check_same_shape(qv, dqv, kernel);
  check_same_shape(qv, dkv, kernel);
  check_same_shape(qv, dvv, kernel);
  require_shape(lv, shape{n.batch, n.heads, n.seq}, kernel, "lse");
  require_contiguous(lv, kernel, "lse");
  for (const auto* other : {&kv, &vv, &ov, &dov}) check_same_device(qv, *other, kernel);
  check_same_device(qv, lv, kernel);
  check_same_device(qv, dqv, kernel);
  check_same_device(qv, dkv, kernel);
  check_same_device(qv, dvv, kernel);
  attention_engine<Device>::backward(
      exec, detail::attention_rows(qv, kernel, "q"), detail::attention_rows(kv, kernel, "k"),
      detail::attention_rows(vv, kernel, "v"), detail::attention_rows(ov, kernel, "out"), lv.data(),
      detail::attention_rows(dov, kernel, "dout"), detail::attention_rows(dqv, kernel, "dq"),
      detail::attention_rows(dkv, kernel, "dk"), detail::attention_rows(dvv, kernel, "dv"), n,
      detail::attention_scale<acc>(n));
}

// The backward of one block of keys. q, dout and dq are (batch, queries, width); k, v, dk, dv
// (batch, keys, width); lse and delta (batch, heads, queries), contiguous, of accumulator_t<T>,
// are the queries' FINAL values over every key block (lse from the merged forward, delta from
// attention_delta of the merged output). With p = exp(scale q k^T - lse) over the visible keys:
//   dv += p^T dout,  ds = p (dout v^T - delta),  dq += scale ds k,  dk += scale ds^T q.
// dq, dk, dv are accumulated into, so the blocks' contributions add up.
template <device_tag Device, class Q, class K, class V, class DOut, class Lse, class Delta,
          class DQ, class DK, class DV>
void attention_backward_block(const execution<Device>& exec, const Q& q, const K& k, const V& v,
                              const DOut& dout, const Lse& lse, const Delta& delta, DQ&& dq,
                              DK&& dk, DV&& dv, std::int64_t heads, attention_mask mask) {
  const char* kernel = "attention_backward_block";
  const auto qv = input_view(q);
  const auto kv = input_view(k);
  const auto vv = input_view(v);
  const auto dov = input_view(dout);
  const auto lv = input_view(lse);
  const auto delv = input_view(delta);
  const auto dqv = output_view(dq);
  const auto dkv = output_view(dk);
  const auto dvv = output_view(dv);
  detail::check_operand_types<Device, decltype(qv), decltype(kv), decltype(vv), decltype(dov),
                              decltype(dqv), decltype(dkv), decltype(dvv)>();
  using acc = accumulator_t<typename decltype(qv)::value_type>;
  static_assert(std::same_as<typename decltype(lv)::value_type, acc> &&
                    std::same_as<typename decltype(delv)::value_type, acc>,
                "attention: lse and delta hold accumulator_t<T> (float, or double for double)");
  auto n = detail::attention_sizes_of(qv, heads, kernel);
  detail::check_keys(qv, kv, mask, n, kernel);
  check_same_shape(kv, vv, kernel);
  check_same_shape(qv, dov, kernel);
  check_same_shape(qv, dqv, kernel);
  check_same_shape(kv, dkv, kernel);
  check_same_shape(kv, dvv, kernel);
  require_shape(lv, shape{n.batch, n.heads, n.seq}, kernel, "lse");
  require_shape(delv, shape{n.batch, n.heads, n.seq}, kernel, "delta");
  require_contiguous(lv, kernel, "lse");
  require_contiguous(delv, kernel, "delta");
  for (const auto* other : {&kv, &vv, &dov}) check_same_device(qv, *other, kernel);
  check_same_device(qv, lv, kernel);
  check_same_device(qv, delv, kernel);
  check_same_device(qv, dqv, kernel);
  check_same_device(qv, dkv, kernel);
  check_same_device(qv, dvv, kernel);
  attention_engine<Device>::backward_block(
      exec, detail::attention_rows(qv, kernel, "q"), detail::attention_rows(kv, kernel, "k"),
      detail::attention_rows(vv, kernel, "v"), detail::attention_rows(dov, kernel, "dout"),
      lv.data(), delv.data(), detail::attention_rows(dqv, kernel, "dq"),
      detail::attention_rows(dkv, kernel, "dk"), detail::attention_rows(dvv, kernel, "dv"), n,
      detail::attention_scale<acc>(n), mask);
}

// delta (batch, heads, seq), contiguous, of accumulator_t<T> = per head sum over head_dim of
// dout * out, for (batch, seq, heads * head_dim) dout and out: the term every key block's
// backward subtracts.
template <device_tag Device, class DOut, class Out, class Delta>
void attention_delta(const execution<Device>& exec, const DOut& dout, const Out& out, Delta&& delta,
                     std::int64_t heads) {
  const char* kernel = "attention_delta";
  const auto dov = input_view(dout);
  const auto ov = input_view(out);
  const auto dv = output_view(delta);
  detail::check_operand_types<Device, decltype(dov), decltype(ov)>();
  using acc = accumulator_t<typename decltype(dov)::value_type>;
  static_assert(std::same_as<typename decltype(dv)::value_type, acc>,
                "attention: delta holds accumulator_t<T> (float, or double for double)");
  const auto n = detail::attention_sizes_of(dov, heads, kernel);
  check_same_shape(dov, ov, kernel);
  require_shape(dv, shape{n.batch, n.heads, n.seq}, kernel, "delta");
  require_contiguous(dv, kernel, "delta");
  check_same_device(dov, ov, kernel);
  check_same_device(dov, dv, kernel);
  attention_engine<Device>::delta(exec, detail::attention_rows(dov, kernel, "dout"),
                                  detail::attention_rows(ov, kernel, "out"), dv.data(), n);
}

// Online-softmax merge, in place, of a result over another block of keys (block_out like out,
// block_lse like lse) into the running (out (batch, seq, width), lse (batch, heads, seq)):
//   lse' = logaddexp(lse, block_lse),  out = out exp(lse - lse') + block_out exp(block_lse - lse').
// lse = -inf means no key seen yet: out is then replaced, whatever it held (no NaN); a block whose
// block_lse is -inf leaves the row unchanged.
template <device_tag Device, class Out, class Lse, class BlockOut, class BlockLse>
void attention_merge(const execution<Device>& exec, Out&& out, Lse&& lse, const BlockOut& block_out,
                     const BlockLse& block_lse, std::int64_t heads) {
  const char* kernel = "attention_merge";
  const auto ov = output_view(out);
  const auto lv = output_view(lse);
  const auto bov = input_view(block_out);
  const auto blv = input_view(block_lse);
  detail::check_operand_types<Device, decltype(ov), decltype(bov)>();
  using acc = accumulator_t<typename decltype(ov)::value_type>;
  static_assert(std::same_as<typename decltype(lv)::value_type, acc> &&
                    std::same_as<typename decltype(blv)::value_type, acc>,
                "attention: lse and block_lse hold accumulator_t<T> (float, or double for double)");
  const auto n = detail::attention_sizes_of(ov, heads, kernel);
  check_same_shape(ov, bov, kernel);
  require_shape(lv, shape{n.batch, n.heads, n.seq}, kernel, "lse");
  require_shape(blv, shape{n.batch, n.heads, n.seq}, kernel, "block_lse");
  require_contiguous(lv, kernel, "lse");
  require_contiguous(blv, kernel, "block_lse");
  check_same_device(ov, bov, kernel);
  check_same_device(ov, lv, kernel);
  check_same_device(ov, blv, kernel);
  attention_engine<Device>::merge(exec, detail::attention_rows(ov, kernel, "out"), lv.data(),
                                  detail::attention_rows(bov, kernel, "block_out"), blv.data(), n);
}

}  // namespace quintet::kernels
