// Causal multi-head attention against a naive double computation (scores, masked softmax,
// weighted values), backward against central finite differences, on q, k, v that are slices of
// one fused projection (strided rows) as a layer passes them.
#include "kernel_test_support.hpp"

#include <quintet/kernels/attention.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/slice.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

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
  const execution<host> exec;
  std::uint64_t stream = 500;
  for (const auto& c : cases) {
    const std::int64_t width = c.heads * c.head_dim;
    auto qkv = random_tensor<float>(shape{c.batch, c.seq, 3 * width}, ++stream, -2.0, 2.0);
    const auto parts = split(qkv, width);
    tensor<float, host> out(shape{c.batch, c.seq, width}), lse(shape{c.batch, c.heads, c.seq});
    k::attention_forward(exec, parts.q, parts.k, parts.v, out, lse, c.heads);
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
    k::attention_forward(exec, q, kk, v, out2, lse2, c.heads);
    require_close(out2, to_double(out), 0.0, 0.0, "contiguous vs strided");
  }
}

TEST_CASE("attention_backward equals finite differences of the forward", "[kernels][attention]") {
  const execution<host> exec;
  std::uint64_t stream = 600;
  for (const auto& c :
       {attention_case{1, 1, 1, 2}, attention_case{2, 5, 2, 3}, attention_case{1, 7, 3, 2}}) {
    const std::int64_t width = c.heads * c.head_dim;
    auto qkv = random_tensor<double>(shape{c.batch, c.seq, 3 * width}, ++stream, -1.5, 1.5);
    auto w = random_tensor<double>(shape{c.batch, c.seq, width}, ++stream);
    const auto parts = split(qkv, width);
    tensor<double, host> out(shape{c.batch, c.seq, width}), lse(shape{c.batch, c.heads, c.seq});
    auto loss = [&] {
      k::attention_forward(exec, parts.q, parts.k, parts.v, out, lse, c.heads);
      return weighted_sum(out, w);
    };
    const auto numeric = finite_difference_gradient(qkv, loss);
    loss();
    tensor<double, host> dqkv(qkv.shape());
    quintet::fill(dqkv, std::nan(""));  // every element must be written
    const auto grads = split(dqkv, width);
    k::attention_backward(exec, parts.q, parts.k, parts.v, out, lse, w, grads.q, grads.k, grads.v,
                          c.heads);
    INFO("batch " << c.batch << " seq " << c.seq << " heads " << c.heads << " head_dim "
                  << c.head_dim);
    require_close(dqkv, numeric, 1e-6, 1e-8, "dq, dk, dv");
  }
}

TEST_CASE("attention_backward in float agrees with double", "[kernels][attention]") {
  const execution<host> exec;
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
    k::attention_forward(exec, p.q, p.k, p.v, out, lse, c.heads);
    const auto g = split(dqkv, width);
    k::attention_backward(exec, p.q, p.k, p.v, out, lse, dout, g.q, g.k, g.v, c.heads);
    return to_double(dqkv);
  };
  const auto want = run(qkv_d, dout_d, 0.0);
  const auto got = run(qkv_f, dout_f, 0.0f);
  require_close(got, want, 1e-4, 1e-5, "float backward");
}

TEST_CASE("attention rejects heads that do not divide the width and misshapen operands",
          "[kernels][attention][errors]") {
  const execution<host> exec;
  tensor<float, host> q(shape{2, 4, 12}), out(shape{2, 4, 12}), lse(shape{2, 5, 4});
  REQUIRE_THROWS_WITH(k::attention_forward(exec, q, q, q, out, lse, 5),
                      Catch::Contains("5 heads do not divide the width 12"));
  REQUIRE_THROWS_WITH(k::attention_forward(exec, q, q, q, out, lse, 3),
                      Catch::Contains("lse has shape (2, 5, 4), expected (2, 3, 4)"));
  tensor<float, host> k_short(shape{2, 3, 12}), lse3(shape{2, 3, 4});
  REQUIRE_THROWS_WITH(k::attention_forward(exec, q, k_short, q, out, lse3, 3),
                      Catch::Contains("(2, 4, 12)") && Catch::Contains("(2, 3, 12)"));
  tensor<float, host> flat(shape{8, 12});
  REQUIRE_THROWS_WITH(k::attention_forward(exec, flat, flat, flat, flat, lse3, 3),
                      Catch::Contains("(batch, seq, heads * head_dim) is needed"));
  // A view whose last dimension is strided.
  tensor<float, host> wide(shape{2, 12, 4});
  const quintet::tensor_view<float, host> transposed(wide.data(), shape{2, 4, 12}, {48, 1, 4});
  REQUIRE_THROWS_WITH(k::attention_forward(exec, transposed, q, q, out, lse3, 3),
                      Catch::Contains("last dimension of q") && Catch::Contains("stride is 4"));
}

