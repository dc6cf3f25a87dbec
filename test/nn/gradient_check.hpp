// Central finite differences for layers in double precision: L = sum(forward(x) * r) for a random
// upstream gradient r, so backward(r) must return dL/dx and accumulate dL/dparameter.
#pragma once

#include <catch2/catch.hpp>

#include <quintet/nn/context.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace quintet::test {

using host_tensor = quintet::tensor<double, quintet::host>;

inline double dot(const host_tensor& a, const host_tensor& b) {
  REQUIRE(a.shape() == b.shape());
  double sum = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) sum += a.data()[i] * b.data()[i];
  return sum;
}

// The analytic and the central-difference derivative agree to `tolerance`, relative to the
// larger of the two magnitudes (floored at 1, so tiny derivatives are compared absolutely).
inline void require_close(double analytic, double numeric, double tolerance,
                          const std::string& what) {
  const double scale = std::max({1.0, std::abs(analytic), std::abs(numeric)});
  INFO(what << ": analytic " << analytic << ", finite difference " << numeric);
  REQUIRE(std::abs(analytic - numeric) <= tolerance * scale);
}

// (loss(value + step) - loss(value - step)) / (2 step), with `value` restored afterwards.
template <class Loss>
double central_difference(double& value, double step, Loss&& loss) {
  const double saved = value;
  value = saved + step;
  const double plus = loss();
  value = saved - step;
  const double minus = loss();
  value = saved;
  return (plus - minus) / (2 * step);
}

// L = sum(forward(ctx) * r): every element of every parameter in `registry`, and of `input` when
// given, is perturbed by +-step; backward(ctx, r) must accumulate the parameter gradients and
// return dL/dinput (anything, when there is no input).
template <class Forward, class Backward>
void check_gradients_of(quintet::nn::parameter_registry<double, quintet::host>& registry,
                        host_tensor* input, Forward forward, Backward backward, double step,
                        double tolerance) {
  quintet::nn::context<quintet::host> ctx;
  const host_tensor y = forward(ctx);
  host_tensor upstream(y.shape());
  quintet::fill_normal(upstream, {.seed = 77, .stream = 1}, 0.0, 1.0);
  registry.zero_grad();
  const auto dx = backward(ctx, upstream);

  const auto loss = [&] {
    quintet::nn::context<quintet::host> fresh;
    return dot(forward(fresh), upstream);
  };
  if constexpr (std::is_same_v<std::remove_cvref_t<decltype(dx)>, host_tensor>) {
    REQUIRE(input != nullptr);
    REQUIRE(dx.shape() == input->shape());
    for (std::int64_t i = 0; i < input->numel(); ++i)
      require_close(dx.data()[i], central_difference(input->data()[i], step, loss), tolerance,
                    "dx[" + std::to_string(i) + "]");
  }
  for (auto& p : registry) {
    for (std::int64_t i = 0; i < p.value.numel(); ++i)
      require_close(p.grad.data()[i], central_difference(p.value.data()[i], step, loss), tolerance,
                    "d" + p.name + "[" + std::to_string(i) + "]");
  }
}

// A layer of one floating-point input: forward(ctx, x) -> y, backward(ctx, dy) -> dx.
template <class Forward, class Backward>
void check_gradients(quintet::nn::parameter_registry<double, quintet::host>& registry,
                     host_tensor& x, Forward forward, Backward backward, double step = 1e-6,
                     double tolerance = 1e-6) {
  check_gradients_of(
      registry, &x, [&](auto& ctx) { return forward(ctx, x); }, backward, step, tolerance);
}

}  // namespace quintet::test
