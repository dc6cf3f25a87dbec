// Causal multi-head attention against a naive double computation (scores, masked softmax,
// weighted values), backward against central finite differences, on q, k, v that are slices of
// one fused projection (strided rows) as a layer passes them.
#include "kernel_test_support.hpp"

#include <quintet/kernels/attention.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>

#include <algorithm>
#include <cmath>

using namespace kernel_test;
using quintet::execution;
namespace k = quintet::kernels;

namespace {

struct attention_case {
  std::int64_t batch, seq, heads, head_dim;
};

// Naive causal attention over a fused qkv (batch, seq, 3 * width): out and lse in double.
void attention_reference(const std::vector<double>& qkv, const attention_case& c,
                         std::vector<double>& out, std::vector<double>& lse) {
  const std::int64_t width = c.heads * c.head_dim;
  auto at = [&](std::int64_t b, std::int64_t s, std::int64_t part, std::int64_t h, std::int64_t e) {
    return qkv[(b * c.seq + s) * 3 * width + part * width + h * c.head_dim + e];
  };
  out.assign(c.batch * c.seq * width, 0.0);
  lse.assign(c.batch * c.heads * c.seq, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t i = 0; i < c.seq; ++i) {
        std::vector<double> scores(i + 1);
        for (std::int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (std::int64_t e = 0; e < c.head_dim; ++e) s += at(b, i, 0, h, e) * at(b, j, 1, h, e);
          scores[j] = s * scale;
        }
        const double peak = *std::max_element(scores.begin(), scores.end());
        double total = 0;
        for (const double s : scores) total += std::exp(s - peak);
        lse[(b * c.heads + h) * c.seq + i] = peak + std::log(total);
        for (std::int64_t j = 0; j <= i; ++j)
          for (std::int64_t e = 0; e < c.head_dim; ++e)
            out[(b * c.seq + i) * width + h * c.head_dim + e] +=
                std::exp(scores[j] - peak) / total * at(b, j, 2, h, e);
      }
}

template <class T>
struct qkv_views {
  quintet::tensor_view<T, host> q, k, v;
};

template <class T>
qkv_views<T> split(tensor<T, host>& qkv, std::int64_t width) {
  return {quintet::slice(qkv, 2, 0, width), quintet::slice(qkv, 2, width, 2 * width),
          quintet::slice(qkv, 2, 2 * width, 3 * width)};
}

// 130 queries span three blocks of the product-based kernel (64 queries each).
const std::vector<attention_case> cases = {{1, 1, 1, 1}, {2, 5, 2, 3},  {1, 17, 3, 4},
                                           {3, 4, 1, 8}, {1, 33, 2, 5}, {2, 130, 2, 16}};

}  // namespace

TEST_CASE("attention_forward equals naive causal attention in double", "[kernels][attention]") {
  const execution<host> ctx;
  std::uint64_t stream = 500;
  for (const auto& c : cases) {
    const std::int64_t width = c.heads * c.head_dim;
    auto qkv = random_tensor<float>(shape{c.batch, c.seq, 3 * width}, ++stream, -2.0, 2.0);
    const auto parts = split(qkv, width);
    tensor<float, host> out(shape{c.batch, c.seq, width}), lse(shape{c.batch, c.heads, c.seq});
    k::attention_forward(ctx, parts.q, parts.k, parts.v, out, lse, c.heads);
    std::vector<double> want_out, want_lse;
    attention_reference(to_double(qkv), c, want_out, want_lse);
    INFO("batch " << c.batch << " seq " << c.seq << " heads " << c.heads << " head_dim "
                  << c.head_dim);
    require_close(out, want_out, 1e-5, 1e-6, "out");
    require_close(lse, want_lse, 1e-5, 1e-6, "lse");
    // Contiguous copies of q, k, v give the same result as the strided slices.
    tensor<float, host> q(out.shape()), kk(out.shape()), v(out.shape()), out2(out.shape()),
        lse2(lse.shape());
    quintet::copy(q, parts.q);
    quintet::copy(kk, parts.k);
    quintet::copy(v, parts.v);
    k::attention_forward(ctx, q, kk, v, out2, lse2, c.heads);
    require_close(out2, to_double(out), 0.0, 0.0, "contiguous vs strided");
  }
}

TEST_CASE("attention_backward equals finite differences of the forward", "[kernels][attention]") {
  const execution<host> ctx;
  std::uint64_t stream = 600;
  for (const auto& c :
       {attention_case{1, 1, 1, 2}, attention_case{2, 5, 2, 3}, attention_case{1, 7, 3, 2}}) {
    const std::int64_t width = c.heads * c.head_dim;
    auto qkv = random_tensor<double>(shape{c.batch, c.seq, 3 * width}, ++stream, -1.5, 1.5);
    auto w = random_tensor<double>(shape{c.batch, c.seq, width}, ++stream);
    const auto parts = split(qkv, width);
    tensor<double, host> out(shape{c.batch, c.seq, width}), lse(shape{c.batch, c.heads, c.seq});
    auto loss = [&] {
      k::attention_forward(ctx, parts.q, parts.k, parts.v, out, lse, c.heads);
      return weighted_sum(out, w);
    };
    const auto numeric = finite_difference_gradient(qkv, loss);
    loss();
    tensor<double, host> dqkv(qkv.shape());
    quintet::fill(dqkv, std::nan(""));  // every element must be written
    const auto grads = split(dqkv, width);
    k::attention_backward(ctx, parts.q, parts.k, parts.v, out, lse, w, grads.q, grads.k, grads.v,
                          c.heads);
    INFO("batch " << c.batch << " seq " << c.seq << " heads " << c.heads << " head_dim "
                  << c.head_dim);
    require_close(dqkv, numeric, 1e-6, 1e-8, "dq, dk, dv");
  }
}

