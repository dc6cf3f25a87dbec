// The CUDA softmax and cross-entropy against the host kernels on the same random operands: row
// lengths that take every launch shape (a warp or a block holding the row in registers, streamed
// rows), vectorised and element-wise rows, in place; the loss, its gradient, the vocabulary-shard
// pieces chained as the vocabulary-parallel loss chains them, and the errors for bad targets.
#include "../gpu_test_support.hpp"

#include <catch2/catch.hpp>

#include <quintet/core/philox.hpp>
#include <quintet/kernels/cross_entropy.hpp>
#include <quintet/kernels/cuda/cross_entropy.cuh>
#include <quintet/kernels/cuda/softmax.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/softmax.hpp>
#include <quintet/tensor/copy.hpp>
#include <quintet/tensor/cuda_memory.hpp>
#include <quintet/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

using device = quintet::cuda;  // not `cuda`: CCCL declares a global namespace of that name
using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
namespace k = quintet::kernels;
using namespace quintet::gpu_test;

namespace {

constexpr std::int32_t ignore = -100;

// Row lengths and the launch shape each takes for float (bf16 and double take others, so each
// type still crosses several): a warp (n <= 256, <= 1024), a block of 256 (<= 2048, 4096, 8192),
// of 512 (<= 16384; the backward streams beyond 8192), streamed beyond. Odd lengths cannot be read
// in 16-byte vectors. 300 rows of 33: many rows per launch.
const std::vector<shape> softmax_shapes = {
    shape{1, 1},     shape{3, 17},    shape{2, 3, 256}, shape{5, 1000}, shape{4, 1001},
    shape{3, 2048},  shape{3, 3000},  shape{2, 4096},   shape{2, 8192}, shape{2, 8193},
    shape{2, 12289}, shape{2, 40000}, shape{300, 33}};

struct softmax_tolerance {
  double forward_rtol, forward_atol, backward_rtol, backward_atol;
};

template <class T>
void check_softmax(softmax_tolerance tolerance) {
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 100;
  for (const shape& s : softmax_shapes) {
    INFO("shape " << s.to_string());
    auto x = random_host<T>(s, ++stream, -3.0, 3.0), dy = random_host<T>(s, ++stream);
    auto y = random_host<T>(s, ++stream), dx = random_host<T>(s, ++stream);  // poison: overwritten
    auto x_d = to_device(x), dy_d = to_device(dy), y_d = to_device(y), dx_d = to_device(dx);
    k::softmax_forward(host_exec, x, y);
    k::softmax_backward(host_exec, y, dy, dx);
    k::softmax_forward(device_exec, x_d, y_d);
    auto host_y_d = to_device(y);  // the backward from the host's y: its own error alone
    k::softmax_backward(device_exec, host_y_d, dy_d, dx_d);
    device_exec.synchronize();
    const auto y_got = to_host(y_d), dx_got = to_host(dx_d);
    require_close(y_got, y, tolerance.forward_rtol, tolerance.forward_atol, "y");
    require_close(dx_got, dx, tolerance.backward_rtol, tolerance.backward_atol, "dx");

    // Fixed reduction orders: a second run gives the same bits, and so do the in-place forms.
    auto again_y_d = to_device(random_host<T>(s, ++stream));
    auto again_dx_d = to_device(random_host<T>(s, ++stream));
    k::softmax_forward(device_exec, x_d, again_y_d);
    k::softmax_backward(device_exec, host_y_d, dy_d, again_dx_d);
    auto in_place_d = to_device(x);
    k::softmax_forward(device_exec, in_place_d, in_place_d);
    auto in_place_dx_d = to_device(dy);
    k::softmax_backward(device_exec, host_y_d, in_place_dx_d, in_place_dx_d);
    device_exec.synchronize();
    REQUIRE(same_bits(to_host(again_y_d), y_got));
    REQUIRE(same_bits(to_host(again_dx_d), dx_got));
    REQUIRE(same_bits(to_host(in_place_d), y_got));
    REQUIRE(same_bits(to_host(in_place_dx_d), dx_got));
  }
}

// Targets in [0, vocab) from a Philox stream, every fourth the ignore index.
tensor<std::int32_t, host> random_targets(std::int64_t rows, std::int64_t vocab,
                                          std::uint64_t stream) {
  tensor<std::int32_t, host> t(shape{rows});
  for (std::int64_t i = 0; i < rows; ++i) {
    const double draw = quintet::uniform_double({.seed = 7, .stream = stream}, i);
    t.data()[i] = i % 4 == 3
                      ? ignore
                      : static_cast<std::int32_t>(std::min<double>(
                            draw * static_cast<double>(vocab), static_cast<double>(vocab - 1)));
  }
  return t;
}

struct loss_tolerance {
  double lse_rtol, lse_atol;    // per row; the loss sum gets one row's worth per counted row
  double grad_rtol, grad_atol;  // grad_atol is multiplied by the scale

