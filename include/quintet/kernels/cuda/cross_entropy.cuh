// cross_entropy on cuda tensors: the rows' log-sum-exp by the row machinery
// (cuda/row_groups.cuh), the loss summed over the rows by one block in a fixed order, the gradient
// an elementwise pass per row; and the vocabulary-parallel shard pieces. Targets are checked on the
// device: the first bad row is recorded and the host raises the host kernel's error once the
// kernel is done, so the loss and the whole-vocabulary backward wait for their kernels.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/cuda/row_groups.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/host/cross_entropy.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <cstdint>

namespace quintet::kernels {

namespace cuda_impl {

// lse[r] = max + log sum exp(x - max) of each row of vocab.
template <class T>
struct log_sum_exp_rows {
  using acc = accumulator_t<T>;
  static constexpr int register_arrays = 1;
  const T* logits;
  acc* lse;
  std::int64_t vocab;
  bool vectorised;

  template <int Items, class Group>
  __device__ void run(Group& group, std::int64_t row) const {
    const T* xr = logits + row * vocab;
    exp_statistics<acc> statistics;
    if constexpr (Items > 0) {
      acc e[Items];
      row_tile<T, Group::lanes, Items>::load(xr, vocab, group.lane(), vectorised, e,
                                             minus_infinity<acc>);
      statistics = exp_statistics_of(group, e);
    } else {
      statistics = streamed_exp_statistics<T>(group, xr, vocab, vectorised);
    }
    if (group.leader()) lse[row] = statistics.peak + logarithm(statistics.total);
  }
};

// row_max[r] = the maximum of the first `valid` of a row's `columns` (-inf when valid is 0).
template <class T>
struct shard_max_rows {
  using acc = accumulator_t<T>;
  const T* logits;
  acc* row_max;
  std::int64_t columns, valid;
  bool vectorised;

  template <int Items, class Group>
  __device__ void run(Group& group, std::int64_t row) const {
    static_assert(Items == 0, "the shard maximum streams its row");
    constexpr int width = vector_width<T>;
    const T* xr = logits + row * columns;
    acc peak = minus_infinity<acc>;
    for (std::int64_t column = first_column<T>(group); column < valid;
         column += column_step<T, Group>) {
      acc values[width];
      load_widened(xr, column, valid, vectorised, values, minus_infinity<acc>);
#pragma unroll
      for (int i = 0; i < width; ++i) peak = larger_of{}(peak, values[i]);
    }
    peak = group.max(peak);
    if (group.leader()) row_max[row] = peak;
  }
};

// partials[r] = {sum over the valid columns of exp(x - row_max[r]), the target's logit when this
// shard holds it and it is not ignore_index, else 0}.
template <class T>
struct shard_partials_rows {
  using acc = accumulator_t<T>;
  const T* logits;
  const std::int32_t* targets;
  const acc* row_max;
  acc* partials;
  std::int64_t columns, begin, valid;
  std::int32_t ignore_index;
  bool vectorised;

