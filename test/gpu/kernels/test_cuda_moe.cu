// The CUDA mixture-of-experts kernels against their host twins on Philox-random operands: the
// router softmax within the exponential's last-ulp differences; routing from the same
// probabilities (coarse ones, so ties occur) giving the host's integers exactly, with and without
// capacity, both drop orders, k = 1, 2, 3, the buffer's rows from 0 or a later first row; the
// losses within a reduction's rounding; the router's backward and the permutations with the
// host's bits where the host rounds every operation (else within a few ulps); the grouped
// products against the host's BLAS, empty groups included.
#include "../gpu_test_support.hpp"

#include <catch2/catch.hpp>

#include <quintet/kernels/cuda/moe.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/moe.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

using device = quintet::cuda;  // not `cuda`: CCCL declares a global namespace of that name
using quintet::bf16;
using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
using quintet::tensor_view;
namespace k = quintet::kernels;
using namespace quintet::gpu_test;

namespace {

// Probabilities from logits on a coarse grid (multiples of 1/4 in [-2, 2]): many equal values
// per row and per expert column, so the tie rules are exercised.
template <class T>
tensor<T, host> coarse_probs(std::int64_t tokens, std::int64_t experts, std::uint64_t stream) {
  auto logits = random_host<T>(shape{tokens, experts}, stream, -2.0, 2.0);
  for (std::int64_t i = 0; i < logits.numel(); ++i)
    logits.data()[i] = T(static_cast<float>(std::round(as_double(logits.data()[i]) * 4) / 4));
  tensor<T, host> probs(shape{tokens, experts}), lse(shape{tokens});
  k::router_softmax(execution<host>(), logits, probs, lse);
  return probs;
}

template <class T>
void check_router_softmax(double rtol, double atol) {
  for (const std::int64_t experts : {std::int64_t{1}, std::int64_t{8}, std::int64_t{64}}) {
    INFO(experts << " experts");
    const auto logits = random_host<T>(shape{300, experts}, 40 + experts, -6.0, 6.0);
    tensor<T, host> probs(logits.shape()), lse(shape{300});
    k::router_softmax(execution<host>(), logits, probs, lse);
    const execution<device> exec;
    tensor<T, device> probs_d(logits.shape()), lse_d(shape{300});
    k::router_softmax(exec, to_device(logits), probs_d, lse_d);
    require_close(to_host(probs_d), probs, rtol, atol, "router probs");
    require_close(to_host(lse_d), lse, rtol, atol, "router lse");
  }
}

template <class T>
void check_routing() {
  const std::int64_t tokens = 300, experts = 8;
  const auto probs = coarse_probs<T>(tokens, experts, 7);
  const auto probs_d = to_device(probs);
  const execution<device> exec;
  for (const std::int64_t top : {1, 2, 3}) {
    for (const std::int64_t capacity : {std::int64_t{0}, std::int64_t{20}, std::int64_t{300}}) {
      for (const k::drop_order drop : {k::drop_order::lowest_probability, k::drop_order::position}) {
        INFO("k " << top << " capacity " << capacity << " drop by "
                  << (drop == k::drop_order::position ? "position" : "probability"));
        // A later routing group's buffer rows start after the earlier groups' (first_row).
        const k::routing_options options{.k = top,
                                         .capacity = capacity,
                                         .drop = drop,
                                         .first_row = drop == k::drop_order::position ? 0 : 1000};
        const shape slots{tokens, top};
        tensor<std::int32_t, host> expert(slots), position(slots);
        tensor<T, host> gate(slots);
        tensor<std::int64_t, host> routed(shape{experts}), kept(shape{experts});
        k::route_top_k(execution<host>(), probs, expert, gate, position, routed, kept, options);
        tensor<std::int32_t, device> expert_d(slots), position_d(slots);
        tensor<T, device> gate_d(slots);
        tensor<std::int64_t, device> routed_d(shape{experts}), kept_d(shape{experts});
        k::route_top_k(exec, probs_d, expert_d, gate_d, position_d, routed_d, kept_d, options);
        REQUIRE(same_bits(to_host(expert_d), expert));
        REQUIRE(same_bits(to_host(position_d), position));
        REQUIRE(same_bits(to_host(routed_d), routed));
        REQUIRE(same_bits(to_host(kept_d), kept));
        REQUIRE(same_bits(to_host(gate_d), gate));  // a sum and a division: nothing to fuse
      }
    }
  }
}

// The losses, the router's backward and the permutations from one routing (k = 2, capacity 50:
// some assignments dropped), the same operands on both devices.
template <class T>
void check_router_and_permutations(double rtol, double atol) {
  const std::int64_t tokens = 300, experts = 8, top = 2, width = 40;
  const execution<host> host_exec;
  const execution<device> exec;
  const auto logits = random_host<T>(shape{tokens, experts}, 11, -3.0, 3.0);
  tensor<T, host> probs(logits.shape()), lse(shape{tokens});
  k::router_softmax(host_exec, logits, probs, lse);
  const shape slots{tokens, top};
  tensor<std::int32_t, host> expert(slots), position(slots);
  tensor<T, host> gate(slots);
  tensor<std::int64_t, host> routed(shape{experts}), kept(shape{experts});
  k::route_top_k(host_exec, probs, expert, gate, position, routed, kept,
                 {.k = top, .capacity = 50, .drop = k::drop_order::lowest_probability});
  std::int64_t rows = 0;
  for (std::int64_t e = 0; e < experts; ++e) rows += kept.data()[e];
  const auto probs_d = to_device(probs), lse_d = to_device(lse), gate_d = to_device(gate);
  const auto expert_d = to_device(expert), position_d = to_device(position);
  const auto routed_d = to_device(routed);

  const auto want_losses = k::router_losses(host_exec, probs, lse, routed, top);
  const auto got_losses = k::router_losses(exec, probs_d, lse_d, routed_d, top);
  CHECK(got_losses.load_balancing == Approx(want_losses.load_balancing).epsilon(1e-4));
  CHECK(got_losses.z == Approx(want_losses.z).epsilon(1e-4));

  const auto dgate = random_host<T>(slots, 12);
  tensor<T, host> dlogits(probs.shape());
  tensor<T, device> dlogits_d(probs.shape());
  k::router_backward(host_exec, probs, lse, expert, gate, dgate, routed, 0.01, 0.001, dlogits);
  k::router_backward(exec, probs_d, lse_d, expert_d, gate_d, to_device(dgate), routed_d, 0.01,
                     0.001, dlogits_d);
  require_twin(to_host(dlogits_d), dlogits, rtol, atol, "router backward");

  const auto x = random_host<T>(shape{tokens, width}, 13);
  tensor<T, host> permuted(shape{rows, width}), out(shape{tokens, width});
  tensor<T, device> permuted_d(shape{rows, width}), out_d(shape{tokens, width});
  k::permute_rows(host_exec, x, position, permuted);
  k::permute_rows(exec, to_device(x), position_d, permuted_d);
  REQUIRE(same_bits(to_host(permuted_d), permuted));  // copies

  k::unpermute_rows(host_exec, permuted, position, gate, out);
  k::unpermute_rows(exec, permuted_d, position_d, gate_d, out_d);
  require_twin(to_host(out_d), out, rtol, atol, "unpermute with gates");
  k::unpermute_rows(host_exec, permuted, position, out);
  k::unpermute_rows(exec, permuted_d, position_d, out_d);
  require_twin(to_host(out_d), out, rtol, atol, "unpermute without gates");

  const auto dout = random_host<T>(shape{tokens, width}, 14);
  tensor<T, host> drows(shape{rows, width}), dgate_out(slots);
  tensor<T, device> drows_d(shape{rows, width}), dgate_out_d(slots);
  k::unpermute_rows_backward(host_exec, dout, permuted, position, gate, drows, dgate_out);
  k::unpermute_rows_backward(exec, to_device(dout), permuted_d, position_d, gate_d, drows_d,
                             dgate_out_d);
  require_twin(to_host(drows_d), drows, rtol, atol, "unpermute backward rows");
  require_twin(to_host(dgate_out_d), dgate_out, rtol, atol, "unpermute backward gates");
}

// The group operands as the kernels take them: a view of each tensor.
template <class T, class Device>
std::vector<tensor_view<T, Device>> views_of(std::vector<tensor<T, Device>>& tensors) {
  std::vector<tensor_view<T, Device>> views;
  for (auto& t : tensors) views.emplace_back(t);
  return views;
}

// Four groups of rows, one empty: products, weight gradients, bias add and bias gradients.
template <class T>
void check_grouped(double rtol, double atol) {
  const std::vector<std::int64_t> offsets = {0, 37, 37, 100, 164};
  const std::int64_t rows = offsets.back(), in = 48, out = 24, groups = 4;
  const execution<host> host_exec;
  const execution<device> exec;
  const auto x = random_host<T>(shape{rows, in}, 21);
  const auto dy = random_host<T>(shape{rows, out}, 22);
  std::vector<tensor<T, host>> w, dw, bias, dbias;
  std::vector<tensor<T, device>> w_d, dw_d, bias_d, dbias_d;
  for (std::int64_t g = 0; g < groups; ++g) {
    w.push_back(random_host<T>(shape{out, in}, 30 + g));
    dw.push_back(random_host<T>(shape{out, in}, 40 + g));
    bias.push_back(random_host<T>(shape{out}, 50 + g));
    dbias.push_back(random_host<T>(shape{out}, 60 + g));
    w_d.push_back(to_device(w.back()));
    dw_d.push_back(to_device(dw.back()));
    bias_d.push_back(to_device(bias.back()));
    dbias_d.push_back(to_device(dbias.back()));
  }
  const std::span<const std::int64_t> groups_of_rows(offsets);
  tensor<T, host> y(shape{rows, out});
  tensor<T, device> y_d(shape{rows, out});
  const k::matmul_options linear{.transpose_b = true};
  k::grouped_matmul(host_exec, x, groups_of_rows, views_of(w), y, linear);
  k::grouped_matmul(exec, to_device(x), groups_of_rows, views_of(w_d), y_d, linear);
  require_close(to_host(y_d), y, rtol, atol * in, "grouped matmul");
  k::grouped_bias_add(host_exec, y, groups_of_rows, views_of(bias));
  k::grouped_bias_add(exec, y_d, groups_of_rows, views_of(bias_d));
  require_close(to_host(y_d), y, rtol, atol * in, "grouped bias add");
  k::grouped_weight_gradient(host_exec, dy, x, groups_of_rows, views_of(dw));
  k::grouped_weight_gradient(exec, to_device(dy), to_device(x), groups_of_rows, views_of(dw_d));
  k::grouped_bias_grad(host_exec, dy, groups_of_rows, views_of(dbias));
  k::grouped_bias_grad(exec, to_device(dy), groups_of_rows, views_of(dbias_d));
  for (std::int64_t g = 0; g < groups; ++g) {
    INFO("group " << g);
    require_close(to_host(dw_d[g]), dw[g], rtol, atol * 64, "grouped weight gradient");
    require_close(to_host(dbias_d[g]), dbias[g], rtol, atol * 64, "grouped bias gradient");
  }
}

}  // namespace

