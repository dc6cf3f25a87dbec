// matmul against a naive double-precision product: every transpose combination, batches, a
// broadcast B, alpha and beta, odd sizes; the CBLAS path and the portable kernel (each instruction
// set this CPU has); bf16; and the errors for operands that do not fit together.
#include "kernel_test_support.hpp"

#include <quintet/kernels/matmul.hpp>
#include <quintet/kernels/moe.hpp>
#include <quintet/tensor/slice.hpp>

#include <cmath>
#include <vector>

using namespace kernel_test;
using quintet::execution;
using quintet::kernels::matmul_options;

namespace {

struct problem {
  std::int64_t batch, m, n, k;
  bool broadcast_b;
};

// Naive C = alpha op(A) op(B) + beta C in double, and for each element the sum of absolute terms
// (the scale a rounding error is measured against).
void reference_matmul(const problem& p, const matmul_options& o, const std::vector<double>& a,
                      const std::vector<double>& b, std::vector<double>& c,
                      std::vector<double>& magnitude) {
  magnitude.assign(c.size(), 0.0);
  for (std::int64_t e = 0; e < p.batch; ++e) {
    const double* ae = a.data() + e * p.m * p.k;
    const double* be = b.data() + (p.broadcast_b ? 0 : e * p.k * p.n);
    for (std::int64_t i = 0; i < p.m; ++i)
      for (std::int64_t j = 0; j < p.n; ++j) {
        double sum = 0.0, abs_sum = 0.0;
        for (std::int64_t q = 0; q < p.k; ++q) {
          const double av = o.transpose_a ? ae[q * p.m + i] : ae[i * p.k + q];
          const double bv = o.transpose_b ? be[j * p.k + q] : be[q * p.n + j];
          sum += av * bv;
          abs_sum += std::abs(av * bv);
        }
        double& out = c[(e * p.m + i) * p.n + j];
        magnitude[(e * p.m + i) * p.n + j] = std::abs(o.alpha) * abs_sum + std::abs(o.beta * out);
        out = o.alpha * sum + (o.beta == 0.0 ? 0.0 : o.beta * out);
      }
  }
}

shape matrix_shape(const problem& p, bool batched, std::int64_t rows, std::int64_t cols) {
  return batched && p.batch > 1 ? shape{p.batch, rows, cols} : shape{rows, cols};
}

// Runs `product` (matmul or matmul_portable) on random operands and compares with the reference:
// |error| <= tolerance x (sum of |terms|), the bound a summation of k products obeys.
template <class T, class Product>
void check_product(const problem& p, const matmul_options& o, double tolerance, Product product,
                   std::uint64_t stream) {
  const bool batched = p.batch > 1;
  const shape a_shape =
      o.transpose_a ? matrix_shape(p, true, p.k, p.m) : matrix_shape(p, true, p.m, p.k);
  const shape b_shape = o.transpose_b ? matrix_shape(p, !p.broadcast_b, p.n, p.k)
                                      : matrix_shape(p, !p.broadcast_b, p.k, p.n);
  const shape c_shape = matrix_shape(p, batched, p.m, p.n);
  auto a = random_tensor<T>(a_shape, stream);
  auto b = random_tensor<T>(b_shape, stream + 1);
  auto c = random_tensor<T>(c_shape, stream + 2);  // read when beta != 0, overwritten otherwise
  std::vector<double> want = to_double(c), magnitude;
  reference_matmul(p, o, to_double(a), to_double(b), want, magnitude);
  product(a, b, c, o);
  const auto got = to_double(c);
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double ratio = std::abs(got[i] - want[i]) / (magnitude[i] + 1e-300);
    if (!(ratio <= worst)) {
      worst = std::isnan(ratio) ? INFINITY : ratio;
      at = i;
    }
  }
  INFO("batch " << p.batch << " m " << p.m << " n " << p.n << " k " << p.k << " transpose_a "
                << o.transpose_a << " transpose_b " << o.transpose_b << " broadcast_b "
                << p.broadcast_b << " alpha " << o.alpha << " beta " << o.beta
                << ": worst relative error " << worst << " at " << at);
  REQUIRE(worst <= tolerance);
}

const std::vector<problem> problems = {
    {1, 1, 1, 1, false},    {1, 3, 17, 33, false},    {1, 33, 3, 17, false},
    {1, 65, 63, 64, false}, {1, 130, 70, 300, false}, {3, 7, 17, 5, false},
    {2, 17, 33, 9, true},   {4, 1, 5, 3, true},       {1, 5, 4, 0, false},
};

