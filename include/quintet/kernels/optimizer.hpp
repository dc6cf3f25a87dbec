// Optimizer update kernels over one parameter tensor and its gradient and state: AdamW (decoupled
// weight decay, bias-corrected moments) and SGD (optional momentum, L2 weight decay). grad_scale
// multiplies the gradient first, which is how global-norm clipping and loss scaling reach the
// update without another pass. Optimizer state (m, v, momentum) is kept in accumulator_t<T>.
// Host here; cuda in <quintet/kernels/cuda/optimizer.cuh>. optim/ applies these over the parameter
// registry.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/operand.hpp>

#include <cmath>
#include <concepts>
#include <cstdint>

namespace quintet::kernels {

struct adamw_hyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct sgd_hyperparameters {
  double lr = 1e-2;
  double momentum = 0.0;
  double weight_decay = 0.0;
};

template <class Device>
struct optimizer_engine {
  static_assert(quintet::detail::always_false<Device>,
                "adamw_update and sgd_update on this device need their implementation: for "
                "quintet::cuda include <quintet/kernels/cuda/optimizer.cuh> in a translation unit "
                "compiled by nvcc");
};

template <>
struct optimizer_engine<host> {
  static constexpr std::int64_t grain = execution<host>::grain_for(1);

  template <class T, class Acc>
  static void adamw(const execution<host>& exec, T* param, const T* grad, Acc* m, Acc* v,
                    std::int64_t count, const host_impl::adamw_constants<Acc>& k) {
    exec.parallel_for(count, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::adamw_update(param + begin, grad + begin, m + begin, v + begin, end - begin, k);
    });
  }
  template <class T, class Acc>
  static void sgd(const execution<host>& exec, T* param, const T* grad, Acc* buffer,
                  std::int64_t count, const host_impl::sgd_constants<Acc>& k) {
    exec.parallel_for(count, grain, [&](std::int64_t begin, std::int64_t end) {
      host_impl::sgd_update(param + begin, grad + begin,
                            buffer != nullptr ? buffer + begin : nullptr, end - begin, k);
    });
  }
};

namespace detail {

template <class ParamView, class GradView>
void check_param_and_grad(const ParamView& param, const GradView& grad, const char* kernel) {
  require_contiguous(param, kernel, "param");
  require_contiguous(grad, kernel, "grad");
  check_same_shape(param, grad, kernel);
  check_same_device(param, grad, kernel);
}

template <class ParamView, class StateView>
void check_state(const ParamView& param, const StateView& state, const char* kernel,
                 const char* name) {
  static_assert(
      std::same_as<typename StateView::value_type, accumulator_t<typename ParamView::value_type>>,
      "optimizer state is kept in accumulator_t<T> (float, or double for double parameters)");
  require_contiguous(state, kernel, name);
  require_shape(state, param.shape(), kernel, name);
  check_same_device(param, state, kernel);
}

}  // namespace detail

