// Elementwise kernels and dropout against naive double formulas; GELU's and the bias's backward
// against central finite differences; dropout masks reproducible per shard.
#include "kernel_test_support.hpp"

#include <quintet/kernels/dropout.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/fill.hpp>
#include <quintet/tensor/slice.hpp>

#include <cmath>
#include <cstring>

using namespace kernel_test;
using quintet::execution;
namespace k = quintet::kernels;

namespace {

double gelu_reference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

const std::vector<shape> shapes = {shape{1}, shape{3, 17}, shape{2, 5, 33}, shape{64, 33}};

}  // namespace

TEST_CASE("bias_add and bias_grad equal the double formulas", "[kernels][elementwise]") {
  const execution<host> exec;
  std::uint64_t stream = 10;
  for (const shape& s : shapes) {
    const std::int64_t n = s[s.rank() - 1], rows = s.numel() / n;
    auto x = random_tensor<float>(s, ++stream);
    auto bias = random_tensor<float>(shape{n}, ++stream);
    auto want = to_double(x);
    const auto b = to_double(bias);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < n; ++j) want[r * n + j] += b[j];
    k::bias_add(exec, x, bias);
    require_close(x, want, 1e-6, 1e-7, "bias_add");

    auto dy = random_tensor<float>(s, ++stream);
    auto dbias = random_tensor<float>(shape{n}, ++stream);  // accumulated into
    std::vector<double> grad = to_double(dbias);
    const auto d = to_double(dy);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < n; ++j) grad[j] += d[r * n + j];
    k::bias_grad(exec, dy, dbias);
    require_close(dbias, grad, 1e-5, 1e-5, "bias_grad");
  }
}

TEST_CASE("bias_grad is the gradient of bias_add (finite differences)", "[kernels][elementwise]") {
  const execution<host> exec;
  auto x = random_tensor<double>(shape{7, 5}, 1);
  auto bias = random_tensor<double>(shape{5}, 2);
  auto w = random_tensor<double>(shape{7, 5}, 3);
  auto loss = [&] {
    tensor<double, host> y(x.shape());
    quintet::copy(y, x);
    k::bias_add(exec, y, bias);
    return weighted_sum(y, w);
  };
  const auto numeric = finite_difference_gradient(bias, loss);
  tensor<double, host> dbias(shape{5});
  quintet::fill(dbias, 0.0);
  k::bias_grad(exec, w, dbias);
  require_close(dbias, numeric, 1e-7, 1e-8, "dbias vs finite differences");
}

TEST_CASE("GELU forward and backward equal the tanh formula and its derivative",
          "[kernels][elementwise]") {
  const execution<host> exec;
  std::uint64_t stream = 40;
  for (const shape& s : shapes) {
    auto x = random_tensor<float>(s, ++stream, -4.0, 4.0);
    tensor<float, host> y(s);
    k::gelu_forward(exec, x, y);
    std::vector<double> want;
    for (const double v : to_double(x)) want.push_back(gelu_reference(v));
    require_close(y, want, 1e-5, 1e-6, "gelu_forward float");
  }
  // Backward in double against central differences of the double forward.
  auto x = random_tensor<double>(shape{3, 17}, 5, -3.0, 3.0);
  auto w = random_tensor<double>(shape{3, 17}, 6);
  auto loss = [&] {
    tensor<double, host> y(x.shape());
    k::gelu_forward(exec, x, y);
    return weighted_sum(y, w);
  };
  const auto numeric = finite_difference_gradient(x, loss);
  tensor<double, host> dx(x.shape());
  k::gelu_backward(exec, x, w, dx);
  require_close(dx, numeric, 1e-7, 1e-8, "gelu_backward vs finite differences");
  // The float backward agrees with the double one.
  tensor<float, host> xf(x.shape()), wf(x.shape()), dxf(x.shape());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    xf.data()[i] = static_cast<float>(x.data()[i]);
    wf.data()[i] = static_cast<float>(w.data()[i]);
  }
  k::gelu_backward(exec, xf, wf, dxf);
  require_close(dxf, to_double(dx), 1e-5, 1e-6, "gelu_backward float");
}

TEST_CASE("add and scale equal the double formulas, in place too", "[kernels][elementwise]") {
  const execution<host> exec;
  auto a = random_tensor<float>(shape{5, 33}, 1);
  auto b = random_tensor<float>(shape{5, 33}, 2);
  std::vector<double> want = to_double(a);
  const auto bd = to_double(b);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = (want[i] + bd[i]) * -2.5;
  k::add(exec, a, b, a);  // a residual stream updated in place
  k::scale(exec, a, -2.5);
  require_close(a, want, 1e-6, 1e-7, "add + scale");
  auto h = random_tensor<quintet::bf16>(shape{17}, 3);
  auto hd = to_double(h);
  k::scale(exec, h, 0.5);  // exact in bf16
  for (auto& v : hd) v *= 0.5;
  require_close(h, hd, 0.0, 0.0, "bf16 scale");
}