const std::vector<matmul_options> option_sets = {
    {false, false, 1.0, 0.0}, {true, false, 1.0, 0.0},   {false, true, -0.5, 0.0},
    {true, true, 2.0, 0.0},   {false, false, 1.5, 0.75}, {true, true, 1.0, -1.0},
};

template <class T>
void check_all(const char* what, double tolerance, bool portable) {
  const execution<host> exec;
  std::uint64_t stream = 100;
  for (const auto& p : problems)
    for (const auto& o : option_sets) {
      INFO(what);
      check_product<T>(
          p, o, tolerance,
          [&](const auto& a, const auto& b, auto& c, const matmul_options& opts) {
            if (portable) {
              quintet::kernels::matmul_portable(exec, a, b, c, opts);
            } else {
              quintet::kernels::matmul(exec, a, b, c, opts);
            }
          },
          stream += 3);
    }
}

}  // namespace

TEST_CASE("matmul equals the double reference for every transpose, batch and broadcast",
          "[kernels][matmul]") {
  // Float sums of at most 300 products: rounding stays far below 1e-5 of the absolute sum.
  check_all<float>("matmul float", 1e-5, false);
  check_all<double>("matmul double", 1e-13, false);
  // bf16 output is rounded to 8 significant bits: 2^-8 of the result, relative to the magnitude.
  check_all<quintet::bf16>("matmul bf16", 8e-3, false);
  check_all<quintet::half>("matmul half", 2e-3, false);
}

TEST_CASE("the portable blocked kernel equals the double reference", "[kernels][matmul]") {
  check_all<float>("portable float", 1e-5, true);
  check_all<double>("portable double", 1e-13, true);
  check_all<quintet::bf16>("portable bf16", 8e-3, true);
}

TEST_CASE("every instruction set of the portable kernel this CPU runs gives the same product",
          "[kernels][matmul]") {
  // Sizes that cross every cache block (mc 96, kc 256, nc 2048 is too large; 40 exercises edges).
  const std::int64_t m = 200, n = 45, k = 520;
  auto a = random_tensor<float>(shape{m, k}, 7);
  auto b = random_tensor<float>(shape{n, k}, 8);
  const auto ad = to_double(a), bd = to_double(b);
  std::vector<double> want(m * n);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::int64_t q = 0; q < k; ++q) sum += ad[i * k + q] * bd[j * k + q];
      want[i * n + j] = sum;
    }
  for (const quintet::host_isa isa : quintet::all_host_isas) {
    if (!quintet::host_isa_supported(isa)) continue;
    tensor<float, host> c(shape{m, n});
    quintet::kernels::host_impl::gemm_portable<float>(false, true, m, n, k, 1.0f, a.data(), k,
                                                      b.data(), k, 0.0f, c.data(), n, isa);
    INFO("isa " << quintet::host_isa_name(isa));
    // |terms| <= 1 each, k = 520 of them: float error well under 1e-4 absolute.
    require_close(c, want, 0.0, 1e-4, "portable kernel");
  }
}

TEST_CASE("matmul with beta = 0 ignores NaN already in C", "[kernels][matmul]") {
  const execution<host> exec;
  auto a = random_tensor<float>(shape{5, 7}, 1);
  auto b = random_tensor<float>(shape{7, 3}, 2);
  tensor<float, host> c1(shape{5, 3}), c2(shape{5, 3});
  for (std::int64_t i = 0; i < 15; ++i) c1.data()[i] = c2.data()[i] = NAN;
  quintet::kernels::matmul(exec, a, b, c1);
  quintet::kernels::matmul_portable(exec, a, b, c2);
  for (std::int64_t i = 0; i < 15; ++i) {
    REQUIRE(std::isfinite(c1.data()[i]));
    REQUIRE(c1.data()[i] == Approx(c2.data()[i]).epsilon(1e-5));
  }
}

