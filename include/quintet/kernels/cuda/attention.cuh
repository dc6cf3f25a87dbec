// attention on cuda tensors: flash-attention-style kernels on the host's layout and numerics, in
// plain FMA arithmetic: float for float, bf16 and half (storage widened on load), double for
// double. bf16 at head_dim 64 on sm_80 and newer takes the tensor-core kernels of
// kernels/cuda/attention_mma.cuh instead (same blocks and order; p and ds rounded to bf16 before
// their products). Tiling, grid and visited tiles: kernels/cuda/attention_tiling.hpp.
//
// forward   a block owns a tile of queries of one (batch, head), each query's q, running max, sum
//           and output in registers, and loops over key tiles staged in shared memory (those
//           wholly above the causal diagonal skipped): scores, an online-softmax rescale, p v.
//           Writes out and lse; a query that sees no key (a full block of 0 keys) gets out 0 and
//           lse -inf, as on the host.
// backward  p = exp(s - lse) recomputed per tile. delta = rowsum(dout * out) first (whole
//           backward), then two kernels, each summing in a fixed order with no atomics, so the
//           bits do not depend on scheduling: dk, dv per key tile looping over query tiles, and
//           dq per query tile looping over key tiles (the scores are computed twice for that).
//           attention_backward overwrites dq, dk, dv; attention_backward_block adds to them.
// delta, merge: one warp per (batch, head, query) row.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/attention_layout.hpp>
#include <quintet/kernels/cuda/attention_mma.cuh>
#include <quintet/kernels/cuda/attention_tiling.hpp>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace quintet::kernels {

