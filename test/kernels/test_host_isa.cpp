// The host kernels' instruction-set variants (kernels/host/isa.hpp): every kernel that dispatches
// on execution<host>::isa() gives the baseline's bits under AVX2 and AVX-512 where this CPU has
// them, on one thread and split over three; the exponentials over their whole range (subnormal
// results, clamping, infinities, NaN) likewise; and QUINTET_HOST_ISA's values are parsed or
// refused by name.
#include "kernel_test_support.hpp"

#include <quintet/kernels/attention.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/elementwise.hpp>
#include <quintet/kernels/host/exponential.hpp>
#include <quintet/kernels/host/isa.hpp>
#include <quintet/kernels/layer_norm.hpp>
#include <quintet/kernels/softmax.hpp>
#include <quintet/tensor/slice.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace kernel_test;
using quintet::execution;
using quintet::host_isa;
namespace k = quintet::kernels;

namespace {

// Every output of every dispatching kernel, run under `exec` on the same inputs, flattened to
// float bits in a fixed order (a double accumulation target is appended as two floats' worth of
// bytes).
std::vector<unsigned char> every_output(const execution<host>& exec) {
  std::vector<unsigned char> bytes;
  const auto keep = [&](const auto& t) {
    const auto* first = reinterpret_cast<const unsigned char*>(t.data());
    bytes.insert(bytes.end(), first, first + t.numel() * sizeof(*t.data()));
  };
  // Elementwise: three parts of grain_for(1) and a tail of fewer than 16 lanes. Inputs span the
  // exponential's clamp (|2u| > 88 for |x| > ~8).
  const shape flat{3 * 65536 + 5};
  const auto x = random_tensor<float>(flat, 1, -12.0, 12.0);
  const auto dy = random_tensor<float>(flat, 2);
  tensor<float, host> y(flat), dx(flat), sum(flat);
  k::gelu_forward(exec, x, y);
  k::gelu_backward(exec, x, dy, dx);
  k::add(exec, x, dy, sum);
  keep(y), keep(dx), keep(sum);
  k::scale(exec, sum, 0.37);
  keep(sum);
  tensor<double, host> wide(flat);
  quintet::fill(wide, 0.25);
  k::accumulate(exec, y, wide);
  keep(wide);

  // Rows: 500 rows of 300 (two parts of 218 rows and a partial one).
  const std::int64_t rows = 500, n = 300;
  auto h = random_tensor<float>(shape{rows, n}, 3, -3.0, 3.0);
  const auto bias = random_tensor<float>(shape{n}, 4);
  const auto gamma = random_tensor<float>(shape{n}, 5, 0.5, 1.5);
  const auto beta = random_tensor<float>(shape{n}, 6);
  const auto dh = random_tensor<float>(shape{rows, n}, 7);
  k::bias_add(exec, h, bias);
  keep(h);
  auto dbias = random_tensor<float>(shape{n}, 8);
  k::bias_grad(exec, dh, dbias);
  keep(dbias);
  tensor<float, host> normed(shape{rows, n}), mean(shape{rows}), rstd(shape{rows}),
      dnormed(shape{rows, n}), dnormed_input(shape{rows, n});
  k::layer_norm_forward(exec, h, gamma, beta, normed, mean, rstd);
  keep(normed), keep(mean), keep(rstd);
  auto dgamma = random_tensor<float>(shape{n}, 9), dbeta = random_tensor<float>(shape{n}, 10);
  k::layer_norm_backward(exec, h, gamma, mean, rstd, dh, dnormed, dgamma, dbeta);
  k::layer_norm_backward_input(exec, h, gamma, mean, rstd, dh, dnormed_input);
  keep(dnormed), keep(dgamma), keep(dbeta), keep(dnormed_input);
  tensor<float, host> soft(shape{rows, n}), dsoft(shape{rows, n});
  k::softmax_forward(exec, h, soft);
  k::softmax_backward(exec, soft, dh, dsoft);
  keep(soft), keep(dsoft);

  // Cross-entropy over a vocabulary of 300, one ignored row.
  tensor<std::int32_t, host> targets(shape{rows});
  for (std::int64_t r = 0; r < rows; ++r)
    targets.data()[r] = r == 17 ? k::no_target : static_cast<std::int32_t>((r * 37) % n);
  tensor<float, host> lse(shape{rows}), dlogits(shape{rows, n});
  const auto loss = k::cross_entropy_forward(exec, h, targets, lse, k::no_target);
  k::cross_entropy_backward(exec, h, targets, lse, dlogits, 1.0 / 499, k::no_target);
  tensor<double, host> loss_sum(shape{1});
  loss_sum.data()[0] = loss.loss_sum;
  keep(lse), keep(dlogits), keep(loss_sum);

  // Causal attention: 130 queries (three blocks of 64), two heads of 16.
  const std::int64_t batch = 2, seq = 130, heads = 2, width = 32;
  auto qkv = random_tensor<float>(shape{batch, seq, 3 * width}, 11, -2.0, 2.0);
  const auto dout = random_tensor<float>(shape{batch, seq, width}, 12);
  const auto q = quintet::slice(qkv, 2, 0, width), kk = quintet::slice(qkv, 2, width, 2 * width),
             v = quintet::slice(qkv, 2, 2 * width, 3 * width);
  tensor<float, host> out(shape{batch, seq, width}), attention_lse(shape{batch, heads, seq}),
      dqkv(qkv.shape());
  k::attention_forward(exec, q, kk, v, out, attention_lse, heads);
  k::attention_backward(exec, q, kk, v, out, attention_lse, dout, quintet::slice(dqkv, 2, 0, width),
                        quintet::slice(dqkv, 2, width, 2 * width),
                        quintet::slice(dqkv, 2, 2 * width, 3 * width), heads);
  keep(out), keep(attention_lse), keep(dqkv);
  return bytes;
}

std::string isa_name(host_isa isa) { return std::string(quintet::host_isa_name(isa)); }

}  // namespace

