// layer_norm_forward / layer_norm_backward (or its two passes, _input and _weight): normalisation
// over the last dimension with a learned scale (gamma) and shift (beta). Forward saves each row's
// mean and 1/sqrt(var + eps) in the accumulator type for backward. Host here; cuda (CUB block
// reductions) in <quintet/kernels/cuda/layer_norm.cuh>.
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

// Row passes over the context's threads, with its instruction set for float; the passes that sum
// dgamma and dbeta over rows (in row order) run on the calling thread, which keeps their bits.
template <>
struct layer_norm_engine<host> {
  template <class T, class Acc>
  static void forward(const execution<host>& exec, const T* x, const T* gamma, const T* beta, T* y,
                      Acc* mean, Acc* rstd, std::int64_t rows, std::int64_t n, Acc eps) {
    exec.parallel_rows<T>(
        rows, execution<host>::grain_for(n), [&](std::int64_t begin, std::int64_t end) {
          host_impl::layer_norm_forward(x + begin * n, gamma, beta, y + begin * n, mean + begin,
                                        rstd + begin, end - begin, n, eps);
        });
  }
  template <class T, class Acc>
  static void backward(const execution<host>& exec, const T* x, const T* gamma, const Acc* mean,
                       const Acc* rstd, const T* dy, T* dx, T* dgamma, T* dbeta, std::int64_t rows,
                       std::int64_t n) {
    exec.run_rows<T>([&] {
      host_impl::layer_norm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, n);
    });
  }
  template <class T, class Acc>
  static void backward_input(const execution<host>& exec, const T* x, const T* gamma,
                             const Acc* mean, const Acc* rstd, const T* dy, T* dx,
                             std::int64_t rows, std::int64_t n) {
    exec.parallel_rows<T>(
        rows, execution<host>::grain_for(n), [&](std::int64_t begin, std::int64_t end) {
          host_impl::layer_norm_backward_input(x + begin * n, gamma, mean + begin, rstd + begin,
                                               dy + begin * n, dx + begin * n, end - begin, n);
        });
  }
  template <class T, class Acc>
  static void backward_weight(const execution<host>& exec, const T* x, const Acc* mean,
                              const Acc* rstd, const T* dy, T* dgamma, T* dbeta, std::int64_t rows,
                              std::int64_t n) {
    exec.run_rows<T>(
        [&] { host_impl::layer_norm_backward_weight(x, mean, rstd, dy, dgamma, dbeta, rows, n); });
  }
};

namespace detail {

// x: (..., n) with n > 0; mean and rstd: x's shape without n, of type accumulator_t<T>; all
// contiguous and on x's device.
template <class XView, class StatView>
void check_layer_norm_rows(const XView& x, const StatView& mean, const StatView& rstd,
                           const char* kernel) {
  using T = typename XView::value_type;
  static_assert(std::same_as<typename StatView::value_type, accumulator_t<T>>,
                "layer_norm: mean and rstd hold accumulator_t<T> (float, or double for double)");
  require_rank_at_least(x, 1, kernel, "x");
  QUINTET_CHECK(row_length(x) > 0, "{}: x of shape {} has empty rows", kernel, x.shape());
  require_contiguous(x, kernel, "x");
  require_contiguous(mean, kernel, "mean");
  require_contiguous(rstd, kernel, "rstd");
  require_shape(mean, leading_shape(x), kernel, "mean");
  require_shape(rstd, leading_shape(x), kernel, "rstd");
  check_same_device(x, mean, kernel);
  check_same_device(x, rstd, kernel);
}

// One value per feature (gamma, beta, dgamma, dbeta): shape (n), contiguous, on x's device.
template <class XView, class View>
void check_layer_norm_feature(const XView& x, const View& v, const char* kernel,
                              const char* operand) {
  require_contiguous(v, kernel, operand);
  require_shape(v, shape{row_length(x)}, kernel, operand);
  check_same_device(x, v, kernel);
}

// One value per element of x (y, dy, dx): x's shape, contiguous, on x's device.
template <class XView, class View>
void check_layer_norm_element(const XView& x, const View& v, const char* kernel,
                              const char* operand) {
  require_contiguous(v, kernel, operand);
  require_shape(v, x.shape(), kernel, operand);
  check_same_device(x, v, kernel);
}

// The input pass's operands: gamma (n), dy and dx shaped like x.
template <class XView, class GammaView, class StatView, class DyView, class DxView>
void check_layer_norm_input_pass(const XView& x, const GammaView& gamma, const StatView& mean,
                                 const StatView& rstd, const DyView& dy, const DxView& dx,
                                 const char* kernel) {
  check_layer_norm_rows(x, mean, rstd, kernel);
  check_layer_norm_feature(x, gamma, kernel, "gamma");
  check_layer_norm_element(x, dy, kernel, "dy");
  check_layer_norm_element(x, dx, kernel, "dx");
}

// The weight pass's operands: dy shaped like x, dgamma and dbeta (n).
template <class XView, class StatView, class DyView, class DGammaView, class DBetaView>
void check_layer_norm_weight_pass(const XView& x, const StatView& mean, const StatView& rstd,
                                  const DyView& dy, const DGammaView& dgamma,
                                  const DBetaView& dbeta, const char* kernel) {
  check_layer_norm_rows(x, mean, rstd, kernel);
  check_layer_norm_element(x, dy, kernel, "dy");
  check_layer_norm_feature(x, dgamma, kernel, "dgamma");
  check_layer_norm_feature(x, dbeta, kernel, "dbeta");
}

}  // namespace detail