namespace cuda_impl {

__device__ inline float device_exp(float x) { return expf(x); }
__device__ inline double device_exp(double x) { return exp(x); }
__device__ inline float device_log(float x) { return logf(x); }
__device__ inline double device_log(double x) { return log(x); }
__device__ inline float device_log1p(float x) { return log1pf(x); }
__device__ inline double device_log1p(double x) { return log1p(x); }
__device__ inline float device_abs(float x) { return fabsf(x); }
__device__ inline double device_abs(double x) { return fabs(x); }

template <class Acc>
__device__ inline Acc negative_infinity() {
  return -static_cast<Acc>(INFINITY);
}

template <class Acc>
__device__ inline Acc larger(Acc a, Acc b) {
  return a < b ? b : a;
}

// The sum of a value over the `Lanes` consecutive threads of a row (an xor butterfly inside one
// warp). Every lane ends with the same bits: each step adds the same two partial sums, and a + b
// equals b + a exactly. The whole warp must call it (full mask).
template <int Lanes, class Acc>
__device__ inline Acc row_sum(Acc partial) {
#pragma unroll
  for (int offset = 1; offset < Lanes; offset *= 2)
    partial += __shfl_xor_sync(0xffffffffu, partial, offset);
  return partial;
}

// The tile a kernel instance uses: see attention_tile_for.
template <class Acc, int Capacity>
inline constexpr attention_tile tile_of = attention_tile_for(Capacity, sizeof(Acc));

// Stages rows [first_row, first_row + Loop) of two (batch, seq, width) operands, head columns
// [column, column + head_dim), into (Loop, Capacity) shared tiles of accumulators; rows at or past
// row_end and columns past head_dim are zero.
template <class T, class Acc, int Capacity, int Threads, int Loop>
__device__ inline void stage_rows(rows3<const T> a, rows3<const T> b, Acc* a_tile, Acc* b_tile,
                                  std::int64_t batch, std::int64_t first_row, std::int64_t row_end,
                                  std::int64_t column, int head_dim) {
  for (int at = threadIdx.x; at < Loop * Capacity; at += Threads) {
    const int r = at / Capacity, e = at % Capacity;
    const std::int64_t row = first_row + r;
    const bool inside = row < row_end && e < head_dim;
    a_tile[at] = inside ? widen(a.at(batch, row)[column + e]) : Acc(0);
    b_tile[at] = inside ? widen(b.at(batch, row)[column + e]) : Acc(0);
  }
}

// A row's 16 columns held by one lane: columns lane, lane + Lanes, ... (zero past head_dim or for
// a row past the end).
template <class T, class Acc, int Lanes>
__device__ inline void load_lane_columns(const T* row, bool row_valid, int lane, int head_dim,
                                         Acc (&values)[attention_lane_columns]) {
#pragma unroll
  for (int t = 0; t < attention_lane_columns; ++t) {
    const int e = lane + Lanes * t;
    values[t] = row_valid && e < head_dim ? widen(row[e]) : Acc(0);
  }
}

// The lane's part of the dot product of its row with staged row `staged` (its Capacity columns).
template <class Acc, int Lanes, int Capacity>
__device__ inline Acc partial_dot(const Acc (&values)[attention_lane_columns], const Acc* tile,
                                  int staged, int lane) {
  const Acc* row = tile + staged * Capacity + lane;
  Acc sum = 0;
#pragma unroll
  for (int t = 0; t < attention_lane_columns; ++t) sum += values[t] * row[Lanes * t];
  return sum;
}

// Shared memory of every attention kernel, typed per instance.
extern __shared__ __align__(16) unsigned char attention_shared[];

// out (batch, seq, width) and lse (batch, heads, seq): blocks as attention_block_at (last query
// tile first); thread (row, lane) of a block holds query first_query + row. Per key tile, in key
// order: s_j = scale q . k_j (masked: -inf), m' = max(m, max_j s_j), sum and output rescaled by
// exp(m - m'), then p_j = exp(s_j - m') added to the sum and p_j v_j to the output. At the end
// out = output / sum, lse = m + log(sum).
template <class T, class Acc, int Capacity>
__global__ void __launch_bounds__((tile_of<Acc, Capacity>.threads))
    attention_forward_kernel(rows3<const T> q, rows3<const T> k, rows3<const T> v, rows3<T> out,
                             Acc* lse, attention_sizes n, Acc scale, attention_mask mask,
                             std::int64_t tiles) {
  constexpr attention_tile tile = tile_of<Acc, Capacity>;
  constexpr int lanes = tile.lanes, loop = tile.loop, columns = attention_lane_columns;
  const attention_block block = attention_block_at(blockIdx.x, tiles, n.heads, true);
  const int lane = static_cast<int>(threadIdx.x) % lanes,
            row = static_cast<int>(threadIdx.x) / lanes;
  const int head_dim = static_cast<int>(n.head_dim);
  const std::int64_t keys = n.keys(), column = block.head * n.head_dim;
  const std::int64_t first_query = block.tile * tile.rows, i = first_query + row;
  const bool row_valid = i < n.seq;
  Acc* k_tile = reinterpret_cast<Acc*>(attention_shared);  // (loop, Capacity)
  Acc* v_tile = k_tile + loop * Capacity;                  // (loop, Capacity)

  Acc q_part[columns], output[columns];
  load_lane_columns<T, Acc, lanes>(q.at(block.batch, row_valid ? i : 0) + column, row_valid, lane,
                                   head_dim, q_part);
#pragma unroll
  for (int t = 0; t < columns; ++t) output[t] = 0;
  Acc running_max = negative_infinity<Acc>(), running_sum = 0;

  const std::int64_t key_end = attention_keys_read(mask, first_query, tile.rows, n.seq, keys);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += loop) {
    __syncthreads();  // every thread is done with the previous key tile
    stage_rows<T, Acc, Capacity, tile.threads, loop>(k, v, k_tile, v_tile, block.batch, j0, keys,
                                                     column, head_dim);
    __syncthreads();
    Acc score[loop];
    Acc tile_max = negative_infinity<Acc>();
#pragma unroll
    for (int c = 0; c < loop; ++c) {
      const Acc dot = row_sum<lanes>(partial_dot<Acc, lanes, Capacity>(q_part, k_tile, c, lane));
      const std::int64_t j = j0 + c;
      const bool visible = row_valid && j < keys && (mask == attention_mask::full || j <= i);
      score[c] = visible ? scale * dot : negative_infinity<Acc>();
      tile_max = larger(tile_max, score[c]);
    }
    const Acc new_max = larger(running_max, tile_max);
    // Before the first visible key the sums are empty (and exp(-inf - -inf) would be NaN).
    const Acc rescale =
        running_max == negative_infinity<Acc>() ? Acc(0) : device_exp(running_max - new_max);
    running_sum *= rescale;
#pragma unroll
    for (int t = 0; t < columns; ++t) output[t] *= rescale;
#pragma unroll
    for (int c = 0; c < loop; ++c) {
      const Acc p = score[c] == negative_infinity<Acc>() ? Acc(0) : device_exp(score[c] - new_max);
      running_sum += p;
      const Acc* v_row = v_tile + c * Capacity + lane;
#pragma unroll
      for (int t = 0; t < columns; ++t) output[t] += p * v_row[lanes * t];
    }
    running_max = new_max;
  }
  if (!row_valid) return;
  // Every query sees key 0 (causal) or every key (full, keys > 0): running_sum >= 1.
  const Acc inverse = Acc(1) / running_sum;
  T* out_row = out.at(block.batch, i) + column;
#pragma unroll
  for (int t = 0; t < columns; ++t) {
    const int e = lane + lanes * t;
    if (e < head_dim) out_row[e] = narrow<T>(output[t] * inverse);
  }
  if (lane == 0)
    lse[(block.batch * n.heads + block.head) * n.seq + i] = running_max + device_log(running_sum);
}