  template <int Items, class Group>
  __device__ void run(Group& group, std::int64_t row) const {
    static_assert(Items == 0, "the shard partials stream their row");
    constexpr int width = vector_width<T>;
    const T* xr = logits + row * columns;
    const acc peak = row_max[row];
    acc total = 0;
    for (std::int64_t column = first_column<T>(group); column < valid;
         column += column_step<T, Group>) {
      acc values[width];
      load_widened(xr, column, valid, vectorised, values, minus_infinity<acc>);
#pragma unroll
      for (int i = 0; i < width; ++i) total += exponential(values[i] - peak);  // 0 past the end
    }
    total = group.sum(total);
    if (group.leader()) {
      const std::int32_t target = targets[row];
      const std::int64_t local = static_cast<std::int64_t>(target) - begin;
      const bool held = target != ignore_index && local >= 0 && local < valid;
      partials[2 * row] = total;
      partials[2 * row + 1] = held ? widen(xr[local]) : acc(0);
    }
  }
};

// --- the loss: one block sums the rows -----------------------------------------------------------

// 1024 threads each sum every 1024th row in row order, then cub::BlockReduce adds the partial sums
// in its fixed tree: the same bits every run (the host adds the rows one after the other; both are
// double sums of float or double terms, so they differ by a few double ulps of the total).
inline constexpr int totals_threads = 1024;

struct smaller_of {
  __device__ std::int64_t operator()(std::int64_t a, std::int64_t b) const { return a < b ? a : b; }
};

// What the totals kernels write: loss_sum[0], and counts = {counted rows, the first row whose
// target is neither a vocabulary id nor ignore_index (rows when there is none), that row's target}.
struct totals_out {
  double* loss_sum;
  std::int64_t* counts;
};

__device__ inline void publish_totals(double loss, std::int64_t count, std::int64_t first_bad,
                                      std::int64_t rows, const std::int32_t* targets,
                                      totals_out out) {
  using sum_doubles = cub::BlockReduce<double, totals_threads>;
  using reduce_counts = cub::BlockReduce<std::int64_t, totals_threads>;
  // Three reductions on three storages: none is reused, so no barrier is needed between them.
  __shared__ typename sum_doubles::TempStorage loss_storage;
  __shared__ typename reduce_counts::TempStorage count_storage, bad_storage;
  const double total_loss = sum_doubles(loss_storage).Sum(loss);
  const std::int64_t total_count = reduce_counts(count_storage).Sum(count);
  const std::int64_t bad = reduce_counts(bad_storage).Reduce(first_bad, smaller_of{});
  if (threadIdx.x == 0) {
    out.loss_sum[0] = total_loss;
    out.counts[0] = total_count;
    out.counts[1] = bad;
    out.counts[2] = bad < rows ? targets[bad] : 0;
  }
}

// The loss of cross_entropy_forward: sum over counted rows of lse - logit[target], in double.
template <class T>
__global__ void __launch_bounds__(totals_threads)
    cross_entropy_totals_kernel(const T* logits, const std::int32_t* targets,
                                const accumulator_t<T>* lse, std::int64_t rows, std::int64_t vocab,
                                std::int32_t ignore_index, totals_out out) {
  double loss = 0.0;
  std::int64_t count = 0, first_bad = rows;
  for (std::int64_t r = threadIdx.x; r < rows; r += totals_threads) {
    const std::int32_t target = targets[r];
    if (target == ignore_index) continue;
    if (target < 0 || target >= vocab) {
      first_bad = std::min(first_bad, r);
      continue;
    }
    loss += static_cast<double>(lse[r]) - static_cast<double>(widen(logits[r * vocab + target]));
    ++count;
  }
  publish_totals(loss, count, first_bad, rows, targets, out);
}

// cross_entropy_shard_finish: lse = row_max + log(sum_exp) for every row, and the loss.
template <class Acc>
__global__ void __launch_bounds__(totals_threads)
    shard_finish_kernel(const std::int32_t* targets, const Acc* row_max, const Acc* partials,
                        Acc* lse, std::int64_t rows, std::int64_t vocab, std::int32_t ignore_index,
                        totals_out out) {
  double loss = 0.0;
  std::int64_t count = 0, first_bad = rows;
  for (std::int64_t r = threadIdx.x; r < rows; r += totals_threads) {
    const std::int32_t target = targets[r];
    const Acc row_lse = row_max[r] + logarithm(partials[2 * r]);
    lse[r] = row_lse;
    if (target == ignore_index) continue;
    if (target < 0 || target >= vocab) {
      first_bad = std::min(first_bad, r);
      continue;
    }
    loss += static_cast<double>(row_lse) - static_cast<double>(partials[2 * r + 1]);
    ++count;
  }
  publish_totals(loss, count, first_bad, rows, targets, out);
}

// Runs `launch(out)` (a one-block totals kernel), brings the totals to the host (waiting for the
// stream) and raises the host kernel's error, naming `kernel`, for the first bad target.
template <class Launch>
cross_entropy_result finish_totals(const execution<cuda>& exec, const char* kernel,
                                   std::int64_t rows, std::int64_t vocab, std::int32_t ignore_index,
                                   Launch launch) {
  tensor<double, cuda> loss_sum(shape{1}, exec.stream());
  tensor<std::int64_t, cuda> counts(shape{3}, exec.stream());
  launch(totals_out{loss_sum.data(), counts.data()});
  QUINTET_CUDA_CHECK(cudaGetLastError());
  double host_loss = 0.0;
  std::int64_t host_counts[3] = {};
  QUINTET_CUDA_CHECK(cudaMemcpyAsync(&host_loss, loss_sum.data(), sizeof(host_loss),
                                     cudaMemcpyDeviceToHost, exec.native()));
  QUINTET_CUDA_CHECK(cudaMemcpyAsync(host_counts, counts.data(), sizeof(host_counts),
                                     cudaMemcpyDeviceToHost, exec.native()));
  QUINTET_CUDA_CHECK(cudaStreamSynchronize(exec.native()));
  if (host_counts[1] < rows)
    host_impl::check_target(kernel, static_cast<std::int32_t>(host_counts[2]), host_counts[1],
                            vocab, ignore_index);
  return {host_loss, host_counts[0]};
}

// --- the gradient --------------------------------------------------------------------------------

// dlogits = scale (exp(x - lse) - onehot(target)) on the first `valid` of a row's `columns`, 0 on
// the others and on ignored rows; the onehot only where target - begin is in [0, valid). With
// first_bad_row (the whole-vocabulary backward, begin 0 and valid = columns = vocab) a row whose
// target is neither a vocabulary id nor ignore_index is left unwritten, as the host throws before
// writing it, and the smallest such row is recorded (an integer atomicMin: its result does not
// depend on the order).
template <class T>
struct gradient_rows {
  using acc = accumulator_t<T>;
  const T* logits;
  const std::int32_t* targets;
  const acc* lse;
  T* dlogits;
  std::int64_t columns, begin, valid;
  acc scale;
  std::int32_t ignore_index;
  long long* first_bad_row;  // null: targets are not checked (the shards')
  bool vectorised;
};

// A block of 256 per row: a 50000-id row gives each thread 12 float4 chunks.
inline constexpr int gradient_threads = 256;

template <class T>
__global__ void __launch_bounds__(gradient_threads)
    cross_entropy_gradient_kernel(gradient_rows<T> g, std::int64_t rows) {
  using acc = accumulator_t<T>;
  constexpr int width = vector_width<T>;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int32_t target = g.targets[row];
    const bool ignored = target == g.ignore_index;
    const std::int64_t local = static_cast<std::int64_t>(target) - g.begin;
    if (!ignored && g.first_bad_row != nullptr && (local < 0 || local >= g.valid)) {
      if (threadIdx.x == 0) atomicMin(g.first_bad_row, static_cast<long long>(row));
      continue;  // the same for the whole block
    }
    const std::int64_t counted = ignored ? 0 : g.valid;  // the columns that get a probability
    const acc shift = g.lse[row];
    const T* xr = g.logits + row * g.columns;
    T* out = g.dlogits + row * g.columns;
    for (std::int64_t column = std::int64_t{threadIdx.x} * width; column < g.columns;
         column += std::int64_t{gradient_threads} * width) {
      acc values[width];
      load_widened(xr, column, counted, g.vectorised, values, acc(0));
#pragma unroll
      for (int i = 0; i < width; ++i) {
        const std::int64_t j = column + i;
        const acc e = j < counted ? exponential(values[i] - shift) : acc(0);
        values[i] = j < counted ? (j == local ? g.scale * (e - acc(1)) : g.scale * e) : acc(0);
      }
      store_narrowed(out, column, g.columns, g.vectorised, values);
    }
  }
}

template <class T>
void launch_gradient(const execution<cuda>& exec, const gradient_rows<T>& g, std::int64_t rows) {
  const auto blocks = static_cast<unsigned>(std::min(rows, max_grid_blocks));
  cross_entropy_gradient_kernel<T><<<blocks, gradient_threads, 0, exec.native()>>>(g, rows);
  QUINTET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda_impl

template <>
struct cross_entropy_engine<cuda> {
  template <class T, class Acc>
  static cross_entropy_result forward(const execution<cuda>& exec, const T* logits,
                                      const std::int32_t* targets, Acc* lse, std::int64_t rows,
                                      std::int64_t vocab, std::int32_t ignore_index) {
    if (rows == 0) return {};
    const bool vectorised = cuda_impl::vectorisable(logits, vocab);
    cuda_impl::launch_register_rows(
        exec, cuda_impl::log_sum_exp_rows<T>{logits, lse, vocab, vectorised}, rows, vocab);
    return cuda_impl::finish_totals(exec, "cross_entropy_forward", rows, vocab, ignore_index,
                                    [&](cuda_impl::totals_out out) {
                                      cuda_impl::cross_entropy_totals_kernel<T>
                                          <<<1, cuda_impl::totals_threads, 0, exec.native()>>>(
                                              logits, targets, lse, rows, vocab, ignore_index, out);
                                    });
  }

  // Waits for its kernel: a bad target must raise here, as on the host.
  template <class T, class Acc>
  static void backward(const execution<cuda>& exec, const T* logits, const std::int32_t* targets,
                       const Acc* lse, T* dlogits, std::int64_t rows, std::int64_t vocab, Acc scale,
                       std::int32_t ignore_index) {
    if (rows == 0) return;
    tensor<std::int64_t, cuda> first_bad(shape{1}, exec.stream());
    auto* first_bad_row = reinterpret_cast<long long*>(first_bad.data());
    // 0x7f7f... is above any row count: no bad row until the kernel records one.
    QUINTET_CUDA_CHECK(cudaMemsetAsync(first_bad_row, 0x7f, sizeof(long long), exec.native()));
    const bool vectorised =
        cuda_impl::vectorisable(logits, vocab) && cuda_impl::vectorisable(dlogits, vocab);
    cuda_impl::launch_gradient(
        exec,
        cuda_impl::gradient_rows<T>{logits, targets, lse, dlogits, vocab, 0, vocab, scale,
                                    ignore_index, first_bad_row, vectorised},
        rows);
    long long bad_row = 0;
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(&bad_row, first_bad_row, sizeof(bad_row),
                                       cudaMemcpyDeviceToHost, exec.native()));
    QUINTET_CUDA_CHECK(cudaStreamSynchronize(exec.native()));
    if (bad_row >= rows) return;
    std::int32_t target = 0;
    QUINTET_CUDA_CHECK(cudaMemcpyAsync(&target, targets + bad_row, sizeof(target),
                                       cudaMemcpyDeviceToHost, exec.native()));
    QUINTET_CUDA_CHECK(cudaStreamSynchronize(exec.native()));
    host_impl::check_target("cross_entropy_backward", target, bad_row, vocab, ignore_index);
  }

  template <class T, class Acc>
  static void shard_max(const execution<cuda>& exec, const T* logits, Acc* row_max,
                        std::int64_t rows, std::int64_t columns, std::int64_t valid) {
    if (rows == 0) return;
    const bool vectorised = cuda_impl::vectorisable(logits, columns);
    cuda_impl::launch_streamed_rows(
        exec, cuda_impl::shard_max_rows<T>{logits, row_max, columns, valid, vectorised}, rows,
        valid);
  }

  template <class T, class Acc>
  static void shard_partials(const execution<cuda>& exec, const T* logits,
                             const std::int32_t* targets, const Acc* row_max, Acc* partials,
                             std::int64_t rows, std::int64_t columns, std::int64_t begin,
                             std::int64_t valid, std::int32_t ignore_index) {
    if (rows == 0) return;
    const bool vectorised = cuda_impl::vectorisable(logits, columns);
    cuda_impl::launch_streamed_rows(
        exec,
        cuda_impl::shard_partials_rows<T>{logits, targets, row_max, partials, columns, begin, valid,
                                          ignore_index, vectorised},
        rows, valid);
  }

  template <class Acc>
  static cross_entropy_result shard_finish(const execution<cuda>& exec, const std::int32_t* targets,
                                           const Acc* row_max, const Acc* partials, Acc* lse,
                                           std::int64_t rows, std::int64_t vocab,
                                           std::int32_t ignore_index) {
    if (rows == 0) return {};
    return cuda_impl::finish_totals(
        exec, "vocab-parallel cross_entropy", rows, vocab, ignore_index,
        [&](cuda_impl::totals_out out) {
          cuda_impl::shard_finish_kernel<Acc><<<1, cuda_impl::totals_threads, 0, exec.native()>>>(
              targets, row_max, partials, lse, rows, vocab, ignore_index, out);
        });
  }

  template <class T, class Acc>
  static void shard_backward(const execution<cuda>& exec, const T* logits,
                             const std::int32_t* targets, const Acc* lse, T* dlogits,
                             std::int64_t rows, std::int64_t columns, std::int64_t begin,
                             std::int64_t valid, Acc scale, std::int32_t ignore_index) {
    if (rows == 0 || columns == 0) return;
    const bool vectorised =
        cuda_impl::vectorisable(logits, columns) && cuda_impl::vectorisable(dlogits, columns);
    cuda_impl::launch_gradient(
        exec,
        cuda_impl::gradient_rows<T>{logits, targets, lse, dlogits, columns, begin, valid, scale,
                                    ignore_index, nullptr, vectorised},
        rows);
  }
};

}  // namespace quintet::kernels
