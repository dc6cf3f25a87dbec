// One elementwise pass over a list of cuda tensors (kernels/multi_tensor.hpp): a launch per group
// of up to list_capacity tensors, one block per unit, the group's records in the launch's
// parameters. The optimizer updates and the list forms of convert and accumulate use it.
//
// An Op binds one record's range: Op::at(record, begin, constants) gives the op over elements
// [begin, ...) of that tensor, op.aligned() says whether all its operands there allow Op::lanes
// elements per access, and op.apply<Lanes>(first) does elements [first, first + Lanes).
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/cuda/map.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/multi_tensor.hpp>
#include <quintet/tensor/cuda/launch.cuh>

#include <algorithm>
#include <cstdint>
#include <span>

namespace quintet::kernels::cuda_impl {

// Tensors per launch (not tuned; ~4 launches for the GPT-2 124M shape's ~150 parameters): the
// group's records travel in the kernel's parameters, which every toolkit takes up to 4 KiB of.
inline constexpr int list_capacity = 40;

// One launch's tensors: their records, and where each one's units start (counted from the group's
// first; first_unit[size] is the group's units).
template <class Record>
struct tensor_group {
  Record record[list_capacity];
  std::int64_t first_unit[list_capacity + 1];
  int size;
};

// Block b does unit b of the group: the op bound to its tensor's range, walked in chunks of Lanes
// elements where the operands are all aligned for them (units start at multiples of Unit, which
// keeps each tensor's alignment), else one element at a time.
// The group is read in place (__grid_constant__): it is indexed by the block's tensor.
template <int Lanes, std::int64_t Unit, class Op, class Record, class Constants>
__global__ void list_unit_kernel(const __grid_constant__ tensor_group<Record> group,
                                 const Constants k) {
  const auto at =
      multi_tensor::locate(group.first_unit, group.size, Unit, std::int64_t{blockIdx.x});
  const Record& t = group.record[at.tensor];
  const std::int64_t remaining = t.count - at.begin;
  const std::int64_t count = remaining < Unit ? remaining : Unit;
  const Op op = Op::at(t, at.begin, k);
  const auto element = [&](std::int64_t i) { op.template apply<1>(i); };
  if (op.aligned()) {
    for_each_share(
        chunked_range{count, Lanes}, threadIdx.x, blockDim.x,
        [&](std::int64_t first) { op.template apply<Lanes>(first); }, element);
  } else {
    for_each_share(chunked_range{count, 1}, threadIdx.x, blockDim.x, element, element);
  }
}

// Op over every tensor of the list (records with `count`), in units of Unit elements. The records
// were checked by the entry point and the block counts are checked before the first launch (`what`
// names the pass in that error); a launch that fails still leaves the earlier groups done.
template <class Op, std::int64_t Unit, class Record, class Constants>
void for_each_list_unit(const execution<cuda>& exec, std::span<const Record> tensors,
                        const Constants& k, const char* what) {
  static_assert(sizeof(tensor_group<Record>) + sizeof(Constants) <= 4096,
                "a launch's parameters stay within 4 KiB");
  const auto plan =
      multi_tensor::plan_launches(multi_tensor::counts_of(tensors), Unit, list_capacity, what);
  for (const auto range : plan.groups) {
    const std::int64_t units = plan.units(range);
    if (units == 0) continue;  // only tensors without elements
    tensor_group<Record> group{};
    group.size = static_cast<int>(range.size());
    std::copy(tensors.begin() + range.begin, tensors.begin() + range.end, group.record);
    plan.group_first_units(range, group.first_unit);
    constexpr int threads = quintet::detail::elementwise_threads;
    list_unit_kernel<Op::lanes, Unit, Op>
        <<<static_cast<unsigned>(units), threads, 0, exec.native()>>>(group, k);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace quintet::kernels::cuda_impl