// dq (batch, seq, width): blocks and rows as the forward's. Per key j in key order, with
// p = exp(scale q . k_j - lse) for the visible keys and ds = p (dout . v_j - delta):
// dq_sum += ds k_j; then dq = (Accumulate ? dq : 0) + scale dq_sum, as the host adds it.
template <class T, class Acc, int Capacity, bool Accumulate>
__global__ void __launch_bounds__((tile_of<Acc, Capacity>.threads))
    attention_dq_kernel(rows3<const T> q, rows3<const T> k, rows3<const T> v, rows3<const T> dout,
                        const Acc* lse, const Acc* delta, rows3<T> dq, attention_sizes n, Acc scale,
                        attention_mask mask, std::int64_t tiles) {
  constexpr attention_tile tile = tile_of<Acc, Capacity>;
  constexpr int lanes = tile.lanes, loop = tile.loop, columns = attention_lane_columns;
  const attention_block block = attention_block_at(blockIdx.x, tiles, n.heads, true);
  const int lane = static_cast<int>(threadIdx.x) % lanes,
            row = static_cast<int>(threadIdx.x) / lanes;
  const int head_dim = static_cast<int>(n.head_dim);
  const std::int64_t keys = n.keys(), column = block.head * n.head_dim;
  const std::int64_t first_query = block.tile * tile.rows, i = first_query + row;
  const bool row_valid = i < n.seq;
  const std::int64_t statistic = (block.batch * n.heads + block.head) * n.seq + i;
  Acc* k_tile = reinterpret_cast<Acc*>(attention_shared);  // (loop, Capacity)
  Acc* v_tile = k_tile + loop * Capacity;                  // (loop, Capacity)

  Acc q_part[columns], dout_part[columns], dq_sum[columns];
  load_lane_columns<T, Acc, lanes>(q.at(block.batch, row_valid ? i : 0) + column, row_valid, lane,
                                   head_dim, q_part);
  load_lane_columns<T, Acc, lanes>(dout.at(block.batch, row_valid ? i : 0) + column, row_valid,
                                   lane, head_dim, dout_part);
#pragma unroll
  for (int t = 0; t < columns; ++t) dq_sum[t] = 0;
  const Acc lse_i = row_valid ? lse[statistic] : Acc(0);
  const Acc delta_i = row_valid ? delta[statistic] : Acc(0);

  const std::int64_t key_end = attention_keys_read(mask, first_query, tile.rows, n.seq, keys);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += loop) {
    __syncthreads();  // every thread is done with the previous key tile
    stage_rows<T, Acc, Capacity, tile.threads, loop>(k, v, k_tile, v_tile, block.batch, j0, keys,
                                                     column, head_dim);
    __syncthreads();
#pragma unroll 4
    for (int c = 0; c < loop; ++c) {
      const Acc s = row_sum<lanes>(partial_dot<Acc, lanes, Capacity>(q_part, k_tile, c, lane));
      const Acc dp = row_sum<lanes>(partial_dot<Acc, lanes, Capacity>(dout_part, v_tile, c, lane));
      const std::int64_t j = j0 + c;
      const bool visible = row_valid && j < keys && (mask == attention_mask::full || j <= i);
      const Acc p = visible ? device_exp(scale * s - lse_i) : Acc(0);
      const Acc ds = p * (dp - delta_i);
      const Acc* k_row = k_tile + c * Capacity + lane;
#pragma unroll
      for (int t = 0; t < columns; ++t) dq_sum[t] += ds * k_row[lanes * t];
    }
  }
  if (!row_valid) return;
  T* dq_row = dq.at(block.batch, i) + column;