TEST_CASE("matmul rejects operands that do not fit together", "[kernels][matmul][errors]") {
  const execution<host> exec;
  tensor<float, host> a(shape{4, 5}), b(shape{6, 3}), c(shape{4, 3});
  REQUIRE_THROWS_WITH(quintet::kernels::matmul(exec, a, b, c),
                      Catch::Contains("inner dimensions differ") && Catch::Contains("(4, 5)") &&
                          Catch::Contains("(6, 3)"));
  tensor<float, host> b_ok(shape{5, 3}), c_bad(shape{4, 4});
  REQUIRE_THROWS_WITH(quintet::kernels::matmul(exec, a, b_ok, c_bad),
                      Catch::Contains("C has shape (4, 4)") && Catch::Contains("(4, 3)"));
  tensor<float, host> a3(shape{2, 4, 5}), b3(shape{3, 5, 3}), c3(shape{2, 4, 3});
  REQUIRE_THROWS_WITH(quintet::kernels::matmul(exec, a3, b3, c3),
                      Catch::Contains("batch dimension 0 differs"));
  tensor<float, host> wide(shape{4, 10});
  REQUIRE_THROWS_WITH(quintet::kernels::matmul(exec, quintet::slice(wide, 1, 0, 5), b_ok, c),
                      Catch::Contains("A of shape (4, 5) must be contiguous"));
  tensor<float, host> vector(shape{5});
  REQUIRE_THROWS_WITH(quintet::kernels::matmul(exec, a, vector, c),
                      Catch::Contains("rank 2 or more"));
  tensor<float, host> square(shape{4, 4});
  REQUIRE_THROWS_WITH(quintet::kernels::matmul(exec, square, square.view(), square),
                      Catch::Contains("must not share memory"));
  REQUIRE_THROWS_WITH(execution<host>(0), Catch::Contains("at least one thread, got 0"));
}

TEST_CASE("a host context with several threads computes the same product", "[kernels][matmul]") {
  auto a = random_tensor<double>(shape{3, 40, 30}, 5);
  auto b = random_tensor<double>(shape{20, 30}, 6);
  tensor<double, host> c1(shape{3, 40, 20}), c2(shape{3, 40, 20});
  quintet::kernels::matmul(execution<host>(1), a, b, c1, {.transpose_b = true});
  quintet::kernels::matmul(execution<host>::all_cores(), a, b, c2, {.transpose_b = true});
  require_close(c2, to_double(c1), 1e-14, 1e-14, "threads");
}

TEST_CASE("grouped products in bf16 equal the double products of their operands, rounded once",
          "[kernels][matmul][moe]") {
  // Mixture-of-experts layers in bf16 (mixed precision): each group's operands widened to float,
  // multiplied, and the result rounded once to bf16, as matmul does. Three groups, one empty.
  namespace k = quintet::kernels;
  const execution<host> exec;
  const std::int64_t rows = 9, in = 6, out = 5;
  const std::vector<std::int64_t> offsets = {0, 4, 4, 9};
  const auto x = random_tensor<quintet::bf16>(shape{rows, in}, 31);
  std::vector<tensor<quintet::bf16, host>> weights;
  for (int g = 0; g < 3; ++g)
    weights.push_back(random_tensor<quintet::bf16>(shape{out, in}, 32 + g));
  std::vector<quintet::tensor_view<const quintet::bf16, host>> w;
  for (const auto& t : weights) w.push_back(t.view());
  tensor<quintet::bf16, host> y(shape{rows, out});
  k::grouped_matmul(exec, x, offsets, w, y, {.transpose_b = true});  // y_g = x_g w_g^T
  const auto xd = to_double(x);
  std::vector<double> want(static_cast<std::size_t>(rows * out));
  for (std::size_t g = 0; g < 3; ++g) {
    const auto wd = to_double(weights[g]);
    for (std::int64_t r = offsets[g]; r < offsets[g + 1]; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        double sum = 0;
        for (std::int64_t i = 0; i < in; ++i) sum += xd[r * in + i] * wd[o * in + i];
        want[r * out + o] = sum;
      }
  }
  // One rounding to bf16 (2^-9 relative) beyond float's sum of 6 terms.
  require_close(y, want, 0x1.0p-8, 1e-6, "grouped_matmul bf16");

  // dw_g += dy_g^T x_g, into gradients that start non-zero; the empty group's is unchanged.
  const auto dy = random_tensor<quintet::bf16>(shape{rows, out}, 40);
  std::vector<tensor<quintet::bf16, host>> grads;
  for (int g = 0; g < 3; ++g) grads.push_back(random_tensor<quintet::bf16>(shape{out, in}, 41 + g));
  std::vector<std::vector<double>> start;
  for (const auto& t : grads) start.push_back(to_double(t));
  std::vector<quintet::tensor_view<quintet::bf16, host>> dw;
  for (auto& t : grads) dw.push_back(t.view());
  k::grouped_weight_gradient(exec, dy, x, offsets, dw);
  const auto dyd = to_double(dy);
  for (std::size_t g = 0; g < 3; ++g) {
    std::vector<double> expected = start[g];
    for (std::int64_t r = offsets[g]; r < offsets[g + 1]; ++r)
      for (std::int64_t o = 0; o < out; ++o)
        for (std::int64_t i = 0; i < in; ++i)
          expected[o * in + i] += dyd[r * out + o] * xd[r * in + i];
    require_close(grads[g], expected, 0x1.0p-8, 1e-6, "grouped_weight_gradient bf16");
  }
}
