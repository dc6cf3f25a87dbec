// Host reduction loops shared by the CPU communicators: combine n equally long inputs in rank order
// (so every rank and every run gets the same bits) and write the result to one or more outputs.
#pragma once

#include <quintet/comm/communicator.hpp>
#include <quintet/core/bf16.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/core/half.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

// Writes `bytes` from `source` to `target`. Streaming stores bypass the cache: for large
// messages nobody reads the output soon, and skipping the read-for-ownership saves a third of the
// memory traffic. The caller fences (stream_fence) before another thread may read the target.
inline void write_block(void* target, const void* source, std::size_t bytes, bool streaming) {
#if defined(__SSE2__)
  if (streaming && reinterpret_cast<std::uintptr_t>(target) % 16 == 0) {
    auto* to = static_cast<__m128i*>(target);
    const auto* from = static_cast<const __m128i*>(source);
    const std::size_t vectors = bytes / 16;
    for (std::size_t v = 0; v < vectors; ++v) _mm_stream_si128(to + v, _mm_loadu_si128(from + v));
    std::memcpy(static_cast<std::byte*>(target) + vectors * 16,
                static_cast<const std::byte*>(source) + vectors * 16, bytes - vectors * 16);
    return;
  }
#endif
  (void)streaming;
  std::memcpy(target, source, bytes);
}

// Orders this thread's streaming stores before its following stores (the barrier's release).
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Elements per tile. Small on purpose: with 4096-element tiles the same loop ran 3x slower on the
// development machine (32 MiB, 2 inputs -> 2 outputs: 10 ms against 4 ms with 256, memcpy of
// 32 MiB 2.6 ms; best of 15), as inputs and accumulator contend in L1.
inline constexpr std::int64_t reduce_tile_elements = 256;

// One tile: Length > 0 is a compile-time trip count (so -O2 vectorizes the loops), 0 a runtime
// `length` for the last, partial tile.
template <class T, reduce_op Op, std::int64_t Length>
inline void reduce_tile(std::span<const T* const> inputs, std::span<T* const> outputs,
                        std::int64_t start, std::int64_t length, bool streaming) {
  using A = reduce_accumulator_t<T>;
  constexpr std::int64_t capacity = Length > 0 ? Length : reduce_tile_elements;
  const std::int64_t count = Length > 0 ? Length : length;
  alignas(64) A accumulator[capacity];
  // The first two inputs are combined in one pass: one fewer trip through the accumulator.
  const T* first = inputs[0] + start;
  std::size_t j = 1;
  if (inputs.size() >= 2) {
    const T* second = inputs[1] + start;
    for (std::int64_t i = 0; i < count; ++i) {
      accumulator[i] = combine<Op>(static_cast<A>(first[i]), static_cast<A>(second[i]));
    }
    j = 2;
  } else {
    for (std::int64_t i = 0; i < count; ++i) accumulator[i] = static_cast<A>(first[i]);
  }
  for (; j < inputs.size(); ++j) {
    const T* next = inputs[j] + start;
    for (std::int64_t i = 0; i < count; ++i) {
      accumulator[i] = combine<Op>(accumulator[i], static_cast<A>(next[i]));
    }
  }
  if constexpr (Op == reduce_op::average) {
    const A divisor = static_cast<A>(inputs.size());
    for (std::int64_t i = 0; i < count; ++i) accumulator[i] = accumulator[i] / divisor;
  }
  const T* result = nullptr;
  alignas(64) T narrowed[std::is_same_v<A, T> ? 1 : capacity];
  if constexpr (std::is_same_v<A, T>) {
    result = accumulator;
  } else {
    for (std::int64_t i = 0; i < count; ++i) narrowed[i] = static_cast<T>(accumulator[i]);
    result = narrowed;
  }
  for (T* output : outputs) {
    write_block(output + start, result, static_cast<std::size_t>(count) * sizeof(T), streaming);
  }
}

// outputs[o][i] = op over j of inputs[j][i], j in rank order, for i in [0, count). An output may
// alias an input: each tile is read from every input before it is written anywhere.
template <class T, reduce_op Op>
inline void reduce_tiles(std::span<const T* const> inputs, std::span<T* const> outputs,
                         std::int64_t count, bool streaming) {
  constexpr std::int64_t tile = reduce_tile_elements;
  std::int64_t start = 0;
  for (; start + tile <= count; start += tile) {
    reduce_tile<T, Op, tile>(inputs, outputs, start, tile, streaming);
  }
  if (start < count) reduce_tile<T, Op, 0>(inputs, outputs, start, count - start, streaming);
}

template <class T>
inline void reduce_typed(std::span<const void* const> inputs, std::span<void* const> outputs,
                         std::int64_t offset, std::int64_t count, reduce_op op, bool streaming) {
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
      return reduce_tiles<T, reduce_op::sum>(in, out, count, streaming);
    case reduce_op::max:
      return reduce_tiles<T, reduce_op::max>(in, out, count, streaming);
    case reduce_op::min:
      return reduce_tiles<T, reduce_op::min>(in, out, count, streaming);
    case reduce_op::average:
      return reduce_tiles<T, reduce_op::average>(in, out, count, streaming);
  }
}

// Reduces elements [offset, offset + count) of every input (buffers of element type `type`) into
// the same elements of every output, with streaming stores when `streaming` (see write_block).
inline void reduce_buffers(dtype type, std::span<const void* const> inputs,
                           std::span<void* const> outputs, std::int64_t offset, std::int64_t count,
                           reduce_op op, bool streaming = false) {
  if (count <= 0 || inputs.empty()) return;
  switch (type) {
    case dtype::f32:
      return reduce_typed<float>(inputs, outputs, offset, count, op, streaming);
    case dtype::f64:
      return reduce_typed<double>(inputs, outputs, offset, count, op, streaming);
    case dtype::bf16:
      return reduce_typed<bf16>(inputs, outputs, offset, count, op, streaming);
    case dtype::f16:
      return reduce_typed<half>(inputs, outputs, offset, count, op, streaming);
    case dtype::i32:
      return reduce_typed<std::int32_t>(inputs, outputs, offset, count, op, streaming);
    case dtype::i64:
      return reduce_typed<std::int64_t>(inputs, outputs, offset, count, op, streaming);
  }
}

}  // namespace quintet::detail