#pragma unroll
  for (int t = 0; t < columns; ++t) {
    const int e = lane + lanes * t;
    if (e >= head_dim) continue;
    const Acc base = Accumulate ? widen(dq_row[e]) : Acc(0);
    dq_row[e] = narrow<T>(base + scale * dq_sum[t]);
  }
}

// dk, dv (batch, keys, width): blocks as attention_block_at (first key tile first); thread (row,
// lane) of a block holds key first_key + row. Per query i in query order from the first that sees
// the tile, with p and ds as in the dq kernel: dv_sum += p dout_i, dk_sum += ds q_i; then
// dk = (Accumulate ? dk : 0) + scale dk_sum, dv = (Accumulate ? dv : 0) + dv_sum.
template <class T, class Acc, int Capacity, bool Accumulate>
__global__ void __launch_bounds__((tile_of<Acc, Capacity>.threads))
    attention_dkdv_kernel(rows3<const T> q, rows3<const T> k, rows3<const T> v, rows3<const T> dout,
                          const Acc* lse, const Acc* delta, rows3<T> dk, rows3<T> dv,
                          attention_sizes n, Acc scale, attention_mask mask, std::int64_t tiles) {
  constexpr attention_tile tile = tile_of<Acc, Capacity>;
  constexpr int lanes = tile.lanes, loop = tile.loop, columns = attention_lane_columns;
  const attention_block block = attention_block_at(blockIdx.x, tiles, n.heads, false);
  const int lane = static_cast<int>(threadIdx.x) % lanes,
            row = static_cast<int>(threadIdx.x) / lanes;
  const int head_dim = static_cast<int>(n.head_dim);
  const std::int64_t keys = n.keys(), column = block.head * n.head_dim;
  const std::int64_t first_key = block.tile * tile.rows, j = first_key + row;
  const bool row_valid = j < keys;
  const std::int64_t statistics = (block.batch * n.heads + block.head) * n.seq;
  Acc* q_tile = reinterpret_cast<Acc*>(attention_shared);  // (loop, Capacity)
  Acc* dout_tile = q_tile + loop * Capacity;               // (loop, Capacity)
  Acc* lse_tile = dout_tile + loop * Capacity;             // (loop)
  Acc* delta_tile = lse_tile + loop;                       // (loop)

  Acc k_part[columns], v_part[columns], dk_sum[columns], dv_sum[columns];
  load_lane_columns<T, Acc, lanes>(k.at(block.batch, row_valid ? j : 0) + column, row_valid, lane,
                                   head_dim, k_part);
  load_lane_columns<T, Acc, lanes>(v.at(block.batch, row_valid ? j : 0) + column, row_valid, lane,
                                   head_dim, v_part);
#pragma unroll
  for (int t = 0; t < columns; ++t) dk_sum[t] = dv_sum[t] = 0;

  for (std::int64_t i0 = attention_first_query_read(mask, first_key); i0 < n.seq; i0 += loop) {
    __syncthreads();  // every thread is done with the previous query tile
    stage_rows<T, Acc, Capacity, tile.threads, loop>(q, dout, q_tile, dout_tile, block.batch, i0,
                                                     n.seq, column, head_dim);
    for (int r = static_cast<int>(threadIdx.x); r < loop; r += tile.threads) {
      const bool inside = i0 + r < n.seq;
      lse_tile[r] = inside ? lse[statistics + i0 + r] : Acc(0);
      delta_tile[r] = inside ? delta[statistics + i0 + r] : Acc(0);
    }
    __syncthreads();
#pragma unroll 4
    for (int r = 0; r < loop; ++r) {
      const Acc s = row_sum<lanes>(partial_dot<Acc, lanes, Capacity>(k_part, q_tile, r, lane));
      const Acc dp = row_sum<lanes>(partial_dot<Acc, lanes, Capacity>(v_part, dout_tile, r, lane));
      const std::int64_t i = i0 + r;
      const bool visible = row_valid && i < n.seq && (mask == attention_mask::full || j <= i);
      const Acc p = visible ? device_exp(scale * s - lse_tile[r]) : Acc(0);
      const Acc ds = p * (dp - delta_tile[r]);
      const Acc* q_row = q_tile + r * Capacity + lane;
      const Acc* dout_row = dout_tile + r * Capacity + lane;
#pragma unroll
      for (int t = 0; t < columns; ++t) {
        dv_sum[t] += p * dout_row[lanes * t];
        dk_sum[t] += ds * q_row[lanes * t];
      }
    }
  }
  if (!row_valid) return;
  T* dk_row = dk.at(block.batch, j) + column;
  T* dv_row = dv.at(block.batch, j) + column;
#pragma unroll
  for (int t = 0; t < columns; ++t) {
    const int e = lane + lanes * t;
    if (e >= head_dim) continue;
    const Acc dk_base = Accumulate ? widen(dk_row[e]) : Acc(0);
    const Acc dv_base = Accumulate ? widen(dv_row[e]) : Acc(0);
    dk_row[e] = narrow<T>(dk_base + scale * dk_sum[t]);
    dv_row[e] = narrow<T>(dv_base + dv_sum[t]);
  }
}