TEST_CASE("fill sets every element, split over the context's threads or not",
          "[kernels][elementwise]") {
  // Large enough for two parts of worth_a_wake_up each, and an odd length so the parts differ.
  const std::int64_t n = 2 * execution<host>::worth_a_wake_up + 3;
  for (const int threads : {1, 2}) {
    const execution<host> exec(threads);
    auto x = random_tensor<float>(shape{n}, 5);
    k::fill(exec, x, -1.5f);
    for (std::int64_t i = 0; i < n; ++i) REQUIRE(x.data()[i] == -1.5f);
    // A view fills only its elements.
    auto y = random_tensor<double>(shape{4, 9}, 6);
    const double kept = y.data()[35];
    k::fill(exec, quintet::slice(y, 0, 0, 3), 0.0);
    for (std::int64_t i = 0; i < 27; ++i) REQUIRE(y.data()[i] == 0.0);
    CHECK(y.data()[35] == kept);
  }
}

TEST_CASE("convert widens exactly and narrows to the nearest 16-bit value",
          "[kernels][elementwise]") {
  const execution<host> exec;
  const auto x = random_tensor<float>(shape{3, 41}, 5, -100.0, 100.0);
  tensor<quintet::bf16, host> h(x.shape());
  tensor<quintet::half, host> f16(x.shape());
  tensor<double, host> wide(x.shape()), back(x.shape());
  k::convert(exec, x, h);
  k::convert(exec, x, f16);
  k::convert(exec, x, wide);
  k::convert(exec, h, back);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    INFO(i);
    // The core conversions (checked against every bit pattern in test_float16) are the reference.
    REQUIRE(h.data()[i].bits == quintet::bf16(x.data()[i]).bits);
    REQUIRE(f16.data()[i].bits == quintet::half(x.data()[i]).bits);
    REQUIRE(wide.data()[i] == static_cast<double>(x.data()[i]));
    REQUIRE(back.data()[i] == static_cast<double>(static_cast<float>(h.data()[i])));
  }
  tensor<float, host> wrong(shape{3, 40});
  REQUIRE_THROWS_WITH(k::convert(exec, x, wrong), Catch::Contains("convert"));
}

TEST_CASE("accumulate adds a narrower tensor into a wider sum, rounding once",
          "[kernels][elementwise]") {
  const execution<host> exec;
  // bf16 into float (mixed precision's gradients), over a length with a partial lane block.
  const auto addend = random_tensor<quintet::bf16>(shape{7, 37}, 21);
  auto sum = random_tensor<float>(shape{7, 37}, 22);
  const auto before = to_double(sum);
  const auto bd = to_double(addend);
  k::accumulate(exec, addend, sum);
  for (std::int64_t i = 0; i < sum.numel(); ++i) {
    INFO(i);
    const auto j = static_cast<std::size_t>(i);
    // Both terms are floats, so the double sum is exact and its rounding to float is the kernel's.
    REQUIRE(sum.data()[i] == static_cast<float>(before[j] + bd[j]));
  }
  // float into double: exact in double.
  const auto narrow = random_tensor<float>(shape{33}, 23);
  auto wide = random_tensor<double>(shape{33}, 24);
  auto want = to_double(wide);
  const auto nd = to_double(narrow);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] += nd[i];
  k::accumulate(exec, narrow, wide);
  require_close(wide, want, 0.0, 0.0, "float into double");
  tensor<float, host> wrong(shape{7, 36});
  REQUIRE_THROWS_WITH(k::accumulate(exec, addend, wrong), Catch::Contains("accumulate"));
}

TEST_CASE("elementwise kernels reject mismatched shapes", "[kernels][elementwise][errors]") {
  const execution<host> exec;
  tensor<float, host> x(shape{4, 6}), bias(shape{5}), y(shape{4, 5});
  REQUIRE_THROWS_WITH(k::bias_add(exec, x, bias),
                      Catch::Contains("bias has shape (5,), expected (6,)"));
  REQUIRE_THROWS_WITH(k::bias_grad(exec, x, bias),
                      Catch::Contains("dbias has shape (5,), expected (6,)"));
  REQUIRE_THROWS_WITH(k::gelu_forward(exec, x, y), Catch::Contains("equal shapes") &&
                                                       Catch::Contains("(4, 6)") &&
                                                       Catch::Contains("(4, 5)"));
  REQUIRE_THROWS_WITH(k::add(exec, x, y, x), Catch::Contains("add needs equal shapes"));
  REQUIRE_THROWS_WITH(k::scale(exec, quintet::slice(x, 1, 0, 3), 2.0),
                      Catch::Contains("x of shape (4, 3) must be contiguous"));
}

