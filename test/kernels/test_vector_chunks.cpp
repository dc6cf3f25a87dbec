// How the CUDA elementwise maps cut a flat range into 16-byte chunks and a tail, on the host: every
// element reached exactly once, by a chunk at a multiple of the lanes or as a tail element, for
// any number of threads; the lanes per operand type; alignment as the kernels test it.
#include <catch2/catch.hpp>

#include <quintet/core/bf16.hpp>
#include <quintet/kernels/cuda/vector_chunks.hpp>

#include <cstdint>
#include <vector>

namespace chunks = quintet::kernels::cuda_impl;

TEST_CASE("vector chunks: lanes fill 16 bytes for the widest operand", "[kernels][tiling]") {
  STATIC_REQUIRE(chunks::vector_lanes<float> == 4);
  STATIC_REQUIRE(chunks::vector_lanes<double> == 2);
  STATIC_REQUIRE(chunks::vector_lanes<quintet::bf16> == 8);
  STATIC_REQUIRE(chunks::vector_lanes<quintet::bf16, float> == 4);  // accumulate bf16 into float
  STATIC_REQUIRE(chunks::vector_lanes<float, double> == 2);
  STATIC_REQUIRE(chunks::vector_lanes<float, float, float> == 4);
}

TEST_CASE("vector chunks: a chunk is aligned when its first element is on lanes x size bytes",
          "[kernels][tiling]") {
  alignas(16) float floats[8] = {};
  REQUIRE(chunks::chunk_aligned(floats, 4, sizeof(float)));
  REQUIRE_FALSE(chunks::chunk_aligned(floats + 1, 4, sizeof(float)));
  REQUIRE_FALSE(chunks::chunk_aligned(floats + 2, 4, sizeof(float)));
  REQUIRE(chunks::chunk_aligned(floats + 4, 4, sizeof(float)));
  REQUIRE(chunks::chunk_aligned(floats + 2, 2, sizeof(float)));  // 8 bytes suffice for 2 lanes
  REQUIRE(chunks::chunk_aligned(floats + 1, 1, sizeof(float)));  // one element: always
}

TEST_CASE("vector chunks: every element is reached once, whatever the threads",
          "[kernels][tiling]") {
  for (const std::int64_t count : {0, 1, 3, 4, 5, 17, 64, 1000, 1031, 4099}) {
    for (const int lanes : {1, 2, 4, 8}) {
      for (const std::int64_t threads : {1, 3, 7, 256, 5000}) {
        INFO(count << " elements, " << lanes << " lanes, " << threads << " threads");
        const chunks::chunked_range range{count, lanes};
        REQUIRE(range.tail_begin() <= count);
        REQUIRE(count - range.tail_begin() < lanes);
        REQUIRE(range.work_items() == range.chunks() + (count - range.tail_begin()));
        std::vector<int> reached(static_cast<std::size_t>(count), 0);
        bool chunk_misplaced = false;
        for (std::int64_t thread = 0; thread < threads; ++thread) {
          chunks::for_each_share(
              range, thread, threads,
              [&](std::int64_t first) {
                if (first % lanes != 0 || first + lanes > range.tail_begin())
                  chunk_misplaced = true;
                for (int l = 0; l < lanes; ++l) ++reached[static_cast<std::size_t>(first + l)];
              },
              [&](std::int64_t i) {
                if (i < range.tail_begin()) chunk_misplaced = true;
                ++reached[static_cast<std::size_t>(i)];
              });
        }
        REQUIRE_FALSE(chunk_misplaced);
        for (std::int64_t i = 0; i < count; ++i) {
          INFO("element " << i);
          REQUIRE(reached[static_cast<std::size_t>(i)] == 1);
        }
      }
    }
  }
}
