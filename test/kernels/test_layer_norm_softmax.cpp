// Layer norm and softmax against naive double formulas; their backward kernels against central
// finite differences in double; stability for rows with a large offset; layer norm's split
// backward (input pass, weight pass) against the formula and, bit for bit, the fused backward.
#include "kernel_test_support.hpp"

#include <quintet/kernels/layer_norm.hpp>
#include <quintet/kernels/softmax.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/slice.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

using namespace kernel_test;
using quintet::execution;
namespace k = quintet::kernels;

namespace {

const std::vector<shape> shapes = {shape{1}, shape{3, 17}, shape{2, 5, 33}, shape{4, 1},
                                   shape{2, 130}};

shape without_last(const shape& s) { return shape(s.extents().first(s.rank() - 1)); }

// Per row: mean, variance (population), y = (x - mean) / sqrt(var + eps) * gamma + beta.
std::vector<double> layer_norm_reference(const std::vector<double>& x,
                                         const std::vector<double>& gamma,
                                         const std::vector<double>& beta, std::int64_t n,
                                         double eps, std::vector<double>& mean,
                                         std::vector<double>& rstd) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / n;
  std::vector<double> y(x.size());
  mean.assign(rows, 0);
  rstd.assign(rows, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (std::int64_t j = 0; j < n; ++j) mu += x[r * n + j] / n;
    for (std::int64_t j = 0; j < n; ++j) var += (x[r * n + j] - mu) * (x[r * n + j] - mu) / n;
    mean[r] = mu;
    rstd[r] = 1 / std::sqrt(var + eps);
    for (std::int64_t j = 0; j < n; ++j)
      y[r * n + j] = (x[r * n + j] - mu) * rstd[r] * gamma[j] + beta[j];
  }
  return y;
}

// The backward of layer_norm_reference (eps 1e-5), with xhat = (x - mean) rstd and g = dy gamma:
// dx = rstd (g - mean(g) - xhat mean(g xhat)) per row; dgamma = sum dy xhat, dbeta = sum dy.
struct layer_norm_gradients {
  std::vector<double> dx, dgamma, dbeta;
};

layer_norm_gradients layer_norm_backward_reference(const std::vector<double>& x,
                                                   const std::vector<double>& gamma,
                                                   const std::vector<double>& dy, std::int64_t n) {
  std::vector<double> mean, rstd;
  layer_norm_reference(x, gamma, gamma, n, 1e-5, mean, rstd);
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / n;
  layer_norm_gradients want{std::vector<double>(x.size()), std::vector<double>(n),
                            std::vector<double>(n)};
  for (std::int64_t r = 0; r < rows; ++r) {
    double g_mean = 0, g_xhat_mean = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const double xhat = (x[r * n + j] - mean[r]) * rstd[r], g = dy[r * n + j] * gamma[j];
      g_mean += g / n;
      g_xhat_mean += g * xhat / n;
      want.dgamma[j] += dy[r * n + j] * xhat;
      want.dbeta[j] += dy[r * n + j];
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const double xhat = (x[r * n + j] - mean[r]) * rstd[r], g = dy[r * n + j] * gamma[j];
      want.dx[r * n + j] = rstd[r] * (g - g_mean - xhat * g_xhat_mean);
    }
  }
  return want;
}

std::vector<double> softmax_reference(const std::vector<double>& x, std::int64_t n) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < x.size() / n; ++r) {
    const double peak = *std::max_element(x.begin() + r * n, x.begin() + (r + 1) * n);
    double sum = 0;
    for (std::int64_t j = 0; j < n; ++j) sum += std::exp(x[r * n + j] - peak);
    for (std::int64_t j = 0; j < n; ++j) y[r * n + j] = std::exp(x[r * n + j] - peak) / sum;
  }
  return y;
}

}  // namespace

