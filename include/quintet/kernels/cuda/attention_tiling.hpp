// How the CUDA attention kernels cut their work: the head_dim a kernel instance holds, threads per
// row, rows per block, the rows staged in shared memory per step and their bytes, the grid, and
// which tiles a block visits under each mask. Plain C++ (no CUDA), so it is tested on the host; the
// functions the kernels call are QUINTET_HOST_DEVICE (nothing under g++).
#pragma once

#include <quintet/core/config.hpp>
#include <quintet/kernels/attention_layout.hpp>

#include <cstddef>
#include <cstdint>

namespace quintet::kernels::cuda_impl {

// A thread holds 16 columns of a row of one head: columns g, g + lanes, g + 2 lanes, ... for its
// lane g, so the lanes of a row read consecutive shared-memory words (no bank conflict) while every
// row of a warp reads the same staged row (a broadcast). A row's lanes are consecutive threads of
// one warp and add their partial dot products with shuffles.
inline constexpr int attention_lane_columns = 16;
inline constexpr std::int64_t attention_max_head_dim = 128;

// The head_dim capacity a kernel instance is compiled for: the least of 16, 32, 64 and 128 that
// holds head_dim (columns beyond head_dim are zero); 0 when head_dim exceeds 128 or is not
// positive.
QUINTET_HOST_DEVICE constexpr int attention_head_dim_capacity(std::int64_t head_dim) {
  if (head_dim <= 0 || head_dim > attention_max_head_dim) return 0;
  int capacity = attention_lane_columns;
  while (capacity < head_dim) capacity *= 2;
  return capacity;
}

// The shape of one block's work. Rows are queries for the forward and dq kernels and keys for the
// dk/dv kernel; the loop runs over the other side (keys, or queries) `loop` rows at a time, staged
// in shared memory, while each row's state (its q or k and v, running sums) stays in registers.
struct attention_tile {
  int head_dim_capacity;  // 16, 32, 64 or 128 columns per row
  int lanes;              // threads per row: capacity / 16, a power of two dividing 32
  int rows;               // rows a block owns
  int threads;            // rows * lanes, whole warps
  int loop;               // rows staged per step (forward: its scores stay in registers)
};

// 64 rows per block: each staged row is then reused by 64 rows. Double at capacity 128 takes 32:
// 512 threads would cap each at 128 registers, no more than the forward's 64 doubles of state (q,
// output, 32 scores) take alone. 32 staged rows: 32 scores in registers, and shared memory of at
// most 64.5 KiB (double at capacity 128, the only case above the default 48 KiB).
QUINTET_HOST_DEVICE constexpr attention_tile attention_tile_for(int head_dim_capacity,
                                                                int accumulator_bytes) {
  const int lanes = head_dim_capacity / attention_lane_columns;
  const int rows = accumulator_bytes == 8 && head_dim_capacity == 128 ? 32 : 64;
  return {head_dim_capacity, lanes, rows, rows * lanes, 32};
}

// Dynamic shared memory of one block: two staged (loop, capacity) tiles of accumulators (k and v,
// or q and dout), then, for the dk/dv kernel, the staged queries' lse and delta.
QUINTET_HOST_DEVICE constexpr std::size_t attention_shared_bytes(const attention_tile& tile,
                                                                 int accumulator_bytes,
                                                                 bool with_row_statistics) {
  const std::size_t per_row =
      static_cast<std::size_t>(tile.head_dim_capacity) + (with_row_statistics ? 1 : 0);
  return 2 * static_cast<std::size_t>(tile.loop) * per_row *
         static_cast<std::size_t>(accumulator_bytes);
}

// Above 48 KiB a kernel must opt in to more dynamic shared memory (cudaFuncSetAttribute).
inline constexpr std::size_t attention_default_shared_bytes = std::size_t{48} << 10;

// Row tiles covering `rows_total` rows.
QUINTET_HOST_DEVICE constexpr std::int64_t attention_row_tiles(std::int64_t rows_total,
                                                               const attention_tile& tile) {
  return (rows_total + tile.rows - 1) / tile.rows;
}

// The grid is one x dimension of batch * heads * tiles blocks (y and z stop at 65535).
struct attention_block {
  std::int64_t batch, head, tile;
};

// Block `block` of the grid: consecutive blocks share (batch, head), so the rows they stage stay
// in L2. last_tile_first reverses the tiles within a head: under the causal mask the last query
// tiles read the most keys, and starting them first shortens the tail (the forward and dq; the
// dk/dv kernel's heaviest key tiles are the first ones already).
QUINTET_HOST_DEVICE constexpr attention_block attention_block_at(std::int64_t block,
                                                                 std::int64_t tiles,
                                                                 std::int64_t heads,
                                                                 bool last_tile_first) {
  const std::int64_t in_head = block % tiles, head_index = block / tiles;
  return {head_index / heads, head_index % heads, last_tile_first ? tiles - 1 - in_head : in_head};
}

// Forward and dq: how many keys the query tile [first_query, first_query + rows) reads, from key 0.
// Under the causal mask (keys == queries) only those up to its last query: key tiles wholly above
// the diagonal are skipped. Under the full mask all of them.
QUINTET_HOST_DEVICE constexpr std::int64_t attention_keys_read(attention_mask mask,
                                                               std::int64_t first_query,
                                                               std::int64_t rows,
                                                               std::int64_t queries,
                                                               std::int64_t keys) {
  if (mask == attention_mask::full) return keys;
  return first_query + rows < queries ? first_query + rows : queries;
}

// dk/dv: the first query the key tile starting at first_key reads (it reads on to the last one):
// under the causal mask no earlier query sees any of its keys.
QUINTET_HOST_DEVICE constexpr std::int64_t attention_first_query_read(attention_mask mask,
                                                                      std::int64_t first_key) {
  return mask == attention_mask::causal ? first_key : 0;
}

// ---- the tensor-core path: bf16 operands at head_dim 64 (kernels/cuda/attention_mma.cuh) ----
//
// A block of 4 warps owns 64 rows (queries for the forward and dq, keys for dk/dv), 16 per warp,
// and loops over the other side 64 rows at a time. Operand tiles are staged in shared memory as
// bf16 rows of 64 + 8 elements: 144 bytes, so the 8 rows an ldmatrix reads at once (16 bytes
// each) start in 8 different bank groups, and every row stays 16-byte aligned.
inline constexpr int attention_mma_head_dim = 64;
inline constexpr int attention_mma_rows = 64;
inline constexpr int attention_mma_warp_rows = 16;
inline constexpr int attention_mma_threads = 32 * attention_mma_rows / attention_mma_warp_rows;
inline constexpr int attention_mma_bf16_pitch = attention_mma_head_dim + 8;

enum class attention_mma_kernel { forward, dq, dkdv };

// Bytes of one staged (64, 72) bf16 tile.
inline constexpr std::size_t attention_mma_staged_bytes =
    std::size_t{attention_mma_rows} * attention_mma_bf16_pitch * 2;

// Dynamic shared memory of a block: the staged tiles (forward: q, k, v; dq: q, dout, k, v; dk/dv:
// k, v, q, dout), then for dk/dv the staged queries' lse and delta (floats).
QUINTET_HOST_DEVICE constexpr std::size_t attention_mma_shared_bytes(attention_mma_kernel kernel) {
  switch (kernel) {
    case attention_mma_kernel::forward:
      return 3 * attention_mma_staged_bytes;
    case attention_mma_kernel::dq:
      return 4 * attention_mma_staged_bytes;
    case attention_mma_kernel::dkdv:
      return 4 * attention_mma_staged_bytes + 2 * std::size_t{attention_mma_rows} * 4;
  }
  return 0;
}

// Row tiles of 64 covering `rows_total` rows.
QUINTET_HOST_DEVICE constexpr std::int64_t attention_mma_row_tiles(std::int64_t rows_total) {
  return (rows_total + attention_mma_rows - 1) / attention_mma_rows;
}

// Whether an operand's rows can be staged 8 bf16 (16 bytes) at a time: its address and both
// strides (in elements) aligned to 16 bytes. With head_dim 64 each head's columns start at a
// multiple of 128 bytes of the row.
QUINTET_HOST_DEVICE constexpr bool attention_mma_rows_aligned(std::uintptr_t address,
                                                              std::int64_t batch_stride,
                                                              std::int64_t seq_stride) {
  return address % 16 == 0 && batch_stride % 8 == 0 && seq_stride % 8 == 0;
}

// delta, merge and the empty result: one warp per (batch, head, query) row, its 32 lanes striding
// over head_dim; 8 warps (256 threads) per block.
inline constexpr int attention_warp_rows = 8;

constexpr std::int64_t attention_warp_row_blocks(std::int64_t rows_total) {
  return (rows_total + attention_warp_rows - 1) / attention_warp_rows;
}

}  // namespace quintet::kernels::cuda_impl
