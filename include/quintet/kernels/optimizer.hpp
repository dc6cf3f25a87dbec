// Optimizer update kernels over parameter tensors, their gradients and state: AdamW (decoupled
// weight decay, bias-corrected moments) and SGD (optional momentum, L2 weight decay). grad_scale
// multiplies the gradient first, which is how global-norm clipping and loss scaling reach the
// update without another pass. Optimizer state (m, v, momentum) is kept in accumulator_t<T>.
// Each takes one tensor or a list of them; a list is updated in one pass (kernels/multi_tensor.hpp:
// one parallel_for on the host, one launch per group of tensors on cuda), every element with the
// operations and the bits the one-tensor call gives it. Host here; cuda in
// <quintet/kernels/cuda/optimizer.cuh>. optim/ applies these over the parameter registry.
#pragma once

#include <quintet/core/config.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/host/optimizer.hpp>
#include <quintet/kernels/multi_tensor.hpp>
#include <quintet/kernels/operand.hpp>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

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

// One tensor of an update, as the engines take it: `count` elements from each pointer; `decays`:
// whether weight decay applies to it (not to biases and norms).
template <class T, class Acc>
struct adamw_tensor {
  T* param;
  const T* grad;
  Acc* m;
  Acc* v;
  std::int64_t count;
  bool decays;
};
template <class T, class Acc>
struct sgd_tensor {
  T* param;
  const T* grad;
  Acc* buffer;  // nullptr: plain SGD
  std::int64_t count;
  bool decays;
};

// Elements per unit of a multi-tensor update.
inline constexpr std::int64_t optimizer_unit = multi_tensor::elementwise_unit;

// The constants of one tensor: weight decay only where it applies.
template <class Acc>
QUINTET_HOST_DEVICE host_impl::adamw_constants<Acc> constants_for(host_impl::adamw_constants<Acc> k,
                                                                  bool decays) {
  if (!decays) k.weight_decay = Acc(0);
  return k;
}
template <class Acc>
QUINTET_HOST_DEVICE host_impl::sgd_constants<Acc> constants_for(host_impl::sgd_constants<Acc> k,
                                                                bool decays) {
  if (!decays) k.weight_decay = Acc(0);
  return k;
}

template <class Device>
struct optimizer_engine {
  static_assert(quintet::detail::always_false<Device>,
                "adamw_update and sgd_update on this device need their implementation: for "
                "quintet::cuda include <quintet/kernels/cuda/optimizer.cuh> in a translation unit "
                "compiled by nvcc");
};

template <>
struct optimizer_engine<host> {
  template <class T, class Acc>
  static void adamw(const execution<host>& exec, std::span<const adamw_tensor<T, Acc>> tensors,
                    const host_impl::adamw_constants<Acc>& k) {
    multi_tensor::for_each_unit(
        exec, tensors, optimizer_unit,
        [&](const adamw_tensor<T, Acc>& t, std::int64_t begin, std::int64_t end) {
          host_impl::adamw_update(t.param + begin, t.grad + begin, t.m + begin, t.v + begin,
                                  end - begin, constants_for(k, t.decays));
        });
  }
  template <class T, class Acc>
  static void sgd(const execution<host>& exec, std::span<const sgd_tensor<T, Acc>> tensors,
                  const host_impl::sgd_constants<Acc>& k) {
    multi_tensor::for_each_unit(
        exec, tensors, optimizer_unit,
        [&](const sgd_tensor<T, Acc>& t, std::int64_t begin, std::int64_t end) {
          host_impl::sgd_update(t.param + begin, t.grad + begin,
                                t.buffer != nullptr ? t.buffer + begin : nullptr, end - begin,
                                constants_for(k, t.decays));
        });
  }
};