// The (batch, head, query) row a warp of the row kernels owns; false past the last row (the
// whole warp leaves together).
struct warp_row {
  std::int64_t index, batch, head, query;
  int lane;
};

__device__ inline bool warp_row_of(attention_sizes n, warp_row& at) {
  at.index = std::int64_t{blockIdx.x} * attention_warp_rows + threadIdx.x / 32;
  at.lane = static_cast<int>(threadIdx.x % 32);
  if (at.index >= n.batch * n.heads * n.seq) return false;
  at.query = at.index % n.seq;
  at.head = at.index / n.seq % n.heads;
  at.batch = at.index / n.seq / n.heads;
  return true;
}

// delta[b, h, i] = dout_i . out_i over the head's columns: each lane sums columns lane,
// lane + 32, ... in order, then the lanes' sums meet in a fixed butterfly.
template <class T, class Acc>
__global__ void __launch_bounds__(attention_warp_rows * 32)
    attention_delta_kernel(rows3<const T> dout, rows3<const T> out, Acc* delta, attention_sizes n) {
  warp_row at;
  if (!warp_row_of(n, at)) return;
  const std::int64_t column = at.head * n.head_dim;
  const T* dout_row = dout.at(at.batch, at.query) + column;
  const T* out_row = out.at(at.batch, at.query) + column;
  Acc partial = 0;
  for (std::int64_t e = at.lane; e < n.head_dim; e += 32)
    partial += widen(dout_row[e]) * widen(out_row[e]);
  const Acc sum = row_sum<32>(partial);
  if (at.lane == 0) delta[at.index] = sum;
}