TEST_CASE("bf16 attention (row loops in float) agrees with float attention (products)",
          "[kernels][attention]") {
  const execution<host> exec;
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
    k::attention_forward(exec, p.q, p.k, p.v, out, lse, heads);
    const auto g = split(dqkv, width);
    k::attention_backward(exec, p.q, p.k, p.v, out, lse, dout, g.q, g.k, g.v, heads);
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

// ---- Attention over blocks of keys: the full mask, the block backward, delta and merge. ----

namespace {

// Sizes of a naive attention of `queries` queries over `keys` keys.
struct block_case {
  std::int64_t batch, queries, keys, heads, head_dim;
  std::int64_t width() const { return heads * head_dim; }
};

// Which keys query i sees, in the naive loops.
using visibility = std::function<bool(std::int64_t, std::int64_t)>;
const visibility every_key = [](std::int64_t, std::int64_t) { return true; };
const visibility causal_keys = [](std::int64_t i, std::int64_t j) { return j <= i; };

// A (batch, seq, width) view (any strides) read densely into doubles.
template <class View>
std::vector<double> dense(const View& v) {
  const auto& n = v.shape();
  const auto& st = v.strides();
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(v.numel()));
  for (std::int64_t b = 0; b < n[0]; ++b)
    for (std::int64_t s = 0; s < n[1]; ++s)
      for (std::int64_t c = 0; c < n[2]; ++c)
        out.push_back(static_cast<double>(v.data()[b * st[0] + s * st[1] + c * st[2]]));
  return out;
}

// Naive attention in double: q (batch, queries, width), k and v (batch, keys, width), dense.
void naive_attention(const std::vector<double>& q, const std::vector<double>& kk,
                     const std::vector<double>& v, const block_case& c, const visibility& visible,
                     std::vector<double>& out, std::vector<double>& lse) {
  const std::int64_t w = c.width();
  out.assign(c.batch * c.queries * w, 0.0);
  lse.assign(c.batch * c.heads * c.queries, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t i = 0; i < c.queries; ++i) {
        std::vector<double> scores;
        std::vector<std::int64_t> seen;
        for (std::int64_t j = 0; j < c.keys; ++j) {
          if (!visible(i, j)) continue;
          double s = 0;
          for (std::int64_t e = 0; e < c.head_dim; ++e)
            s += q[(b * c.queries + i) * w + h * c.head_dim + e] *
                 kk[(b * c.keys + j) * w + h * c.head_dim + e];
          scores.push_back(s * scale);
          seen.push_back(j);
        }
        const double peak = *std::max_element(scores.begin(), scores.end());
        double total = 0;
        for (const double s : scores) total += std::exp(s - peak);
        lse[(b * c.heads + h) * c.queries + i] = peak + std::log(total);
        for (std::size_t t = 0; t < seen.size(); ++t)
          for (std::int64_t e = 0; e < c.head_dim; ++e)
            out[(b * c.queries + i) * w + h * c.head_dim + e] +=
                std::exp(scores[t] - peak) / total *
                v[(b * c.keys + seen[t]) * w + h * c.head_dim + e];
      }
}

// Naive block backward in double, the formulas written out: p = exp(scale q.k - lse),
// dv = p^T dout, ds = p (dout . v - delta), dq = scale ds k, dk = scale ds^T q (fresh, not added).
void naive_backward_block(const std::vector<double>& q, const std::vector<double>& kk,
                          const std::vector<double>& v, const std::vector<double>& dout,
                          const std::vector<double>& lse, const std::vector<double>& delta,
                          const block_case& c, const visibility& visible, std::vector<double>& dq,
                          std::vector<double>& dk, std::vector<double>& dv) {
  const std::int64_t w = c.width(), d = c.head_dim;
  dq.assign(c.batch * c.queries * w, 0.0);
  dk.assign(c.batch * c.keys * w, 0.0);
  dv.assign(c.batch * c.keys * w, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < c.heads; ++h)
      for (std::int64_t i = 0; i < c.queries; ++i)
        for (std::int64_t j = 0; j < c.keys; ++j) {
          if (!visible(i, j)) continue;
          const std::int64_t qi = (b * c.queries + i) * w + h * d,
                             kj = (b * c.keys + j) * w + h * d;
          double s = 0, dp = 0;
          for (std::int64_t e = 0; e < d; ++e) {
            s += q[qi + e] * kk[kj + e];
            dp += dout[qi + e] * v[kj + e];
          }
          const std::int64_t row = (b * c.heads + h) * c.queries + i;
          const double p = std::exp(scale * s - lse[row]);
          const double ds = p * (dp - delta[row]);
          for (std::int64_t e = 0; e < d; ++e) {
            dv[kj + e] += p * dout[qi + e];
            dq[qi + e] += scale * ds * kk[kj + e];
            dk[kj + e] += scale * ds * q[qi + e];
          }
        }
}

std::vector<double> plus(std::vector<double> a, const std::vector<double>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

// Tolerances against the naive double loops: double agrees to rounding (1e-12); float to a few
// ulps of the accumulated sums (the existing float attention tests use the same).
template <class T>
constexpr double block_rtol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
template <class T>
constexpr double block_atol = std::is_same_v<T, double> ? 1e-12 : 1e-6;

// q (batch, queries, width) a strided slice of a (batch, queries, 2 width) tensor; k and v slices
// of one fused (batch, keys, 2 width) tensor, as ring attention's packed blocks are not.
template <class T>
struct block_operands {
  tensor<T, host> q_wide, kv;
  quintet::tensor_view<T, host> q, k, v;
  block_operands(const block_case& c, std::uint64_t stream)
      : q_wide(random_tensor<T>(shape{c.batch, c.queries, 2 * c.width()}, stream, -2.0, 2.0)),
        kv(random_tensor<T>(shape{c.batch, c.keys, 2 * c.width()}, stream + 1000, -2.0, 2.0)),
        q(quintet::slice(q_wide, 2, c.width(), 2 * c.width())),
        k(quintet::slice(kv, 2, 0, c.width())),
        v(quintet::slice(kv, 2, c.width(), 2 * c.width())) {}
};

const std::vector<block_case> full_cases = {
    {1, 1, 1, 1, 1}, {2, 5, 7, 2, 3}, {1, 70, 9, 2, 4}, {2, 3, 130, 3, 4}, {1, 9, 9, 1, 8}};

}  // namespace

TEMPLATE_TEST_CASE("attention_forward with the full mask equals naive attention over every key",
                   "[kernels][attention][blocks]", float, double) {
  using T = TestType;
  const execution<host> exec;
  std::uint64_t stream = 700;
  for (const auto& c : full_cases) {
    const block_operands<T> in(c, ++stream);
    tensor<T, host> out(shape{c.batch, c.queries, c.width()});
    tensor<T, host> lse(shape{c.batch, c.heads, c.queries});
    k::attention_forward(exec, in.q, in.k, in.v, out, lse, c.heads, k::attention_mask::full);
    std::vector<double> want_out, want_lse;
    naive_attention(dense(in.q), dense(in.k), dense(in.v), c, every_key, want_out, want_lse);
    INFO("queries " << c.queries << " keys " << c.keys << " heads " << c.heads);
    require_close(out, want_out, block_rtol<T>, block_atol<T>, "out");
    require_close(lse, want_lse, block_rtol<T>, block_atol<T>, "lse");
  }
}

TEST_CASE("bf16 attention with the full mask agrees with float", "[kernels][attention][blocks]") {
  const execution<host> exec;
  const block_case c{2, 6, 11, 2, 8};
  const block_operands<float> in(c, 40);
  tensor<quintet::bf16, host> q(in.q.shape()), kk(in.k.shape()), v(in.v.shape());
  tensor<float, host> qf(in.q.shape()), kf(in.k.shape()), vf(in.v.shape());
  for (auto [dst, dst_f, src] :
       {std::tuple{&q, &qf, in.q}, std::tuple{&kk, &kf, in.k}, std::tuple{&v, &vf, in.v}}) {
    *dst = from_double<quintet::bf16>(dense(src), src.shape());
    *dst_f = from_double<float>(to_double(*dst), src.shape());
  }
  tensor<quintet::bf16, host> out(q.shape());
  tensor<float, host> out_f(q.shape()), lse(shape{2, 2, 6}), lse_f(shape{2, 2, 6});
  k::attention_forward(exec, q, kk, v, out, lse, c.heads, k::attention_mask::full);
  k::attention_forward(exec, qf, kf, vf, out_f, lse_f, c.heads, k::attention_mask::full);
  require_close(out, to_double(out_f), 1e-2, 1e-2, "bf16 out");
  require_close(lse, to_double(lse_f), 1e-5, 1e-5, "bf16 lse");
}

TEST_CASE("attention_forward needs as many keys as queries under the causal mask",
          "[kernels][attention][blocks][errors]") {
  const execution<host> exec;
  tensor<float, host> q(shape{2, 4, 6}), kk(shape{2, 5, 6}), out(shape{2, 4, 6}),
      lse(shape{2, 2, 4});
  REQUIRE_THROWS_WITH(k::attention_forward(exec, q, kk, kk, out, lse, 2),
                      Catch::Contains("causal mask needs as many keys as queries"));
  tensor<float, host> narrow_k(shape{2, 5, 4});
  REQUIRE_THROWS_WITH(
      k::attention_forward(exec, q, narrow_k, narrow_k, out, lse, 2, k::attention_mask::full),
      Catch::Contains("need the same batch and width"));
  k::attention_forward(exec, q, kk, kk, out, lse, 2, k::attention_mask::full);  // full: fine
}

TEMPLATE_TEST_CASE("attention_delta is the per-head sum of dout times out",
                   "[kernels][attention][blocks]", float, double) {
  using T = TestType;
  const execution<host> exec;
  const std::int64_t batch = 2, seq = 5, heads = 3, head_dim = 4, width = 12;
  auto wide = random_tensor<T>(shape{batch, seq, 2 * width}, 71);
  const auto dout = quintet::slice(wide, 2, 0, width);
  const auto out = quintet::slice(wide, 2, width, 2 * width);
  tensor<T, host> delta(shape{batch, heads, seq});
  k::attention_delta(exec, dout, out, delta, heads);
  std::vector<double> want;
  const auto a = dense(dout), b = dense(out);
  for (std::int64_t n = 0; n < batch; ++n)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t s = 0; s < seq; ++s) {
        double sum = 0;
        for (std::int64_t e = 0; e < head_dim; ++e) {
          const std::int64_t at = (n * seq + s) * width + h * head_dim + e;
          sum += a[at] * b[at];
        }
        want.push_back(sum);
      }
  require_close(delta, want, block_rtol<T>, block_atol<T>, "delta");
}