TEST_CASE("dropout keeps elements by the Philox draw and scales them by 1 / (1 - p)",
          "[kernels][dropout]") {
  const execution<host> exec;
  const quintet::rng_key key{.seed = 5, .stream = quintet::rng_stream_for("blocks.0.attn.drop")};
  const double p = 0.3;
  auto x = random_tensor<float>(shape{8, 33}, 9, 0.5, 1.5);  // nonzero, so a zero means dropped
  tensor<float, host> y(x.shape());
  k::dropout_forward(exec, x, y, p, key);
  std::int64_t dropped = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const bool keep = quintet::uniform_float(key, static_cast<std::uint64_t>(i)) >= p;
    const double want = keep ? static_cast<double>(x.data()[i]) / (1.0 - p) : 0.0;
    REQUIRE(y.data()[i] == Approx(want).epsilon(1e-6));
    dropped += keep ? 0 : 1;
  }
  // 264 Bernoulli(0.3) draws: the count is within 5 standard deviations (7.4) of 79.2.
  REQUIRE(std::abs(static_cast<double>(dropped) - 0.3 * 264) < 5 * 7.45);

  // Backward applies the same mask to dy.
  auto dy = random_tensor<float>(x.shape(), 10);
  tensor<float, host> dx(x.shape());
  k::dropout_backward(exec, dy, dx, p, key);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const bool keep = y.data()[i] != 0.0f;
    REQUIRE(dx.data()[i] == (keep ? Approx(dy.data()[i] / (1.0 - p)).epsilon(1e-6) : Approx(0.0)));
  }
  // p = 0 is the identity.
  k::dropout_forward(exec, x, y, 0.0, key);
  require_close(y, to_double(x), 0.0, 0.0, "dropout p = 0");
}

TEST_CASE("a shard's dropout mask equals that slice of the full tensor's mask",
          "[kernels][dropout]") {
  const execution<host> exec;
  const quintet::rng_key key{.seed = 17, .stream = 3};
  const shape global{6, 10, 8};
  auto x = random_tensor<float>(global, 1);
  tensor<float, host> whole(global);
  k::dropout_forward(exec, x, whole, 0.5, key);
  for (int dim = 0; dim < 3; ++dim) {
    const quintet::region where = quintet::region(global).chunk(dim, 2, 1);
    tensor<float, host> x_shard(where.local_shape()), y_shard(where.local_shape()),
        expected(where.local_shape());
    quintet::copy(x_shard, quintet::chunk(x, dim, 2, 1));
    k::dropout_forward(exec, x_shard, y_shard, 0.5, key, where);
    quintet::copy(expected, quintet::chunk(whole, dim, 2, 1));
    INFO("dim " << dim);
    REQUIRE(std::memcmp(y_shard.data(), expected.data(), expected.bytes()) == 0);
  }
}

TEST_CASE("dropout rejects a probability outside the unit interval and a region of another shape",
          "[kernels][dropout][errors]") {
  const execution<host> exec;
  tensor<float, host> x(shape{4, 4}), y(shape{4, 4});
  quintet::fill(x, 1.0f);
  REQUIRE_THROWS_WITH(k::dropout_forward(exec, x, y, 1.0, {}),
                      Catch::Contains("drop probability 1 must be in [0, 1)"));
  REQUIRE_THROWS_WITH(k::dropout_backward(exec, x, y, -0.1, {}),
                      Catch::Contains("drop probability -0.1"));
  REQUIRE_THROWS_WITH(
      k::dropout_forward(exec, x, y, 0.1, {}, quintet::region(shape{8, 4}).chunk(0, 4, 1)),
      Catch::Contains("local shape (2, 4) differs from the tensor's shape (4, 4)"));
}

TEST_CASE("GELU stays finite and exact at large magnitudes", "[kernels][elementwise]") {
  const execution<host> exec;
  tensor<float, host> x(shape{6}), y(shape{6}), dy(shape{6}), dx(shape{6});
  const float values[] = {-100.0f, -30.0f, -9.0f, 9.0f, 30.0f, 100.0f};
  for (int i = 0; i < 6; ++i) {
    x.data()[i] = values[i];
    dy.data()[i] = 1.0f;
  }
  k::gelu_forward(exec, x, y);
  k::gelu_backward(exec, x, dy, dx);
  for (int i = 0; i < 6; ++i) {
    const double v = values[i];
    INFO("x = " << v);
    // Far from zero GELU is x (or 0) and its slope 1 (or 0), to float precision.
    REQUIRE(y.data()[i] == Approx(gelu_reference(v)).margin(1e-6));
    REQUIRE(dx.data()[i] == Approx(v > 0 ? 1.0 : 0.0).margin(1e-6));
  }
}