// fp32: expf and logf within 2 ulp of the host's exponentials; bf16 rounds the same float to
// within one bf16 ulp (2^-8 relative); double within a few ulp.
TEST_CASE("cuda router_softmax equals the host's within the exponential's rounding", "[device]") {
  check_router_softmax<float>(2e-6, 1e-7);
  check_router_softmax<double>(1e-14, 1e-15);
  check_router_softmax<bf16>(8e-3, 1e-3);
}

TEST_CASE("cuda route_top_k gives the host's experts, gates, positions and counts", "[device]") {
  check_routing<float>();
  check_routing<bf16>();
  check_routing<double>();
}

// Where the host may fuse (require_twin) a few roundings per element move by an ulp each.
TEST_CASE("cuda router losses, router backward and permutations equal the host's", "[device]") {
  check_router_and_permutations<float>(1e-5, 1e-6);
  check_router_and_permutations<double>(1e-12, 1e-14);
  check_router_and_permutations<bf16>(8e-3, 1e-2);
}

// cuBLASLt against OpenBLAS: float sums of up to 64 products of values in [-1, 1] in different
// orders (a few 1e-7 per term); bf16 results round once to 2^-8.
TEST_CASE("cuda grouped products and biases equal the host's, empty groups included",
          "[device]") {
  check_grouped<float>(1e-5, 1e-6);
  check_grouped<bf16>(8e-3, 1e-3);
}
