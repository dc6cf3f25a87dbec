// Mixture-of-experts routing and dispatch. Host here; cuda in <quintet/kernels/cuda/moe.cuh>.
//
//   router_softmax           logits (tokens, E) -> probs (tokens, E), lse (tokens)
//   route_top_k              probs -> per (token, slot): expert, gate, row in the permuted buffer
//                            (-1: dropped over capacity); per expert: routed and kept counts
//   router_losses            the load-balancing and z losses (without their coefficients)
//   router_backward          dgate (tokens, k) and the losses' weights -> dlogits (tokens, E)
//   permute_rows             x (tokens, d) -> rows (kept, d) grouped by expert, token order within
//   unpermute_rows           rows (kept, d) -> out (tokens, d) = sum over slots of gate * row
//   unpermute_rows_backward  dout (tokens, d) -> drows (kept, d), dgate (tokens, k)
//   grouped_matmul           per group of rows g: c_g = a_g op(b_g), one matrix per group
//   grouped_weight_gradient  per group: dw_g += dy_g^T x_g
//   grouped_bias_add / grouped_bias_grad
//
// The permuted buffer for 3 tokens, k = 2, experts 0..2, token 1's expert 2 dropped:
//   expert (3, 2) = [[0 2] [2 0] [1 2]]   position = [[0 3] [-1 1] [2 4]]
//   rows: [t0 t1 | t2 | t0 t2]            offsets = {0, 2, 3, 5}
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/moe.hpp>
#include <quintet/kernels/matmul_geometry.hpp>
#include <quintet/kernels/operand.hpp>

#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