TEST_CASE("layer_norm_forward equals the double formula, also far from zero",
          "[kernels][layer_norm]") {
  const execution<host> exec;
  std::uint64_t stream = 200;
  for (const shape& s : shapes)
    for (const double offset : {0.0, 1000.0}) {
      const std::int64_t n = s[s.rank() - 1];
      auto x = random_tensor<float>(s, ++stream, offset - 2.0, offset + 2.0);
      auto gamma = random_tensor<float>(shape{n}, ++stream, 0.5, 1.5);
      auto beta = random_tensor<float>(shape{n}, ++stream);
      tensor<float, host> y(s), mean(without_last(s)), rstd(without_last(s));
      k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd);
      std::vector<double> want_mean, want_rstd;
      const auto want = layer_norm_reference(to_double(x), to_double(gamma), to_double(beta), n,
                                             1e-5, want_mean, want_rstd);
      INFO("shape " << s.to_string() << " offset " << offset);
      // Rows near 1000 carry float's relative error of the inputs (6e-8 x 1000 / spread 1).
      const double atol = offset == 0.0 ? 2e-5 : 2e-4;
      require_close(y, want, 1e-5, atol, "y");
      require_close(mean, want_mean, 1e-6, 1e-6, "mean");
      require_close(rstd, want_rstd, 1e-4, 1e-4, "rstd");
    }
}

TEST_CASE("layer_norm_backward equals finite differences of the forward", "[kernels][layer_norm]") {
  const execution<host> exec;
  std::uint64_t stream = 300;
  for (const shape& s : {shape{1, 3}, shape{3, 17}, shape{2, 2, 5}, shape{2, 1}}) {
    const std::int64_t n = s[s.rank() - 1];
    auto x = random_tensor<double>(s, ++stream, -2.0, 2.0);
    auto gamma = random_tensor<double>(shape{n}, ++stream, 0.5, 1.5);
    auto beta = random_tensor<double>(shape{n}, ++stream);
    auto w = random_tensor<double>(s, ++stream);
    tensor<double, host> y(s), mean(without_last(s)), rstd(without_last(s));
    auto loss = [&] {
      k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd);
      return weighted_sum(y, w);
    };
    const auto dx_numeric = finite_difference_gradient(x, loss);
    const auto dgamma_numeric = finite_difference_gradient(gamma, loss);
    const auto dbeta_numeric = finite_difference_gradient(beta, loss);
    loss();  // mean and rstd of the unperturbed input
    tensor<double, host> dx(s), dgamma(shape{n}), dbeta(shape{n});
    quintet::fill(dgamma, 0.0);
    quintet::fill(dbeta, 0.0);
    k::layer_norm_backward(exec, x, gamma, mean, rstd, w, dx, dgamma, dbeta);
    INFO("shape " << s.to_string());
    require_close(dx, dx_numeric, 1e-6, 1e-7, "dx");
    require_close(dgamma, dgamma_numeric, 1e-6, 1e-7, "dgamma");
    require_close(dbeta, dbeta_numeric, 1e-6, 1e-7, "dbeta");
    // A second backward accumulates onto the parameter gradients.
    k::layer_norm_backward(exec, x, gamma, mean, rstd, w, dx, dgamma, dbeta);
    std::vector<double> twice = dbeta_numeric;
    for (double& v : twice) v *= 2;
    require_close(dbeta, twice, 1e-6, 1e-7, "dbeta accumulated");
  }
}

TEST_CASE("layer_norm_backward in float agrees with double", "[kernels][layer_norm]") {
  const execution<host> exec;
  const shape s{9, 65};
  auto xd = random_tensor<double>(s, 1), gd = random_tensor<double>(shape{65}, 2, 0.5, 1.5),
       bd = random_tensor<double>(shape{65}, 3), dyd = random_tensor<double>(s, 4);
  auto xf = from_double<float>(to_double(xd), s), gf = from_double<float>(to_double(gd), {65}),
       bf = from_double<float>(to_double(bd), {65}), dyf = from_double<float>(to_double(dyd), s);
  tensor<double, host> yd(s), md(shape{9}), rd(shape{9}), dxd(s), dgd(shape{65}), dbd(shape{65});
  tensor<float, host> yf(s), mf(shape{9}), rf(shape{9}), dxf(s), dgf(shape{65}), dbf(shape{65});
  quintet::fill(dgd, 0.0);
  quintet::fill(dbd, 0.0);
  quintet::fill(dgf, 0.0f);
  quintet::fill(dbf, 0.0f);
  k::layer_norm_forward(exec, xd, gd, bd, yd, md, rd);
  k::layer_norm_forward(exec, xf, gf, bf, yf, mf, rf);
  k::layer_norm_backward(exec, xd, gd, md, rd, dyd, dxd, dgd, dbd);
  k::layer_norm_backward(exec, xf, gf, mf, rf, dyf, dxf, dgf, dbf);
  require_close(dxf, to_double(dxd), 1e-4, 1e-5, "dx");
  require_close(dgf, to_double(dgd), 1e-4, 1e-5, "dgamma");
  require_close(dbf, to_double(dbd), 1e-5, 1e-5, "dbeta");
}

