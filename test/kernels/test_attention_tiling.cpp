// The CUDA attention kernels' tiling decisions, on the host: head_dim capacities, tile shapes that
// fit the hardware (whole warps, a row's lanes inside one warp, registers and shared memory), the
// grid's blocks covering every (batch, head, tile) once, and the tiles each block visits against
// a brute-force walk over the mask.
#include <catch2/catch.hpp>

#include <quintet/kernels/attention_layout.hpp>
#include <quintet/kernels/cuda/attention_tiling.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace k = quintet::kernels;
namespace tiling = quintet::kernels::cuda_impl;

namespace {

bool sees(k::attention_mask mask, std::int64_t query, std::int64_t key, std::int64_t keys) {
  return key < k::visible_keys(mask, query, keys);
}

}  // namespace

TEST_CASE("attention tiling: head_dim capacities", "[kernels][attention][tiling]") {
  const std::vector<std::pair<std::int64_t, int>> expected = {
      {1, 16},  {3, 16},   {16, 16},   {17, 32},   {32, 32}, {33, 64},
      {64, 64}, {65, 128}, {100, 128}, {128, 128}, {129, 0}, {0, 0}};
  for (const auto& [head_dim, capacity] : expected) {
    INFO("head_dim " << head_dim);
    REQUIRE(tiling::attention_head_dim_capacity(head_dim) == capacity);
  }
}

TEST_CASE("attention tiling: tiles fit a CUDA block", "[kernels][attention][tiling]") {
  // Hopper: at most 227 KiB of shared memory per block (opted in), 64 Ki registers per block.
  const std::size_t shared_limit = 227 * 1024;
  for (const int capacity : {16, 32, 64, 128})
    for (const int accumulator_bytes : {4, 8}) {
      INFO("capacity " << capacity << ", accumulator of " << accumulator_bytes << " bytes");
      const auto tile = tiling::attention_tile_for(capacity, accumulator_bytes);
      REQUIRE(tile.head_dim_capacity == capacity);
      REQUIRE(tile.lanes * tiling::attention_lane_columns == capacity);
      REQUIRE(32 % tile.lanes == 0);  // a row's lanes share a warp (the shuffles stay inside it)
      REQUIRE(tile.threads == tile.rows * tile.lanes);
      REQUIRE(tile.threads % 32 == 0);  // whole warps: every shuffle has its full mask
      // The forward's state is 64 accumulators a thread (q, output, 32 scores): 128 registers
      // allow 512 threads of floats, 256 of doubles.
      REQUIRE(tile.threads <= (accumulator_bytes == 4 ? 512 : 256));
      REQUIRE(tile.loop == 32);
      REQUIRE(tile.rows >= tile.loop);
      const std::size_t staged = 2 * std::size_t(tile.loop) * capacity * accumulator_bytes;
      REQUIRE(tiling::attention_shared_bytes(tile, accumulator_bytes, false) == staged);
      REQUIRE(tiling::attention_shared_bytes(tile, accumulator_bytes, true) ==
              staged + 2 * std::size_t(tile.loop) * accumulator_bytes);
      REQUIRE(tiling::attention_shared_bytes(tile, accumulator_bytes, true) <= shared_limit);
      // Only double at capacity 128 asks for more than the default 48 KiB.
      const bool opt_in = tiling::attention_shared_bytes(tile, accumulator_bytes, true) >
                          tiling::attention_default_shared_bytes;
      REQUIRE(opt_in == (accumulator_bytes == 8 && capacity == 128));
    }
  REQUIRE(tiling::attention_tile_for(128, 4).rows == 64);
  REQUIRE(tiling::attention_tile_for(128, 8).rows == 32);
}