TEMPLATE_TEST_CASE("attention_backward_block accumulates the naive block gradients",
                   "[kernels][attention][blocks]", float, double) {
  using T = TestType;
  const execution<host> exec;
  std::uint64_t stream = 800;
  auto run = [&](const block_case& c, k::attention_mask mask) {
    const block_operands<T> in(c, ++stream);
    const auto dout = random_tensor<T>(shape{c.batch, c.queries, c.width()}, ++stream);
    // Final lse and delta as a merged result over more keys would give: the block's own lse raised
    // by up to 1 (other blocks' mass), and a random delta.
    tensor<T, host> out(dout.shape()), lse(shape{c.batch, c.heads, c.queries});
    k::attention_forward(exec, in.q, in.k, in.v, out, lse, c.heads, mask);
    const auto raise = random_tensor<T>(lse.shape(), ++stream, 0.0, 1.0);
    const auto delta = random_tensor<T>(lse.shape(), ++stream);
    for (std::int64_t i = 0; i < lse.numel(); ++i) lse.data()[i] += raise.data()[i];
    // dq, dk, dv start random (and dq, dk are strided slices): the kernel must add to them.
    auto dq_wide = random_tensor<T>(shape{c.batch, c.queries, 2 * c.width()}, ++stream);
    auto dkv = random_tensor<T>(shape{c.batch, c.keys, 2 * c.width()}, ++stream);
    const auto dq = quintet::slice(dq_wide, 2, 0, c.width());
    const auto dk = quintet::slice(dkv, 2, 0, c.width());
    const auto dv = quintet::slice(dkv, 2, c.width(), 2 * c.width());
    const auto dq0 = dense(dq), dk0 = dense(dk), dv0 = dense(dv);
    k::attention_backward_block(exec, in.q, in.k, in.v, dout, lse, delta, dq, dk, dv, c.heads,
                                mask);
    std::vector<double> want_dq, want_dk, want_dv;
    naive_backward_block(
        dense(in.q), dense(in.k), dense(in.v), to_double(dout), to_double(lse), to_double(delta), c,
        mask == k::attention_mask::full ? every_key : causal_keys, want_dq, want_dk, want_dv);
    INFO("queries " << c.queries << " keys " << c.keys << " heads " << c.heads << " mask "
                    << (mask == k::attention_mask::full ? "full" : "causal"));
    // Float: the sums are of terms up to ~10; 1e-4 relative as the float backward test allows.
    const double rtol = std::is_same_v<T, double> ? 1e-12 : 1e-4;
    const double atol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
    require_close(dense(dq), plus(dq0, want_dq), rtol, atol, "dq");
    require_close(dense(dk), plus(dk0, want_dk), rtol, atol, "dk");
    require_close(dense(dv), plus(dv0, want_dv), rtol, atol, "dv");
  };
  for (const auto& c : full_cases) run(c, k::attention_mask::full);
  for (const auto& c :
       {block_case{1, 1, 1, 1, 2}, block_case{2, 7, 7, 2, 3}, block_case{1, 70, 70, 2, 4}})
    run(c, k::attention_mask::causal);
}

