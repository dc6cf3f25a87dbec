// attention_forward / attention_backward: causal multi-head scaled dot-product attention.
//
// Layout: q, k, v, out and their gradients are (batch, seq, heads * head_dim), head h owning
// columns [h * head_dim, (h + 1) * head_dim). The width must be contiguous but batch and seq may
// be strided, so q, k and v can be slices of one fused (batch, seq, 3 * width) projection and
// dq, dk, dv slices of its gradient: no transposition to (batch, heads, seq, head_dim) is needed,
// and out feeds the output projection directly.
//
// Numerics: softmax over j <= i of scale q_i . k_j with the row maximum subtracted; forward saves
// lse (batch, heads, seq) = log sum_j exp(scale q_i . k_j) so backward recomputes the weights
// exactly (p_ij = exp(scale q_i . k_j - lse_i)) without storing a (seq, seq) matrix. Host only.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/attention.hpp>
#include <quintet/kernels/operand.hpp>

#include <cmath>
#include <concepts>

namespace quintet::kernels {

template <class Device>
struct attention_engine {
  static_assert(quintet::detail::always_false<Device>,
                "attention_forward and attention_backward have only a host implementation: their "
                "CUDA twin is not written yet");
};

template <>
struct attention_engine<host> {
  template <class T, class Acc>
  static void forward(const execution<host>& ctx, host_impl::rows3<const T> q,
                      host_impl::rows3<const T> k, host_impl::rows3<const T> v,
                      host_impl::rows3<T> out, Acc* lse, host_impl::attention_sizes n, Acc scale) {
    host_impl::attention_forward(ctx, q, k, v, out, lse, n, scale);
  }
  template <class T, class Acc>
  static void backward(const execution<host>& ctx, host_impl::rows3<const T> q,
                       host_impl::rows3<const T> k, host_impl::rows3<const T> v,
                       host_impl::rows3<const T> out, const Acc* lse,
                       host_impl::rows3<const T> dout, host_impl::rows3<T> dq,
                       host_impl::rows3<T> dk, host_impl::rows3<T> dv, host_impl::attention_sizes n,
                       Acc scale) {
    host_impl::attention_backward(ctx, q, k, v, out, lse, dout, dq, dk, dv, n, scale);
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

template <class Scale, class Sizes>
Scale attention_scale(const Sizes& n) {
  return n.head_dim == 0 ? Scale(1) : Scale(1) / std::sqrt(static_cast<Scale>(n.head_dim));
}

}  // namespace detail

// out (batch, seq, heads * head_dim) = causal softmax(q k^T / sqrt(head_dim)) v per head;
// lse (batch, heads, seq), of accumulator_t<T>, receives each query's log-sum-exp for backward.
template <device_tag Device, class Q, class K, class V, class Out, class Lse>
void attention_forward(const execution<Device>& ctx, const Q& q, const K& k, const V& v, Out&& out,
                       Lse&& lse, std::int64_t heads) {
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
  const auto n = detail::attention_sizes_of(qv, heads, kernel);
  check_same_shape(qv, kv, kernel);
  check_same_shape(qv, vv, kernel);
  check_same_shape(qv, ov, kernel);
  require_shape(lv, shape{n.batch, n.heads, n.seq}, kernel, "lse");
  require_contiguous(lv, kernel, "lse");
  check_same_device(qv, kv, kernel);
  check_same_device(qv, vv, kernel);
  check_same_device(qv, ov, kernel);
  check_same_device(qv, lv, kernel);
  attention_engine<Device>::forward(
      ctx, detail::attention_rows(qv, kernel, "q"), detail::attention_rows(kv, kernel, "k"),
      detail::attention_rows(vv, kernel, "v"), detail::attention_rows(ov, kernel, "out"), lv.data(),
      n, detail::attention_scale<acc>(n));
}

// From the forward's q, k, v, out, lse and the output gradient dout: dq, dk, dv are overwritten
// (they may be slices of one fused gradient tensor).
template <device_tag Device, class Q, class K, class V, class Out, class Lse, class DOut, class DQ,
          class DK, class DV>
void attention_backward(const execution<Device>& ctx, const Q& q, const K& k, const V& v,
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
      ctx, detail::attention_rows(qv, kernel, "q"), detail::attention_rows(kv, kernel, "k"),
      detail::attention_rows(vv, kernel, "v"), detail::attention_rows(ov, kernel, "out"), lv.data(),
      detail::attention_rows(dov, kernel, "dout"), detail::attention_rows(dqv, kernel, "dq"),
      detail::attention_rows(dkv, kernel, "dk"), detail::attention_rows(dvv, kernel, "dv"), n,
      detail::attention_scale<acc>(n));
}

}  // namespace quintet::kernels
