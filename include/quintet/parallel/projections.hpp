// projections<T, Device, Plan, Mesh>: the linear layers a block is built from, chosen by the plan.
// Serial (no tensor policy): two nn::linear. With parallel::tp<megatron_1d>: column_linear for
// the projection that fans out (qkv, fc) and row_linear for the one that comes back (attention
// output, MLP output), so a block communicates twice forward and twice backward.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/linear.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/no_mesh.hpp>
#include <quintet/parallel/plan.hpp>
#include <quintet/parallel/tensor/column_linear.hpp>
#include <quintet/parallel/tensor/row_linear.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace quintet::parallel {

// The sequence style the tensor-parallel linears take part in, as the plan's sequence style says:
// megatron_sp shards the sequence on the tp group, so the linears gather and scatter it; Ulysses
// and ring work on the sp axis and leave the linears alone (none).
template <class Plan>
using linear_sequence_style = typename sequence_of<Plan>::linear_sequence;

template <class T, class Device, class Plan, class Mesh>
struct projections {
  static_assert(mesh_for<Mesh, Plan>,
                "parallel::projections<T, Device, Plan, Mesh>: a parallel plan needs a device mesh "
                "type (Mesh = device_mesh<Comm>), not parallel::no_mesh");
  using column = nn::linear<T, Device>;
  using row = nn::linear<T, Device>;

  static column make_column(nn::parameter_registry<T, Device>& registry,
                            const execution<Device>& exec, Mesh*, const std::string& name,
                            std::int64_t in, std::int64_t out, nn::linear_options options = {}) {
    return column(registry, exec, name, in, out, options);
  }
  static row make_row(nn::parameter_registry<T, Device>& registry, const execution<Device>& exec,
                      Mesh*, const std::string& name, std::int64_t in, std::int64_t out,
                      nn::linear_options options = {}) {
    return row(registry, exec, name, in, out, options);
  }
  static int tp_size(Mesh*) { return 1; }
};

// (A tensor-parallel plan with no_mesh falls to the primary template and its static_assert.)
template <class T, class Device, class Plan, class Mesh>
requires uses_tensor_parallel<Plan> && mesh_like<Mesh>
struct projections<T, Device, Plan, Mesh> {
  using column = column_linear<T, Device, communicator_of<Mesh>, linear_sequence_style<Plan>>;
  using row = row_linear<T, Device, communicator_of<Mesh>, linear_sequence_style<Plan>>;

  static column make_column(nn::parameter_registry<T, Device>& registry,
                            const execution<Device>& exec, Mesh* mesh, const std::string& name,
                            std::int64_t in, std::int64_t out, nn::linear_options options = {}) {
    return column(registry, exec, require(mesh, name).tp(), name, in, out, options);
  }
  static row make_row(nn::parameter_registry<T, Device>& registry, const execution<Device>& exec,
                      Mesh* mesh, const std::string& name, std::int64_t in, std::int64_t out,
                      nn::linear_options options = {}) {
    return row(registry, exec, require(mesh, name).tp(), name, in, out, options);
  }
  static int tp_size(Mesh* mesh) { return require(mesh, "tensor-parallel layer").tp().size(); }

 private:
  static Mesh& require(Mesh* mesh, const std::string& name) {
    QUINTET_CHECK(mesh != nullptr, "'{}': a tensor-parallel plan needs the device mesh", name);
    return *mesh;
  }
};

}  // namespace quintet::parallel