TEST_CASE("attention_backward_block over a full and a causal block equals finite differences",
          "[kernels][attention][blocks]") {
  // Queries see a preceding block of keys wholly (full, more keys than queries) and their own
  // block causally, as in ring attention: out = merge(forward(full), forward(causal)). The
  // gradients of both blocks from the final lse and delta must be those of the merged output.
  const execution<host> exec;
  const std::int64_t batch = 2, seq = 4, before = 6, heads = 2, width = 6;  // head_dim 3
  auto q = random_tensor<double>(shape{batch, seq, width}, 91, -1.5, 1.5);
  auto kv_before = random_tensor<double>(shape{batch, before, 2 * width}, 92, -1.5, 1.5);
  auto kv_self = random_tensor<double>(shape{batch, seq, 2 * width}, 93, -1.5, 1.5);
  const auto w = random_tensor<double>(shape{batch, seq, width}, 94);
  auto k_of = [&](tensor<double, host>& kv) { return quintet::slice(kv, 2, 0, width); };
  auto v_of = [&](tensor<double, host>& kv) { return quintet::slice(kv, 2, width, 2 * width); };
  tensor<double, host> out(shape{batch, seq, width}), lse(shape{batch, heads, seq}),
      block_out(out.shape()), block_lse(lse.shape());
  auto loss = [&] {
    k::attention_forward(exec, q, k_of(kv_before), v_of(kv_before), out, lse, heads,
                         k::attention_mask::full);
    k::attention_forward(exec, q, k_of(kv_self), v_of(kv_self), block_out, block_lse, heads);
    k::attention_merge(exec, out, lse, block_out, block_lse, heads);
    return weighted_sum(out, w);
  };
  const auto numeric_q = finite_difference_gradient(q, loss);
  const auto numeric_before = finite_difference_gradient(kv_before, loss);
  const auto numeric_self = finite_difference_gradient(kv_self, loss);
  loss();
  tensor<double, host> delta(lse.shape()), dq(q.shape()), dkv_before(kv_before.shape()),
      dkv_self(kv_self.shape());
  k::attention_delta(exec, w, out, delta, heads);
  quintet::fill(dq, 0.0);
  quintet::fill(dkv_before, 0.0);
  quintet::fill(dkv_self, 0.0);
  k::attention_backward_block(exec, q, k_of(kv_before), v_of(kv_before), w, lse, delta, dq,
                              k_of(dkv_before), v_of(dkv_before), heads, k::attention_mask::full);
  k::attention_backward_block(exec, q, k_of(kv_self), v_of(kv_self), w, lse, delta, dq,
                              k_of(dkv_self), v_of(dkv_self), heads, k::attention_mask::causal);
  require_close(dq, numeric_q, 1e-6, 1e-8, "dq");
  require_close(dkv_before, numeric_before, 1e-6, 1e-8, "dk, dv of the full block");
  require_close(dkv_self, numeric_self, 1e-6, 1e-8, "dk, dv of the causal block");
}

