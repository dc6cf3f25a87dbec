// The mixture-of-experts kernels on cuda tensors (kernels/moe.hpp says what each computes; the
// host loops in kernels/host/moe.hpp are the reference):
//
//   router_softmax           a thread per token over its experts (the host's two passes)
//   route_top_k              a thread per token picks its k experts and gates; then a block per
//                            expert lists its assignments in token order (cub::BlockScan),
//                            decides which it keeps over capacity (by position, or by a stable
//                            rank of the probabilities: strictly larger ones, then equal ones of
//                            earlier tokens) and numbers the kept ones; a last pass adds each
//                            expert's offset in the permuted buffer. The host's integers exactly.
//   router_losses            a block per expert's mean probability and one for the z sum, each
//                            a fixed-order reduction; the two losses come back to the host
//   router_backward          a thread per token, the host's operations in the host's order
//   permute_rows, unpermute_rows, unpermute_rows_backward
//                            a thread per element (a slot's dot product in dgate: a thread per
//                            slot, in column order); sums over a token's slots in slot order
//   grouped_*                one cuBLASLt product, bias add or bias gradient per non-empty group
//                            (the groups' row offsets are host numbers)
//
// Products and sums round every operation on its own (cuda/unfused.cuh), in the host's order, so
// where no exponential or logarithm enters (routing from given probabilities, the permutations,
// the router's backward) the device gives the host's bits; the softmax and the losses differ from
// the host's by the last-ulp differences of expf/logf and of a reduction tree.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/elementwise.cuh>
#include <quintet/kernels/cuda/matmul.cuh>
#include <quintet/kernels/cuda/unfused.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/host/moe.hpp>
#include <quintet/kernels/moe.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cstdint>

namespace quintet::kernels {

namespace cuda_impl {

inline constexpr int moe_threads = 256;

inline unsigned moe_blocks(std::int64_t items) {
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((items + moe_threads - 1) / moe_threads, 1, 65535));
}

__device__ __forceinline__ float moe_exp(float x) { return expf(x); }
__device__ __forceinline__ double moe_exp(double x) { return exp(x); }
__device__ __forceinline__ float moe_log(float x) { return logf(x); }
__device__ __forceinline__ double moe_log(double x) { return log(x); }

// probs[t] = softmax(logits[t]) and lse[t] from the row maximum, a thread per token.
template <class T>
__global__ void router_softmax_kernel(const T* logits, T* probs, T* lse, std::int64_t tokens,
                                      std::int64_t experts) {
  using acc = accumulator_t<T>;
  using namespace unfused;
  for (std::int64_t t = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < tokens;
       t += std::int64_t{gridDim.x} * blockDim.x) {
    const T* row = logits + t * experts;
    acc peak = widen(row[0]);
    for (std::int64_t j = 1; j < experts; ++j) peak = widen(row[j]) > peak ? widen(row[j]) : peak;
    acc sum = 0;
    for (std::int64_t j = 0; j < experts; ++j) sum = plus(sum, moe_exp(minus(widen(row[j]), peak)));
    for (std::int64_t j = 0; j < experts; ++j)
      probs[t * experts + j] = narrow<T>(divide(moe_exp(minus(widen(row[j]), peak)), sum));
    lse[t] = narrow<T>(plus(peak, moe_log(sum)));
  }
}

// A thread per token: its k experts of highest probability (strictly greater wins, so a tie keeps
// the lower index), in decreasing order, and their gates.
template <class T>
__global__ void top_k_kernel(const T* probs, std::int32_t* expert, T* gate,
                             host_impl::routing_sizes n) {
  using acc = accumulator_t<T>;
  using namespace unfused;
  for (std::int64_t t = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < n.tokens;
       t += std::int64_t{gridDim.x} * blockDim.x) {
    const T* p = probs + t * n.experts;
    std::int32_t* chosen = expert + t * n.k;
    acc sum = 0;
    for (std::int64_t j = 0; j < n.k; ++j) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < n.experts; ++e) {
        bool taken = false;
        for (std::int64_t i = 0; i < j; ++i) taken = taken || chosen[i] == e;
        if (!taken && (best < 0 || widen(p[e]) > widen(p[best]))) best = e;
      }
      chosen[j] = static_cast<std::int32_t>(best);
      sum = plus(sum, widen(p[best]));
    }
    for (std::int64_t j = 0; j < n.k; ++j) {
      const acc prob = widen(p[chosen[j]]);
      gate[t * n.k + j] = narrow<T>(n.k == 1 ? prob : divide(prob, sum));
    }
  }
}

