// device_mesh<Comm>: the world communicator cut into one communicator per parallel axis (tp, sp,
// dp, pp) plus the expert groups (ep, edp), with this rank's coordinates (see mesh_layout.hpp).
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/mesh/mesh_layout.hpp>

#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace quintet {

template <communicator Comm>
class device_mesh {
 public:
  // Collective over `world`: every rank constructs its mesh with the same degrees. Communicators
  // that can carry an axis label (counting_comm) are labelled with the axis name.
  device_mesh(Comm& world, mesh_degrees degrees)
      : layout_(degrees, world.size()),
        world_rank_(world.rank()),
        coordinates_(layout_.coordinates_of(world_rank_)) {
    groups_.reserve(all_mesh_axes.size());
    for (const mesh_axis axis : all_mesh_axes) {
      Comm group = world.split(layout_.group_id(axis, world_rank_),
                               layout_.index_in_group(axis, world_rank_));
      if constexpr (requires { group.set_axis_label(std::string_view{}); }) {
        group.set_axis_label(name_of(axis));
      }
      groups_.push_back(std::move(group));
    }
  }

  const mesh_layout& layout() const { return layout_; }
  const mesh_degrees& degrees() const { return layout_.degrees(); }
  const mesh_coordinates& coordinates() const { return coordinates_; }
  int world_rank() const { return world_rank_; }

  Comm& axis(mesh_axis which) { return groups_[static_cast<std::size_t>(which)]; }
  Comm& tp() { return axis(mesh_axis::tp); }
  Comm& sp() { return axis(mesh_axis::sp); }
  Comm& dp() { return axis(mesh_axis::dp); }
  Comm& pp() { return axis(mesh_axis::pp); }
  Comm& ep() { return axis(mesh_axis::ep); }
  Comm& expert_dp() { return axis(mesh_axis::edp); }

 private:
  mesh_layout layout_;
  int world_rank_;
  mesh_coordinates coordinates_;
  std::vector<Comm> groups_;  // indexed by mesh_axis
};

// The communicator type of a device_mesh (what its axes are).
template <class Mesh>
using communicator_of = std::remove_reference_t<decltype(std::declval<Mesh&>().tp())>;

}  // namespace quintet
