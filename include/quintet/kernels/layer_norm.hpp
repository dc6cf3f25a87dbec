// layer_norm_forward / layer_norm_backward: normalisation over the last dimension with a learned
// scale (gamma) and shift (beta). Forward saves each row's mean and 1/sqrt(var + eps) in the
// accumulator type for backward. Host here; cuda (CUB block reductions) in
// <quintet/kernels/cuda/layer_norm.cuh>.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/layer_norm.hpp>
#include <quintet/kernels/operand.hpp>

#include <concepts>

namespace quintet::kernels {

template <class Device>
struct layer_norm_engine {
  static_assert(quintet::detail::always_false<Device>,
                "layer_norm on this device needs its implementation: for quintet::cuda include "
                "<quintet/kernels/cuda/layer_norm.cuh> in a translation unit compiled by nvcc");
};

template <>
struct layer_norm_engine<host> {
  template <class T, class Acc>
  static void forward(const execution<host>&, const T* x, const T* gamma, const T* beta, T* y,
                      Acc* mean, Acc* rstd, std::int64_t rows, std::int64_t n, Acc eps) {
    host_impl::layer_norm_forward(x, gamma, beta, y, mean, rstd, rows, n, eps);
  }
  template <class T, class Acc>
  static void backward(const execution<host>&, const T* x, const T* gamma, const Acc* mean,
                       const Acc* rstd, const T* dy, T* dx, T* dgamma, T* dbeta, std::int64_t rows,
                       std::int64_t n) {
    host_impl::layer_norm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, n);
  }
};

namespace detail {

// x: (..., n) with n > 0; gamma and beta: (n); mean and rstd: x's shape without n, of type
// accumulator_t<T>; every operand contiguous and on one device.
template <class XView, class ParamView, class StatView>
void check_layer_norm_operands(const XView& x, const ParamView& gamma, const ParamView& beta,
                               const StatView& mean, const StatView& rstd, const char* kernel) {
  using T = typename XView::value_type;
  static_assert(std::same_as<typename StatView::value_type, accumulator_t<T>>,
                "layer_norm: mean and rstd hold accumulator_t<T> (float, or double for double)");
  require_rank_at_least(x, 1, kernel, "x");
  QUINTET_CHECK(row_length(x) > 0, "{}: x of shape {} has empty rows", kernel, x.shape());
  require_contiguous(x, kernel, "x");
  require_contiguous(gamma, kernel, "gamma");
  require_contiguous(beta, kernel, "beta");
  require_contiguous(mean, kernel, "mean");
  require_contiguous(rstd, kernel, "rstd");
  require_shape(gamma, shape{row_length(x)}, kernel, "gamma");
  require_shape(beta, shape{row_length(x)}, kernel, "beta");
  require_shape(mean, leading_shape(x), kernel, "mean");
  require_shape(rstd, leading_shape(x), kernel, "rstd");
  check_same_device(x, gamma, kernel);
  check_same_device(x, beta, kernel);
  check_same_device(x, mean, kernel);
  check_same_device(x, rstd, kernel);
}

}  // namespace detail

// y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dimension of x (..., n);
// mean and rstd (x's shape without n) receive each row's mean and 1 / sqrt(var + eps).
template <device_tag Device, class X, class Gamma, class Beta, class Y, class Mean, class Rstd>
void layer_norm_forward(const execution<Device>& ctx, const X& x, const Gamma& gamma,
                        const Beta& beta, Y&& y, Mean&& mean, Rstd&& rstd, double eps = 1e-5) {
  const auto xv = input_view(x);
  const auto gv = input_view(gamma);
  const auto bv = input_view(beta);
  const auto yv = output_view(y);
  const auto mv = output_view(mean);
  const auto rv = output_view(rstd);
  detail::check_operand_types<Device, decltype(xv), decltype(gv), decltype(bv), decltype(yv)>();
  detail::check_layer_norm_operands(xv, gv, bv, mv, rv, "layer_norm_forward");
  QUINTET_CHECK(eps > 0.0, "layer_norm_forward: eps {} must be positive", eps);
  require_contiguous(yv, "layer_norm_forward", "y");
  check_same_shape(xv, yv, "layer_norm_forward");
  check_same_device(xv, yv, "layer_norm_forward");
  using acc = typename decltype(mv)::value_type;
  layer_norm_engine<Device>::forward(ctx, xv.data(), gv.data(), bv.data(), yv.data(), mv.data(),
                                     rv.data(), row_count(xv), row_length(xv),
                                     static_cast<acc>(eps));
}

// From the forward's x, gamma, mean, rstd and the output gradient dy: dx is overwritten, dgamma
// and dbeta (n) accumulate (+=) the parameter gradients.
template <device_tag Device, class X, class Gamma, class Mean, class Rstd, class Dy, class Dx,
          class DGamma, class DBeta>
void layer_norm_backward(const execution<Device>& ctx, const X& x, const Gamma& gamma,
                         const Mean& mean, const Rstd& rstd, const Dy& dy, Dx&& dx, DGamma&& dgamma,
                         DBeta&& dbeta) {
  const auto xv = input_view(x);
  const auto gv = input_view(gamma);
  const auto mv = input_view(mean);
  const auto rv = input_view(rstd);
  const auto dyv = input_view(dy);
  const auto dxv = output_view(dx);
  const auto dgv = output_view(dgamma);
  const auto dbv = output_view(dbeta);
  detail::check_operand_types<Device, decltype(xv), decltype(gv), decltype(dyv), decltype(dxv),
                              decltype(dgv), decltype(dbv)>();
  const char* kernel = "layer_norm_backward";
  detail::check_layer_norm_operands(xv, gv, input_view(dgv), mv, rv, kernel);
  require_contiguous(dyv, kernel, "dy");
  require_contiguous(dxv, kernel, "dx");
  require_contiguous(dbv, kernel, "dbeta");
  require_shape(dbv, shape{row_length(xv)}, kernel, "dbeta");
  check_same_shape(xv, dyv, kernel);
  check_same_shape(xv, dxv, kernel);
  check_same_device(xv, dyv, kernel);
  check_same_device(xv, dxv, kernel);
  check_same_device(xv, dbv, kernel);
  layer_norm_engine<Device>::backward(ctx, xv.data(), gv.data(), mv.data(), rv.data(), dyv.data(),
                                      dxv.data(), dgv.data(), dbv.data(), row_count(xv),
                                      row_length(xv));
}

}  // namespace quintet::kernels