// Block e: expert e's assignments (slot i = t k + j) in slot order into slots[e tokens ...],
// which of them it keeps, and each kept one's rank among them (written to position[i] as a
// position within the expert; -1 when dropped); routed[e] and kept[e].
template <class T>
__global__ void __launch_bounds__(moe_threads)
    expert_slots_kernel(const T* probs, const std::int32_t* expert, std::int32_t* slots,
                        std::int32_t* position, std::int64_t* routed, std::int64_t* kept,
                        host_impl::routing_sizes n) {
  using scan = cub::BlockScan<std::int32_t, moe_threads>;
  __shared__ typename scan::TempStorage storage;
  const auto e = static_cast<std::int32_t>(blockIdx.x);
  std::int32_t* mine = slots + std::int64_t{e} * n.tokens;  // a token picks e at most once
  const std::int64_t assignments = n.tokens * n.k;
  // 1. The list, in slot order: each pass of moe_threads slots scanned for its members' ranks.
  std::int32_t listed = 0;
  for (std::int64_t base = 0; base < assignments; base += moe_threads) {
    const std::int64_t i = base + threadIdx.x;
    const std::int32_t member = i < assignments && expert[i] == e ? 1 : 0;
    std::int32_t rank = 0, pass_total = 0;
    scan(storage).ExclusiveSum(member, rank, pass_total);
    if (member) mine[listed + rank] = static_cast<std::int32_t>(i);
    listed += pass_total;
    __syncthreads();  // storage is reused by the next pass
  }
  __syncthreads();  // the list is complete
  // 2. Which are kept: all within capacity; over it the first `capacity` by position, or by the
  //    stable descending order of probability (strictly larger ones first, then equal ones that
  //    come earlier). 3. Each kept one numbered in list order.
  const bool over = n.capacity != 0 && listed > n.capacity;
  std::int32_t numbered = 0;
  for (std::int32_t base = 0; base < listed; base += moe_threads) {
    const std::int32_t r = base + static_cast<std::int32_t>(threadIdx.x);
    std::int32_t keep = 0;
    if (r < listed) {
      keep = 1;
      if (over && n.drop == drop_order::position) {
        keep = r < n.capacity ? 1 : 0;
      } else if (over) {
        const auto p_of = [&](std::int32_t slot) { return widen(probs[(slot / n.k) * n.experts + e]); };
        const auto p = p_of(mine[r]);
        std::int64_t ahead = 0;
        for (std::int32_t q = 0; q < listed && ahead < n.capacity; ++q) {
          const auto other = p_of(mine[q]);
          ahead += other > p || (other == p && q < r) ? 1 : 0;
        }
        keep = ahead < n.capacity ? 1 : 0;
      }
    }
    std::int32_t rank = 0, pass_total = 0;
    scan(storage).ExclusiveSum(keep, rank, pass_total);
    if (r < listed) position[mine[r]] = keep ? numbered + rank : -1;
    numbered += pass_total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    routed[e] = listed;
    kept[e] = numbered;
  }
}

