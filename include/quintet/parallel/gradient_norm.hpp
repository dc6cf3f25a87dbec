// The global gradient norm of a model laid out over a mesh: every element of the serial model
// counted once. Replicated parameters hold the same gradient on every rank and are summed locally;
// parameters sharded over tp are summed over the tp group.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cmath>

namespace quintet::parallel {

template <class T, class Device, class Mesh>
double global_gradient_norm(const execution<Device>& exec,
                            const nn::parameter_registry<T, Device>& registry, Mesh& mesh) {
  double replicated = 0.0;
  quintet::tensor<double, host> tp_sharded(shape{1});
  tp_sharded(0) = 0.0;
  for (const auto& p : registry) {
    for (const mesh_axis axis : all_mesh_axes) {
      QUINTET_CHECK(axis == mesh_axis::tp || !p.placement.is_sharded(axis),
                    "global_gradient_norm: parameter '{}' is sharded over {}, which this norm does "
                    "not reduce yet",
                    p.name, name_of(axis));
    }
    const double squares = kernels::squared_norm(exec, p.grad);
    (p.placement.is_sharded(mesh_axis::tp) ? tp_sharded(0) : replicated) += squares;
  }
  mesh.tp().all_reduce(tp_sharded, reduce_op::sum);
  return std::sqrt(replicated + tp_sharded(0));
}

}  // namespace quintet::parallel
