// attention on tensor cores: the forward, dq and dk/dv kernels of kernels/cuda/attention.cuh for
// bf16 operands at head_dim 64 on sm_80 and newer, every product (q k^T, p v, dout v^T, ds k,
// k q^T, v dout^T, p^T dout, ds^T q) as mma.sync m16n8k16 tiles of bf16 with float accumulators,
// operands loaded from shared memory by ldmatrix. The online softmax, the masks, the block order,
// lse, delta and the fixed summation order (no atomics) are the FMA kernels'; what differs is that
// p and ds are rounded to bf16 before they enter a product (as every tensor-core flash attention
// does), so the results are not those bits: the tests hold them to a double reference at least as
// closely as the host's bf16 kernel. Shapes and shared memory: kernels/cuda/attention_tiling.hpp
// ("the tensor-core path").
//
// A warp's 16 rows stay in registers through the loop: its q (or k and v) as A fragments, its
// output (or dq, or dk and dv) as accumulators, and each step's scores, p and ds as accumulators
// that become the next product's A fragments without leaving the registers (the layouts below).
// The four lanes that share a row (lane / 4) meet by shuffles for its max and sum.
#pragma once

#include <quintet/core/bf16.hpp>
#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/attention_layout.hpp>
#include <quintet/kernels/cuda/attention_tiling.hpp>
#include <quintet/kernels/cuda_execution.hpp>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

// The kernels' bodies exist for sm_80 and newer (bf16 mma.sync); an older architecture's binary has
// none, and attention_mma_available() keeps them from being launched there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define QUINTET_ATTENTION_MMA_BODY 1
#else
#define QUINTET_ATTENTION_MMA_BODY 0
#endif