// The operands of one tensor of a list update: views of one shape, contiguous, on one device.
template <class T, class Device>
struct adamw_operands {
  tensor_view<T, Device> param;
  tensor_view<const T, Device> grad;
  tensor_view<accumulator_t<T>, Device> m, v;
  bool decays = true;  // weight decay applies (weights and embeddings; not biases and norms)
};
template <class T, class Device>
struct sgd_operands {
  tensor_view<T, Device> param;
  tensor_view<const T, Device> grad;
  std::optional<tensor_view<accumulator_t<T>, Device>> momentum;  // none: plain SGD (momentum 0)
  bool decays = true;
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

// AdamW's constants at step t, the hyperparameters checked; weight decay as given (constants_for
// drops it per tensor).
template <class Acc>
host_impl::adamw_constants<Acc> adamw_constants_at(const adamw_hyperparameters& hp,
                                                   std::int64_t step, double grad_scale) {
  const char* kernel = "adamw_update";
  QUINTET_CHECK(step >= 1, "{}: the step count starts at 1, got {}", kernel, step);
  QUINTET_CHECK(hp.beta1 >= 0 && hp.beta1 < 1 && hp.beta2 >= 0 && hp.beta2 < 1,
                "{}: beta1 {} and beta2 {} must be in [0, 1)", kernel, hp.beta1, hp.beta2);
  QUINTET_CHECK(hp.eps > 0 && hp.lr >= 0 && hp.weight_decay >= 0,
                "{}: needs eps > 0, lr >= 0, weight_decay >= 0; got eps {}, lr {}, weight_decay {}",
                kernel, hp.eps, hp.lr, hp.weight_decay);
  const double t = static_cast<double>(step);
  return {static_cast<Acc>(hp.lr),
          static_cast<Acc>(hp.beta1),
          static_cast<Acc>(hp.beta2),
          static_cast<Acc>(hp.eps),
          static_cast<Acc>(hp.weight_decay),
          static_cast<Acc>(grad_scale),
          static_cast<Acc>(1.0 - std::pow(hp.beta1, t)),
          static_cast<Acc>(1.0 - std::pow(hp.beta2, t))};
}

template <class Acc>
host_impl::sgd_constants<Acc> sgd_constants_of(const sgd_hyperparameters& hp, double grad_scale) {
  QUINTET_CHECK(hp.lr >= 0 && hp.momentum >= 0 && hp.weight_decay >= 0,
                "sgd_update: lr {}, momentum {} and weight_decay {} must not be negative", hp.lr,
                hp.momentum, hp.weight_decay);
  return {static_cast<Acc>(hp.lr), static_cast<Acc>(hp.momentum),
          static_cast<Acc>(hp.weight_decay), static_cast<Acc>(grad_scale)};
}

template <class T, class Device>
adamw_tensor<T, accumulator_t<T>> checked_adamw_tensor(const adamw_operands<T, Device>& x,
                                                       const char* kernel) {
  check_param_and_grad(x.param, x.grad, kernel);
  check_state(x.param, x.m, kernel, "m");
  check_state(x.param, x.v, kernel, "v");
  return {x.param.data(), x.grad.data(), x.m.data(), x.v.data(), x.param.numel(), x.decays};
}

// The momentum buffer is used whenever given (at momentum 0 it then holds the last step's g) and
// needed when momentum is not 0.
template <class T, class Device>
sgd_tensor<T, accumulator_t<T>> checked_sgd_tensor(const sgd_operands<T, Device>& x,
                                                   const sgd_hyperparameters& hp,
                                                   const char* kernel) {
  check_param_and_grad(x.param, x.grad, kernel);
  if (x.momentum) {
    check_state(x.param, *x.momentum, kernel, "momentum");
  } else {
    QUINTET_CHECK(hp.momentum == 0.0,
                  "{}: momentum {} needs a momentum buffer; pass one (zero-initialised)", kernel,
                  hp.momentum);
  }
  return {x.param.data(), x.grad.data(), x.momentum ? x.momentum->data() : nullptr,
          x.param.numel(), x.decays};
}

}  // namespace detail