// One AdamW step t (1, 2, ...) on param with gradient grad_scale * grad and moments m, v.
template <device_tag Device, class Param, class Grad, class M, class V>
void adamw_update(const execution<Device>& exec, Param&& param, const Grad& grad, M&& m, V&& v,
                  const adamw_hyperparameters& hp, std::int64_t step, double grad_scale = 1.0) {
  const char* kernel = "adamw_update";
  const auto pv = output_view(param);
  const auto gv = input_view(grad);
  const auto mv = output_view(m);
  const auto vv = output_view(v);
  detail::check_operand_types<Device, decltype(pv), decltype(gv)>();
  detail::check_param_and_grad(pv, gv, kernel);
  detail::check_state(pv, mv, kernel, "m");
  detail::check_state(pv, vv, kernel, "v");
  QUINTET_CHECK(step >= 1, "{}: the step count starts at 1, got {}", kernel, step);
  QUINTET_CHECK(hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 && hp.beta2 < 1,
                "{}: beta1 {} and beta2 {} must be in [0, 1)", kernel, hp.beta1, hp.beta2);
  QUINTET_CHECK(hp.eps > 0 && hp.lr >= 0 && hp.weight_decay >= 0,
                "{}: needs eps > 0, lr >= 0, weight_decay >= 0; got eps {}, lr {}, weight_decay {}",
                kernel, hp.eps, hp.lr, hp.weight_decay);
  using acc = typename decltype(mv)::value_type;
  const double t = static_cast<double>(step);
  const host_impl::adamw_constants<acc> k{static_cast<acc>(hp.lr),
                                          static_cast<acc>(hp.beta1),
                                          static_cast<acc>(hp.beta2),
                                          static_cast<acc>(hp.eps),
                                          static_cast<acc>(hp.weight_decay),
                                          static_cast<acc>(grad_scale),
                                          static_cast<acc>(1.0 - std::pow(hp.beta1, t)),
                                          static_cast<acc>(1.0 - std::pow(hp.beta2, t))};
  optimizer_engine<Device>::adamw(exec, pv.data(), gv.data(), mv.data(), vv.data(), pv.numel(), k);
}

// One SGD step with a momentum buffer (zero-initialised before the first step).
template <device_tag Device, class Param, class Grad, class Buffer>
void sgd_update(const execution<Device>& exec, Param&& param, const Grad& grad, Buffer&& momentum,
                const sgd_hyperparameters& hp, double grad_scale = 1.0) {
  const char* kernel = "sgd_update";
  const auto pv = output_view(param);
  const auto gv = input_view(grad);
  const auto bv = output_view(momentum);
  detail::check_operand_types<Device, decltype(pv), decltype(gv)>();
  detail::check_param_and_grad(pv, gv, kernel);
  detail::check_state(pv, bv, kernel, "momentum");
  QUINTET_CHECK(hp.lr >= 0 && hp.momentum >= 0 && hp.weight_decay >= 0,
                "{}: lr {}, momentum {} and weight_decay {} must not be negative", kernel, hp.lr,
                hp.momentum, hp.weight_decay);
  using acc = typename decltype(bv)::value_type;
  const host_impl::sgd_constants<acc> k{static_cast<acc>(hp.lr), static_cast<acc>(hp.momentum),
                                        static_cast<acc>(hp.weight_decay),
                                        static_cast<acc>(grad_scale)};
  optimizer_engine<Device>::sgd(exec, pv.data(), gv.data(), bv.data(), pv.numel(), k);
}

// One plain SGD step (no momentum state); hp.momentum must be 0.
template <device_tag Device, class Param, class Grad>
void sgd_update(const execution<Device>& exec, Param&& param, const Grad& grad,
                const sgd_hyperparameters& hp, double grad_scale = 1.0) {
  const char* kernel = "sgd_update";
  const auto pv = output_view(param);
  const auto gv = input_view(grad);
  detail::check_operand_types<Device, decltype(pv), decltype(gv)>();
  detail::check_param_and_grad(pv, gv, kernel);
  QUINTET_CHECK(hp.momentum == 0.0,
                "{}: momentum {} needs a momentum buffer; pass one (zero-initialised)", kernel,
                hp.momentum);
  QUINTET_CHECK(hp.lr >= 0 && hp.weight_decay >= 0,
                "{}: lr {} and weight_decay {} must not be negative", kernel, hp.lr,
                hp.weight_decay);
  using acc = accumulator_t<typename decltype(pv)::value_type>;
  const host_impl::sgd_constants<acc> k{static_cast<acc>(hp.lr), acc(0),
                                        static_cast<acc>(hp.weight_decay),
                                        static_cast<acc>(grad_scale)};
  optimizer_engine<Device>::sgd(exec, pv.data(), gv.data(), static_cast<acc*>(nullptr), pv.numel(),
                                k);
}

}  // namespace quintet::kernels