namespace quintet::kernels {

template <class Device>
struct moe_engine {
  static_assert(quintet::detail::always_false<Device>,
                "the mixture-of-experts kernels (routing, permutation, grouped products) on this "
                "device need their implementation: for quintet::cuda include "
                "<quintet/kernels/cuda/moe.cuh> in a translation unit compiled by nvcc");
};

template <>
struct moe_engine<host> {
  template <class T>
  static void router_softmax(const execution<host>&, const T* logits, T* probs, T* lse,
                             std::int64_t tokens, std::int64_t experts) {
    host_impl::router_softmax(logits, probs, lse, tokens, experts);
  }
  template <class T>
  static void route_top_k(const execution<host>&, const T* probs, std::int32_t* expert, T* gate,
                          std::int32_t* position, std::int64_t* routed, std::int64_t* kept,
                          host_impl::routing_sizes n) {
    host_impl::route_top_k(probs, expert, gate, position, routed, kept, n);
  }
  template <class T>
  static host_impl::router_loss_values router_losses(const execution<host>&, const T* probs,
                                                     const T* lse, const std::int64_t* routed,
                                                     host_impl::routing_sizes n) {
    return host_impl::router_losses(probs, lse, routed, n);
  }
  template <class T>
  static void router_backward(const execution<host>&, const T* probs, const T* lse,
                              const std::int32_t* expert, const T* gate, const T* dgate,
                              const std::int64_t* routed, double balance_weight, double z_weight,
                              T* dlogits, host_impl::routing_sizes n) {
    host_impl::router_backward(probs, lse, expert, gate, dgate, routed, balance_weight, z_weight,
                               dlogits, n);
  }
  template <class T>
  static void permute_rows(const execution<host>&, const T* x, const std::int32_t* position, T* out,
                           std::int64_t tokens, std::int64_t k, std::int64_t width) {
    host_impl::permute_rows(x, position, out, tokens, k, width);
  }
  template <class T>
  static void unpermute_rows(const execution<host>&, const T* rows, const std::int32_t* position,
                             const T* gate, T* out, std::int64_t tokens, std::int64_t k,
                             std::int64_t width) {
    host_impl::unpermute_rows(rows, position, gate, out, tokens, k, width);
  }
  template <class T>
  static void unpermute_rows_backward(const execution<host>&, const T* dout, const T* rows,
                                      const std::int32_t* position, const T* gate, T* drows,
                                      T* dgate, std::int64_t tokens, std::int64_t k,
                                      std::int64_t width) {
    host_impl::unpermute_rows_backward(dout, rows, position, gate, drows, dgate, tokens, k, width);
  }
  template <class T>
  static void grouped_matmul(const execution<host>& exec, const T* a, const std::int64_t* offsets,
                             const T* const* b, T* c, std::int64_t groups, std::int64_t k,
                             std::int64_t n, bool transpose_b, double alpha, double beta) {
    host_impl::grouped_matmul(exec, a, offsets, b, c, groups, k, n, transpose_b, alpha, beta);
  }
  template <class T>
  static void grouped_weight_gradient(const execution<host>& exec, const T* dy, const T* x,
                                      const std::int64_t* offsets, T* const* dw,
                                      std::int64_t groups, std::int64_t out, std::int64_t in) {
    host_impl::grouped_weight_gradient(exec, dy, x, offsets, dw, groups, out, in);
  }
  template <class T>
  static void grouped_bias_add(const execution<host>&, T* y, const std::int64_t* offsets,
                               const T* const* bias, std::int64_t groups, std::int64_t n) {
    host_impl::grouped_bias_add(y, offsets, bias, groups, n);
  }
  template <class T>
  static void grouped_bias_grad(const execution<host>&, const T* dy, const std::int64_t* offsets,
                                T* const* dbias, std::int64_t groups, std::int64_t n) {
    host_impl::grouped_bias_grad(dy, offsets, dbias, groups, n);
  }
};

namespace detail {

template <class View, class Index>
void require_index_type(const View&) {
  static_assert(std::same_as<std::remove_const_t<typename View::value_type>, Index>,
                "moe kernels: expert ids and positions are int32, counts int64");
}

// (tokens, k) operands: checks the shape and contiguity, and returns k.
template <class View>
void require_slots(const View& v, std::int64_t tokens, std::int64_t k, const char* kernel,
                   const char* operand) {
  require_contiguous(v, kernel, operand);
  require_shape(v, shape{tokens, k}, kernel, operand);
}

// Group offsets: groups + 1 non-decreasing row indices from 0 to rows.
inline void check_offsets(std::span<const std::int64_t> offsets, std::int64_t rows,
                          const char* kernel) {
  QUINTET_CHECK(!offsets.empty() && offsets.front() == 0 && offsets.back() == rows,
                "{}: group offsets must run from 0 to the {} rows", kernel, rows);
  for (std::size_t g = 0; g + 1 < offsets.size(); ++g)
    QUINTET_CHECK(offsets[g] <= offsets[g + 1], "{}: group offsets decrease at group {} ({} > {})",
                  kernel, g, offsets[g], offsets[g + 1]);
}

// Pointers to each group's matrix, each checked for shape, contiguity and device.
template <class Pointer, class RowsView, class Views>
std::vector<Pointer> group_pointers(const Views& views, const shape& expected, const RowsView& rows,
                                    const char* kernel, const char* what) {
  std::vector<Pointer> pointers;
  pointers.reserve(views.size());
  for (const auto& v : views) {
    require_contiguous(v, kernel, what);
    require_shape(v, expected, kernel, what);
    check_same_device(rows, v, kernel);
    pointers.push_back(v.data());
  }
  return pointers;
}

}  // namespace detail

// probs (tokens, experts) = softmax(logits) and lse (tokens) = log sum exp(logits), per row.
template <device_tag Device, class Logits, class Probs, class Lse>
void router_softmax(const execution<Device>& exec, const Logits& logits, Probs&& probs, Lse&& lse) {
  const auto lv = input_view(logits);
  const auto pv = output_view(probs);
  const auto sv = output_view(lse);
  detail::check_operand_types<Device, decltype(lv), decltype(pv), decltype(sv)>();
  QUINTET_CHECK(lv.rank() == 2 && lv.shape()[1] > 0,
                "router_softmax: logits have shape {}; (tokens, experts) is needed", lv.shape());
  require_contiguous(lv, "router_softmax", "logits");
  require_contiguous(pv, "router_softmax", "probs");
  require_contiguous(sv, "router_softmax", "lse");
  check_same_shape(lv, pv, "router_softmax");
  require_shape(sv, shape{lv.shape()[0]}, "router_softmax", "lse");
  check_same_device(lv, pv, "router_softmax");
  check_same_device(lv, sv, "router_softmax");
  moe_engine<Device>::router_softmax(exec, lv.data(), pv.data(), sv.data(), lv.shape()[0],
                                     lv.shape()[1]);
}

// What route_top_k needs besides the tensors.
struct routing_options {
  std::int64_t k = 1;
  std::int64_t capacity = 0;  // tokens an expert keeps at most; 0: no limit
  drop_order drop = drop_order::lowest_probability;
  std::int64_t first_row = 0;  // the permuted buffer's row of the first kept assignment
};

// Top-k choice (ties to the lower expert index), gates (k = 1: the probability; k >= 2:
// renormalised over the chosen k), capacity and the permuted buffer's rows, from probs
// (tokens, experts). Writes expert and position (tokens, k) int32, gate (tokens, k), routed and
// kept (experts) int64; see host_impl::route_top_k for the exact contract.
template <device_tag Device, class Probs, class Expert, class Gate, class Position, class Routed,
          class Kept>
void route_top_k(const execution<Device>& exec, const Probs& probs, Expert&& expert, Gate&& gate,
                 Position&& position, Routed&& routed, Kept&& kept,
                 const routing_options& options) {
  const auto pv = input_view(probs);
  const auto ev = output_view(expert);
  const auto gv = output_view(gate);
  const auto qv = output_view(position);
  const auto rv = output_view(routed);
  const auto kv = output_view(kept);
  detail::check_operand_types<Device, decltype(pv), decltype(gv)>();
  detail::require_index_type<decltype(ev), std::int32_t>(ev);
  detail::require_index_type<decltype(qv), std::int32_t>(qv);
  detail::require_index_type<decltype(rv), std::int64_t>(rv);
  detail::require_index_type<decltype(kv), std::int64_t>(kv);
  constexpr const char* kernel = "route_top_k";
  QUINTET_CHECK(pv.rank() == 2 && pv.shape()[1] > 0,
                "{}: probs have shape {}; (tokens, experts) is needed", kernel, pv.shape());
  require_contiguous(pv, kernel, "probs");
  const std::int64_t tokens = pv.shape()[0], experts = pv.shape()[1];
  QUINTET_CHECK(options.k >= 1 && options.k <= experts,
                "{}: top-{} routing needs 1 <= k <= the {} experts", kernel, options.k, experts);
  QUINTET_CHECK(options.capacity >= 0, "{}: capacity {} is negative", kernel, options.capacity);
  QUINTET_CHECK(options.first_row >= 0, "{}: first row {} is negative", kernel, options.first_row);
  QUINTET_CHECK(options.first_row + tokens * options.k <= std::numeric_limits<std::int32_t>::max(),
                "{}: {} assignments from row {} exceed the int32 positions", kernel,
                tokens * options.k, options.first_row);
  detail::require_slots(ev, tokens, options.k, kernel, "expert");
  detail::require_slots(gv, tokens, options.k, kernel, "gate");
  detail::require_slots(qv, tokens, options.k, kernel, "position");
  require_contiguous(rv, kernel, "routed");
  require_contiguous(kv, kernel, "kept");
  require_shape(rv, shape{experts}, kernel, "routed");
  require_shape(kv, shape{experts}, kernel, "kept");
  check_same_device(pv, ev, kernel);
  check_same_device(pv, gv, kernel);
  check_same_device(pv, qv, kernel);
  check_same_device(pv, rv, kernel);
  check_same_device(pv, kv, kernel);
  moe_engine<Device>::route_top_k(
      exec, pv.data(), ev.data(), gv.data(), qv.data(), rv.data(), kv.data(),
      {tokens, experts, options.k, options.capacity, options.drop, options.first_row});
}

// The Switch load-balancing loss experts * sum_e f_e P_e (f_e = routed_e / (tokens k), P_e the
// mean router probability of expert e) and the z-loss mean_t lse_t^2, without coefficients.
using router_loss_values = host_impl::router_loss_values;
template <device_tag Device, class Probs, class Lse, class Routed>
router_loss_values router_losses(const execution<Device>& exec, const Probs& probs, const Lse& lse,
                                 const Routed& routed, std::int64_t k) {
  const auto pv = input_view(probs);
  const auto sv = input_view(lse);
  const auto rv = input_view(routed);
  detail::check_operand_types<Device, decltype(pv), decltype(sv)>();
  detail::require_index_type<decltype(rv), std::int64_t>(rv);
  constexpr const char* kernel = "router_losses";
  QUINTET_CHECK(pv.rank() == 2, "{}: probs have shape {}; (tokens, experts) is needed", kernel,
                pv.shape());
  const std::int64_t tokens = pv.shape()[0], experts = pv.shape()[1];
  QUINTET_CHECK(k >= 1 && k <= experts, "{}: k = {} for {} experts", kernel, k, experts);
  require_contiguous(pv, kernel, "probs");
  require_contiguous(sv, kernel, "lse");
  require_contiguous(rv, kernel, "routed");
  require_shape(sv, shape{tokens}, kernel, "lse");
  require_shape(rv, shape{experts}, kernel, "routed");
  return moe_engine<Device>::router_losses(exec, pv.data(), sv.data(), rv.data(),
                                           {tokens, experts, k, 0, drop_order{}, 0});
}

// dlogits (tokens, experts) from dgate (tokens, k) through the gates, plus balance_weight times
// the load-balancing loss's gradient (f_e held constant) and z_weight times the z-loss's.
// Overwrites dlogits.
template <device_tag Device, class Probs, class Lse, class Expert, class Gate, class DGate,
          class Routed, class DLogits>
void router_backward(const execution<Device>& exec, const Probs& probs, const Lse& lse,
                     const Expert& expert, const Gate& gate, const DGate& dgate,
                     const Routed& routed, double balance_weight, double z_weight,
                     DLogits&& dlogits) {
  const auto pv = input_view(probs);
  const auto sv = input_view(lse);
  const auto ev = input_view(expert);
  const auto gv = input_view(gate);
  const auto dgv = input_view(dgate);
  const auto rv = input_view(routed);
  const auto dv = output_view(dlogits);
  detail::check_operand_types<Device, decltype(pv), decltype(sv), decltype(gv), decltype(dgv),
                              decltype(dv)>();
  detail::require_index_type<decltype(ev), std::int32_t>(ev);
  detail::require_index_type<decltype(rv), std::int64_t>(rv);
  constexpr const char* kernel = "router_backward";
  QUINTET_CHECK(pv.rank() == 2 && ev.rank() == 2,
                "{}: probs {} and expert {} must be (tokens, experts) and (tokens, k)", kernel,
                pv.shape(), ev.shape());
  const std::int64_t tokens = pv.shape()[0], experts = pv.shape()[1], k = ev.shape()[1];
  require_contiguous(pv, kernel, "probs");
  require_contiguous(sv, kernel, "lse");
  require_contiguous(rv, kernel, "routed");
  require_contiguous(dv, kernel, "dlogits");
  require_shape(sv, shape{tokens}, kernel, "lse");
  require_shape(rv, shape{experts}, kernel, "routed");
  require_shape(dv, pv.shape(), kernel, "dlogits");
  detail::require_slots(ev, tokens, k, kernel, "expert");
  detail::require_slots(gv, tokens, k, kernel, "gate");
  detail::require_slots(dgv, tokens, k, kernel, "dgate");
  check_same_device(pv, dv, kernel);
  moe_engine<Device>::router_backward(exec, pv.data(), sv.data(), ev.data(), gv.data(), dgv.data(),
                                      rv.data(), balance_weight, z_weight, dv.data(),
                                      {tokens, experts, k, 0, drop_order{}, 0});
}

// rows (kept, d): row position[t, j] is x[t] (tokens, d) for every kept assignment.
template <device_tag Device, class X, class Position, class Rows>
void permute_rows(const execution<Device>& exec, const X& x, const Position& position,
                  Rows&& rows) {
  const auto xv = input_view(x);
  const auto qv = input_view(position);
  const auto rv = output_view(rows);
  detail::check_operand_types<Device, decltype(xv), decltype(rv)>();
  detail::require_index_type<decltype(qv), std::int32_t>(qv);
  constexpr const char* kernel = "permute_rows";
  QUINTET_CHECK(xv.rank() == 2 && qv.rank() == 2 && rv.rank() == 2,
                "{}: x {}, position {} and rows {} must be matrices", kernel, xv.shape(),
                qv.shape(), rv.shape());
  require_contiguous(xv, kernel, "x");
  require_contiguous(qv, kernel, "position");
  require_contiguous(rv, kernel, "rows");
  QUINTET_CHECK(qv.shape()[0] == xv.shape()[0] && rv.shape()[1] == xv.shape()[1],
                "{}: x {}, position {} and rows {} do not agree", kernel, xv.shape(), qv.shape(),
                rv.shape());
  check_same_device(xv, rv, kernel);
  check_same_device(xv, qv, kernel);
  moe_engine<Device>::permute_rows(exec, xv.data(), qv.data(), rv.data(), xv.shape()[0],
                                   qv.shape()[1], xv.shape()[1]);
}

namespace detail {

template <class RowsView, class PositionView, class OutView>
void check_unpermute(const RowsView& rv, const PositionView& qv, const OutView& ov,
                     const char* kernel) {
  QUINTET_CHECK(rv.rank() == 2 && qv.rank() == 2 && ov.rank() == 2,
                "{}: rows {}, position {} and out {} must be matrices", kernel, rv.shape(),
                qv.shape(), ov.shape());
  require_contiguous(rv, kernel, "rows");
  require_contiguous(qv, kernel, "position");
  require_contiguous(ov, kernel, "out");
  QUINTET_CHECK(qv.shape()[0] == ov.shape()[0] && rv.shape()[1] == ov.shape()[1],
                "{}: rows {}, position {} and out {} do not agree", kernel, rv.shape(), qv.shape(),
                ov.shape());
  check_same_device(rv, ov, kernel);
  check_same_device(qv, ov, kernel);
}

}  // namespace detail

// out (tokens, d)[t] = sum over t's kept slots j, in slot order, of gate[t, j] rows[position[t, j]]
// (zeros for a token with none kept). Overwrites out.
template <device_tag Device, class Rows, class Position, class Gate, class Out>
void unpermute_rows(const execution<Device>& exec, const Rows& rows, const Position& position,
                    const Gate& gate, Out&& out) {
  const auto rv = input_view(rows);
  const auto qv = input_view(position);
  const auto gv = input_view(gate);
  const auto ov = output_view(out);
  detail::check_operand_types<Device, decltype(rv), decltype(gv), decltype(ov)>();
  detail::require_index_type<decltype(qv), std::int32_t>(qv);
  detail::check_unpermute(rv, qv, ov, "unpermute_rows");
  detail::require_slots(gv, qv.shape()[0], qv.shape()[1], "unpermute_rows", "gate");
  moe_engine<Device>::unpermute_rows(exec, rv.data(), qv.data(), gv.data(), ov.data(),
                                     qv.shape()[0], qv.shape()[1], rv.shape()[1]);
}

// The same with every gate 1: the backward of permute_rows (a token's kept rows summed).
template <device_tag Device, class Rows, class Position, class Out>
void unpermute_rows(const execution<Device>& exec, const Rows& rows, const Position& position,
                    Out&& out) {
  const auto rv = input_view(rows);
  const auto qv = input_view(position);
  const auto ov = output_view(out);
  detail::check_operand_types<Device, decltype(rv), decltype(ov)>();
  detail::require_index_type<decltype(qv), std::int32_t>(qv);
  detail::check_unpermute(rv, qv, ov, "unpermute_rows");
  using T = typename decltype(ov)::value_type;
  moe_engine<Device>::unpermute_rows(exec, rv.data(), qv.data(), static_cast<const T*>(nullptr),
                                     ov.data(), qv.shape()[0], qv.shape()[1], rv.shape()[1]);
}

// The backward of the gated unpermute_rows: drows (kept, d) and dgate (tokens, k), overwritten.
template <device_tag Device, class DOut, class Rows, class Position, class Gate, class DRows,
          class DGate>
void unpermute_rows_backward(const execution<Device>& exec, const DOut& dout, const Rows& rows,
                             const Position& position, const Gate& gate, DRows&& drows,
                             DGate&& dgate) {
  const auto dv = input_view(dout);
  const auto rv = input_view(rows);
  const auto qv = input_view(position);
  const auto gv = input_view(gate);
  const auto drv = output_view(drows);
  const auto dgv = output_view(dgate);
  detail::check_operand_types<Device, decltype(dv), decltype(rv), decltype(gv), decltype(drv),
                              decltype(dgv)>();
  detail::require_index_type<decltype(qv), std::int32_t>(qv);
  constexpr const char* kernel = "unpermute_rows_backward";
  detail::check_unpermute(rv, qv, dv, kernel);
  detail::require_slots(gv, qv.shape()[0], qv.shape()[1], kernel, "gate");
  detail::require_slots(dgv, qv.shape()[0], qv.shape()[1], kernel, "dgate");
  require_contiguous(drv, kernel, "drows");
  require_shape(drv, rv.shape(), kernel, "drows");
  check_same_device(rv, drv, kernel);
  moe_engine<Device>::unpermute_rows_backward(exec, dv.data(), rv.data(), qv.data(), gv.data(),
                                              drv.data(), dgv.data(), qv.shape()[0], qv.shape()[1],
                                              rv.shape()[1]);
}

// Per group g of rows [offsets[g], offsets[g + 1]): c_g = alpha a_g op(b[g]) + beta c_g, with a
// (rows, k), c (rows, n) and b[g] (k, n), or (n, k) with transpose_b. transpose_a is refused (the
// rows are what is grouped). A group of no rows does nothing.
template <device_tag Device, class A, class B, class C>
void grouped_matmul(const execution<Device>& exec, const A& a,
                    std::span<const std::int64_t> offsets, const std::vector<B>& b, C&& c,
                    const matmul_options& options = {}) {
  const auto av = input_view(a);
  const auto cv = output_view(c);
  using T = typename decltype(cv)::value_type;
  detail::check_operand_types<Device, decltype(av), decltype(cv), decltype(input_view(b[0]))>();
  constexpr const char* kernel = "grouped_matmul";
  QUINTET_CHECK(!options.transpose_a, "{}: the rows of A are grouped; transpose_a is not supported",
                kernel);
  QUINTET_CHECK(av.rank() == 2 && cv.rank() == 2 && av.shape()[0] == cv.shape()[0],
                "{}: A {} and C {} must be matrices of the same rows", kernel, av.shape(),
                cv.shape());
  require_contiguous(av, kernel, "A");
  require_contiguous(cv, kernel, "C");
  check_same_device(av, cv, kernel);
  QUINTET_CHECK(b.size() + 1 == offsets.size(), "{}: {} matrices for {} groups", kernel, b.size(),
                offsets.size() - 1);
  detail::check_offsets(offsets, av.shape()[0], kernel);
  const std::int64_t k = av.shape()[1], n = cv.shape()[1];
  const auto pointers = detail::group_pointers<const T*>(
      b, options.transpose_b ? shape{n, k} : shape{k, n}, cv, kernel, "B");
  moe_engine<Device>::grouped_matmul(exec, av.data(), offsets.data(), pointers.data(), cv.data(),
                                     static_cast<std::int64_t>(b.size()), k, n, options.transpose_b,
                                     options.alpha, options.beta);
}

// dw[g] (out, in) += dy_g^T x_g for each group g of rows of dy (rows, out) and x (rows, in).
template <device_tag Device, class Dy, class X, class DW>
void grouped_weight_gradient(const execution<Device>& exec, const Dy& dy, const X& x,
                             std::span<const std::int64_t> offsets, const std::vector<DW>& dw) {
  const auto dyv = input_view(dy);
  const auto xv = input_view(x);
  using T = typename decltype(xv)::value_type;
  detail::check_operand_types<Device, decltype(dyv), decltype(xv), DW>();
  static_assert(mutable_tensor_like<DW>, "grouped_weight_gradient: dw must be writable views");
  constexpr const char* kernel = "grouped_weight_gradient";
  QUINTET_CHECK(dyv.rank() == 2 && xv.rank() == 2 && dyv.shape()[0] == xv.shape()[0],
                "{}: dy {} and x {} must be matrices of the same rows", kernel, dyv.shape(),
                xv.shape());
  require_contiguous(dyv, kernel, "dy");
  require_contiguous(xv, kernel, "x");
  check_same_device(dyv, xv, kernel);
  QUINTET_CHECK(dw.size() + 1 == offsets.size(), "{}: {} gradients for {} groups", kernel,
                dw.size(), offsets.size() - 1);
  detail::check_offsets(offsets, xv.shape()[0], kernel);
  const std::int64_t out = dyv.shape()[1], in = xv.shape()[1];
  const auto pointers = detail::group_pointers<T*>(dw, shape{out, in}, xv, kernel, "dw");
  moe_engine<Device>::grouped_weight_gradient(exec, dyv.data(), xv.data(), offsets.data(),
                                              pointers.data(), static_cast<std::int64_t>(dw.size()),
                                              out, in);
}

// y (rows, n): each group's rows += bias[g] (n).
template <device_tag Device, class Y, class Bias>
void grouped_bias_add(const execution<Device>& exec, Y&& y, std::span<const std::int64_t> offsets,
                      const std::vector<Bias>& bias) {
  const auto yv = output_view(y);
  using T = typename decltype(yv)::value_type;
  detail::check_operand_types<Device, decltype(yv), decltype(input_view(bias[0]))>();
  constexpr const char* kernel = "grouped_bias_add";
  QUINTET_CHECK(yv.rank() == 2, "{}: y {} must be a matrix", kernel, yv.shape());
  require_contiguous(yv, kernel, "y");
  QUINTET_CHECK(bias.size() + 1 == offsets.size(), "{}: {} biases for {} groups", kernel,
                bias.size(), offsets.size() - 1);
  detail::check_offsets(offsets, yv.shape()[0], kernel);
  const auto pointers =
      detail::group_pointers<const T*>(bias, shape{yv.shape()[1]}, yv, kernel, "bias");
  moe_engine<Device>::grouped_bias_add(exec, yv.data(), offsets.data(), pointers.data(),
                                       static_cast<std::int64_t>(bias.size()), yv.shape()[1]);
}

// dbias[g] (n) += the column sums of group g's rows of dy (rows, n).
template <device_tag Device, class Dy, class DBias>
void grouped_bias_grad(const execution<Device>& exec, const Dy& dy,
                       std::span<const std::int64_t> offsets, const std::vector<DBias>& dbias) {
  const auto dyv = input_view(dy);
  using T = typename decltype(dyv)::value_type;
  detail::check_operand_types<Device, decltype(dyv), DBias>();
  static_assert(mutable_tensor_like<DBias>, "grouped_bias_grad: dbias must be writable views");
  constexpr const char* kernel = "grouped_bias_grad";
  QUINTET_CHECK(dyv.rank() == 2, "{}: dy {} must be a matrix", kernel, dyv.shape());
  require_contiguous(dyv, kernel, "dy");
  QUINTET_CHECK(dbias.size() + 1 == offsets.size(), "{}: {} biases for {} groups", kernel,
                dbias.size(), offsets.size() - 1);
  detail::check_offsets(offsets, dyv.shape()[0], kernel);
  const auto pointers =
      detail::group_pointers<T*>(dbias, shape{dyv.shape()[1]}, dyv, kernel, "dbias");
  moe_engine<Device>::grouped_bias_grad(exec, dyv.data(), offsets.data(), pointers.data(),
                                        static_cast<std::int64_t>(dbias.size()), dyv.shape()[1]);
}

}  // namespace quintet::kernels