TEMPLATE_TEST_CASE("layer_norm_backward_input and _weight equal the double formula",
                   "[kernels][layer_norm]", float, double, quintet::bf16) {
  using T = TestType;
  using stat = quintet::kernels::accumulator_t<T>;
  const execution<host> exec;
  // double: rounding only. float: sums of up to 64 terms of size <= 2, each a few float ulps off
  // (the results stay within 1e-6; 1e-5 leaves a margin). bf16: the inputs are bf16 values and
  // each result is rounded once to bf16 (2^-8 relative) after float arithmetic.
  const double rtol = std::is_same_v<T, double> ? 1e-12 : std::is_same_v<T, float> ? 1e-5 : 1e-2;
  const double atol = rtol;
  std::uint64_t stream = 500;
  for (const shape& s : {shape{1}, shape{3, 17}, shape{2, 5, 33}, shape{4, 1}, shape{64, 40}}) {
    const std::int64_t n = s[s.rank() - 1];
    auto x = random_tensor<T>(s, ++stream, -2.0, 2.0);
    auto gamma = random_tensor<T>(shape{n}, ++stream, 0.5, 1.5);
    auto beta = random_tensor<T>(shape{n}, ++stream);
    auto dy = random_tensor<T>(s, ++stream);
    // The weight pass adds onto what dgamma and dbeta hold; dx is overwritten, never read.
    auto dgamma = random_tensor<T>(shape{n}, ++stream);
    auto dbeta = random_tensor<T>(shape{n}, ++stream);
    const auto dgamma_before = to_double(dgamma), dbeta_before = to_double(dbeta);
    tensor<T, host> y(s), dx(s);
    tensor<stat, host> mean(without_last(s)), rstd(without_last(s));
    quintet::fill(dx, T(NAN));
    k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd);
    k::layer_norm_backward_input(exec, x, gamma, mean, rstd, dy, dx);
    k::layer_norm_backward_weight(exec, x, mean, rstd, dy, dgamma, dbeta);
    auto want = layer_norm_backward_reference(to_double(x), to_double(gamma), to_double(dy), n);
    for (std::int64_t j = 0; j < n; ++j) {
      want.dgamma[j] += dgamma_before[j];
      want.dbeta[j] += dbeta_before[j];
    }
    INFO("shape " << s.to_string());
    require_close(dx, want.dx, rtol, atol, "dx");
    require_close(dgamma, want.dgamma, rtol, atol, "dgamma");
    require_close(dbeta, want.dbeta, rtol, atol, "dbeta");
  }
}

