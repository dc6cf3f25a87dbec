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
#include <quintet/tensor/device_memory.hpp>
#include <quintet/tensor/layout.hpp>
#include <quintet/tensor/region.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cstdint>
#include <type_traits>

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

// The value of element `index` of the cursor's stream under a distribution, converted to T. Float-like
// types draw 24 random bits and compute in float; double draws 53 bits and computes in double.
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

template <class T>
QUINTET_HOST_DEVICE T random_value(normal_distribution dist, rng_cursor& draws,
                                   std::uint64_t index) {
  const double value = detail::fused_multiply_add(dist.stddev, draws.normal_double(index), dist.mean);
  if constexpr (std::is_same_v<T, double>) {
    return value;
  } else {
    return T(static_cast<float>(value));
  }
}

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
    detail::for_each_row(dst.shape(), dst.strides(), [&](const auto& coordinates, std::int64_t offset) {
      // Along the innermost dimension global indices are consecutive: the global tensor is dense.
      const auto first = static_cast<std::uint64_t>(where.global_index(coordinates));
      T* row = dst.data() + offset;
      rng_cursor draws(key);
      for (std::int64_t i = 0; i < length; ++i)
        row[i * step] = random_value<T>(dist, draws, first + static_cast<std::uint64_t>(i));
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