// y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dimension of x (..., n);
// mean and rstd (x's shape without n) receive each row's mean and 1 / sqrt(var + eps).
template <device_tag Device, class X, class Gamma, class Beta, class Y, class Mean, class Rstd>
void layer_norm_forward(const execution<Device>& exec, const X& x, const Gamma& gamma,
                        const Beta& beta, Y&& y, Mean&& mean, Rstd&& rstd, double eps = 1e-5) {
  const auto xv = input_view(x);
  const auto gv = input_view(gamma);
  const auto bv = input_view(beta);
  const auto yv = output_view(y);
  const auto mv = output_view(mean);
  const auto rv = output_view(rstd);
  detail::check_operand_types<Device, decltype(xv), decltype(gv), decltype(bv), decltype(yv)>();
  const char* kernel = "layer_norm_forward";
  detail::check_layer_norm_rows(xv, mv, rv, kernel);
  detail::check_layer_norm_feature(xv, gv, kernel, "gamma");
  detail::check_layer_norm_feature(xv, bv, kernel, "beta");
  detail::check_layer_norm_element(xv, yv, kernel, "y");
  QUINTET_CHECK(eps > 0.0, "layer_norm_forward: eps {} must be positive", eps);
  using acc = typename decltype(mv)::value_type;
  layer_norm_engine<Device>::forward(exec, xv.data(), gv.data(), bv.data(), yv.data(), mv.data(),
                                     rv.data(), row_count(xv), row_length(xv),
                                     static_cast<acc>(eps));
}

// The backward, from the forward's x, gamma, mean, rstd and the output gradient dy, with
// xhat = (x - mean) rstd and g = dy gamma:
//   layer_norm_backward_input    dx = rstd (g - mean(g) - xhat mean(g xhat)) per row (overwritten);
//   layer_norm_backward_weight   dgamma += sum_rows dy xhat, dbeta += sum_rows dy (both (n));
//   layer_norm_backward          both in one pass over the rows.
// Zero-bubble pipeline schedules run the two passes apart; input then weight gives the fused
// backward's result bit for bit (the same arithmetic in the same order). The weight pass reads dy,
// so dx must not overwrite dy before it has run.
template <device_tag Device, class X, class Gamma, class Mean, class Rstd, class Dy, class Dx>
void layer_norm_backward_input(const execution<Device>& exec, const X& x, const Gamma& gamma,
                               const Mean& mean, const Rstd& rstd, const Dy& dy, Dx&& dx) {
  const auto xv = input_view(x);
  const auto gv = input_view(gamma);
  const auto mv = input_view(mean);
  const auto rv = input_view(rstd);
  const auto dyv = input_view(dy);
  const auto dxv = output_view(dx);
  detail::check_operand_types<Device, decltype(xv), decltype(gv), decltype(dyv), decltype(dxv)>();
  detail::check_layer_norm_input_pass(xv, gv, mv, rv, dyv, dxv, "layer_norm_backward_input");
  layer_norm_engine<Device>::backward_input(exec, xv.data(), gv.data(), mv.data(), rv.data(),
                                            dyv.data(), dxv.data(), row_count(xv), row_length(xv));
}

template <device_tag Device, class X, class Mean, class Rstd, class Dy, class DGamma, class DBeta>
void layer_norm_backward_weight(const execution<Device>& exec, const X& x, const Mean& mean,
                                const Rstd& rstd, const Dy& dy, DGamma&& dgamma, DBeta&& dbeta) {
  const auto xv = input_view(x);
  const auto mv = input_view(mean);
  const auto rv = input_view(rstd);
  const auto dyv = input_view(dy);
  const auto dgv = output_view(dgamma);
  const auto dbv = output_view(dbeta);
  detail::check_operand_types<Device, decltype(xv), decltype(dyv), decltype(dgv), decltype(dbv)>();
  detail::check_layer_norm_weight_pass(xv, mv, rv, dyv, dgv, dbv, "layer_norm_backward_weight");
  layer_norm_engine<Device>::backward_weight(exec, xv.data(), mv.data(), rv.data(), dyv.data(),
                                             dgv.data(), dbv.data(), row_count(xv), row_length(xv));
}

template <device_tag Device, class X, class Gamma, class Mean, class Rstd, class Dy, class Dx,
          class DGamma, class DBeta>
void layer_norm_backward(const execution<Device>& exec, const X& x, const Gamma& gamma,
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
  detail::check_layer_norm_input_pass(xv, gv, mv, rv, dyv, dxv, kernel);
  detail::check_layer_norm_weight_pass(xv, mv, rv, dyv, dgv, dbv, kernel);
  layer_norm_engine<Device>::backward(exec, xv.data(), gv.data(), mv.data(), rv.data(), dyv.data(),
                                      dxv.data(), dgv.data(), dbv.data(), row_count(xv),
                                      row_length(xv));
}

}  // namespace quintet::kernels
