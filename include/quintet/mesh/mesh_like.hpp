// mesh_like<M>: what layers and the library's parallel machinery need of a device mesh — its layout
// and degrees, one communicator per axis and product groups over several (device_mesh<Comm> is
// one). parallel::no_mesh, the serial model's, is not.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_layout.hpp>

#include <concepts>

namespace quintet {

template <class M>
concept mesh_like = communicator<typename M::communicator_type> &&
    requires(M& m, const M& cm, mesh_axis axis, mesh_axis_set axes) {
  { cm.layout() } -> std::same_as<const mesh_layout&>;
  { cm.degrees() } -> std::same_as<const mesh_degrees&>;
  { cm.world_rank() } -> std::same_as<int>;
  { m.axis(axis) } -> std::same_as<typename M::communicator_type&>;
  { m.group(axes) } -> std::same_as<typename M::communicator_type&>;
};

}  // namespace quintet