// A thread per slot: a kept slot's position within its expert becomes its row in the buffer
// (from first_row, the kept rows of the experts before it first). A template, as every kernel in
// a header is: an ordinary __global__ function would be defined again by every unit including it.
template <class Count>
__global__ void expert_offsets_kernel(const std::int32_t* expert, const Count* kept,
                                      std::int32_t* position, std::int64_t assignments,
                                      Count first_row) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < assignments;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    if (position[i] < 0) continue;
    Count offset = first_row;
    for (std::int32_t e = 0; e < expert[i]; ++e) offset += kept[e];
    position[i] = static_cast<std::int32_t>(offset + position[i]);
  }
}

// Block e < experts: sums[e] = sum over tokens of probs[t, e]; block `experts`: sums[experts] =
// sum of lse[t]^2. Thread r adds tokens r, r + 256, ... in order, then the block tree.
template <class T>
__global__ void __launch_bounds__(moe_threads)
    router_loss_sums_kernel(const T* probs, const T* lse, host_impl::routing_sizes n,
                            accumulator_t<T>* sums) {
  using acc = accumulator_t<T>;
  using namespace unfused;
  using reduce = cub::BlockReduce<acc, moe_threads>;
  __shared__ typename reduce::TempStorage storage;
  const std::int64_t e = blockIdx.x;
  acc partial = 0;
  for (std::int64_t t = threadIdx.x; t < n.tokens; t += moe_threads) {
    if (e < n.experts) {
      partial = plus(partial, widen(probs[t * n.experts + e]));
    } else {
      const acc l = widen(lse[t]);
      partial = plus(partial, multiply(l, l));
    }
  }
  const acc total = reduce(storage).Sum(partial);
  if (threadIdx.x == 0) sums[e] = total;
}

// One thread: the two losses from the sums, as the host forms them.
template <class Acc>
__global__ void router_loss_values_kernel(const Acc* sums, const std::int64_t* routed,
                                          host_impl::routing_sizes n, double* out) {
  using namespace unfused;
  const Acc assignments = static_cast<Acc>(n.tokens * n.k);
  const Acc tokens = static_cast<Acc>(n.tokens);
  Acc balance = 0;
  for (std::int64_t e = 0; e < n.experts; ++e)
    balance = plus(balance, multiply(divide(static_cast<Acc>(routed[e]), assignments),
                                     divide(sums[e], tokens)));
  out[0] = static_cast<double>(multiply(static_cast<Acc>(n.experts), balance));
  out[1] = static_cast<double>(divide(sums[n.experts], tokens));
}

// A thread per token: host_impl::router_backward's arithmetic, with dp[e] formed on the fly
// (the expert's balance term, then the token's chosen slots' terms in slot order).
template <class T>
__global__ void router_backward_kernel(const T* probs, const T* lse, const std::int32_t* expert,
                                       const T* gate, const T* dgate, const std::int64_t* routed,
                                       double balance_weight, double z_weight, T* dlogits,
                                       host_impl::routing_sizes n) {
  using acc = accumulator_t<T>;
  using namespace unfused;
  const acc tokens = static_cast<acc>(n.tokens);
  const acc z_scale = divide(multiply(acc(2), static_cast<acc>(z_weight)), tokens);
  for (std::int64_t t = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; t < n.tokens;
       t += std::int64_t{gridDim.x} * blockDim.x) {
    const T* p = probs + t * n.experts;
    const std::int32_t* chosen = expert + t * n.k;
    const T* g = gate + t * n.k;
    const T* dg = dgate + t * n.k;
    acc sum = 0, weighted = 0;
    if (n.k > 1) {
      for (std::int64_t j = 0; j < n.k; ++j) {
        sum = plus(sum, widen(p[chosen[j]]));
        weighted = plus(weighted, multiply(widen(dg[j]), widen(g[j])));
      }
    }
    const auto dp = [&](std::int64_t e) {
      acc value = divide(
          multiply(multiply(static_cast<acc>(balance_weight), static_cast<acc>(n.experts)),
                   divide(static_cast<acc>(routed[e]), static_cast<acc>(n.tokens * n.k))),
          tokens);
      for (std::int64_t j = 0; j < n.k; ++j) {
        if (chosen[j] != e) continue;
        value = plus(value, n.k == 1 ? widen(dg[0]) : divide(minus(widen(dg[j]), weighted), sum));
      }
      return value;
    };
    acc dot = 0;
    for (std::int64_t e = 0; e < n.experts; ++e) dot = plus(dot, multiply(dp(e), widen(p[e])));
    const acc z = multiply(z_scale, widen(lse[t]));
    for (std::int64_t e = 0; e < n.experts; ++e)
      dlogits[t * n.experts + e] = narrow<T>(multiply(widen(p[e]), plus(minus(dp(e), dot), z)));
  }
}