namespace quintet::kernels::cuda_impl {

struct attention_mma_forward_args {
  rows3<const bf16> q, k, v;
  rows3<bf16> out;
  float* lse;
  attention_sizes n;
  float scale;
  std::int64_t tiles;
};

struct attention_mma_backward_args {
  rows3<const bf16> q, k, v, dout;
  const float* lse;
  const float* delta;
  rows3<bf16> dq, dk, dv;
  attention_sizes n;
  float scale;
  std::int64_t tiles;
};

#if QUINTET_ATTENTION_MMA_BODY

namespace mma {

constexpr int head_dim = attention_mma_head_dim, rows = attention_mma_rows;
constexpr int pitch = attention_mma_bf16_pitch, warp_rows = attention_mma_warp_rows;
constexpr int slabs = head_dim / 16;  // 16-column slabs of a head
constexpr int column_tiles = head_dim / 8;

extern __shared__ __align__(128) unsigned char shared[];

// ---- the instructions (PTX ISA: ldmatrix, mma.m16n8k16 with bf16 operands) ----
//
// Fragments of lane l, g = l / 4, t = l % 4: A (16 x 16) a[0] = row g, columns 2t, 2t + 1;
// a[1] = row g + 8; a[2] = row g, columns 2t + 8, 2t + 9; a[3] = row g + 8, those. B (16 x 8)
// b[0] = rows 2t, 2t + 1 of column g; b[1] = rows 2t + 8, 2t + 9. C (16 x 8, float) c[0], c[1] =
// row g, columns 2t, 2t + 1; c[2], c[3] = row g + 8. Two C tiles side by side are thus an A
// fragment once rounded to bf16: p and ds never leave the registers.

__device__ __forceinline__ void load_matrices(unsigned (&r)[4], const __nv_bfloat16* row) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void load_matrices_transposed(unsigned (&r)[4],
                                                         const __nv_bfloat16* row) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// c += a b.
__device__ __forceinline__ void multiply_add(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to bf16, the first in the low half (the lower column).
__device__ __forceinline__ unsigned pack(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const unsigned*>(&pair);
}

// The A fragment of columns [16 kk, 16 kk + 16) of a row of C tiles (c[2 kk], c[2 kk + 1]).
template <int Tiles>
__device__ __forceinline__ void as_operand(unsigned (&a)[4], const float (&c)[Tiles][4], int kk) {
  a[0] = pack(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// ---- operands from staged (64, pitch) tiles ----

// A fragments of the warp's 16 rows starting at `first_row`, every 16-column slab of the head.
__device__ __forceinline__ void load_rows(unsigned (&a)[slabs][4], const __nv_bfloat16* tile,
                                          int first_row, int lane) {
#pragma unroll
  for (int kk = 0; kk < slabs; ++kk)
    load_matrices(a[kk], tile + (first_row + lane % 16) * pitch + kk * 16 + lane / 16 * 8);
}

// c[Tiles] (16 x 8 Tiles) += a (16 x 64) x tile rows [first, first + 8 Tiles)^T: the staged rows
// are the columns (q k^T, dout v^T, k q^T, v dout^T).
template <int Tiles>
__device__ __forceinline__ void times_rows_transposed(float (&c)[Tiles][4],
                                                      const unsigned (&a)[slabs][4],
                                                      const __nv_bfloat16* tile, int first,
                                                      int lane) {
#pragma unroll
  for (int kk = 0; kk < slabs; ++kk)
#pragma unroll
    for (int pair = 0; pair < Tiles / 2; ++pair) {
      unsigned b[4];
      load_matrices(b, tile + (first + pair * 16 + lane % 8 + lane / 16 * 8) * pitch + kk * 16 +
                           (lane / 8) % 2 * 8);
      multiply_add(c[2 * pair], a[kk], b[0], b[1]);
      multiply_add(c[2 * pair + 1], a[kk], b[2], b[3]);
    }
}

// c[8] (16 x 64) += a (16 x 16) x tile rows [first, first + 16) (p v, ds k, p^T dout, ds^T q).
__device__ __forceinline__ void add_times_rows(float (&c)[column_tiles][4], const unsigned (&a)[4],
                                               const __nv_bfloat16* tile, int first, int lane) {
#pragma unroll
  for (int pair = 0; pair < column_tiles / 2; ++pair) {
    unsigned b[4];
    load_matrices_transposed(
        b, tile + (first + lane % 8 + (lane / 8) % 2 * 8) * pitch + pair * 16 + lane / 16 * 8);
    multiply_add(c[2 * pair], a, b[0], b[1]);
    multiply_add(c[2 * pair + 1], a, b[2], b[3]);
  }
}

// Rows [first, first + 64) of one head's 64 columns of x into a (64, pitch) tile, 16 bytes per
// load; rows at or past `end` are zero.
__device__ inline void stage(rows3<const bf16> x, std::int64_t batch, std::int64_t first,
                             std::int64_t end, std::int64_t column, __nv_bfloat16* tile) {
  constexpr int chunks = head_dim / 8;  // 16-byte pieces of a row
  for (int at = static_cast<int>(threadIdx.x); at < rows * chunks; at += attention_mma_threads) {
    const int r = at / chunks, chunk = at % chunks;
    const std::int64_t row = first + r;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row < end) value = *reinterpret_cast<const uint4*>(x.at(batch, row) + column + chunk * 8);
    *reinterpret_cast<uint4*>(tile + r * pitch + chunk * 8) = value;
  }
}

__device__ __forceinline__ __nv_bfloat16* staged_tile(int index) {
  return reinterpret_cast<__nv_bfloat16*>(shared) + index * rows * pitch;
}

// Row r of the 64 x 64 result c of the warp's rows (r = 0: row g, 1: row g + 8) into `row`:
// (Accumulate ? row : 0) + factor * c, rounded once, two columns per store.
template <bool Accumulate>
__device__ __forceinline__ void write_row(bf16* row, const float (&c)[column_tiles][4], int r,
                                          int t, float factor) {
#pragma unroll
  for (int n = 0; n < column_tiles; ++n) {
    const int column = n * 8 + 2 * t;
    float low = factor * c[n][2 * r], high = factor * c[n][2 * r + 1];
    if (Accumulate) {
      low += static_cast<float>(row[column]);
      high += static_cast<float>(row[column + 1]);
    }
    *reinterpret_cast<__nv_bfloat162*>(row + column) = __floats2bfloat162_rn(low, high);
  }
}

__device__ __forceinline__ float negative_infinity() { return -INFINITY; }

// The max and the sum over the 4 lanes (t = 0..3) that hold one row.
__device__ __forceinline__ float row_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}
__device__ __forceinline__ float row_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

template <attention_mask Mask>
__device__ __forceinline__ bool sees(std::int64_t query, std::int64_t key) {
  return Mask == attention_mask::full || key <= query;
}

template <attention_mask Mask>
__device__ inline void forward(const attention_mma_forward_args& a) {
  const attention_block block = attention_block_at(blockIdx.x, a.tiles, a.n.heads, true);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const std::int64_t keys = a.n.keys(), column = block.head * head_dim;
  const std::int64_t first_query = block.tile * rows;
  const std::int64_t query[2] = {first_query + warp * warp_rows + g,
                                 first_query + warp * warp_rows + g + 8};
  const bool valid[2] = {query[0] < a.n.seq, query[1] < a.n.seq};
  __nv_bfloat16* q_tile = staged_tile(0);
  __nv_bfloat16* k_tile = staged_tile(1);
  __nv_bfloat16* v_tile = staged_tile(2);

  stage(a.q, block.batch, first_query, a.n.seq, column, q_tile);
  __syncthreads();
  unsigned q[slabs][4];
  load_rows(q, q_tile, warp * warp_rows, lane);

  float output[column_tiles][4] = {};
  float running_max[2] = {negative_infinity(), negative_infinity()};
  float running_sum[2] = {0.0f, 0.0f};  // this lane's columns only, until the end

  const std::int64_t key_end = attention_keys_read(Mask, first_query, rows, a.n.seq, keys);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += rows) {
    __syncthreads();  // every warp is done with the previous key tile
    stage(a.k, block.batch, j0, keys, column, k_tile);
    stage(a.v, block.batch, j0, keys, column, v_tile);
    __syncthreads();
    float score[column_tiles][4] = {};
    times_rows_transposed(score, q, k_tile, 0, lane);
    float tile_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
    for (int n = 0; n < column_tiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const std::int64_t key = j0 + n * 8 + 2 * t + e % 2;
        const bool visible = valid[r] && key < keys && sees<Mask>(query[r], key);
        score[n][e] = visible ? a.scale * score[n][e] : negative_infinity();
        tile_max[r] = fmaxf(tile_max[r], score[n][e]);
      }
    float rescale[2], new_max[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      new_max[r] = fmaxf(running_max[r], row_max(tile_max[r]));
      // Before the first visible key the sums are empty (and exp(-inf - -inf) would be NaN).
      rescale[r] = running_max[r] == negative_infinity() ? 0.0f : expf(running_max[r] - new_max[r]);
      running_sum[r] *= rescale[r];
      running_max[r] = new_max[r];
    }
#pragma unroll
    for (int n = 0; n < column_tiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2;
        const float p = score[n][e] == negative_infinity() ? 0.0f : expf(score[n][e] - new_max[r]);
        score[n][e] = p;
        running_sum[r] += p;
        output[n][e] *= rescale[r];
      }
#pragma unroll
    for (int kk = 0; kk < rows / 16; ++kk) {
      unsigned p[4];
      as_operand(p, score, kk);
      add_times_rows(output, p, v_tile, kk * 16, lane);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    // Every query sees key 0 (causal) or every key (full, keys > 0): the sum is >= 1.
    const float total = row_sum(running_sum[r]);
    write_row<false>(a.out.at(block.batch, query[r]) + column, output, r, t, 1.0f / total);
    if (t == 0)
      a.lse[(block.batch * a.n.heads + block.head) * a.n.seq + query[r]] =
          running_max[r] + logf(total);
  }
}

template <attention_mask Mask, bool Accumulate>
__device__ inline void dq(const attention_mma_backward_args& a) {
  const attention_block block = attention_block_at(blockIdx.x, a.tiles, a.n.heads, true);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const std::int64_t keys = a.n.keys(), column = block.head * head_dim;
  const std::int64_t first_query = block.tile * rows;
  const std::int64_t query[2] = {first_query + warp * warp_rows + g,
                                 first_query + warp * warp_rows + g + 8};
  const bool valid[2] = {query[0] < a.n.seq, query[1] < a.n.seq};
  const std::int64_t statistics = (block.batch * a.n.heads + block.head) * a.n.seq;
  __nv_bfloat16* q_tile = staged_tile(0);
  __nv_bfloat16* dout_tile = staged_tile(1);
  __nv_bfloat16* k_tile = staged_tile(2);
  __nv_bfloat16* v_tile = staged_tile(3);

  stage(a.q, block.batch, first_query, a.n.seq, column, q_tile);
  stage(a.dout, block.batch, first_query, a.n.seq, column, dout_tile);
  __syncthreads();
  unsigned q[slabs][4], dout[slabs][4];
  load_rows(q, q_tile, warp * warp_rows, lane);
  load_rows(dout, dout_tile, warp * warp_rows, lane);
  float lse[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lse[r] = valid[r] ? a.lse[statistics + query[r]] : 0.0f;
    delta[r] = valid[r] ? a.delta[statistics + query[r]] : 0.0f;
  }
  float dq_sum[column_tiles][4] = {};

  const std::int64_t key_end = attention_keys_read(Mask, first_query, rows, a.n.seq, keys);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += rows) {
    __syncthreads();  // every warp is done with the previous key tile
    stage(a.k, block.batch, j0, keys, column, k_tile);
    stage(a.v, block.batch, j0, keys, column, v_tile);
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // 32 keys at a time: fewer registers
      float s[4][4] = {}, dp[4][4] = {};
      times_rows_transposed(s, q, k_tile, half * 32, lane);
      times_rows_transposed(dp, dout, v_tile, half * 32, lane);
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2;
          const std::int64_t key = j0 + half * 32 + n * 8 + 2 * t + e % 2;
          const bool visible = valid[r] && key < keys && sees<Mask>(query[r], key);
          const float p = visible ? expf(a.scale * s[n][e] - lse[r]) : 0.0f;
          s[n][e] = p * (dp[n][e] - delta[r]);  // ds
        }
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        unsigned ds[4];
        as_operand(ds, s, kk);
        add_times_rows(dq_sum, ds, k_tile, half * 32 + kk * 16, lane);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (valid[r])
      write_row<Accumulate>(a.dq.at(block.batch, query[r]) + column, dq_sum, r, t, a.scale);
}

template <attention_mask Mask, bool Accumulate>
__device__ inline void dkdv(const attention_mma_backward_args& a) {
  const attention_block block = attention_block_at(blockIdx.x, a.tiles, a.n.heads, false);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const std::int64_t keys = a.n.keys(), column = block.head * head_dim;
  const std::int64_t first_key = block.tile * rows;
  const std::int64_t key[2] = {first_key + warp * warp_rows + g,
                               first_key + warp * warp_rows + g + 8};
  const bool valid[2] = {key[0] < keys, key[1] < keys};
  const std::int64_t statistics = (block.batch * a.n.heads + block.head) * a.n.seq;
  __nv_bfloat16* k_tile = staged_tile(0);
  __nv_bfloat16* v_tile = staged_tile(1);
  __nv_bfloat16* q_tile = staged_tile(2);
  __nv_bfloat16* dout_tile = staged_tile(3);
  float* lse_tile = reinterpret_cast<float*>(staged_tile(4));
  float* delta_tile = lse_tile + rows;

  stage(a.k, block.batch, first_key, keys, column, k_tile);
  stage(a.v, block.batch, first_key, keys, column, v_tile);
  __syncthreads();
  unsigned k[slabs][4], v[slabs][4];
  load_rows(k, k_tile, warp * warp_rows, lane);
  load_rows(v, v_tile, warp * warp_rows, lane);
  float dk_sum[column_tiles][4] = {}, dv_sum[column_tiles][4] = {};

  for (std::int64_t i0 = attention_first_query_read(Mask, first_key); i0 < a.n.seq; i0 += rows) {
    __syncthreads();  // every warp is done with the previous query tile
    stage(a.q, block.batch, i0, a.n.seq, column, q_tile);
    stage(a.dout, block.batch, i0, a.n.seq, column, dout_tile);
    for (int r = static_cast<int>(threadIdx.x); r < rows; r += attention_mma_threads) {
      const bool inside = i0 + r < a.n.seq;
      lse_tile[r] = inside ? a.lse[statistics + i0 + r] : 0.0f;
      delta_tile[r] = inside ? a.delta[statistics + i0 + r] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // 32 queries at a time
      float p[4][4] = {}, ds[4][4] = {};    // s^T, then p^T; dp^T, then ds^T
      times_rows_transposed(p, k, q_tile, half * 32, lane);
      times_rows_transposed(ds, v, dout_tile, half * 32, lane);
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, c = half * 32 + n * 8 + 2 * t + e % 2;
          const std::int64_t query = i0 + c;
          const bool visible = valid[r] && query < a.n.seq && sees<Mask>(query, key[r]);
          p[n][e] = visible ? expf(a.scale * p[n][e] - lse_tile[c]) : 0.0f;
          ds[n][e] = p[n][e] * (ds[n][e] - delta_tile[c]);
        }
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        unsigned p_operand[4], ds_operand[4];
        as_operand(p_operand, p, kk);
        as_operand(ds_operand, ds, kk);
        add_times_rows(dv_sum, p_operand, dout_tile, half * 32 + kk * 16, lane);
        add_times_rows(dk_sum, ds_operand, q_tile, half * 32 + kk * 16, lane);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!valid[r]) continue;
    write_row<Accumulate>(a.dk.at(block.batch, key[r]) + column, dk_sum, r, t, a.scale);
    write_row<Accumulate>(a.dv.at(block.batch, key[r]) + column, dv_sum, r, t, 1.0f);
  }
}

}  // namespace mma

