// embedding on cuda tensors: gathers by a warp per activation row; the token table's gradient by
// sorting the tokens (cub::DeviceRadixSort) so that each table row's gradient rows are added by one
// warp in position order, and the position table's by a column sum over the batch in batch order.
// Every sum is the host's, element by element and in the host's order (each addition rounded to
// the element type, as the host does), so the results are the host's bits, run after run.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cuda/row_groups.cuh>  // the 16-byte row chunks (load_chunk, store_chunk)
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/embedding.hpp>
#include <quintet/kernels/host/embedding.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace quintet::kernels {

namespace cuda_impl {

// A warp per activation row (batch * seq of them), 8 rows per block, rows visited grid-stride;
// lane l handles the chunks at columns (k 32 + l) W.
inline constexpr int rows_per_embedding_block = 8;
inline constexpr int embedding_threads = 32 * rows_per_embedding_block;
inline constexpr std::int64_t embedding_max_blocks = 2147483647;  // gridDim.x < 2^31

template <class Op>
__global__ void __launch_bounds__(embedding_threads)
    activation_rows_kernel(Op op, std::int64_t rows) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (std::int64_t row = std::int64_t{blockIdx.x} * rows_per_embedding_block + threadIdx.x / 32;
       row < rows; row += std::int64_t{gridDim.x} * rows_per_embedding_block)
    op(row, lane);
}

template <class Op>
void launch_activation_rows(const execution<cuda>& exec, const Op& op, std::int64_t rows) {
  const std::int64_t blocks = std::min<std::int64_t>(
      (rows + rows_per_embedding_block - 1) / rows_per_embedding_block, embedding_max_blocks);
  activation_rows_kernel<<<static_cast<unsigned>(blocks), embedding_threads, 0, exec.native()>>>(
      op, rows);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

// out[b, s] = token_table[token] + position_table[offset + s] (with_positions), or
// token_table[token - begin] for ids in [begin, begin + table_rows), else 0 (a lookup alone: an
// exact copy, as the host's std::copy).
template <class T>
struct gather_rows {
  const std::int32_t* tokens;
  const T* token_table;
  const T* position_table;  // null: no positions
  T* out;
  std::int64_t seq, width, begin, table_rows, position_offset;
  bool vectorised;

  __device__ void operator()(std::int64_t row, int lane) const {
    constexpr int w = vector_width<T>;
    const std::int64_t local = static_cast<std::int64_t>(tokens[row]) - begin;
    const bool held = local >= 0 && local < table_rows;
    const T* te = token_table + (held ? local : 0) * width;
    const T* pe = position_table == nullptr
                      ? nullptr
                      : position_table + (position_offset + row % seq) * width;
    T* o = out + row * width;
    for (std::int64_t column = std::int64_t{lane} * w; column < width; column += 32 * w) {
      T values[w];
      if (!held) {
#pragma unroll
        for (int i = 0; i < w; ++i) values[i] = T(0.0f);
      } else if (position_table == nullptr) {
        load_chunk(te, column, width, vectorised, values);
      } else {
        T positions[w];
        load_chunk(te, column, width, vectorised, values);
        load_chunk(pe, column, width, vectorised, positions);
#pragma unroll
        for (int i = 0; i < w; ++i) values[i] = narrow<T>(widen(values[i]) + widen(positions[i]));
      }
      store_chunk(o, column, width, vectorised, values);
    }
  }
};

// out[b, s] += position_table[offset + s], in place.
template <class T>
struct add_position_rows {
  const T* position_table;
  T* out;
  std::int64_t seq, width, position_offset;
  bool vectorised;

  __device__ void operator()(std::int64_t row, int lane) const {
    constexpr int w = vector_width<T>;
    const T* pe = position_table + (position_offset + row % seq) * width;
    T* o = out + row * width;
    for (std::int64_t column = std::int64_t{lane} * w; column < width; column += 32 * w) {
      T values[w], positions[w];
      load_chunk(o, column, width, vectorised, values);
      load_chunk(pe, column, width, vectorised, positions);
#pragma unroll
      for (int i = 0; i < w; ++i) values[i] = narrow<T>(widen(values[i]) + widen(positions[i]));
      store_chunk(o, column, width, vectorised, values);
    }
  }
};

// --- checking the tokens -------------------------------------------------------------------------

// first_bad = the smallest flat index (b seq + s) whose token is outside [0, vocab): the one the
// host's check, which walks the tokens in order, reports. An integer atomicMin: order-free.
// (A template, as every kernel in a header: one definition however many units include it.)
template <class Token>
__global__ void check_tokens_kernel(const Token* tokens, std::int64_t count, std::int64_t vocab,
                                    long long* first_bad) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const Token token = tokens[i];
    if (token < 0 || token >= vocab) atomicMin(first_bad, static_cast<long long>(i));
  }
}