// Zero-bubble schedules run the passes apart; the training run must give the same losses as the
// fused backward, so the passes must give its bits, not merely close values.
TEMPLATE_TEST_CASE("layer_norm_backward_input then _weight equals layer_norm_backward bit for bit",
                   "[kernels][layer_norm]", float, double, quintet::bf16) {
  using T = TestType;
  using stat = quintet::kernels::accumulator_t<T>;
  const execution<host> exec;
  std::uint64_t stream = 600;
  for (const shape& s : {shape{1}, shape{3, 17}, shape{2, 5, 33}, shape{64, 40}, shape{7, 769}}) {
    const std::int64_t n = s[s.rank() - 1];
    const std::uint64_t first = stream;
    auto x = random_tensor<T>(s, ++stream, -2.0, 2.0);
    auto gamma = random_tensor<T>(shape{n}, ++stream, 0.5, 1.5);
    auto beta = random_tensor<T>(shape{n}, ++stream);
    auto dy = random_tensor<T>(s, ++stream);
    tensor<T, host> y(s), dx_fused(s), dx_split(s);
    tensor<stat, host> mean(without_last(s)), rstd(without_last(s));
    k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd);
    // Both start from the same non-zero parameter gradients (drawn twice from one stream).
    auto dgamma_fused = random_tensor<T>(shape{n}, first + 10),
         dgamma_split = random_tensor<T>(shape{n}, first + 10);
    auto dbeta_fused = random_tensor<T>(shape{n}, first + 11),
         dbeta_split = random_tensor<T>(shape{n}, first + 11);
    k::layer_norm_backward(exec, x, gamma, mean, rstd, dy, dx_fused, dgamma_fused, dbeta_fused);
    k::layer_norm_backward_input(exec, x, gamma, mean, rstd, dy, dx_split);
    k::layer_norm_backward_weight(exec, x, mean, rstd, dy, dgamma_split, dbeta_split);
    INFO("shape " << s.to_string());
    REQUIRE(same_bits(dx_split, dx_fused));
    REQUIRE(same_bits(dgamma_split, dgamma_fused));
    REQUIRE(same_bits(dbeta_split, dbeta_fused));
  }
}

TEST_CASE("layer_norm rejects operands of the wrong shape", "[kernels][layer_norm][errors]") {
  const execution<host> exec;
  tensor<float, host> x(shape{4, 8}), y(shape{4, 8}), gamma(shape{8}), beta(shape{7}),
      mean(shape{4}), rstd(shape{4}), bad_stats(shape{4, 1});
  REQUIRE_THROWS_WITH(k::layer_norm_forward(exec, x, gamma, beta, y, mean, rstd),
                      Catch::Contains("beta has shape (7,), expected (8,)"));
  REQUIRE_THROWS_WITH(k::layer_norm_forward(exec, x, gamma, gamma, y, bad_stats, rstd),
                      Catch::Contains("mean has shape (4, 1), expected (4,)"));
  REQUIRE_THROWS_WITH(k::layer_norm_forward(exec, x, gamma, gamma, y, mean, rstd, 0.0),
                      Catch::Contains("eps 0 must be positive"));
  tensor<float, host> dx(shape{4, 9}), dbeta(shape{8});
  REQUIRE_THROWS_WITH(k::layer_norm_backward(exec, x, gamma, mean, rstd, y, dx, gamma, dbeta),
                      Catch::Contains("(4, 8)") && Catch::Contains("(4, 9)"));
  REQUIRE_THROWS_WITH(k::layer_norm_backward(exec, x, gamma, mean, rstd, y, y, beta, dbeta),
                      Catch::Contains("layer_norm_backward: dgamma has shape (7,), expected (8,)"));
  // The split passes check what each one touches and name the pass.
  REQUIRE_THROWS_WITH(
      k::layer_norm_backward_input(exec, x, gamma, mean, rstd, y, dx),
      Catch::Contains("layer_norm_backward_input: dx has shape (4, 9), expected (4, 8)"));
  REQUIRE_THROWS_WITH(
      k::layer_norm_backward_input(exec, x, beta, mean, rstd, y, y),
      Catch::Contains("layer_norm_backward_input: gamma has shape (7,), expected (8,)"));
  REQUIRE_THROWS_WITH(
      k::layer_norm_backward_input(exec, x, gamma, bad_stats, rstd, y, y),
      Catch::Contains("layer_norm_backward_input: mean has shape (4, 1), expected (4,)"));
  REQUIRE_THROWS_WITH(
      k::layer_norm_backward_weight(exec, x, mean, rstd, dx, gamma, dbeta),
      Catch::Contains("layer_norm_backward_weight: dy has shape (4, 9), expected (4, 8)"));
  REQUIRE_THROWS_WITH(
      k::layer_norm_backward_weight(exec, x, mean, rstd, y, beta, dbeta),
      Catch::Contains("layer_norm_backward_weight: dgamma has shape (7,), expected (8,)"));
  REQUIRE_THROWS_WITH(
      k::layer_norm_backward_weight(exec, x, mean, bad_stats, y, gamma, beta),
      Catch::Contains("layer_norm_backward_weight: rstd has shape (4, 1), expected (4,)"));
  REQUIRE_THROWS_WITH(
      k::layer_norm_backward_weight(exec, x, mean, rstd, y, gamma, beta),
      Catch::Contains("layer_norm_backward_weight: dbeta has shape (7,), expected (8,)"));
  REQUIRE_THROWS_WITH(
      k::layer_norm_backward_input(exec, x, gamma, mean, rstd, quintet::slice(dx, 1, 0, 8), y),
      Catch::Contains("layer_norm_backward_input: dy of shape (4, 8) must be contiguous"));
}

