// no_mesh: the mesh of the serial model, which has no communicators. Layers default their Mesh
// parameter to it, so serial code never names a communicator type.
#pragma once

namespace quintet::parallel {

struct no_mesh {};

}  // namespace quintet::parallel
