// synchronize_gradients: after the backward of a step's micro-batches, sums every gradient the plan
// left partial, so every rank holds its part of the serial model's gradient (what clipping and the
// optimizer expect). Which gradients are partial over which axes is in each parameter's placement
// (the plan's rule, applied by the registry); the registry's buckets group them by that set, so
// each set is one all-reduce, in place, on the mesh's product group of its axes:
//
//   sp<megatron_sp>      parameters replicated over tp (layer norms, positions, row biases): tp
//   sp<ulysses|ring>     every parameter: sp
//   with data parallelism, every parameter also over dp: one all-reduce over sp x dp
//
// After the last micro-batch, not after each: gradients accumulate across micro-batches, and
// summing twice would count the earlier ones twice.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/error.hpp>
#include <quintet/mesh/device_mesh.hpp>
#include <quintet/nn/parameter.hpp>
#include <quintet/parallel/no_mesh.hpp>

namespace quintet::parallel {

template <class T, class Device, mesh_like Mesh>
void synchronize_gradients(nn::parameter_registry<T, Device>& registry, Mesh& mesh) {
  QUINTET_CHECK(!registry.gradients_released(),
                "synchronize_gradients: the gradient buffers were released (ZeRO-2 between "
                "steps); zero_grad() and a backward make them again");
  for (auto& bucket : registry.buckets())
    if (!bucket.partial_axes.empty())
      mesh.group(bucket.partial_axes).all_reduce(bucket.grads, reduce_op::sum);
}

// The serial model leaves nothing partial.
template <class T, class Device>
void synchronize_gradients(nn::parameter_registry<T, Device>&, no_mesh&) {}

}  // namespace quintet::parallel
