// Host reduction loops shared by the CPU communicators: combine n equally long inputs in rank order
// (so every rank and every run gets the same bits) and write the result to one or more outputs.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/bf16.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/core/half.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>

namespace quintet::detail {

// 16-bit floats are combined in fp32; every other type in itself.
template <class T>
using reduce_accumulator_t =
    std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, half>, float, T>;

template <reduce_op Op, class A>
inline A combine(A a, A b) {
  if constexpr (Op == reduce_op::max) {
    return b > a ? b : a;
  } else if constexpr (Op == reduce_op::min) {
    return b < a ? b : a;
  } else {
    return a + b;
  }
}

// outputs[o][i] = op over j of inputs[j][i], j in rank order, for i in [0, count). An output may
// alias an input: each tile is read from every input before it is written anywhere.
template <class T, reduce_op Op>
inline void reduce_tiles(std::span<const T* const> inputs, std::span<T* const> outputs,
                         std::int64_t count) {
  using A = reduce_accumulator_t<T>;
  // 16 KiB of fp32 accumulators: stays in L1 while every input streams through it.
  constexpr std::int64_t tile = 4096;
  alignas(64) A accumulator[tile];
  const int n = static_cast<int>(inputs.size());
  for (std::int64_t start = 0; start < count; start += tile) {
    const std::int64_t length = std::min(tile, count - start);
    const T* first = inputs[0] + start;
    for (std::int64_t i = 0; i < length; ++i) accumulator[i] = static_cast<A>(first[i]);
    for (int j = 1; j < n; ++j) {
      const T* next = inputs[j] + start;
      for (std::int64_t i = 0; i < length; ++i) {
        accumulator[i] = combine<Op>(accumulator[i], static_cast<A>(next[i]));
      }
    }
    if constexpr (Op == reduce_op::average) {
      const A divisor = static_cast<A>(n);
      for (std::int64_t i = 0; i < length; ++i) accumulator[i] = accumulator[i] / divisor;
    }
    for (T* output : outputs) {
      T* target = output + start;
      for (std::int64_t i = 0; i < length; ++i) target[i] = static_cast<T>(accumulator[i]);
    }
  }
}

template <class T>
inline void reduce_typed(std::span<const void* const> inputs, std::span<void* const> outputs,
                         std::int64_t offset, std::int64_t count, reduce_op op) {
  constexpr int max_ranks = 1024;
  QUINTET_CHECK(inputs.size() <= max_ranks && outputs.size() <= max_ranks,
                "host reduction supports at most {} ranks, got {}", max_ranks, inputs.size());
  const T* typed_inputs[max_ranks];
  T* typed_outputs[max_ranks];
  for (std::size_t j = 0; j < inputs.size(); ++j) {
    typed_inputs[j] = static_cast<const T*>(inputs[j]) + offset;
  }
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    typed_outputs[o] = static_cast<T*>(outputs[o]) + offset;
  }
  const std::span<const T* const> in(typed_inputs, inputs.size());
  const std::span<T* const> out(typed_outputs, outputs.size());
  switch (op) {
    case reduce_op::sum:
      return reduce_tiles<T, reduce_op::sum>(in, out, count);
    case reduce_op::max:
      return reduce_tiles<T, reduce_op::max>(in, out, count);
    case reduce_op::min:
      return reduce_tiles<T, reduce_op::min>(in, out, count);
    case reduce_op::average:
      return reduce_tiles<T, reduce_op::average>(in, out, count);
  }
}

// Reduces elements [offset, offset + count) of every input (buffers of element type `type`) into
// the same elements of every output.
inline void reduce_buffers(dtype type, std::span<const void* const> inputs,
                           std::span<void* const> outputs, std::int64_t offset, std::int64_t count,
                           reduce_op op) {
  if (count <= 0 || inputs.empty()) return;
  switch (type) {
    case dtype::f32:
      return reduce_typed<float>(inputs, outputs, offset, count, op);
    case dtype::f64:
      return reduce_typed<double>(inputs, outputs, offset, count, op);
    case dtype::bf16:
      return reduce_typed<bf16>(inputs, outputs, offset, count, op);
    case dtype::f16:
      return reduce_typed<half>(inputs, outputs, offset, count, op);
    case dtype::i32:
      return reduce_typed<std::int32_t>(inputs, outputs, offset, count, op);
    case dtype::i64:
      return reduce_typed<std::int64_t>(inputs, outputs, offset, count, op);
  }
}

}  // namespace quintet::detail