// One AdamW step t (1, 2, ...) on every tensor of the list, with gradient grad_scale * grad and
// the tensor's moments m, v; weight decay only on the tensors that take it. One pass over all.
template <class T, device_tag Device>
void adamw_update(const execution<Device>& exec, const std::vector<adamw_operands<T, Device>>& list,
                  const adamw_hyperparameters& hp, std::int64_t step, double grad_scale = 1.0) {
  using acc = accumulator_t<T>;
  const auto k = detail::adamw_constants_at<acc>(hp, step, grad_scale);
  std::vector<adamw_tensor<T, acc>> tensors;
  tensors.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i)
    tensors.push_back(detail::checked_adamw_tensor(
        list[i], multi_tensor::list_kernel_name("adamw_update", i, list.size()).c_str()));
  optimizer_engine<Device>::adamw(exec, std::span<const adamw_tensor<T, acc>>(tensors), k);
}

// One AdamW step t (1, 2, ...) on param with gradient grad_scale * grad and moments m, v.
template <device_tag Device, class Param, class Grad, class M, class V>
void adamw_update(const execution<Device>& exec, Param&& param, const Grad& grad, M&& m, V&& v,
                  const adamw_hyperparameters& hp, std::int64_t step, double grad_scale = 1.0) {
  const auto pv = output_view(param);
  const auto gv = input_view(grad);
  detail::check_operand_types<Device, decltype(pv), decltype(gv)>();
  const auto mv = output_view(m);
  const auto vv = output_view(v);
  // Checked here, where the caller's types are seen: a state of the wrong element type gets the
  // static_assert's message, not a failed conversion to the list's views.
  detail::check_state(pv, mv, "adamw_update", "m");
  detail::check_state(pv, vv, "adamw_update", "v");
  using T = typename decltype(pv)::value_type;
  const adamw_operands<T, Device> one{pv, gv, mv, vv, true};
  adamw_update(exec, std::vector<adamw_operands<T, Device>>{one}, hp, step, grad_scale);
}

// One SGD step on every tensor of the list (a momentum buffer, zero-initialised before the first
// step, is needed where hp.momentum is not 0); weight decay only on the tensors that take it. One
// pass over all.
template <class T, device_tag Device>
void sgd_update(const execution<Device>& exec, const std::vector<sgd_operands<T, Device>>& list,
                const sgd_hyperparameters& hp, double grad_scale = 1.0) {
  using acc = accumulator_t<T>;
  std::vector<sgd_tensor<T, acc>> tensors;
  tensors.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i)
    tensors.push_back(detail::checked_sgd_tensor(
        list[i], hp, multi_tensor::list_kernel_name("sgd_update", i, list.size()).c_str()));
  const auto k = detail::sgd_constants_of<acc>(hp, grad_scale);
  optimizer_engine<Device>::sgd(exec, std::span<const sgd_tensor<T, acc>>(tensors), k);
}

// One SGD step with a momentum buffer (zero-initialised before the first step).
template <device_tag Device, class Param, class Grad, class Buffer>
void sgd_update(const execution<Device>& exec, Param&& param, const Grad& grad, Buffer&& momentum,
                const sgd_hyperparameters& hp, double grad_scale = 1.0) {
  const auto pv = output_view(param);
  const auto gv = input_view(grad);
  const auto bv = output_view(momentum);
  detail::check_operand_types<Device, decltype(pv), decltype(gv)>();
  using T = typename decltype(pv)::value_type;
  detail::check_state(pv, bv, "sgd_update", "momentum");  // its type, as adamw_update's state
  const sgd_operands<T, Device> one{pv, gv, bv, true};
  sgd_update(exec, std::vector<sgd_operands<T, Device>>{one}, hp, grad_scale);
}

// One plain SGD step (no momentum state); hp.momentum must be 0.
template <device_tag Device, class Param, class Grad>
void sgd_update(const execution<Device>& exec, Param&& param, const Grad& grad,
                const sgd_hyperparameters& hp, double grad_scale = 1.0) {
  const auto pv = output_view(param);
  const auto gv = input_view(grad);
  detail::check_operand_types<Device, decltype(pv), decltype(gv)>();
  using T = typename decltype(pv)::value_type;
  const sgd_operands<T, Device> one{pv, gv, std::nullopt, true};
  sgd_update(exec, std::vector<sgd_operands<T, Device>>{one}, hp, grad_scale);
}

}  // namespace quintet::kernels