  // Logits in [-5, 5] and at most 40000 ids: |lse| < 5 + log(40000) < 16.
  double loss_atol(std::int64_t counted) const {
    return static_cast<double>(counted) * (lse_atol + 16.0 * lse_rtol) + 1e-12;
  }
};

// |got - want| <= atol + rtol |want| for two loss sums.
void require_loss_close(double got, double want, double rtol, double atol) {
  INFO("loss sum " << got << " against " << want);
  REQUIRE(std::abs(got - want) <= atol + rtol * std::abs(want));
}

template <class T>
void check_cross_entropy(loss_tolerance tolerance) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 200;
  // vocab 1: every lse is the logit; 40000 streams the row (past 16384 floats).
  for (const shape s : {shape{4, 1}, shape{33, 7}, shape{20, 300}, shape{9, 1003}, shape{5, 5000},
                        shape{3, 40000}}) {
    const std::int64_t rows = s[0], vocab = s[1];
    INFO("shape " << s.to_string());
    auto logits = random_host<T>(s, ++stream, -5.0, 5.0);
    const auto targets = random_targets(rows, vocab, ++stream);
    tensor<acc, host> lse = random_host<acc>(shape{rows}, ++stream);
    auto logits_d = to_device(logits);
    auto targets_d = to_device(targets);
    auto lse_d = to_device(lse);
    const auto want = k::cross_entropy_forward(host_exec, logits, targets, lse, ignore);
    const auto got = k::cross_entropy_forward(device_exec, logits_d, targets_d, lse_d, ignore);
    const auto lse_got = to_host(lse_d);
    REQUIRE(got.count == want.count);
    require_close(lse_got, lse, tolerance.lse_rtol, tolerance.lse_atol, "lse");
    require_loss_close(got.loss_sum, want.loss_sum, 0.0, tolerance.loss_atol(want.count));

    const double scale = want.count == 0 ? 1.0 : 1.0 / static_cast<double>(want.count);
    auto dlogits = random_host<T>(s, ++stream);  // poison: every element is overwritten
    auto dlogits_d = to_device(dlogits);
    auto host_lse_d = to_device(lse);  // the gradient from the host's lse: its own error alone
    k::cross_entropy_backward(host_exec, logits, targets, lse, dlogits, scale, ignore);
    k::cross_entropy_backward(device_exec, logits_d, targets_d, host_lse_d, dlogits_d, scale,
                              ignore);
    const auto dlogits_got = to_host(dlogits_d);
    require_close(dlogits_got, dlogits, tolerance.grad_rtol, tolerance.grad_atol * scale,
                  "dlogits");

    // A second run: the same bits (the row reductions and the loss sum have fixed orders).
    auto again_lse_d = to_device(lse);
    const auto again =
        k::cross_entropy_forward(device_exec, logits_d, targets_d, again_lse_d, ignore);
    auto again_dlogits_d = to_device(dlogits);
    k::cross_entropy_backward(device_exec, logits_d, targets_d, host_lse_d, again_dlogits_d, scale,
                              ignore);
    REQUIRE(again.loss_sum == got.loss_sum);
    REQUIRE(again.count == got.count);
    REQUIRE(same_bits(to_host(again_lse_d), lse_got));
    REQUIRE(same_bits(to_host(again_dlogits_d), dlogits_got));
  }
}

// Columns [begin, begin + columns) of a (rows, vocab) matrix; ids past the vocabulary (padding)
// hold +-1e30, which would dominate every maximum and sum were they not masked.
template <class T>
tensor<T, host> vocab_block(const tensor<T, host>& full, std::int64_t begin, std::int64_t columns) {
  const std::int64_t rows = full.shape()[0], vocab = full.shape()[1];
  tensor<T, host> block(shape{rows, columns});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < columns; ++j) {
      const std::int64_t id = begin + j;
      block.data()[r * columns + j] =
          id < vocab ? full.data()[r * vocab + id] : T((id % 2 == 0 ? 1.0f : -1.0f) * 1e30f);
    }
  return block;
}