inline constexpr int flat_threads = 256;

inline unsigned flat_blocks(std::int64_t elements) {
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((elements + flat_threads - 1) / flat_threads, 1, 65536));
}

// Raises the host kernel's error for the first token outside the vocabulary, before anything is
// written; waits for the stream. Only when the device finds one are the tokens brought to the host,
// where host_impl::check_tokens walks them and throws its own error (the same text, the same
// place).
inline void check_tokens(const execution<cuda>& exec, const std::int32_t* tokens,
                         const host_impl::embedding_sizes& n, const char* kernel) {
  const std::int64_t count = n.batch * n.seq;
  if (count == 0) return;
  tensor<std::int64_t, cuda> first_bad(shape{1}, exec.stream());
  auto* first_bad_index = reinterpret_cast<long long*>(first_bad.data());
  // 0x7f7f... is above any token count: no bad token until the kernel records one.
  QUINTET_CUDA_CHECK(cudaMemsetAsync(first_bad_index, 0x7f, sizeof(long long), exec.native()));
  check_tokens_kernel<<<flat_blocks(count), flat_threads, 0, exec.native()>>>(
      tokens, count, n.vocab, first_bad_index);
  QUINTET_CUDA_CHECK(cudaGetLastError());
  long long bad = 0;
  QUINTET_CUDA_CHECK(
      cudaMemcpyAsync(&bad, first_bad_index, sizeof(bad), cudaMemcpyDeviceToHost, exec.native()));
  QUINTET_CUDA_CHECK(cudaStreamSynchronize(exec.native()));
  if (bad >= count) return;
  std::vector<std::int32_t> host_tokens(static_cast<std::size_t>(count));
  QUINTET_CUDA_CHECK(cudaMemcpyAsync(host_tokens.data(), tokens,
                                     host_tokens.size() * sizeof(std::int32_t),
                                     cudaMemcpyDeviceToHost, exec.native()));
  QUINTET_CUDA_CHECK(cudaStreamSynchronize(exec.native()));
  host_impl::check_tokens(host_tokens.data(), n, kernel);
}

// --- the token table's gradient ------------------------------------------------------------------

// key = (table row << index_bits) | flat index, with table row = token - begin for the ids the
// table holds and table_rows for the others (sorted last, skipped). Sorting the keys orders by
// row, and within a row by flat index, which is the host's order (b, then s), whether or not the
// sort is stable.
template <class Token>
__global__ void token_keys_kernel(const Token* tokens, std::int64_t count, std::int64_t begin,
                                  std::int64_t table_rows, int index_bits, std::uint64_t* keys) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t local = static_cast<std::int64_t>(tokens[i]) - begin;
    const std::int64_t row = local >= 0 && local < table_rows ? local : table_rows;
    keys[i] = (static_cast<std::uint64_t>(row) << index_bits) | static_cast<std::uint64_t>(i);
  }
}

// A warp per sorted position; the warp at the first key of a run of equal table rows adds the
// run's gradient rows, in order, into that table row, rounding each addition to T as the host
// does. Lane l owns columns tile + 32 k + l, k < columns_per_lane, held in registers while the
// run is walked. Other warps return at once. Runs are disjoint rows: no two warps write the same
// element.
inline constexpr int columns_per_lane = 4;

