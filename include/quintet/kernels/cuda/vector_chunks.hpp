// How the CUDA elementwise kernels cut a flat range of elements into vector accesses: chunks of
// `lanes` consecutive elements, each read and written by one access of up to 16 bytes per operand,
// then the tail (fewer than `lanes` elements) one element per thread. An element's arithmetic is
// the same whichever path reaches it, so the chunking changes no bit. Plain C++, tested on the
// host; the functions the kernels call are QUINTET_HOST_DEVICE (nothing under g++).
#pragma once

#include <quintet/core/config.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace quintet::kernels::cuda_impl {

// The widest access a thread makes: 16 bytes, one LDG.128/STG.128.
inline constexpr std::size_t vector_access_bytes = 16;

// Elements per chunk for operands of these types: the widest reads 16 bytes (4 floats, 8 bf16, 2
// doubles); a narrower operand's access is smaller (float -> bf16 reads 16 bytes, writes 8).
template <class... T>
inline constexpr int vector_lanes = static_cast<int>(vector_access_bytes /
                                                     std::max({sizeof(T)...}));

// True when a chunk of `lanes` elements of `element_bytes` each, starting at `pointer`, is aligned
// for one access: the chunks of an operand start at pointer, pointer + lanes, ... elements.
QUINTET_HOST_DEVICE inline bool chunk_aligned(const void* pointer, int lanes,
                                             std::size_t element_bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) %
             (static_cast<std::size_t>(lanes) * element_bytes) ==
         0;
}

// `count` elements as count / lanes chunks from element 0, then the tail elements.
struct chunked_range {
  std::int64_t count;
  int lanes;

  QUINTET_HOST_DEVICE std::int64_t chunks() const { return count / lanes; }
  QUINTET_HOST_DEVICE std::int64_t tail_begin() const { return chunks() * lanes; }
  // Units of work a grid should have threads for: chunks and tail elements.
  QUINTET_HOST_DEVICE std::int64_t work_items() const { return chunks() + (count - tail_begin()); }
};

// The share of thread `thread` of `threads` (a grid-stride loop): chunk(first element) for chunks
// thread, thread + threads, ..., then element(i) for tail elements i = tail_begin + thread, ...
template <class Chunk, class Element>
QUINTET_HOST_DEVICE void for_each_share(chunked_range range, std::int64_t thread,
                                        std::int64_t threads, Chunk&& chunk, Element&& element) {
  const std::int64_t chunks = range.chunks();
  for (std::int64_t c = thread; c < chunks; c += threads) chunk(c * range.lanes);
  for (std::int64_t i = range.tail_begin() + thread; i < range.count; i += threads) element(i);
}

}  // namespace quintet::kernels::cuda_impl