TEST_CASE("attention tiling: the grid covers every (batch, head, tile) once",
          "[kernels][attention][tiling]") {
  const auto tile = tiling::attention_tile_for(64, 4);
  REQUIRE(tiling::attention_row_tiles(1, tile) == 1);
  REQUIRE(tiling::attention_row_tiles(64, tile) == 1);
  REQUIRE(tiling::attention_row_tiles(65, tile) == 2);
  REQUIRE(tiling::attention_row_tiles(300, tile) == 5);
  REQUIRE(tiling::attention_warp_row_blocks(1) == 1);
  REQUIRE(tiling::attention_warp_row_blocks(8) == 1);
  REQUIRE(tiling::attention_warp_row_blocks(9) == 2);
  for (const bool last_tile_first : {false, true})
    for (const auto& [batch, heads, tiles] :
         {std::tuple{1, 1, 1}, std::tuple{2, 3, 1}, std::tuple{2, 3, 5}, std::tuple{3, 1, 4}}) {
      INFO("batch " << batch << " heads " << heads << " tiles " << tiles << " last tile first "
                    << last_tile_first);
      std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> seen;
      for (std::int64_t block = 0; block < batch * heads * tiles; ++block) {
        const auto at = tiling::attention_block_at(block, tiles, heads, last_tile_first);
        REQUIRE(at.batch >= 0);
        REQUIRE(at.batch < batch);
        REQUIRE(at.head >= 0);
        REQUIRE(at.head < heads);
        REQUIRE(at.tile >= 0);
        REQUIRE(at.tile < tiles);
        seen.insert({at.batch, at.head, at.tile});
        // Consecutive blocks stay on one (batch, head) until its tiles are done.
        const auto first =
            tiling::attention_block_at(block - block % tiles, tiles, heads, last_tile_first);
        REQUIRE(at.batch == first.batch);
        REQUIRE(at.head == first.head);
        REQUIRE(at.tile == (last_tile_first ? tiles - 1 - block % tiles : block % tiles));
      }
      REQUIRE(static_cast<std::int64_t>(seen.size()) == batch * heads * tiles);
    }
}

TEST_CASE("attention tiling: query tiles read exactly the key steps with a visible key",
          "[kernels][attention][tiling]") {
  // Forward and dq: a query tile reads keys [0, keys_read) in steps of `loop`. Every key one of
  // its queries sees must lie inside, and every step read must hold a key one of them sees (the
  // causal mask skips the steps wholly above the diagonal).
  for (const auto& [capacity, bytes] : {std::pair{16, 4}, std::pair{128, 4}, std::pair{128, 8}}) {
    const auto tile = tiling::attention_tile_for(capacity, bytes);
    for (const auto mask : {k::attention_mask::causal, k::attention_mask::full})
      for (const auto& [queries, keys_full] :
           {std::pair{1, 1}, std::pair{5, 7}, std::pair{64, 3}, std::pair{65, 130},
            std::pair{130, 33}, std::pair{300, 300}}) {
        const std::int64_t keys = mask == k::attention_mask::causal ? queries : keys_full;
        for (std::int64_t first = 0; first < queries; first += tile.rows) {
          INFO("rows " << tile.rows << " queries " << queries << " keys " << keys << " first "
                       << first << " mask "
                       << (mask == k::attention_mask::causal ? "causal" : "full"));
          const std::int64_t end =
              tiling::attention_keys_read(mask, first, tile.rows, queries, keys);
          REQUIRE(end <= keys);
          const std::int64_t last = std::min<std::int64_t>(first + tile.rows, queries);
          for (std::int64_t i = first; i < last; ++i)
            for (std::int64_t j = 0; j < keys; ++j)
              if (sees(mask, i, j, keys)) REQUIRE(j < end);
          for (std::int64_t step = 0; step < end; step += tile.loop) {
            bool useful = false;
            for (std::int64_t i = first; i < last; ++i)
              for (std::int64_t j = step; j < std::min(step + tile.loop, keys); ++j)
                useful = useful || sees(mask, i, j, keys);
            REQUIRE(useful);
          }
        }
      }
  }
}

TEST_CASE("attention tiling: key tiles read the queries from the first that sees them",
          "[kernels][attention][tiling]") {
  // dk/dv: a key tile reads queries [first_query_read, queries). No earlier query sees any of its
  // keys, and the first one read sees one.
  for (const auto& [capacity, bytes] : {std::pair{32, 4}, std::pair{128, 8}}) {
    const auto tile = tiling::attention_tile_for(capacity, bytes);
    for (const auto mask : {k::attention_mask::causal, k::attention_mask::full})
      for (const auto& [queries, keys_full] : {std::pair{1, 1}, std::pair{5, 7}, std::pair{65, 130},
                                               std::pair{130, 33}, std::pair{300, 300}}) {
        const std::int64_t keys = mask == k::attention_mask::causal ? queries : keys_full;
        for (std::int64_t first_key = 0; first_key < keys; first_key += tile.rows) {
          INFO("rows " << tile.rows << " queries " << queries << " keys " << keys << " first key "
                       << first_key << " mask "
                       << (mask == k::attention_mask::causal ? "causal" : "full"));
          const std::int64_t begin = tiling::attention_first_query_read(mask, first_key);
          const std::int64_t last_key = std::min<std::int64_t>(first_key + tile.rows, keys);
          std::int64_t first_seeing = queries;
          for (std::int64_t i = queries - 1; i >= 0; --i)
            for (std::int64_t j = first_key; j < last_key; ++j)
              if (sees(mask, i, j, keys)) first_seeing = i;
          REQUIRE(begin == first_seeing);
        }
      }
  }
}