// The host's merge, row by row: a block of no keys (block_lse -inf) changes nothing; a row that has
// seen no key yet (lse -inf) takes the block's result; otherwise lse' = max + log1p(exp(-|a - b|))
// and out = out exp(lse - lse') + block_out exp(block_lse - lse').
template <class T, class Acc>
__global__ void __launch_bounds__(attention_warp_rows * 32)
    attention_merge_kernel(rows3<T> out, Acc* lse, rows3<const T> block_out, const Acc* block_lse,
                           attention_sizes n) {
  warp_row at;
  if (!warp_row_of(n, at)) return;
  const Acc mine = lse[at.index], theirs = block_lse[at.index];
  if (theirs == negative_infinity<Acc>()) return;
  const std::int64_t column = at.head * n.head_dim;
  T* out_row = out.at(at.batch, at.query) + column;
  const T* block_row = block_out.at(at.batch, at.query) + column;
  Acc merged = theirs;
  if (mine == negative_infinity<Acc>()) {
    for (std::int64_t e = at.lane; e < n.head_dim; e += 32) out_row[e] = block_row[e];
  } else {
    merged = larger(mine, theirs) + device_log1p(device_exp(-device_abs(mine - theirs)));
    const Acc keep = device_exp(mine - merged), take = device_exp(theirs - merged);
    for (std::int64_t e = at.lane; e < n.head_dim; e += 32)
      out_row[e] = narrow<T>(keep * widen(out_row[e]) + take * widen(block_row[e]));
  }
  __syncwarp();  // every lane has read lse before lane 0 replaces it
  if (at.lane == 0) lse[at.index] = merged;
}

// The result over no keys: out 0 and lse -inf for every row.
template <class T, class Acc>
__global__ void __launch_bounds__(attention_warp_rows * 32)
    attention_empty_kernel(rows3<T> out, Acc* lse, attention_sizes n) {
  warp_row at;
  if (!warp_row_of(n, at)) return;
  T* out_row = out.at(at.batch, at.query) + at.head * n.head_dim;
  for (std::int64_t e = at.lane; e < n.head_dim; e += 32) out_row[e] = T(0.0f);
  if (at.lane == 0) lse[at.index] = negative_infinity<Acc>();
}

inline unsigned grid_blocks(std::int64_t blocks, const char* kernel) {
  QUINTET_CHECK(blocks <= 2147483647, "{} on cuda: {} blocks exceed the grid's 2^31 - 1", kernel,
                blocks);
  return static_cast<unsigned>(blocks);
}

// Calls launch(std::integral_constant<int, capacity>) for head_dim's capacity (16, 32, 64, 128).
template <class Launch>
void with_head_dim_capacity(std::int64_t head_dim, const char* kernel, Launch&& launch) {
  switch (attention_head_dim_capacity(head_dim)) {
    case 16:
      launch(std::integral_constant<int, 16>{});
      return;
    case 32:
      launch(std::integral_constant<int, 32>{});
      return;
    case 64:
      launch(std::integral_constant<int, 64>{});
      return;
    case 128:
      launch(std::integral_constant<int, 128>{});
      return;
    default:
      QUINTET_FAIL(
          "{} on cuda: head_dim {} cannot be tiled; the CUDA kernels hold head_dim 1 to {}", kernel,
          head_dim, attention_max_head_dim);
  }
}

// Lets `kernel` use `bytes` of dynamic shared memory (above 48 KiB a kernel must ask).
template <class Kernel>
void allow_shared_bytes(Kernel* kernel, std::size_t bytes) {
  if (bytes <= attention_default_shared_bytes) return;
  QUINTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
}

template <class T, class Acc>
void launch_forward(const execution<cuda>& exec, rows3<const T> q, rows3<const T> k,
                    rows3<const T> v, rows3<T> out, Acc* lse, attention_sizes n, Acc scale,
                    attention_mask mask) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (attention_mma_applies(n, q, k, v, out)) {
      const std::int64_t tiles = attention_mma_row_tiles(n.seq);
      const attention_mma_forward_args args{q, k, v, out, lse, n, scale, tiles};
      const unsigned blocks = grid_blocks(n.batch * n.heads * tiles, "attention_forward");
      if (mask == attention_mask::causal)
        launch_mma_forward<attention_mask::causal>(exec, args, blocks);
      else
        launch_mma_forward<attention_mask::full>(exec, args, blocks);
      return;
    }
  }
  with_head_dim_capacity(n.head_dim, "attention_forward", [&](auto capacity) {
    constexpr int cap = decltype(capacity)::value;
    constexpr attention_tile tile = tile_of<Acc, cap>;
    const std::int64_t tiles = attention_row_tiles(n.seq, tile);
    const unsigned blocks = grid_blocks(n.batch * n.heads * tiles, "attention_forward");
    const std::size_t bytes = attention_shared_bytes(tile, sizeof(Acc), false);
    auto* kernel = &attention_forward_kernel<T, Acc, cap>;
    allow_shared_bytes(kernel, bytes);
    kernel<<<blocks, tile.threads, bytes, exec.native()>>>(q, k, v, out, lse, n, scale, mask,
                                                           tiles);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  });
}