TEST_CASE("softmax_forward equals the double formula and survives huge logits",
          "[kernels][softmax]") {
  const execution<host> exec;
  std::uint64_t stream = 400;
  for (const shape& s : shapes) {
    auto x = random_tensor<float>(s, ++stream, -5.0, 5.0);
    tensor<float, host> y(s);
    k::softmax_forward(exec, x, y);
    require_close(y, softmax_reference(to_double(x), s[s.rank() - 1]), 1e-5, 1e-7, "softmax");
  }
  // exp(1000) overflows; subtracting the maximum keeps the result exact.
  auto x = random_tensor<float>(shape{3, 17}, 7, 990.0, 1000.0);
  tensor<float, host> y(x.shape());
  k::softmax_forward(exec, x, y);
  require_close(y, softmax_reference(to_double(x), 17), 1e-4, 1e-7, "softmax of large logits");
}

TEST_CASE("softmax_backward equals finite differences of the forward", "[kernels][softmax]") {
  const execution<host> exec;
  for (const shape& s : {shape{1, 1}, shape{3, 17}, shape{2, 2, 5}}) {
    auto x = random_tensor<double>(s, 11, -3.0, 3.0);
    auto w = random_tensor<double>(s, 12);
    tensor<double, host> y(s);
    auto loss = [&] {
      k::softmax_forward(exec, x, y);
      return weighted_sum(y, w);
    };
    const auto numeric = finite_difference_gradient(x, loss);
    loss();
    tensor<double, host> dx(s);
    k::softmax_backward(exec, y, w, dx);
    require_close(dx, numeric, 1e-6, 1e-8, "softmax dx");
  }
  tensor<double, host> a(shape{2, 3}), b(shape{3, 2});
  REQUIRE_THROWS_WITH(k::softmax_forward(exec, a, b),
                      Catch::Contains("softmax_forward needs equal shapes"));
}

TEST_CASE("the row exponential matches exp to 1.1e-7 relative, and through the subnormals",
          "[kernels][softmax]") {
  std::vector<float> x;
  for (double v = -110.0; v < 88.7; v += 0.0137) x.push_back(static_cast<float>(v));
  x.push_back(-1e30f);
  x.push_back(-INFINITY);
  std::vector<float> y(x.size());
  quintet::kernels::host_impl::exponentials(x.data(), y.data(),
                                            static_cast<std::int64_t>(x.size()));
  double worst_relative = 0, worst_steps = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    const double error = std::abs(static_cast<double>(y[i]) - want);
    // Normal results: relative error; subnormal ones: within one subnormal step (2^-149).
    if (want >= 0x1p-126) {
      worst_relative = std::max(worst_relative, error / want);
    } else {
      worst_steps = std::max(worst_steps, error / 0x1p-149);
    }
  }
  REQUIRE(worst_relative <= 1.1e-7);
  REQUIRE(worst_steps <= 1.0);
  float special[] = {NAN, INFINITY, 0.0f};
  quintet::kernels::host_impl::exponentials(special, special, 3);
  REQUIRE(std::isnan(special[0]));
  REQUIRE(special[1] == Approx(std::exp(static_cast<double>(88.7f))).epsilon(1e-6));  // saturates
  REQUIRE(special[2] == 1.0f);
}
