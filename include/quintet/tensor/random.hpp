// Random initialisation through the Philox RNG. The value of an element depends only on the key
// and on the element's index in the *global* tensor, so a rank that holds the shard `where` of a
// parameter draws exactly what the serial model draws for those elements:
//
//   fill_normal(full, key, 0, 1)                          full: (8, 6)
//   fill_normal(shard, key, 0, 1, region(full_shape).chunk(1, 2, r))
//   => shard == chunk(full, 1, 2, r), bit for bit, on every device.
#pragma once

#include <quintet/core/bf16.hpp>
#include <quintet/core/config.hpp>
#include <quintet/core/dtype.hpp>
#include <quintet/core/error.hpp>
#include <quintet/core/half.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/core/philox_avx2.hpp>
#include <quintet/tensor/device_memory.hpp>
#include <quintet/tensor/layout.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

namespace quintet {

// Uniform on [low, high) before rounding to the element type (a 16-bit type may round up to high).
struct uniform_distribution {
  double low = 0.0;
  double high = 1.0;
};

struct normal_distribution {
  double mean = 0.0;
  double stddev = 1.0;
};

// The value of element `index` of the cursor's stream under a distribution, converted to T.
// Float-like types draw 24 random bits and compute in float; double draws 53 bits and computes in
// double.
template <class T>
QUINTET_HOST_DEVICE T random_value(uniform_distribution dist, rng_cursor& draws,
                                   std::uint64_t index) {
  if constexpr (std::is_same_v<T, double>) {
    return detail::fused_multiply_add(dist.high - dist.low, draws.uniform_double(index), dist.low);
  } else {
    const float low = static_cast<float>(dist.low);
    const float span = static_cast<float>(dist.high) - low;
    return T(detail::fused_multiply_add(span, draws.uniform_float(index), low));
  }
}

namespace detail {

// A standard normal scaled and shifted, converted to T (through float unless T is double).
template <class T>
QUINTET_HOST_DEVICE QUINTET_FORCE_INLINE T normal_value(normal_distribution dist, double standard) {
  const double value = fused_multiply_add(dist.stddev, standard, dist.mean);
  if constexpr (std::is_same_v<T, double>) {
    return value;
  } else {
    return T(static_cast<float>(value));
  }
}

}  // namespace detail

template <class T>
QUINTET_HOST_DEVICE T random_value(normal_distribution dist, rng_cursor& draws,
                                   std::uint64_t index) {
  return detail::normal_value<T>(dist, draws.normal_double(index));
}

namespace detail {

// Elements [first, first + count) of a normal stream into out[0], out[step], ...: the values
// random_value gives, each Box-Muller pair computed once for its two elements.
template <class T>
QUINTET_FORCE_INLINE void normal_run_portable(T* out, std::int64_t step, rng_key key,
                                              normal_distribution dist, std::uint64_t first,
                                              std::int64_t count) {
  const std::uint64_t end = first + static_cast<std::uint64_t>(count);
  for (std::uint64_t index = first; index < end;) {
    const normal_pair pair = box_muller(random_block(key, index / 2));
    if (index % 2 == 0) {
      *out = normal_value<T>(dist, pair.even);
      out += step;
      if (++index == end) break;
    }
    *out = normal_value<T>(dist, pair.odd);
    out += step;
    ++index;
  }
}

#if QUINTET_PHILOX_AVX2
// The same run with AVX2 and FMA, chosen at run time where the CPU has them: four Box-Muller
// pairs at a time in vector lanes (box_muller_x4), the ends through the scalar code, which this
// target also runs with hardware FMA (a generic build calls the C library for each of a pair's
// ~30 fused multiply-adds). Lanes and scalar code give the same bits.
template <class T>
[[gnu::target("avx2,fma")]] void normal_run_avx2(T* out, std::int64_t step, rng_key key,
                                                 normal_distribution dist, std::uint64_t first,
                                                 std::int64_t count) {
  const std::uint64_t end = first + static_cast<std::uint64_t>(count);
  std::uint64_t index = first;
  if (index % 2 == 1 && index < end) {  // the second element of a pair: start on a whole pair
    normal_run_portable(out, step, key, dist, index, 1);
    out += step;
    ++index;
  }
  constexpr std::uint64_t per_group = 8;  // four blocks, two elements each
  const __m256d stddev = _mm256_set1_pd(dist.stddev), mean = _mm256_set1_pd(dist.mean);
  for (; end - index >= per_group; index += per_group) {
    const normal_pairs_x4 pairs = box_muller_x4(random_blocks_x4(key, index / 2));
    alignas(32) double even[4], odd[4];
    _mm256_store_pd(even, _mm256_fmadd_pd(stddev, pairs.even, mean));
    _mm256_store_pd(odd, _mm256_fmadd_pd(stddev, pairs.odd, mean));
    for (int lane = 0; lane < 4; ++lane) {
      // normal_value's conversion of the scaled value.
      if constexpr (std::is_same_v<T, double>) {
        out[0] = even[lane];
        out[step] = odd[lane];
      } else {
        out[0] = T(static_cast<float>(even[lane]));
        out[step] = T(static_cast<float>(odd[lane]));
      }
      out += 2 * step;
    }
  }
  normal_run_portable(out, step, key, dist, index, static_cast<std::int64_t>(end - index));
}
#endif

template <class T>
void normal_run(T* out, std::int64_t step, rng_key key, normal_distribution dist,
                std::uint64_t first, std::int64_t count) {
#if QUINTET_PHILOX_AVX2
  if (cpu_has_avx2_fma()) return normal_run_avx2(out, step, key, dist, first, count);
#endif
  normal_run_portable(out, step, key, dist, first, count);
}

// Normal draws into a dense destination whose elements are consecutive in the global tensor
// (the whole tensor, or a block of whole rows): split into runs over the machine's cores when
// large (initialisation, outside any step: each rank of a parallel run uses them all for a
// moment). The values do not depend on the split.
template <class T>
void normal_fill_consecutive(T* out, rng_key key, normal_distribution dist, std::uint64_t first,
                             std::int64_t count) {
  constexpr std::int64_t per_thread = std::int64_t{1} << 17;  // below this a thread costs more
  const auto cores = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  const std::int64_t threads = std::clamp<std::int64_t>(count / per_thread, 1, cores);
  if (threads == 1) return normal_run(out, 1, key, dist, first, count);
  // At most `threads` runs, of an even length: each Box-Muller pair is drawn once when `first`
  // is even (when it is odd, the pairs at the runs' edges twice).
  const std::int64_t run = ((count + threads - 1) / threads + 1) / 2 * 2;
  const auto fill = [=](std::int64_t begin) {
    normal_run(out + begin, 1, key, dist, first + static_cast<std::uint64_t>(begin),
               std::min(run, count - begin));
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(threads - 1));
  std::int64_t begin = run;
  try {
    for (; begin < count; begin += run) workers.emplace_back(fill, begin);
  } catch (const std::system_error&) {
    // No more threads to be had: this one fills what was not handed out.
  }
  fill(0);
  for (; begin < count; begin += run) fill(begin);
  for (auto& worker : workers) worker.join();
}

}  // namespace detail

// random_engine<Device>::run(view, key, distribution, where): the device's implementation. The
// cuda one lives in <quintet/tensor/cuda/random.cuh> and needs nvcc.
template <class Device>
struct random_engine {
  static_assert(detail::always_false<Device>,
                "random initialisation on this device needs its implementation: for quintet::cuda "
                "include <quintet/tensor/cuda/random.cuh> in a translation unit compiled by nvcc");
};

template <>
struct random_engine<host> {
  template <class T, class Distribution>
  static void run(tensor_view<T, host> dst, rng_key key, Distribution dist, const region& where) {
    const int rank = dst.rank();
    const std::int64_t length = rank > 0 ? dst.shape()[rank - 1] : 1;
    const std::int64_t step = rank > 0 ? dst.strides()[rank - 1] : 1;
    if constexpr (std::is_same_v<Distribution, normal_distribution>) {
      // Parameters' initialisation: a dense destination whose elements are consecutive in the
      // global tensor (the global index of its last element is numel - 1 past its first's) is one
      // run, split over the cores.
      const std::int64_t numel = dst.numel();
      if (numel > 0 && dst.is_contiguous()) {
        shape::index_array last{};
        for (int d = 0; d < rank; ++d) last[d] = dst.shape()[d] - 1;
        const std::int64_t first = where.global_index(shape::index_array{});
        if (where.global_index(last) - first == numel - 1)
          return detail::normal_fill_consecutive(dst.data(), key, dist,
                                                 static_cast<std::uint64_t>(first), numel);
      }
    }
    detail::for_each_row(
        dst.shape(), dst.strides(), [&](const auto& coordinates, std::int64_t offset) {
          // Along the innermost dimension global indices are consecutive: the global tensor is
          // dense.
          const auto first = static_cast<std::uint64_t>(where.global_index(coordinates));
          T* row = dst.data() + offset;
          if constexpr (std::is_same_v<Distribution, normal_distribution>) {
            detail::normal_run(row, step, key, dist, first, length);
          } else {
            rng_cursor draws(key);
            for (std::int64_t i = 0; i < length; ++i)
              row[i * step] = random_value<T>(dist, draws, first + static_cast<std::uint64_t>(i));
          }
        });
  }
};

namespace detail {

template <class Dst, class Distribution>
void fill_random(Dst&& destination, rng_key key, Distribution dist, const region& where,
                 const char* what) {
  const auto dst = view_of(destination);
  using view = std::remove_const_t<decltype(dst)>;
  static_assert(mutable_tensor_like<view>, "random initialisation needs a writable destination");
  static_assert(floating_element<typename view::value_type>,
                "random initialisation needs a floating-point element type");
  QUINTET_CHECK(where.local_shape() == dst.shape(),
                "{}: the region's local shape {} differs from the destination's shape {}", what,
                where.local_shape(), dst.shape());
  random_engine<typename view::device_type>::run(dst, key, dist, where);
}

}  // namespace detail

// Uniform draws on [low, high) into the part `where` of a global tensor (the whole tensor when
// `where` is omitted).
template <class Dst>
void fill_uniform(Dst&& dst, rng_key key, double low, double high, const region& where) {
  QUINTET_CHECK(low <= high, "fill_uniform: low {} is above high {}", low, high);
  detail::fill_random(dst, key, uniform_distribution{low, high}, where, "fill_uniform");
}
template <class Dst>
void fill_uniform(Dst&& dst, rng_key key, double low, double high) {
  fill_uniform(dst, key, low, high, region(view_of(dst).shape()));
}

// Normal draws with the given mean and standard deviation into the part `where` of a global tensor.
template <class Dst>
void fill_normal(Dst&& dst, rng_key key, double mean, double stddev, const region& where) {
  QUINTET_CHECK(stddev >= 0, "fill_normal: the standard deviation {} is negative", stddev);
  detail::fill_random(dst, key, normal_distribution{mean, stddev}, where, "fill_normal");
}
template <class Dst>
void fill_normal(Dst&& dst, rng_key key, double mean, double stddev) {
  fill_normal(dst, key, mean, stddev, region(view_of(dst).shape()));
}

}  // namespace quintet
