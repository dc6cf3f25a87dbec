// Host loops for the elementwise kernels: bias add and its gradient, GELU (tanh form) forward and
// backward, addition and scaling, on contiguous arrays. Arithmetic in accumulator_t<T>.
#pragma once

#include <quintet/kernels/accumulator.hpp>
#include <quintet/kernels/host/exponential.hpp>
#include <quintet/kernels/host/lanes.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace quintet::kernels::host_impl {

// x (rows, n) += bias (n), broadcast over rows.
template <class T>
void bias_add(T* x, const T* bias, std::int64_t rows, std::int64_t n) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* row = x + r * n;
    lane_map(row, n, [&](std::int64_t j) { return narrow<T>(widen(row[j]) + widen(bias[j])); });
  }
}

// dbias (n) += column sums of dy (rows, n); the sums are formed in the accumulator type first.
template <class T>
void bias_grad(const T* dy, T* dbias, std::int64_t rows, std::int64_t n) {
  using acc = accumulator_t<T>;
  std::vector<acc> sums(static_cast<std::size_t>(n), acc(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = dy + r * n;
    acc* total = sums.data();
    lane_map(total, n, [&](std::int64_t j) { return total[j] + widen(row[j]); });
  }
  for (std::int64_t j = 0; j < n; ++j) dbias[j] = narrow<T>(widen(dbias[j]) + sums[j]);
}

// GELU, tanh form (Hendrycks & Gimpel): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// Evaluated as x s with s = 1 / (1 + exp(-2u)), since 0.5 (1 + tanh(u)) = sigmoid(2u): one exp
// instead of tanh (glibc's tanhf is several times slower than expf, and GELU was a third of a
// small model's training step), and no cancellation where tanh(u) is near -1.
template <class Acc>
struct gelu_constants {
  static constexpr Acc sqrt_2_over_pi = Acc(0.79788456080286535588);
  static constexpr Acc cubic = Acc(0.044715);
};

// exp(-2u) for a chunk of x (then s = 1 / (1 + exp(-2u))).
template <class T, class Acc = accumulator_t<T>>
void gelu_exponentials(const T* x, Acc* out, std::int64_t n) {
  using k = gelu_constants<Acc>;
  lane_map(out, n, [&](std::int64_t i) {
    const Acc v = widen(x[i]);
    return Acc(-2) * k::sqrt_2_over_pi * (v + k::cubic * v * v * v);
  });
  exponentials(out, out, n);
}

// Rows of elements are processed in chunks that fit in L1 next to their inputs.
inline constexpr std::int64_t gelu_chunk = 512;

template <class T>
void gelu_forward(const T* x, T* y, std::int64_t count) {
  using acc = accumulator_t<T>;
  acc e[gelu_chunk];
  for (std::int64_t first = 0; first < count; first += gelu_chunk) {
    const std::int64_t n = std::min(gelu_chunk, count - first);
    const T* xc = x + first;
    gelu_exponentials(xc, e, n);
    lane_map(y + first, n,
             [&](std::int64_t i) { return narrow<T>(widen(xc[i]) / (acc(1) + e[i])); });
  }
}

// d gelu / dx = 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x) with t = tanh(u); in terms of s = sigmoid(2u),
// 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s), so the slope is s + 2 x s (1 - s) u'(x),
// u'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <class T>
void gelu_backward(const T* x, const T* dy, T* dx, std::int64_t count) {
  using acc = accumulator_t<T>;
  using k = gelu_constants<acc>;
  acc e[gelu_chunk];
  for (std::int64_t first = 0; first < count; first += gelu_chunk) {
    const std::int64_t n = std::min(gelu_chunk, count - first);
    const T* xc = x + first;
    const T* dyc = dy + first;
    gelu_exponentials(xc, e, n);
    lane_map(dx + first, n, [&](std::int64_t i) {
      const acc v = widen(xc[i]);
      const acc s = acc(1) / (acc(1) + e[i]);
      const acc du = k::sqrt_2_over_pi * (acc(1) + acc(3) * k::cubic * v * v);
      return narrow<T>(widen(dyc[i]) * (s + acc(2) * v * s * (acc(1) - s) * du));
    });
  }
}

template <class T>
void add(const T* a, const T* b, T* out, std::int64_t count) {
  lane_map(out, count, [&](std::int64_t i) { return narrow<T>(widen(a[i]) + widen(b[i])); });
}

template <class T>
void fill(T* x, T value, std::int64_t count) {
  std::fill(x, x + count, value);
}

template <class T>
void scale(T* x, accumulator_t<T> alpha, std::int64_t count) {
  lane_map(x, count, [&](std::int64_t i) { return narrow<T>(widen(x[i]) * alpha); });
}

// into[i] += from[i], from widened exactly to into's type (float or double) and the sum rounded
// once in it.
template <class From, class To>
void accumulate(const From* from, To* into, std::int64_t count) {
  lane_map(into, count, [&](std::int64_t i) { return into[i] + static_cast<To>(widen(from[i])); });
}

// out[i] = in[i] in another floating type: exact when widening; narrowing to bf16 or half rounds
// to nearest even from float (a double goes through float first).
template <class From, class To>
void convert(const From* in, To* out, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<To, float> || std::is_same_v<To, double>) {
      out[i] = static_cast<To>(widen(in[i]));
    } else {
      out[i] = To(static_cast<float>(widen(in[i])));
    }
  }
}

}  // namespace quintet::kernels::host_impl
