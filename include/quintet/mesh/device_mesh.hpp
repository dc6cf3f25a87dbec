// device_mesh<Comm>: the world communicator cut into one communicator per parallel axis (tp, sp,
// dp, pp) plus the expert groups (ep, edp), with this rank's coordinates (see mesh_layout.hpp),
// and product groups over several axes (group({sp, dp})) made on first use.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/mesh/mesh_axis.hpp>
#include <quintet/mesh/mesh_layout.hpp>
#include <quintet/mesh/mesh_like.hpp>

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace quintet {

template <communicator Comm>
class device_mesh {
 public:
  using communicator_type = Comm;

  // Collective over `world`: every rank constructs its mesh with the same degrees. Communicators
  // that can carry an axis label (counting_comm) are labelled with the axis name. The mesh keeps
  // a reference to `world` to cut product groups from it: `world` must outlive the mesh.
  device_mesh(Comm& world, mesh_degrees degrees)
      : world_(&world),
        layout_(degrees, world.size()),
        world_rank_(world.rank()),
        coordinates_(layout_.coordinates_of(world_rank_)) {
    groups_.reserve(all_mesh_axes.size());
    for (const mesh_axis axis : all_mesh_axes) {
      Comm group = world.split(layout_.group_id(axis, world_rank_),
                               layout_.index_in_group(axis, world_rank_));
      label(group, name_of(axis));
      groups_.push_back(std::move(group));
    }
  }
  device_mesh(const device_mesh&) = delete;
  device_mesh& operator=(const device_mesh&) = delete;

  const mesh_layout& layout() const { return layout_; }
  const mesh_degrees& degrees() const { return layout_.degrees(); }
  const mesh_coordinates& coordinates() const { return coordinates_; }
  int world_rank() const { return world_rank_; }
  // Every rank of the mesh (collectives over the whole world: a checkpoint's barriers).
  Comm& world() { return *world_; }

  Comm& axis(mesh_axis which) { return groups_[static_cast<std::size_t>(which)]; }
  Comm& tp() { return axis(mesh_axis::tp); }
  Comm& sp() { return axis(mesh_axis::sp); }
  Comm& dp() { return axis(mesh_axis::dp); }
  Comm& pp() { return axis(mesh_axis::pp); }
  Comm& ep() { return axis(mesh_axis::ep); }
  Comm& expert_dp() { return axis(mesh_axis::edp); }

  // The communicator of the ranks that agree on every axis outside `axes` (ordered by their
  // coordinates on `axes`, fastest first): one all-reduce over sp x dp instead of two. A set's
  // first use is collective over the world (a split), so every rank must ask for the same sets in
  // the same order; later uses are cached.
  // Axes of degree 1 change no group, so they are dropped first: a set with one axis of degree > 1
  // is that axis' communicator, and with none, its first (degree-1) axis'.
  Comm& group(mesh_axis_set axes) {
    layout_.check_axes(axes);
    mesh_axis_set wide;
    axes.for_each([&](mesh_axis axis) {
      if (layout_.size(axis) > 1) wide = wide.with(axis);
    });
    if (wide.count() == 1 || (wide.empty() && !axes.empty())) {
      std::optional<mesh_axis> first;
      (wide.empty() ? axes : wide).for_each([&](mesh_axis axis) {
        if (!first) first = axis;
      });
      return axis(*first);
    }
    axes = wide;  // empty only when asked for the empty set: the rank alone, split below
    const auto found = products_.find(axes);
    if (found != products_.end()) return *found->second;
    auto product = std::make_unique<Comm>(world_->split(layout_.group_id(axes, world_rank_),
                                                        layout_.index_in_group(axes, world_rank_)));
    label(*product, name_of(axes));
    return *products_.emplace(axes, std::move(product)).first->second;
  }

 private:
  static void label(Comm& group, std::string_view name) {
    if constexpr (requires { group.set_axis_label(name); }) group.set_axis_label(name);
  }

  Comm* world_;
  mesh_layout layout_;
  int world_rank_;
  mesh_coordinates coordinates_;
  std::vector<Comm> groups_;                                 // indexed by mesh_axis
  std::map<mesh_axis_set, std::unique_ptr<Comm>> products_;  // product groups made so far
};

// The communicator type of a device_mesh (what its axes are).
template <class Mesh>
using communicator_of = typename Mesh::communicator_type;

}  // namespace quintet