// dq over query tiles, then dk and dv over key tiles.
template <bool Accumulate, class T, class Acc>
void launch_backward(const execution<cuda>& exec, rows3<const T> q, rows3<const T> k,
                     rows3<const T> v, rows3<const T> dout, const Acc* lse, const Acc* delta,
                     rows3<T> dq, rows3<T> dk, rows3<T> dv, attention_sizes n, Acc scale,
                     attention_mask mask, const char* name) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (attention_mma_applies(n, q, k, v, dout, dq, dk, dv)) {
      const std::int64_t query_tiles = attention_mma_row_tiles(n.seq);
      const std::int64_t key_tiles = attention_mma_row_tiles(n.keys());
      const attention_mma_backward_args args{q,  k,  v,  dout, lse,   delta,
                                             dq, dk, dv, n,    scale, query_tiles};
      const unsigned query_blocks = grid_blocks(n.batch * n.heads * query_tiles, name);
      const unsigned key_blocks = grid_blocks(n.batch * n.heads * key_tiles, name);
      if (mask == attention_mask::causal)
        launch_mma_backward<attention_mask::causal, Accumulate>(
            exec, args, query_tiles, query_blocks, key_tiles, key_blocks);
      else
        launch_mma_backward<attention_mask::full, Accumulate>(exec, args, query_tiles, query_blocks,
                                                              key_tiles, key_blocks);
      return;
    }
  }
  with_head_dim_capacity(n.head_dim, name, [&](auto capacity) {
    constexpr int cap = decltype(capacity)::value;
    constexpr attention_tile tile = tile_of<Acc, cap>;
    const std::int64_t query_tiles = attention_row_tiles(n.seq, tile);
    const std::int64_t key_tiles = attention_row_tiles(n.keys(), tile);
    const unsigned query_blocks = grid_blocks(n.batch * n.heads * query_tiles, name);
    const unsigned key_blocks = grid_blocks(n.batch * n.heads * key_tiles, name);

    const std::size_t dq_bytes = attention_shared_bytes(tile, sizeof(Acc), false);
    auto* dq_kernel = &attention_dq_kernel<T, Acc, cap, Accumulate>;
    allow_shared_bytes(dq_kernel, dq_bytes);
    dq_kernel<<<query_blocks, tile.threads, dq_bytes, exec.native()>>>(
        q, k, v, dout, lse, delta, dq, n, scale, mask, query_tiles);
    QUINTET_CUDA_CHECK(cudaGetLastError());

    const std::size_t dkdv_bytes = attention_shared_bytes(tile, sizeof(Acc), true);
    auto* dkdv_kernel = &attention_dkdv_kernel<T, Acc, cap, Accumulate>;
    allow_shared_bytes(dkdv_kernel, dkdv_bytes);
    dkdv_kernel<<<key_blocks, tile.threads, dkdv_bytes, exec.native()>>>(
        q, k, v, dout, lse, delta, dk, dv, n, scale, mask, key_tiles);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  });
}