TEMPLATE_TEST_CASE("attention_merge of two key blocks equals attention over their concatenation",
                   "[kernels][attention][blocks]", float, double) {
  using T = TestType;
  const execution<host> exec;
  const std::int64_t batch = 2, queries = 5, first = 4, second = 7, heads = 2, width = 6;
  const block_case both{batch, queries, first + second, heads, 3};
  const block_operands<T> in(both, 61);
  const auto k1 = quintet::slice(in.k, 1, 0, first), v1 = quintet::slice(in.v, 1, 0, first);
  const auto k2 = quintet::slice(in.k, 1, first, first + second),
             v2 = quintet::slice(in.v, 1, first, first + second);
  tensor<T, host> want(shape{batch, queries, width}), want_lse(shape{batch, heads, queries});
  k::attention_forward(exec, in.q, in.k, in.v, want, want_lse, heads, k::attention_mask::full);
  tensor<T, host> block_out(want.shape()), block_lse(want_lse.shape());

  SECTION("the first block's result, merged with the second's") {
    tensor<T, host> out(want.shape()), lse(want_lse.shape());
    k::attention_forward(exec, in.q, k1, v1, out, lse, heads, k::attention_mask::full);
    k::attention_forward(exec, in.q, k2, v2, block_out, block_lse, heads, k::attention_mask::full);
    k::attention_merge(exec, out, lse, block_out, block_lse, heads);
    require_close(out, to_double(want), block_rtol<T> * 10, block_atol<T> * 10, "merged out");
    require_close(lse, to_double(want_lse), block_rtol<T> * 10, block_atol<T> * 10, "merged lse");
  }
  SECTION("starting empty: lse -inf and out NaN, both blocks merged in") {
    tensor<T, host> out(want.shape()), lse(want_lse.shape());
    quintet::fill(out, std::numeric_limits<T>::quiet_NaN());
    quintet::fill(lse, -std::numeric_limits<T>::infinity());
    for (const auto& [kk, v] : {std::pair{k2, v2}, std::pair{k1, v1}}) {
      k::attention_forward(exec, in.q, kk, v, block_out, block_lse, heads, k::attention_mask::full);
      k::attention_merge(exec, out, lse, block_out, block_lse, heads);
    }
    require_close(out, to_double(want), block_rtol<T> * 10, block_atol<T> * 10, "merged out");
    require_close(lse, to_double(want_lse), block_rtol<T> * 10, block_atol<T> * 10, "merged lse");
    // A block of no keys (out 0, lse -inf) changes nothing.
    k::attention_forward(exec, in.q, quintet::slice(in.k, 1, 0, 0), quintet::slice(in.v, 1, 0, 0),
                         block_out, block_lse, heads, k::attention_mask::full);
    REQUIRE(to_double(block_lse) ==
            std::vector<double>(block_lse.numel(), -std::numeric_limits<double>::infinity()));
    const auto before = to_double(out);
    k::attention_merge(exec, out, lse, block_out, block_lse, heads);
    REQUIRE(to_double(out) == before);
  }
  SECTION("against the merge formula in double on arbitrary values") {
    auto out = random_tensor<T>(want.shape(), 62);
    auto lse = random_tensor<T>(want_lse.shape(), 63, -3.0, 3.0);
    const auto other = random_tensor<T>(want.shape(), 64);
    const auto other_lse = random_tensor<T>(want_lse.shape(), 65, -3.0, 3.0);
    auto expect = to_double(out);
    const auto l = to_double(lse), o = to_double(other), ol = to_double(other_lse);
    std::vector<double> expect_lse(l.size());
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t i = 0; i < queries; ++i) {
          const std::int64_t r = (b * heads + h) * queries + i;
          expect_lse[r] = std::log(std::exp(l[r]) + std::exp(ol[r]));
          for (std::int64_t e = 0; e < 3; ++e) {
            const std::int64_t at = (b * queries + i) * width + h * 3 + e;
            expect[at] = expect[at] * std::exp(l[r] - expect_lse[r]) +
                         o[at] * std::exp(ol[r] - expect_lse[r]);
          }
        }
    k::attention_merge(exec, out, lse, other, other_lse, heads);
    require_close(out, expect, block_rtol<T>, block_atol<T>, "out");
    require_close(lse, expect_lse, block_rtol<T>, block_atol<T>, "lse");
  }
}