template <class T>
__global__ void __launch_bounds__(embedding_threads)
    token_gradient_kernel(const std::uint64_t* sorted, std::int64_t count, int index_bits,
                          std::int64_t table_rows, const T* dout, T* dtable, std::int64_t width) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::uint64_t index_mask = (std::uint64_t{1} << index_bits) - 1;
  for (std::int64_t p = std::int64_t{blockIdx.x} * rows_per_embedding_block + threadIdx.x / 32;
       p < count; p += std::int64_t{gridDim.x} * rows_per_embedding_block) {
    const std::uint64_t row = sorted[p] >> index_bits;
    if (row == static_cast<std::uint64_t>(table_rows)) continue;  // an id this table lacks
    if (p > 0 && (sorted[p - 1] >> index_bits) == row) continue;  // not the first of its run
    std::int64_t end = p + 1;
    while (end < count && (sorted[end] >> index_bits) == row) ++end;
    T* table_row = dtable + static_cast<std::int64_t>(row) * width;
    for (std::int64_t tile = 0; tile < width; tile += 32 * columns_per_lane) {
      T sums[columns_per_lane];
#pragma unroll
      for (int k = 0; k < columns_per_lane; ++k) {
        const std::int64_t c = tile + 32 * k + lane;
        if (c < width) sums[k] = table_row[c];
      }
      // Unrolled so that the loads of several gradient rows are in flight at once; the additions
      // stay in order.
#pragma unroll 8
      for (std::int64_t q = p; q < end; ++q) {
        const T* d = dout + static_cast<std::int64_t>(sorted[q] & index_mask) * width;
#pragma unroll
        for (int k = 0; k < columns_per_lane; ++k) {
          const std::int64_t c = tile + 32 * k + lane;
          if (c < width) sums[k] = narrow<T>(widen(sums[k]) + widen(d[c]));
        }
      }
#pragma unroll
      for (int k = 0; k < columns_per_lane; ++k) {
        const std::int64_t c = tile + 32 * k + lane;
        if (c < width) table_row[c] = sums[k];
      }
    }
  }
}

// dtable[tokens[i] - begin] += dout[i] for the ids in [begin, begin + table_rows).
template <class T>
void token_gradient(const execution<cuda>& exec, const std::int32_t* tokens, const T* dout,
                    T* dtable, std::int64_t count, std::int64_t width, std::int64_t begin,
                    std::int64_t table_rows) {
  if (count == 0 || width == 0 || table_rows == 0) return;
  const int index_bits = std::bit_width(static_cast<std::uint64_t>(count - 1));
  const int row_bits = std::bit_width(static_cast<std::uint64_t>(table_rows));  // rows + 1 values
  QUINTET_CHECK(index_bits + row_bits <= 64,
                "token embedding backward on cuda: {} tokens and a table of {} rows do not fit "
                "one 64-bit sort key",
                count, table_rows);
  tensor<std::int64_t, cuda> keys(shape{count}, exec.stream()), sorted(shape{count}, exec.stream());
  auto* keys_in = reinterpret_cast<std::uint64_t*>(keys.data());
  auto* keys_out = reinterpret_cast<std::uint64_t*>(sorted.data());
  token_keys_kernel<<<flat_blocks(count), flat_threads, 0, exec.native()>>>(
      tokens, count, begin, table_rows, index_bits, keys_in);
  QUINTET_CUDA_CHECK(cudaGetLastError());
  const int end_bit = index_bits + row_bits;
  std::size_t temp_bytes = 0;
  QUINTET_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, keys_in, keys_out, count,
                                                    0, end_bit, exec.native()));
  // At least one word: a null temporary storage would make the second call a size query again.
  const auto temp_words = static_cast<std::int64_t>(
      std::max<std::size_t>(1, (temp_bytes + sizeof(std::int64_t) - 1) / sizeof(std::int64_t)));
  tensor<std::int64_t, cuda> temp(shape{temp_words}, exec.stream());
  QUINTET_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp.data(), temp_bytes, keys_in, keys_out,
                                                    count, 0, end_bit, exec.native()));
  const std::int64_t blocks = std::min<std::int64_t>(
      (count + rows_per_embedding_block - 1) / rows_per_embedding_block, embedding_max_blocks);
  token_gradient_kernel<T><<<static_cast<unsigned>(blocks), embedding_threads, 0, exec.native()>>>(
      keys_out, count, index_bits, table_rows, dout, dtable, width);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

// --- the position table's gradient ---------------------------------------------------------------