TEST_CASE("every instruction set gives the baseline's bits in every dispatching kernel",
          "[kernels][isa]") {
  const auto want = every_output(execution<host>(1, host_isa::baseline));
  int variants = 0;
  for (const host_isa isa : quintet::all_host_isas) {
    if (!quintet::host_isa_supported(isa)) continue;
    for (const int threads : {1, 3}) {
      const auto got = every_output(execution<host>(threads, isa));
      // The first differing byte, not the vectors: Catch would print megabytes.
      const auto differs = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
      INFO(isa_name(isa) << " on " << threads << " threads: first difference at byte "
                         << (differs.first - got.begin()) << " of " << want.size());
      REQUIRE(got.size() == want.size());
      REQUIRE(differs.first == got.end());
      ++variants;
    }
  }
  REQUIRE(variants >= 2);  // the baseline itself, on one thread and on three
}

TEST_CASE("the exponentials give the same bits on every instruction set over their whole range",
          "[kernels][isa]") {
  // A sweep from below the clamp to above it, with the special values: subnormal and zero results,
  // e^88.7 for +inf and large inputs, NaN propagated.
  std::vector<float> in;
  for (float value = -200.0f; value < 100.0f; value += 0.0173f) in.push_back(value);
  const float inf = std::numeric_limits<float>::infinity();
  for (const float special : {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f,
                              -87.3f, -103.9f, -149.0f, 88.72f, 1e-30f})
    in.push_back(special);
  const auto n = static_cast<std::int64_t>(in.size());
  std::vector<float> want(in.size());
  k::host_impl::exponentials(in.data(), want.data(), n);
  for (const host_isa isa : quintet::all_host_isas) {
    if (!quintet::host_isa_supported(isa)) continue;
    std::vector<float> got(in.size());
    k::host_impl::run_on_isa(isa, [&] { k::host_impl::exponentials(in.data(), got.data(), n); });
    INFO(isa_name(isa));
    REQUIRE(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
  }
  // And they are exponentials: within 2 ulp-ish of the double result where that is a normal float.
  for (std::size_t i = 0; i < in.size(); ++i) {
    const double exact = std::exp(static_cast<double>(in[i]));
    if (std::isnan(in[i])) {
      REQUIRE(std::isnan(want[i]));
    } else if (exact > 1e-37 && exact < 3e38) {
      REQUIRE(std::abs(want[i] - exact) <= 3e-7 * exact);
    }
  }
}

TEST_CASE("QUINTET_HOST_ISA names an instruction set or is refused", "[kernels][isa][errors]") {
  using quintet::detail::host_isa_from_environment;
  REQUIRE(host_isa_from_environment("baseline") == host_isa::baseline);
  REQUIRE(host_isa_from_environment(nullptr) == host_isa_from_environment(""));
  const host_isa widest = host_isa_from_environment(nullptr);
  REQUIRE(quintet::host_isa_supported(widest));
  for (const host_isa isa : quintet::all_host_isas) {
    if (quintet::host_isa_supported(isa)) {
      REQUIRE(host_isa_from_environment(isa_name(isa).c_str()) == isa);
      REQUIRE(static_cast<int>(isa) <= static_cast<int>(widest));
    } else {
      REQUIRE_THROWS_WITH(host_isa_from_environment(isa_name(isa).c_str()),
                          Catch::Contains("cannot run it"));
      REQUIRE_THROWS_WITH(execution<host>(1, isa), Catch::Contains("cannot run it"));
    }
  }
  REQUIRE_THROWS_WITH(host_isa_from_environment("avx-512"),
                      Catch::Contains("expected baseline, avx2 or avx512"));
}