TEST_CASE("attention_backward in float agrees with double", "[kernels][attention]") {
  const execution<host> ctx;
  const attention_case c{2, 19, 2, 8};
  const std::int64_t width = 16;
  auto qkv_d = random_tensor<double>(shape{2, 19, 48}, 1, -2.0, 2.0);
  auto dout_d = random_tensor<double>(shape{2, 19, 16}, 2);
  auto qkv_f = from_double<float>(to_double(qkv_d), qkv_d.shape());
  auto dout_f = from_double<float>(to_double(dout_d), dout_d.shape());
  auto run = [&](auto& qkv, auto& dout, auto zero) {
    using T = decltype(zero);
    const auto p = split(qkv, width);
    tensor<T, host> out(shape{2, 19, 16}), lse(shape{2, 2, 19}), dqkv(qkv.shape());
    k::attention_forward(ctx, p.q, p.k, p.v, out, lse, c.heads);
    const auto g = split(dqkv, width);
    k::attention_backward(ctx, p.q, p.k, p.v, out, lse, dout, g.q, g.k, g.v, c.heads);
    return to_double(dqkv);
  };
  const auto want = run(qkv_d, dout_d, 0.0);
  const auto got = run(qkv_f, dout_f, 0.0f);
  require_close(got, want, 1e-4, 1e-5, "float backward");
}

TEST_CASE("attention rejects heads that do not divide the width and misshapen operands",
          "[kernels][attention][errors]") {
  const execution<host> ctx;
  tensor<float, host> q(shape{2, 4, 12}), out(shape{2, 4, 12}), lse(shape{2, 5, 4});
  REQUIRE_THROWS_WITH(k::attention_forward(ctx, q, q, q, out, lse, 5),
                      Catch::Contains("5 heads do not divide the width 12"));
  REQUIRE_THROWS_WITH(k::attention_forward(ctx, q, q, q, out, lse, 3),
                      Catch::Contains("lse has shape (2, 5, 4), expected (2, 3, 4)"));
  tensor<float, host> k_short(shape{2, 3, 12}), lse3(shape{2, 3, 4});
  REQUIRE_THROWS_WITH(k::attention_forward(ctx, q, k_short, q, out, lse3, 3),
                      Catch::Contains("(2, 4, 12)") && Catch::Contains("(2, 3, 12)"));
  tensor<float, host> flat(shape{8, 12});
  REQUIRE_THROWS_WITH(k::attention_forward(ctx, flat, flat, flat, flat, lse3, 3),
                      Catch::Contains("(batch, seq, heads * head_dim) is needed"));
  // A view whose last dimension is strided.
  tensor<float, host> wide(shape{2, 12, 4});
  const quintet::tensor_view<float, host> transposed(wide.data(), shape{2, 4, 12}, {48, 1, 4});
  REQUIRE_THROWS_WITH(k::attention_forward(ctx, transposed, q, q, out, lse3, 3),
                      Catch::Contains("last dimension of q") && Catch::Contains("stride is 4"));
}

TEST_CASE("bf16 attention (row loops in float) agrees with float attention (products)",
          "[kernels][attention]") {
  const execution<host> ctx;
  const std::int64_t heads = 2, width = 16;
  auto qkv_f = random_tensor<float>(shape{2, 70, 48}, 31, -2.0, 2.0);  // 70 > one query block
  auto dout_f = random_tensor<float>(shape{2, 70, 16}, 32);
  auto qkv_h = from_double<quintet::bf16>(to_double(qkv_f), qkv_f.shape());
  auto dout_h = from_double<quintet::bf16>(to_double(dout_f), dout_f.shape());
  // The float run starts from the bf16-rounded inputs, so only the arithmetic differs.
  qkv_f = from_double<float>(to_double(qkv_h), qkv_f.shape());
  dout_f = from_double<float>(to_double(dout_h), dout_f.shape());
  auto run = [&](auto& qkv, auto& dout, auto zero, std::vector<double>& out_values) {
    using T = decltype(zero);
    const auto p = split(qkv, width);
    tensor<T, host> out(shape{2, 70, 16}), dqkv(qkv.shape());
    tensor<float, host> lse(shape{2, 2, 70});
    k::attention_forward(ctx, p.q, p.k, p.v, out, lse, heads);
    const auto g = split(dqkv, width);
    k::attention_backward(ctx, p.q, p.k, p.v, out, lse, dout, g.q, g.k, g.v, heads);
    out_values = to_double(out);
    return to_double(dqkv);
  };
  std::vector<double> out_f, out_h;
  const auto grad_f = run(qkv_f, dout_f, 0.0f, out_f);
  const auto grad_h = run(qkv_h, dout_h, quintet::bf16(0.0f), out_h);
  // bf16 keeps 8 significant bits: outputs within 2^-8 relative (plus a little absolute).
  require_close(out_h, out_f, 1e-2, 1e-2, "bf16 out");
  require_close(grad_h, grad_f, 2e-2, 2e-2, "bf16 dq, dk, dv");
}