// dposition[offset + s, c] += dout[b, s, c] for b = 0, 1, ... in order: a thread per (s, c), so
// a warp reads 32 consecutive columns of each batch row.
template <class T>
__global__ void __launch_bounds__(flat_threads)
    position_gradient_kernel(const T* dout, T* dposition, std::int64_t batch, std::int64_t seq,
                             std::int64_t width, std::int64_t position_offset) {
  const std::int64_t elements = seq * width;
  for (std::int64_t e = std::int64_t{blockIdx.x} * flat_threads + threadIdx.x; e < elements;
       e += std::int64_t{gridDim.x} * flat_threads) {
    T* dp = dposition + position_offset * width + e;
    T sum = *dp;
    for (std::int64_t b = 0; b < batch; ++b)
      sum = narrow<T>(widen(sum) + widen(dout[b * elements + e]));
    *dp = sum;
  }
}

template <class T>
void position_gradient(const execution<cuda>& exec, const T* dout, T* dposition,
                       const host_impl::position_sizes& n) {
  const std::int64_t elements = n.seq * n.width;
  if (elements == 0 || n.batch == 0) return;
  position_gradient_kernel<T><<<flat_blocks(elements), flat_threads, 0, exec.native()>>>(
      dout, dposition, n.batch, n.seq, n.width, n.position_offset);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda_impl

template <>
struct embedding_engine<cuda> {
  // Checks every token first (waiting for the stream), as the host does before writing.
  template <class T>
  static void forward(const execution<cuda>& exec, const std::int32_t* tokens, const T* token_table,
                      const T* position_table, T* out, host_impl::embedding_sizes n) {
    const std::int64_t rows = n.batch * n.seq;
    cuda_impl::check_tokens(exec, tokens, n, "embedding_forward");
    if (rows == 0 || n.width == 0) return;
    const bool vectorised = cuda_impl::vectorisable(token_table, n.width) &&
                            cuda_impl::vectorisable(position_table, n.width) &&
                            cuda_impl::vectorisable(out, n.width);
    cuda_impl::launch_activation_rows(
        exec,
        cuda_impl::gather_rows<T>{tokens, token_table, position_table, out, n.seq, n.width, 0,
                                  n.vocab, n.position_offset, vectorised},
        rows);
  }

  // Checks every token first (waiting for the stream): a bad id leaves both gradients untouched.
  template <class T>
  static void backward(const execution<cuda>& exec, const std::int32_t* tokens, const T* dout,
                       T* dtoken_table, T* dposition_table, host_impl::embedding_sizes n) {
    cuda_impl::check_tokens(exec, tokens, n, "embedding_backward");
    cuda_impl::token_gradient(exec, tokens, dout, dtoken_table, n.batch * n.seq, n.width, 0,
                              n.vocab);
    cuda_impl::position_gradient(exec, dout, dposition_table,
                                 {n.batch, n.seq, n.width, n.position_offset});
  }

  template <class T>
  static void token_forward(const execution<cuda>& exec, const std::int32_t* tokens,
                            const T* token_table, T* out, host_impl::token_range_sizes n) {
    const std::int64_t rows = n.batch * n.seq;
    if (rows == 0 || n.width == 0) return;
    const bool vectorised =
        cuda_impl::vectorisable(token_table, n.width) && cuda_impl::vectorisable(out, n.width);
    cuda_impl::launch_activation_rows(
        exec,
        cuda_impl::gather_rows<T>{tokens, token_table, nullptr, out, n.seq, n.width, n.begin,
                                  n.rows, 0, vectorised},
        rows);
  }

  template <class T>
  static void token_backward(const execution<cuda>& exec, const std::int32_t* tokens, const T* dout,
                             T* dtoken_table, host_impl::token_range_sizes n) {
    cuda_impl::token_gradient(exec, tokens, dout, dtoken_table, n.batch * n.seq, n.width, n.begin,
                              n.rows);
  }

  template <class T>
  static void position_add(const execution<cuda>& exec, const T* position_table, T* out,
                           host_impl::position_sizes n) {
    const std::int64_t rows = n.batch * n.seq;
    if (rows == 0 || n.width == 0) return;
    const bool vectorised =
        cuda_impl::vectorisable(position_table, n.width) && cuda_impl::vectorisable(out, n.width);
    cuda_impl::launch_activation_rows(
        exec,
        cuda_impl::add_position_rows<T>{position_table, out, n.seq, n.width, n.position_offset,
                                        vectorised},
        rows);
  }

  template <class T>
  static void position_backward(const execution<cuda>& exec, const T* dout, T* dposition_table,
                                host_impl::position_sizes n) {
    cuda_impl::position_gradient(exec, dout, dposition_table, n);
  }
};

}  // namespace quintet::kernels