template <class T, class Acc>
void launch_delta(const execution<cuda>& exec, rows3<const T> dout, rows3<const T> out, Acc* delta,
                  attention_sizes n, const char* name) {
  const unsigned blocks = grid_blocks(attention_warp_row_blocks(n.batch * n.heads * n.seq), name);
  attention_delta_kernel<T, Acc>
      <<<blocks, attention_warp_rows * 32, 0, exec.native()>>>(dout, out, delta, n);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda_impl

template <>
struct attention_engine<cuda> {
  template <class T, class Acc>
  static void forward(const execution<cuda>& exec, host_impl::rows3<const T> q,
                      host_impl::rows3<const T> k, host_impl::rows3<const T> v,
                      host_impl::rows3<T> out, Acc* lse, host_impl::attention_sizes n, Acc scale,
                      attention_mask mask) {
    if (n.batch == 0 || n.heads == 0 || n.seq == 0 || n.head_dim == 0) return;
    if (n.keys() == 0) {  // a full block of no keys: the empty result
      const unsigned blocks = cuda_impl::grid_blocks(
          cuda_impl::attention_warp_row_blocks(n.batch * n.heads * n.seq), "attention_forward");
      cuda_impl::attention_empty_kernel<T, Acc>
          <<<blocks, cuda_impl::attention_warp_rows * 32, 0, exec.native()>>>(out, lse, n);
      QUINTET_CUDA_CHECK(cudaGetLastError());
      return;
    }
    cuda_impl::launch_forward<T, Acc>(exec, q, k, v, out, lse, n, scale, mask);
  }

  // delta into a temporary on the exec's stream, then the block backward over every key (causal)
  // writing dq, dk, dv instead of adding to them.
  template <class T, class Acc>
  static void backward(const execution<cuda>& exec, host_impl::rows3<const T> q,
                       host_impl::rows3<const T> k, host_impl::rows3<const T> v,
                       host_impl::rows3<const T> out, const Acc* lse,
                       host_impl::rows3<const T> dout, host_impl::rows3<T> dq,
                       host_impl::rows3<T> dk, host_impl::rows3<T> dv, host_impl::attention_sizes n,
                       Acc scale) {
    const char* name = "attention_backward";
    if (n.batch == 0 || n.heads == 0 || n.seq == 0 || n.head_dim == 0) return;
    QUINTET_CHECK(cuda_impl::attention_head_dim_capacity(n.head_dim) != 0,
                  "{} on cuda: head_dim {} cannot be tiled; the CUDA kernels hold head_dim 1 to {}",
                  name, n.head_dim, cuda_impl::attention_max_head_dim);
    tensor<Acc, cuda> delta(shape{n.batch, n.heads, n.seq}, exec.stream());  // (batch, heads, seq)
    cuda_impl::launch_delta<T, Acc>(exec, dout, out, delta.data(), n, name);
    cuda_impl::launch_backward<false, T, Acc>(exec, q, k, v, dout, lse, delta.data(), dq, dk, dv, n,
                                              scale, attention_mask::causal, name);
  }

  template <class T, class Acc>
  static void backward_block(const execution<cuda>& exec, host_impl::rows3<const T> q,
                             host_impl::rows3<const T> k, host_impl::rows3<const T> v,
                             host_impl::rows3<const T> dout, const Acc* lse, const Acc* delta,
                             host_impl::rows3<T> dq, host_impl::rows3<T> dk, host_impl::rows3<T> dv,
                             host_impl::attention_sizes n, Acc scale, attention_mask mask) {
    if (n.batch == 0 || n.heads == 0 || n.seq == 0 || n.head_dim == 0 || n.keys() == 0) return;
    cuda_impl::launch_backward<true, T, Acc>(exec, q, k, v, dout, lse, delta, dq, dk, dv, n, scale,
                                             mask, "attention_backward_block");
  }

  // Written for every row, also when head_dim is 0 (then delta is 0, as on the host).
  template <class T, class Acc>
  static void delta(const execution<cuda>& exec, host_impl::rows3<const T> dout,
                    host_impl::rows3<const T> out, Acc* delta, host_impl::attention_sizes n) {
    if (n.batch == 0 || n.heads == 0 || n.seq == 0) return;
    cuda_impl::launch_delta<T, Acc>(exec, dout, out, delta, n, "attention_delta");
  }

  template <class T, class Acc>
  static void merge(const execution<cuda>& exec, host_impl::rows3<T> out, Acc* lse,
                    host_impl::rows3<const T> block_out, const Acc* block_lse,
                    host_impl::attention_sizes n) {
    if (n.batch == 0 || n.heads == 0 || n.seq == 0) return;
    const unsigned blocks = cuda_impl::grid_blocks(
        cuda_impl::attention_warp_row_blocks(n.batch * n.heads * n.seq), "attention_merge");
    cuda_impl::attention_merge_kernel<T, Acc>
        <<<blocks, cuda_impl::attention_warp_rows * 32, 0, exec.native()>>>(out, lse, block_out,
                                                                            block_lse, n);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace quintet::kernels
