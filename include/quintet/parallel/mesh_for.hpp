// mesh_for<Mesh, Plan>: a mesh a model of Plan can run on — a device mesh (mesh_like), or no_mesh
// for the serial plan alone. Layers constrain their Mesh parameter with it, so a tensor-parallel
// model without a mesh does not compile.
#pragma once

#include <quintet/mesh/mesh_like.hpp>
#include <quintet/parallel/no_mesh.hpp>

#include <concepts>

namespace quintet::parallel {

template <class Mesh, class Plan>
concept mesh_for = mesh_like<Mesh> ||(Plan::is_serial&& std::same_as<Mesh, no_mesh>);

}  // namespace quintet::parallel