// A thread per element of a slot's row: rows[position[i]] = x[i / k].
template <class T>
__global__ void permute_rows_kernel(const T* x, const std::int32_t* position, T* out,
                                    std::int64_t assignments, std::int64_t k, std::int64_t width) {
  const std::int64_t count = assignments * width;
  for (std::int64_t at = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; at < count;
       at += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t i = at / width, c = at % width;
    if (position[i] >= 0) out[std::int64_t{position[i]} * width + c] = x[(i / k) * width + c];
  }
}

// A thread per output element: the token's kept slots' gate * row, added in slot order.
template <class T>
__global__ void unpermute_rows_kernel(const T* rows, const std::int32_t* position, const T* gate,
                                      T* out, std::int64_t tokens, std::int64_t k,
                                      std::int64_t width) {
  using acc = accumulator_t<T>;
  using namespace unfused;
  const std::int64_t count = tokens * width;
  for (std::int64_t at = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; at < count;
       at += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t t = at / width, c = at % width;
    acc sum = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int32_t row = position[t * k + j];
      if (row < 0) continue;
      const acc g = gate == nullptr ? acc(1) : widen(gate[t * k + j]);
      sum = plus(sum, multiply(g, widen(rows[std::int64_t{row} * width + c])));
    }
    out[at] = narrow<T>(sum);
  }
}

// drows[position[i]] = gate[i] dout[i / k], a thread per element.
template <class T>
__global__ void unpermute_drows_kernel(const T* dout, const std::int32_t* position, const T* gate,
                                       T* drows, std::int64_t assignments, std::int64_t k,
                                       std::int64_t width) {
  using namespace unfused;
  const std::int64_t count = assignments * width;
  for (std::int64_t at = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; at < count;
       at += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t i = at / width, c = at % width;
    const std::int32_t row = position[i];
    if (row >= 0)
      drows[std::int64_t{row} * width + c] =
          narrow<T>(multiply(widen(gate[i]), widen(dout[(i / k) * width + c])));
  }
}

// dgate[i] = dout[i / k] . rows[position[i]] in column order (0 when dropped), a thread per slot.
template <class T>
__global__ void unpermute_dgate_kernel(const T* dout, const T* rows, const std::int32_t* position,
                                       T* dgate, std::int64_t assignments, std::int64_t k,
                                       std::int64_t width) {
  using acc = accumulator_t<T>;
  using namespace unfused;
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < assignments;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int32_t row = position[i];
    if (row < 0) {
      dgate[i] = T(0);
      continue;
    }
    const T* d = dout + (i / k) * width;
    const T* r = rows + std::int64_t{row} * width;
    acc dot = 0;
    for (std::int64_t c = 0; c < width; ++c) dot = plus(dot, multiply(widen(d[c]), widen(r[c])));
    dgate[i] = narrow<T>(dot);
  }
}

}  // namespace cuda_impl

template <>
struct moe_engine<cuda> {
  template <class T>
  static void router_softmax(const execution<cuda>& exec, const T* logits, T* probs, T* lse,
                             std::int64_t tokens, std::int64_t experts) {
    if (tokens == 0) return;
    cuda_impl::router_softmax_kernel<<<cuda_impl::moe_blocks(tokens), cuda_impl::moe_threads, 0,
                                       exec.native()>>>(logits, probs, lse, tokens, experts);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }

  template <class T>
  static void route_top_k(const execution<cuda>& exec, const T* probs, std::int32_t* expert, T* gate,
                          std::int32_t* position, std::int64_t* routed, std::int64_t* kept,
                          host_impl::routing_sizes n) {
    constexpr int threads = cuda_impl::moe_threads;
    if (n.tokens > 0) {
      cuda_impl::top_k_kernel<<<cuda_impl::moe_blocks(n.tokens), threads, 0, exec.native()>>>(
          probs, expert, gate, n);
      QUINTET_CUDA_CHECK(cudaGetLastError());
    }
    QUINTET_CHECK(n.experts <= 2147483647, "route_top_k on cuda: {} experts", n.experts);
    // Each expert's list of assignments: a token picks an expert at most once.
    tensor<std::int32_t, cuda> slots(shape{n.experts * std::max<std::int64_t>(n.tokens, 1)},
                                     exec.stream());
    cuda_impl::expert_slots_kernel<<<static_cast<unsigned>(n.experts), threads, 0,
                                     exec.native()>>>(probs, expert, slots.data(), position,
                                                      routed, kept, n);
    QUINTET_CUDA_CHECK(cudaGetLastError());
    const std::int64_t assignments = n.tokens * n.k;
    if (assignments > 0) {
      cuda_impl::expert_offsets_kernel<std::int64_t>
          <<<cuda_impl::moe_blocks(assignments), threads, 0, exec.native()>>>(
              expert, kept, position, assignments, n.first_row);
      QUINTET_CUDA_CHECK(cudaGetLastError());
    }
  }