#endif  // QUINTET_ATTENTION_MMA_BODY

// The mask is a template parameter: each kernel's visibility test compiles to what its mask needs.
template <attention_mask Mask>
__global__ void __launch_bounds__(attention_mma_threads)
    attention_mma_forward_kernel([[maybe_unused]] const attention_mma_forward_args args) {
#if QUINTET_ATTENTION_MMA_BODY
  mma::forward<Mask>(args);
#else
  __trap();  // never launched: see attention_mma_available
#endif
}

template <attention_mask Mask, bool Accumulate>
__global__ void __launch_bounds__(attention_mma_threads)
    attention_mma_dq_kernel([[maybe_unused]] const attention_mma_backward_args args) {
#if QUINTET_ATTENTION_MMA_BODY
  mma::dq<Mask, Accumulate>(args);
#else
  __trap();
#endif
}

template <attention_mask Mask, bool Accumulate>
__global__ void __launch_bounds__(attention_mma_threads)
    attention_mma_dkdv_kernel([[maybe_unused]] const attention_mma_backward_args args) {
#if QUINTET_ATTENTION_MMA_BODY
  mma::dkdv<Mask, Accumulate>(args);
#else
  __trap();
#endif
}

// Whether the current device runs the tensor-core kernels: the binary the runtime picked for it
// was compiled for sm_80 or newer (then the bodies exist). Asked once per process: a process
// drives GPUs of one kind.
inline bool attention_mma_available() {
  static const bool available = [] {
    cudaFuncAttributes attributes{};
    if (cudaFuncGetAttributes(&attributes, attention_mma_forward_kernel<attention_mask::causal>) !=
        cudaSuccess) {
      (void)cudaGetLastError();  // no image for this device: the FMA kernels serve it
      return false;
    }
    return attributes.binaryVersion >= 80;
  }();
  return available;
}

