// The global gradient norm of a model laid out over a mesh: every element of the serial model
// counted once. Each parameter's squares are summed locally with the others sharded over the same
// axes; each such sum is all-reduced over the product group of its axes (replicated parameters
// hold the same gradient on every rank and are not reduced). A parameter sharded over an axis no
// policy of the plan uses is refused: its layout does not match the plan.
#pragma once

#include <quintet/comm/all_reduce_from_host.hpp>
#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/optim/gradient_norm.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

namespace quintet::parallel {

template <class Plan, class T, class Device, mesh_like Mesh>
double global_gradient_norm(const execution<Device>& exec,
                            const nn::parameter_registry<T, Device>& registry, Mesh& mesh) {
  // Sums in registration order per set of sharded axes; sets in order of their bits, the
  // replicated set (no bits) first.
  std::map<std::uint8_t, double> squares;
  for (const auto& p : registry) {
    // Parameters held by other stages live on other pp ranks (and a tied table on two): summing
    // over pp, once each, is the pipeline's part, not built yet.
    QUINTET_CHECK(p.placement.stages() == std::vector<int>{0},
                  "global_gradient_norm: parameter '{}' is held by pipeline stages other than 0 "
                  "alone; the norm over pipeline stages is not implemented yet",
                  p.name);
    const mesh_axis_set sharded = p.placement.sharded_axes();
    QUINTET_CHECK(Plan::axes.contains_all(sharded),
                  "global_gradient_norm: parameter '{}' is sharded over {}, but the plan {} runs "
                  "on {} only",
                  p.name, name_of(sharded), Plan::name(), name_of(Plan::axes));
    squares[sharded.bits()] += kernels::squared_norm(exec, p.grad);
  }
  double total = 0.0;
  for (auto& [bits, sum] : squares) {
    mesh_axis_set axes;
    for (const mesh_axis axis : all_mesh_axes)
      if (mesh_axis_set{axis}.bits() & bits) axes = axes.with(axis);
    if (!axes.empty()) {
      quintet::tensor<double, host> value(shape{1});
      value(0) = sum;
      all_reduce_from_host(mesh.group(axes), value, reduce_op::sum);
      sum = value(0);
    }
    total += sum;
  }
  return std::sqrt(total);
}

// The serial model: every parameter whole on the one rank.
template <class Plan, class T, class Device>
double global_gradient_norm(const execution<Device>& exec,
                            const nn::parameter_registry<T, Device>& registry, no_mesh&) {
  return optim::global_gradient_norm(exec, registry);
}

}  // namespace quintet::parallel