// The vocabulary split into tp blocks; on each, the shard kernels of both devices, chained as
// parallel::vocab_parallel_cross_entropy chains them (the all-reduces done here: a max, then a sum
// in rank order); then the finished lse and loss against the whole-vocabulary cuda kernel.
template <class T>
void check_cross_entropy_shards(loss_tolerance tolerance, double sum_rtol) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  std::uint64_t stream = 300;
  struct split {
    std::int64_t vocab, tp;
  };
  // {5, 4}: the last block holds only padding (valid 0).
  for (const split shards :
       {split{7, 2}, split{5, 4}, split{1003, 3}, split{5000, 2}, split{40000, 3}}) {
    const std::int64_t vocab = shards.vocab, tp = shards.tp, rows = 6;
    const std::int64_t columns = (vocab + tp - 1) / tp;
    INFO("vocab " << vocab << " tp " << tp);
    const auto full = random_host<T>(shape{rows, vocab}, ++stream, -5.0, 5.0);
    const auto targets = random_targets(rows, vocab, ++stream);
    auto targets_d = to_device(targets);
    std::vector<tensor<T, host>> blocks;
    for (std::int64_t r = 0; r < tp; ++r) blocks.push_back(vocab_block(full, r * columns, columns));
    auto valid_of = [&](std::int64_t r) {
      return std::clamp<std::int64_t>(vocab - r * columns, 0, columns);
    };

    // 1. Row maxima: a max picks an element, so both devices agree exactly.
    tensor<acc, host> row_max(shape{rows});
    std::fill(row_max.data(), row_max.data() + rows, -std::numeric_limits<acc>::infinity());
    for (std::int64_t r = 0; r < tp; ++r) {
      tensor<acc, host> local(shape{rows});
      auto local_d = to_device(random_host<acc>(shape{rows}, ++stream));
      k::cross_entropy_shard_max(host_exec, blocks[r], local, valid_of(r));
      k::cross_entropy_shard_max(device_exec, to_device(blocks[r]), local_d, valid_of(r));
      REQUIRE(same_bits(to_host(local_d), local));
      for (std::int64_t i = 0; i < rows; ++i)
        row_max.data()[i] = std::max(row_max.data()[i], local.data()[i]);
    }
    auto row_max_d = to_device(row_max);

    // 2. Partials {sum_exp, target logit}: the sums differ by their order, the logit is a copy.
    tensor<acc, host> partials(shape{rows, 2}), partials_from_device(shape{rows, 2});
    std::fill(partials.data(), partials.data() + 2 * rows, acc(0));
    std::fill(partials_from_device.data(), partials_from_device.data() + 2 * rows, acc(0));
    for (std::int64_t r = 0; r < tp; ++r) {
      tensor<acc, host> local(shape{rows, 2});
      auto local_d = to_device(random_host<acc>(shape{rows, 2}, ++stream));
      k::cross_entropy_shard_partials(host_exec, blocks[r], targets, row_max, local, r * columns,
                                      valid_of(r), ignore);
      k::cross_entropy_shard_partials(device_exec, to_device(blocks[r]), targets_d, row_max_d,
                                      local_d, r * columns, valid_of(r), ignore);
      const auto got = to_host(local_d);
      for (std::int64_t i = 0; i < rows; ++i) {
        INFO("rank " << r << " row " << i);
        const double want_sum = local.data()[2 * i], got_sum = got.data()[2 * i];
        REQUIRE(std::abs(got_sum - want_sum) <= sum_rtol * want_sum);
        REQUIRE(got.data()[2 * i + 1] == local.data()[2 * i + 1]);
      }
      for (std::int64_t i = 0; i < 2 * rows; ++i) {
        partials.data()[i] += local.data()[i];
        partials_from_device.data()[i] += got.data()[i];
      }
    }

    // 3. lse and the loss, from the same partials on both devices; then the device's own chain
    // against the whole-vocabulary device kernel.
    tensor<acc, host> lse(shape{rows});
    auto lse_d = to_device(random_host<acc>(shape{rows}, ++stream));
    const auto want =
        k::cross_entropy_shard_finish(host_exec, targets, row_max, partials, lse, vocab, ignore);
    const auto got = k::cross_entropy_shard_finish(device_exec, targets_d, row_max_d,
                                                   to_device(partials), lse_d, vocab, ignore);
    REQUIRE(got.count == want.count);
    // From equal inputs lse = max + log(sum) differs by the two logs' and the sum's rounding: a few
    // ulps of the accumulator type (16 eps, relative and absolute); the loss by that per row.
    const double eps = std::numeric_limits<acc>::epsilon();
    require_close(to_host(lse_d), lse, 16 * eps, 16 * eps, "shard lse");
    require_loss_close(got.loss_sum, want.loss_sum, 0.0,
                       16 * eps * (1.0 + 20.0 * static_cast<double>(want.count)));

    auto chained_lse_d = to_device(random_host<acc>(shape{rows}, ++stream));
    const auto chained = k::cross_entropy_shard_finish(device_exec, targets_d, row_max_d,
                                                       to_device(partials_from_device),
                                                       chained_lse_d, vocab, ignore);
    auto whole_lse_d = to_device(random_host<acc>(shape{rows}, ++stream));
    const auto whole =
        k::cross_entropy_forward(device_exec, to_device(full), targets_d, whole_lse_d, ignore);
    REQUIRE(chained.count == whole.count);
    require_close(to_host(chained_lse_d), to_host(whole_lse_d), tolerance.lse_rtol,
                  tolerance.lse_atol, "shard lse against the whole vocabulary's");
    require_loss_close(chained.loss_sum, whole.loss_sum, 0.0, tolerance.loss_atol(whole.count));

    // 4. Each block's gradient from the host's finished lse; padding columns exactly 0.
    const double scale = want.count == 0 ? 1.0 : 1.0 / static_cast<double>(want.count);
    auto host_lse_d = to_device(lse);
    for (std::int64_t r = 0; r < tp; ++r) {
      INFO("rank " << r);
      auto dlogits = random_host<T>(shape{rows, columns}, ++stream);  // poison: overwritten
      auto dlogits_d = to_device(dlogits);
      k::cross_entropy_shard_backward(host_exec, blocks[r], targets, lse, dlogits, scale,
                                      r * columns, valid_of(r), ignore);
      k::cross_entropy_shard_backward(device_exec, to_device(blocks[r]), targets_d, host_lse_d,
                                      dlogits_d, scale, r * columns, valid_of(r), ignore);
      const auto got_dlogits = to_host(dlogits_d);
      require_close(got_dlogits, dlogits, tolerance.grad_rtol, tolerance.grad_atol * scale,
                    "shard dlogits");
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = valid_of(r); j < columns; ++j)
          REQUIRE(got_dlogits.data()[i * columns + j] == T(0.0f));
    }
  }
}

