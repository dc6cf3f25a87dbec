// matmul_probe: a host's practical peak, measured. Where no datasheet peak is given, MFU is taken
// against the rate kernels::matmul reaches on square float products of a few hundred rows with the
// execution context's threads: the sgemm rate of this machine's BLAS (or the portable kernel).
// Untimed products for `seconds` / 4 wake the BLAS threads and let the clock ramp up (on the 2-core
// VM the first 0.1 s ran at 31-41 GFLOP/s, then ~55); then five rounds of `seconds` / 5 each (at
// least one product per round) are timed, and the fastest round gives the rate: a peak is what the
// machine can do, and a round that a preempted BLAS thread slowed says less about that.
#pragma once

#include <quintet/core/error.hpp>
#include <quintet/core/philox.hpp>
#include <quintet/kernels/execution.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/tensor/random.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace quintet::train {

struct matmul_probe_result {
  double flops_per_second = 0.0;  // 2 n^3 per product, in the fastest round
  std::int64_t size = 0;          // n: the products were (n, n) x (n, n)
  std::int64_t products = 0;      // timed, over every round
  double seconds = 0.0;           // of every round
  int threads = 1;                // the execution context's
};

inline matmul_probe_result probe_matmul_rate(const execution<host>& exec, std::int64_t size = 384,
                                             double seconds = 0.2) {
  QUINTET_CHECK(size >= 1 && seconds >= 0.0, "probe_matmul_rate: size {} and {} s", size, seconds);
  tensor<float, host> a(shape{size, size}), b(shape{size, size}), c(shape{size, size});
  fill_uniform(a, rng_key{.seed = 1, .stream = rng_stream_for("quintet.train.matmul_probe.a")},
               -1.0, 1.0);
  fill_uniform(b, rng_key{.seed = 1, .stream = rng_stream_for("quintet.train.matmul_probe.b")},
               -1.0, 1.0);
  using clock = std::chrono::steady_clock;
  const auto warm_up = clock::now();
  do {
    kernels::matmul(exec, a, b, c);
  } while (std::chrono::duration<double>(clock::now() - warm_up).count() < seconds / 4);
  constexpr int rounds = 5;
  const double n = static_cast<double>(size);
  matmul_probe_result result{.size = size, .threads = exec.threads()};
  for (int round = 0; round < rounds; ++round) {
    const auto start = clock::now();
    std::int64_t products = 0;
    double elapsed = 0.0;
    while (products < 1 || elapsed < seconds / rounds) {
      kernels::matmul(exec, a, b, c);
      ++products;
      elapsed = std::chrono::duration<double>(clock::now() - start).count();
    }
    result.products += products;
    result.seconds += elapsed;
    result.flops_per_second = std::max(result.flops_per_second,
                                       2.0 * n * n * n * static_cast<double>(products) / elapsed);
  }
  return result;
}

}  // namespace quintet::train
