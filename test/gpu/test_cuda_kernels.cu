// The CUDA twins against the host kernels on the same random operands: the cuBLASLt matmul (fp32
// and bf16; transposes, batches, a shared B, beta) and the CUB layer norm forward and backward
// (fused, and split into its input and weight passes).
#include "gpu_test_support.hpp"

#include <catch2/catch.hpp>

#include <quintet/kernels/cuda/layer_norm.cuh>
#include <quintet/kernels/cuda/matmul.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/layer_norm.hpp>
#include <quintet/kernels/matmul.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/cuda/fill.cuh>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/random.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

using device = quintet::cuda;  // not `cuda`: CCCL declares a global namespace of that name
using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
namespace k = quintet::kernels;
using namespace quintet::gpu_test;

namespace {

struct product_case {
  shape a, b, c;
  k::matmul_options options;
};

template <class T>
void check_matmul(double rtol, double atol) {
  const execution<host> host_exec;
  const execution<device> device_exec;
  const std::vector<product_case> cases = {
      {shape{3, 33}, shape{33, 17}, shape{3, 17}, {}},
      {shape{33, 3}, shape{17, 33}, shape{3, 17}, {.transpose_a = true, .transpose_b = true}},
      {shape{64, 65}, shape{65, 63}, shape{64, 63}, {.alpha = 0.5, .beta = -1.0}},
      {shape{2, 17, 9}, shape{2, 9, 33}, shape{2, 17, 33}, {}},
      {shape{2, 9, 17},
       shape{2, 33, 9},
       shape{2, 17, 33},
       {.transpose_a = true, .transpose_b = true}},
      {shape{4, 5, 96}, shape{48, 96}, shape{4, 5, 48}, {.transpose_b = true}},  // linear layer
      {shape{4, 96, 5}, shape{96, 48}, shape{4, 5, 48}, {.transpose_a = true}},  // shared B, A^T
  };
  std::uint64_t stream = 1;
  for (const auto& c : cases) {
    auto a = random_host<T>(c.a, ++stream);
    auto b = random_host<T>(c.b, ++stream);
    auto want = random_host<T>(c.c, ++stream);
    auto a_device = to_device(a), b_device = to_device(b), c_device = to_device(want);
    k::matmul(host_exec, a, b, want, c.options);
    k::matmul(device_exec, a_device, b_device, c_device, c.options);
    device_exec.synchronize();
    INFO("A " << c.a.to_string() << " B " << c.b.to_string() << " transpose_a "
              << c.options.transpose_a << " transpose_b " << c.options.transpose_b);
    require_close(to_host(c_device), want, rtol, atol, "matmul");
  }
}

template <class T, class Acc>
void check_layer_norm(double rtol, double atol, double sum_atol_per_row) {
  const execution<host> host_exec;
  const execution<device> device_exec;
  // Rows held by a warp (n <= 1024), by a block (3000), streamed (20000); 3000 rows of 40 make the
  // weight pass sum in many chunks.
  for (const shape s : {shape{1, 1}, shape{3, 17}, shape{2, 5, 33}, shape{7, 1000}, shape{2, 3000},
                        shape{2, 20000}, shape{3000, 40}}) {
    const std::int64_t n = s[s.rank() - 1];
    const shape stats = shape(s.extents().first(s.rank() - 1));
    auto x = random_host<T>(s, 10, -3.0, 3.0), dy = random_host<T>(s, 11);
    auto gamma = random_host<T>(shape{n}, 12, 0.5, 1.5), beta = random_host<T>(shape{n}, 13);
    tensor<T, host> y(s), dx(s), dgamma(shape{n}), dbeta(shape{n});
    tensor<Acc, host> mean(stats), rstd(stats);
    quintet::fill(dgamma, T(0.25f));  // accumulated into
    quintet::fill(dbeta, T(-0.5f));
    auto x_d = to_device(x), dy_d = to_device(dy), gamma_d = to_device(gamma),
         beta_d = to_device(beta), dgamma_d = to_device(dgamma), dbeta_d = to_device(dbeta);
    tensor<T, device> y_d(s), dx_d(s);
    tensor<Acc, device> mean_d(stats), rstd_d(stats);
    k::layer_norm_forward(host_exec, x, gamma, beta, y, mean, rstd);
    k::layer_norm_backward(host_exec, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
    k::layer_norm_forward(device_exec, x_d, gamma_d, beta_d, y_d, mean_d, rstd_d);
    k::layer_norm_backward(device_exec, x_d, gamma_d, mean_d, rstd_d, dy_d, dx_d, dgamma_d,
                           dbeta_d);
    device_exec.synchronize();
    INFO("shape " << s.to_string());
    require_close(to_host(y_d), y, rtol, atol, "y");
    require_close(to_host(mean_d), mean, 1e-5, 1e-6, "mean");
    require_close(to_host(rstd_d), rstd, 1e-5, 1e-6, "rstd");
    require_close(to_host(dx_d), dx, rtol, atol, "dx");
    const double sum_atol = std::max(atol, sum_atol_per_row * static_cast<double>(x.numel() / n));
    require_close(to_host(dgamma_d), dgamma, rtol, sum_atol, "dgamma");
    require_close(to_host(dbeta_d), dbeta, rtol, sum_atol, "dbeta");
  }
}

// layer_norm_backward_input then _weight on cuda against the same passes on the host, and bit for
// bit against the cuda fused backward (which launches the same two kernels).
template <class T, class Acc>
void check_layer_norm_split(double rtol, double atol, double sum_atol_per_row) {
  const execution<host> host_exec;
  const execution<device> device_exec;
  // Rows held by a warp (n <= 1024), by a block (3000), streamed (20000); 3000 rows of 40 make the
  // weight pass sum in many chunks.
  for (const shape s : {shape{1, 1}, shape{3, 17}, shape{2, 5, 33}, shape{7, 1000}, shape{2, 3000},
                        shape{2, 20000}, shape{3000, 40}}) {
    const std::int64_t n = s[s.rank() - 1];
    const shape stats = shape(s.extents().first(s.rank() - 1));
    auto x = random_host<T>(s, 20, -3.0, 3.0), dy = random_host<T>(s, 21);
    auto gamma = random_host<T>(shape{n}, 22, 0.5, 1.5), beta = random_host<T>(shape{n}, 23);
    auto dgamma = random_host<T>(shape{n}, 24), dbeta = random_host<T>(shape{n}, 25);  // += onto
    tensor<T, host> y(s), dx(s);
    tensor<Acc, host> mean(stats), rstd(stats);
    auto x_d = to_device(x), dy_d = to_device(dy), gamma_d = to_device(gamma),
         beta_d = to_device(beta), dgamma_d = to_device(dgamma), dbeta_d = to_device(dbeta),
         dgamma_fused_d = to_device(dgamma), dbeta_fused_d = to_device(dbeta);
    tensor<T, device> y_d(s), dx_d(s), dx_fused_d(s);
    tensor<Acc, device> mean_d(stats), rstd_d(stats);
    k::layer_norm_forward(host_exec, x, gamma, beta, y, mean, rstd);
    k::layer_norm_backward_input(host_exec, x, gamma, mean, rstd, dy, dx);
    k::layer_norm_backward_weight(host_exec, x, mean, rstd, dy, dgamma, dbeta);
    k::layer_norm_forward(device_exec, x_d, gamma_d, beta_d, y_d, mean_d, rstd_d);
    k::layer_norm_backward_input(device_exec, x_d, gamma_d, mean_d, rstd_d, dy_d, dx_d);
    k::layer_norm_backward_weight(device_exec, x_d, mean_d, rstd_d, dy_d, dgamma_d, dbeta_d);
    k::layer_norm_backward(device_exec, x_d, gamma_d, mean_d, rstd_d, dy_d, dx_fused_d,
                           dgamma_fused_d, dbeta_fused_d);
    device_exec.synchronize();
    INFO("shape " << s.to_string());
    require_close(to_host(dx_d), dx, rtol, atol, "dx");
    const double sum_atol = std::max(atol, sum_atol_per_row * static_cast<double>(x.numel() / n));
    require_close(to_host(dgamma_d), dgamma, rtol, sum_atol, "dgamma");
    require_close(to_host(dbeta_d), dbeta, rtol, sum_atol, "dbeta");
    REQUIRE(same_bits(to_host(dx_d), to_host(dx_fused_d)));
    REQUIRE(same_bits(to_host(dgamma_d), to_host(dgamma_fused_d)));
    REQUIRE(same_bits(to_host(dbeta_d), to_host(dbeta_fused_d)));
  }
}

}  // namespace

TEST_CASE("cuBLASLt matmul equals the host matmul in fp32", "[device]") {
  // fp32 compute (no TF32): only the summation order differs, k <= 96 terms of size <= 1.
  check_matmul<float>(1e-5, 1e-5);
}

TEST_CASE("cuBLASLt matmul equals the host matmul in bf16", "[device]") {
  // Both accumulate in fp32 and round once to bf16: at most one bf16 ulp (2^-8 relative) apart.
  check_matmul<quintet::bf16>(8e-3, 1e-2);
}

TEST_CASE("the cuda layer norm equals the host layer norm, forward and backward", "[device]") {
  // dgamma, dbeta sum R rows in another order than the host's one running sum: each of R roundings
  // is <= 2^-24 of a partial sum that wanders like sqrt(R) (terms of size ~1, random signs), so
  // the difference grows like R 2^-24 ~ 6e-8 R: atol 2e-7 R (6e-4 at 3000 rows). double: 2^-29
  // of that, below 1e-12 at these shapes. bf16: the final rounding dominates.
  check_layer_norm<float, float>(1e-5, 1e-5, 2e-7);
  check_layer_norm<double, double>(1e-12, 1e-12, 0);
  check_layer_norm<quintet::bf16, float>(8e-3, 1e-2, 0);
}

TEST_CASE("the cuda layer norm's split backward equals the host's and the fused one", "[device]") {
  check_layer_norm_split<float, float>(1e-5, 1e-5, 2e-7);  // the tolerances argued above
  check_layer_norm_split<double, double>(1e-12, 1e-12, 0);
  check_layer_norm_split<quintet::bf16, float>(8e-3, 1e-2, 0);
}

TEST_CASE("a cuda execution context without a device raises quintet::error", "[no-device]") {
  REQUIRE(quintet::cuda_device_count() == 0);
  REQUIRE_THROWS_WITH(execution<device>(), Catch::Contains("no CUDA device is available"));
}