// The message of the quintet::error `run` throws ("" when it throws none).
template <class Run>
std::string error_of(Run run) {
  try {
    run();
  } catch (const quintet::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the CUDA softmax equals the host softmax, forward and backward", "[device]") {
  // fp32: e = exp(x - max) differs by the two exp implementations (host 1.1e-7, expf 2 ulp) and
  // the sum (terms <= 1, host in 16 lanes of n/16, device in trees) by its order, ~1e-6 relative
  // at n = 40000; y = e / sum -> 1e-5 relative. The backward's dot (terms summing to <= 1 in
  // magnitude) differs by ~1e-6 absolute, times y <= 1 -> 1e-6 absolute where dy - dot cancels.
  check_softmax<float>({1e-5, 1e-12, 1e-5, 1e-6});
  // double: the same differences at double precision.
  check_softmax<double>({1e-12, 1e-300, 1e-12, 1e-13});
  // bf16: both compute in fp32 and round once; values within 1e-5 relative round at most one
  // bf16 ulp (2^-7 relative at most) apart.
  check_softmax<quintet::bf16>({8e-3, 1e-12, 8e-3, 1e-6});
}

TEST_CASE("the CUDA cross-entropy equals the host's: lse, loss and gradient", "[device]") {
  // fp32: the sum of exponentials differs by order and exp (~1e-6 relative, see softmax), so lse
  // (|lse| < 16) by ~1e-6 absolute -> 4e-6; the loss by that per counted row. The gradient is
  // computed from the host's lse: exp(x - lse) differs by the exp implementations (~3e-7), the
  // target's scale (p - 1) cancels, so its error is absolute (scale x 1e-6).
  check_cross_entropy<float>({1e-6, 4e-6, 1e-5, 1e-6});
  check_cross_entropy<double>({1e-13, 1e-12, 1e-12, 1e-13});
  // bf16: lse is fp32 from the same inputs (fp32's tolerance); gradients rounded once to bf16.
  check_cross_entropy<quintet::bf16>({1e-6, 4e-6, 8e-3, 1e-5});
}

TEST_CASE(
    "the CUDA vocabulary-shard cross-entropy equals the host's shard kernels and the "
    "whole-vocabulary loss",
    "[device]") {
  // Tolerances as for the whole-vocabulary loss; a shard's sum of exponentials (terms <= 1)
  // differs by order and exp: 2e-6 relative in fp32.
  check_cross_entropy_shards<float>({1e-6, 4e-6, 1e-5, 1e-6}, 2e-6);
  check_cross_entropy_shards<double>({1e-13, 1e-12, 1e-12, 1e-13}, 1e-13);
  check_cross_entropy_shards<quintet::bf16>({1e-6, 4e-6, 8e-3, 1e-5}, 2e-6);
}

TEST_CASE("the CUDA cross-entropy raises the host's errors for bad targets", "[device]") {
  const execution<host> host_exec;
  const execution<device> device_exec;
  const shape s{5, 10};
  auto logits = random_host<float>(s, 400);
  tensor<std::int32_t, host> targets(shape{5});
  for (std::int64_t i = 0; i < 5; ++i) targets.data()[i] = static_cast<std::int32_t>(i);
  targets.data()[1] = -7;  // the first bad row, reported
  targets.data()[3] = 10;
  auto lse = random_host<float>(shape{5}, 401);
  auto dlogits = random_host<float>(s, 402);
  auto targets_d = to_device(targets);
  auto logits_d = to_device(logits), lse_d = to_device(lse), dlogits_d = to_device(dlogits);

  const std::string forward_error =
      error_of([&] { k::cross_entropy_forward(host_exec, logits, targets, lse); });
  REQUIRE_THAT(forward_error,
               Catch::Contains("cross_entropy_forward: target -7 of row 1 is outside the "
                               "vocabulary [0, 10) and is not the ignore index -1"));
  REQUIRE(error_of([&] { k::cross_entropy_forward(device_exec, logits_d, targets_d, lse_d); }) ==
          forward_error);

  const std::string backward_error =
      error_of([&] { k::cross_entropy_backward(host_exec, logits, targets, lse, dlogits, 1.0); });
  REQUIRE_THAT(backward_error, Catch::Contains("cross_entropy_backward: target -7 of row 1"));
  REQUIRE(error_of([&] {
            k::cross_entropy_backward(device_exec, logits_d, targets_d, lse_d, dlogits_d, 1.0);
          }) == backward_error);

  // The vocabulary-parallel loss checks its targets in cross_entropy_shard_finish.
  tensor<float, host> row_max(shape{5}), partials(shape{5, 2});
  k::cross_entropy_shard_max(host_exec, logits, row_max, 10);
  k::cross_entropy_shard_partials(host_exec, logits, targets, row_max, partials, 0, 10);
  const std::string finish_error = error_of(
      [&] { k::cross_entropy_shard_finish(host_exec, targets, row_max, partials, lse, 10); });
  REQUIRE_THAT(finish_error, Catch::Contains("vocab-parallel cross_entropy: target -7 of row 1"));
  REQUIRE(error_of([&] {
            k::cross_entropy_shard_finish(device_exec, targets_d, to_device(row_max),
                                          to_device(partials), lse_d, 10);
          }) == finish_error);

  // The context is still usable: the errors left no CUDA error behind.
  targets.data()[1] = 1;
  targets.data()[3] = ignore;
  auto good_targets_d = to_device(targets);
  const auto want = k::cross_entropy_forward(host_exec, logits, targets, lse, ignore);
  const auto got = k::cross_entropy_forward(device_exec, logits_d, good_targets_d, lse_d, ignore);
  REQUIRE(got.count == want.count);
  require_loss_close(got.loss_sum, want.loss_sum, 0.0, 4e-6 * static_cast<double>(want.count));
}