TEST_CASE("attention tiling: the tensor-core kernels' tiles and shared memory",
          "[kernels][attention][tiling]") {
  // Whole warps of 16 rows each (an mma tile's rows), whole 16-column slabs of the head.
  REQUIRE(tiling::attention_mma_threads == 128);
  REQUIRE(tiling::attention_mma_warp_rows == 16);
  REQUIRE(tiling::attention_mma_threads / 32 * tiling::attention_mma_warp_rows ==
          tiling::attention_mma_rows);
  REQUIRE(tiling::attention_mma_head_dim % 16 == 0);
  REQUIRE(tiling::attention_mma_rows % 32 == 0);  // the backward's halves of 32
  // ldmatrix: each row address 16-byte aligned; 8 consecutive rows in 8 distinct 16-byte bank
  // groups (a pitch that is an odd multiple of 16 bytes).
  const int pitch_bytes = tiling::attention_mma_bf16_pitch * 2;
  REQUIRE(pitch_bytes % 16 == 0);
  REQUIRE((pitch_bytes / 16) % 2 == 1);
  std::set<int> groups;
  for (int row = 0; row < 8; ++row) groups.insert(row * pitch_bytes / 16 % 8);
  REQUIRE(groups.size() == 8);
  REQUIRE(tiling::attention_mma_bf16_pitch >= tiling::attention_mma_head_dim);
  // Staging: 16-byte loads of a head's 64 columns.
  REQUIRE(tiling::attention_mma_head_dim % 8 == 0);
  using kernel = tiling::attention_mma_kernel;
  const std::size_t staged = 64 * 72 * 2;
  REQUIRE(tiling::attention_mma_staged_bytes == staged);
  REQUIRE(tiling::attention_mma_shared_bytes(kernel::forward) == 3 * staged);
  REQUIRE(tiling::attention_mma_shared_bytes(kernel::dq) == 4 * staged);
  REQUIRE(tiling::attention_mma_shared_bytes(kernel::dkdv) == 4 * staged + 2 * 64 * 4);
  // Each fits the default 48 KiB a block (no opt-in), and four blocks of the largest fit an SM
  // of sm_80 (164 KiB).
  for (const auto which : {kernel::forward, kernel::dq, kernel::dkdv})
    REQUIRE(tiling::attention_mma_shared_bytes(which) <= tiling::attention_default_shared_bytes);
  REQUIRE(4 * tiling::attention_mma_shared_bytes(kernel::dkdv) <= 164 * 1024);

  REQUIRE(tiling::attention_mma_row_tiles(1) == 1);
  REQUIRE(tiling::attention_mma_row_tiles(64) == 1);
  REQUIRE(tiling::attention_mma_row_tiles(65) == 2);
  REQUIRE(tiling::attention_mma_row_tiles(1024) == 16);
}

TEST_CASE("attention tiling: operands the tensor-core kernels can stage",
          "[kernels][attention][tiling]") {
  // q, k, v as slices of a fused (batch, seq, 3 * 12 * 64) projection: aligned.
  REQUIRE(tiling::attention_mma_rows_aligned(0x1000 + 768 * 2, 1024 * 2304, 2304));
  REQUIRE(tiling::attention_mma_rows_aligned(0x1000, 0, 64));
  // An address off 16 bytes, or a stride that is not a multiple of 8 elements: refused.
  REQUIRE_FALSE(tiling::attention_mma_rows_aligned(0x1008, 1024 * 2304, 2304));
  REQUIRE_FALSE(tiling::attention_mma_rows_aligned(0x1000, 1024 * 2304, 2308));
  REQUIRE_FALSE(tiling::attention_mma_rows_aligned(0x1000, 1000 * 2308 + 4, 2304));
}
