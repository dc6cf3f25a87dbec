// Global gradient norm and the clipping factor it implies. Each element of the serial model is
// counted once: over replicated parameters the local sum is the global one. Sharded parameters
// need their sums reduced over the mesh, which the parallel strategies do; here they are refused.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/nn/parameter.hpp>

#include <cmath>
#include <vector>

namespace quintet::optim {

template <class T, class Device>
double global_gradient_norm(const execution<Device>& exec,
                            const nn::parameter_registry<T, Device>& registry) {
  QUINTET_CHECK(!registry.gradients_released(),
                "global_gradient_norm: the gradient buffers were released (ZeRO-2 between steps); "
                "the norm of a sharded gradient is the data-parallel runtime's");
  std::vector<tensor_view<const T, Device>> grads;
  for (const auto& p : registry) {
    QUINTET_CHECK(p.placement.is_replicated(),
                  "global_gradient_norm: parameter '{}' is sharded; its norm must be reduced over "
                  "the mesh by the parallel plan",
                  p.name);
    grads.push_back(p.grad);
  }
  double squares = 0.0;  // added in registration order
  for (const double sum : kernels::squared_norms(exec, grads)) squares += sum;
  return std::sqrt(squares);
}

// The factor that brings a gradient of norm `norm` within `max_norm` (1 when it already is, or
// when clipping is off: max_norm <= 0). A non-finite norm is an error: the step must not apply.
inline double clip_factor(double norm, double max_norm) {
  QUINTET_CHECK(std::isfinite(norm), "gradient norm is {}: the step would corrupt the parameters",
                norm);
  QUINTET_CHECK(!std::isnan(max_norm), "the clipping bound is {}", max_norm);
  if (max_norm <= 0.0 || norm <= max_norm) return 1.0;
  return max_norm / norm;
}

}  // namespace quintet::optim