  // Blocks the calling thread until the two values are on the host.
  template <class T>
  static host_impl::router_loss_values router_losses(const execution<cuda>& exec, const T* probs,
                                                     const T* lse, const std::int64_t* routed,
                                                     host_impl::routing_sizes n) {
    host_impl::router_loss_values out;
    if (n.tokens == 0) return out;
    using acc = accumulator_t<T>;
    tensor<acc, cuda> sums(shape{n.experts + 1}, exec.stream());
    tensor<double, cuda> values(shape{2}, exec.stream());
    cuda_impl::router_loss_sums_kernel<<<static_cast<unsigned>(n.experts + 1),
                                         cuda_impl::moe_threads, 0, exec.native()>>>(
        probs, lse, n, sums.data());
    QUINTET_CUDA_CHECK(cudaGetLastError());
    cuda_impl::router_loss_values_kernel<<<1, 1, 0, exec.native()>>>(sums.data(), routed, n,
                                                                      values.data());
    QUINTET_CUDA_CHECK(cudaGetLastError());
    double host_values[2] = {};
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(host_values, values.data(), sizeof host_values,
                                       cudaMemcpyDeviceToHost, exec.native()));
    exec.synchronize();
    out.load_balancing = host_values[0];
    out.z = host_values[1];
    return out;
  }

  template <class T>
  static void router_backward(const execution<cuda>& exec, const T* probs, const T* lse,
                              const std::int32_t* expert, const T* gate, const T* dgate,
                              const std::int64_t* routed, double balance_weight, double z_weight,
                              T* dlogits, host_impl::routing_sizes n) {
    if (n.tokens == 0) return;
    cuda_impl::router_backward_kernel<<<cuda_impl::moe_blocks(n.tokens), cuda_impl::moe_threads,
                                        0, exec.native()>>>(probs, lse, expert, gate, dgate,
                                                            routed, balance_weight, z_weight,
                                                            dlogits, n);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }

  template <class T>
  static void permute_rows(const execution<cuda>& exec, const T* x, const std::int32_t* position,
                           T* out, std::int64_t tokens, std::int64_t k, std::int64_t width) {
    if (tokens * k * width == 0) return;
    cuda_impl::permute_rows_kernel<<<cuda_impl::moe_blocks(tokens * k * width),
                                     cuda_impl::moe_threads, 0, exec.native()>>>(
        x, position, out, tokens * k, k, width);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }

  template <class T>
  static void unpermute_rows(const execution<cuda>& exec, const T* rows,
                             const std::int32_t* position, const T* gate, T* out,
                             std::int64_t tokens, std::int64_t k, std::int64_t width) {
    if (tokens * width == 0) return;
    cuda_impl::unpermute_rows_kernel<<<cuda_impl::moe_blocks(tokens * width),
                                       cuda_impl::moe_threads, 0, exec.native()>>>(
        rows, position, gate, out, tokens, k, width);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }

  template <class T>
  static void unpermute_rows_backward(const execution<cuda>& exec, const T* dout, const T* rows,
                                      const std::int32_t* position, const T* gate, T* drows,
                                      T* dgate, std::int64_t tokens, std::int64_t k,
                                      std::int64_t width) {
    const std::int64_t assignments = tokens * k;
    if (assignments == 0) return;
    constexpr int threads = cuda_impl::moe_threads;
    if (width > 0) {
      cuda_impl::unpermute_drows_kernel<<<cuda_impl::moe_blocks(assignments * width), threads, 0,
                                          exec.native()>>>(dout, position, gate, drows,
                                                           assignments, k, width);
      QUINTET_CUDA_CHECK(cudaGetLastError());
    }
    cuda_impl::unpermute_dgate_kernel<<<cuda_impl::moe_blocks(assignments), threads, 0,
                                        exec.native()>>>(dout, rows, position, dgate, assignments,
                                                         k, width);
    QUINTET_CUDA_CHECK(cudaGetLastError());
  }

  template <class T>
  static void grouped_matmul(const execution<cuda>& exec, const T* a, const std::int64_t* offsets,
                             const T* const* b, T* c, std::int64_t groups, std::int64_t k,
                             std::int64_t n, bool transpose_b, double alpha, double beta) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t m = offsets[g + 1] - offsets[g];
      if (m == 0 || n == 0) continue;
      QUINTET_CHECK(k > 0, "grouped_matmul on cuda: k = 0 (an empty inner dimension) is not "
                           "supported, group {} of {} rows",
                    g, m);
      cuda_impl::gemm_batched<T>(exec, false, transpose_b, m, n, k, alpha, a + offsets[g] * k, 0,
                                 b[g], 0, beta, c + offsets[g] * n, 0, 1);
    }
  }

  template <class T>
  static void grouped_weight_gradient(const execution<cuda>& exec, const T* dy, const T* x,
                                      const std::int64_t* offsets, T* const* dw,
                                      std::int64_t groups, std::int64_t out, std::int64_t in) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t m = offsets[g + 1] - offsets[g];
      if (m == 0 || out == 0 || in == 0) continue;
      cuda_impl::gemm_batched<T>(exec, true, false, out, in, m, 1.0, dy + offsets[g] * out, 0,
                                 x + offsets[g] * in, 0, 1.0, dw[g], 0, 1);
    }
  }

  template <class T>
  static void grouped_bias_add(const execution<cuda>& exec, T* y, const std::int64_t* offsets,
                               const T* const* bias, std::int64_t groups, std::int64_t n) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t rows = offsets[g + 1] - offsets[g];
      if (rows > 0 && n > 0)
        elementwise_engine<cuda>::bias_add(exec, y + offsets[g] * n, bias[g], rows, n);
    }
  }

  template <class T>
  static void grouped_bias_grad(const execution<cuda>& exec, const T* dy,
                                const std::int64_t* offsets, T* const* dbias, std::int64_t groups,
                                std::int64_t n) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t rows = offsets[g + 1] - offsets[g];
      if (rows > 0 && n > 0)
        elementwise_engine<cuda>::bias_grad(exec, dy + offsets[g] * n, dbias[g], rows, n);
    }
  }
};

}  // namespace quintet::kernels
