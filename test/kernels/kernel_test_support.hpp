// Helpers shared by the kernel tests: random tensors from the Philox fill, copies to double,
// elementwise comparison with a stated tolerance, and central finite differences.
#pragma once

#include <catch2/catch.hpp>

#include <quintet/kernels/accumulator.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace kernel_test {

using quintet::host;
using quintet::shape;
using quintet::tensor;

// Uniform on [low, high) from the Philox stream `stream` (never all zero).
template <class T>
tensor<T, host> random_tensor(shape extents, std::uint64_t stream, double low = -1.0,
                              double high = 1.0) {
  tensor<T, host> t(extents);
  quintet::fill_uniform(t, {.seed = 20261130, .stream = stream}, low, high);
  return t;
}

template <class T>
std::vector<double> to_double(const tensor<T, host>& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    out[i] = static_cast<double>(static_cast<quintet::kernels::accumulator_t<T>>(t.data()[i]));
  return out;
}

template <class T>
tensor<T, host> from_double(const std::vector<double>& values, shape extents) {
  tensor<T, host> t(extents);
  REQUIRE(static_cast<std::int64_t>(values.size()) == t.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, double>) {
      t.data()[i] = values[i];
    } else {
      t.data()[i] = T(static_cast<float>(values[i]));
    }
  }
  return t;
}

// Every |got - want| <= atol + rtol |want|; on failure names the worst element.
inline void require_close(const std::vector<double>& got, const std::vector<double>& want,
                          double rtol, double atol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst_excess = 0.0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double excess = std::abs(got[i] - want[i]) - (atol + rtol * std::abs(want[i]));
    if (!(excess <= worst_excess)) {  // also catches NaN
      worst_excess = std::isnan(excess) ? INFINITY : excess;
      worst = i;
    }
  }
  INFO(what << ": element " << worst << " is " << (got.empty() ? 0.0 : got[worst]) << ", expected "
            << (want.empty() ? 0.0 : want[worst]) << " (rtol " << rtol << ", atol " << atol << ")");
  REQUIRE(worst_excess <= 0.0);
}

template <class T>
void require_close(const tensor<T, host>& got, const std::vector<double>& want, double rtol,
                   double atol, const std::string& what) {
  require_close(to_double(got), want, rtol, atol, what);
}

// d loss / d x[i] by central differences, for every element of x (double tensors).
inline std::vector<double> finite_difference_gradient(tensor<double, host>& x,
                                                      const std::function<double()>& loss,
                                                      double step = 1e-6) {
  std::vector<double> gradient(static_cast<std::size_t>(x.numel()));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double saved = x.data()[i];
    x.data()[i] = saved + step;
    const double up = loss();
    x.data()[i] = saved - step;
    const double down = loss();
    x.data()[i] = saved;
    gradient[i] = (up - down) / (2 * step);
  }
  return gradient;
}

// sum_i w[i] y[i]: the scalar whose gradient with respect to y is w, so a backward kernel fed
// dy = w must return the gradient of this.
inline double weighted_sum(const tensor<double, host>& y, const tensor<double, host>& w) {
  double total = 0.0;
  for (std::int64_t i = 0; i < y.numel(); ++i) total += y.data()[i] * w.data()[i];
  return total;
}

// The same shape and elements, bit for bit.
template <class T>
bool same_bits(const tensor<T, host>& a, const tensor<T, host>& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0;
}

}  // namespace kernel_test
