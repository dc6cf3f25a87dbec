// Helpers for the GPU tests: random host operands, copies to and from the device, and the
// comparisons a CUDA twin is held to against its host kernel.
#pragma once

#include <catch2/catch.hpp>

#include <quintet/kernels/accumulator.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace quintet::gpu_test {

template <class T>
tensor<T, host> random_host(shape extents, std::uint64_t stream, double low = -1.0,
                            double high = 1.0) {
  tensor<T, host> t(extents);
  fill_uniform(t, {.seed = 99, .stream = stream}, low, high);
  return t;
}

template <class T>
tensor<T, cuda> to_device(const tensor<T, host>& h) {
  tensor<T, cuda> d(h.shape());
  copy(d, h);
  return d;
}

template <class T>
tensor<T, host> to_host(const tensor<T, cuda>& d) {
  tensor<T, host> h(d.shape());
  copy(h, d);
  return h;
}

// An element as a double: bf16 and half through float, float and double exactly.
template <class T>
double as_double(T value) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<double>(value);
  } else {
    return static_cast<double>(kernels::widen(value));
  }
}

// Every |got - want| <= atol + rtol |want|; NaN never passes.
template <class T>
void require_close(const tensor<T, host>& got, const tensor<T, host>& want, double rtol,
                   double atol, const char* what) {
  REQUIRE(got.shape() == want.shape());
  double worst = 0;
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double g = as_double(got.data()[i]), w = as_double(want.data()[i]);
    const double excess = std::abs(g - w) - (atol + rtol * std::abs(w));
    if (!(excess <= worst)) {
      worst = std::isnan(excess) ? std::numeric_limits<double>::infinity() : excess;
      at = i;
    }
  }
  INFO(what << ": worst element " << at << " exceeds the tolerance by " << worst);
  REQUIRE(worst <= 0.0);
}

template <class T>
bool same_bits(const tensor<T, host>& a, const tensor<T, host>& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0;
}

// Kernels that round every operation on their own in the host loop's order (cuda/unfused.cuh):
// where the host compiler cannot fuse a * b + c either (x86-64 without FMA, g++'s default target)
// the two give the same bits; elsewhere (a host with FMA may contract) they agree within the
// tolerance.
#if defined(__x86_64__) && !defined(__FMA__)
inline constexpr bool host_rounds_every_operation = true;
#else
inline constexpr bool host_rounds_every_operation = false;
#endif

template <class T>
void require_twin(const tensor<T, host>& got, const tensor<T, host>& want, double rtol, double atol,
                  const char* what) {
  INFO(what);
  if constexpr (host_rounds_every_operation) {
    REQUIRE(same_bits(got, want));
  } else {
    require_close(got, want, rtol, atol, what);
  }
}

}  // namespace quintet::gpu_test