// Whether these operands take the tensor-core path: bf16 (checked by the caller's types), head
// dim 64, rows that stage 16 bytes at a time, and a device that runs the kernels.
template <class... Rows>
bool attention_mma_applies(attention_sizes n, const Rows&... operands) {
  if (n.head_dim != attention_mma_head_dim) return false;
  const bool aligned = (attention_mma_rows_aligned(reinterpret_cast<std::uintptr_t>(operands.data),
                                                   operands.batch_stride, operands.seq_stride) &&
                        ...);
  return aligned && attention_mma_available();
}

template <attention_mask Mask>
void launch_mma_forward(const execution<cuda>& exec, const attention_mma_forward_args& args,
                        unsigned blocks) {
  const std::size_t bytes = attention_mma_shared_bytes(attention_mma_kernel::forward);
  auto* kernel = &attention_mma_forward_kernel<Mask>;
  kernel<<<blocks, attention_mma_threads, bytes, exec.native()>>>(args);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

// dq over query tiles, then dk and dv over key tiles.
template <attention_mask Mask, bool Accumulate>
void launch_mma_backward(const execution<cuda>& exec, attention_mma_backward_args args,
                         std::int64_t query_tiles, unsigned query_blocks, std::int64_t key_tiles,
                         unsigned key_blocks) {
  const std::size_t dq_bytes = attention_mma_shared_bytes(attention_mma_kernel::dq);
  auto* dq_kernel = &attention_mma_dq_kernel<Mask, Accumulate>;
  args.tiles = query_tiles;
  dq_kernel<<<query_blocks, attention_mma_threads, dq_bytes, exec.native()>>>(args);
  QUINTET_CUDA_CHECK(cudaGetLastError());
  const std::size_t dkdv_bytes = attention_mma_shared_bytes(attention_mma_kernel::dkdv);
  auto* dkdv_kernel = &attention_mma_dkdv_kernel<Mask, Accumulate>;
  args.tiles = key_tiles;
  dkdv_kernel<<<key_blocks, attention_mma_threads, dkdv_bytes, exec.native()>>>(args);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace quintet::kernels::cuda_impl
