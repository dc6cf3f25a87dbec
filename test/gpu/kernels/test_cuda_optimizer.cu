// The CUDA squared norm and optimizer updates against their host twins: the squared norm within
// the rounding of two double sums of nonnegative terms (and the same bits run to run), AdamW and
// SGD over several steps with the state carried, in float, bf16 (fp32 state) and double; the list
// forms (one launch per group of tensors) against the host's list forms, over more tensors than
// one group holds, and squared_norms against squared_norm tensor by tensor, bit for bit.
#include "../gpu_test_support.hpp"

#include <catch2/catch.hpp>

#include <quintet/kernels/cuda/optimizer.cuh>
#include <quintet/kernels/cuda/squared_norm.cuh>
#include <quintet/kernels/cuda_execution.hpp>
#include <quintet/kernels/optimizer.hpp>
#include <quintet/kernels/squared_norm.hpp>
#include <quintet/tensor/fill.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

using device = quintet::cuda;  // not `cuda`: CCCL declares a global namespace of that name
using quintet::bf16;
using quintet::execution;
using quintet::host;
using quintet::shape;
using quintet::tensor;
namespace k = quintet::kernels;
using namespace quintet::gpu_test;

namespace {

// Size 1, odd sizes, several blocks, and 2^20 + 4099 elements: more than the 4096 x 256 threads
// of one grid-stride pass.
const std::vector<std::int64_t>& update_counts() {
  static const std::vector<std::int64_t> counts = {1, 17, 1000, 4099,
                                                   (std::int64_t{1} << 20) + 4099};
  return counts;
}

// squared_norm over counts around the 16384-element chunk and past 256 chunks (the total kernel's
// threads each add more than one chunk sum), then a second run for the same bits.
template <class T>
void check_squared_norm() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  constexpr std::int64_t chunk = k::host_impl::squared_norm_chunk;
  std::uint64_t stream = 800;
  for (const std::int64_t count :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{17}, std::int64_t{1000}, chunk, chunk + 1,
        std::int64_t{100003}, 300 * chunk + 123}) {
    auto x = random_host<T>(shape{count}, ++stream, -2.0, 2.0);
    auto x_d = to_device(x);
    const double want = k::squared_norm(host_exec, x);
    const double got = k::squared_norm(device_exec, x_d);
    const double again = k::squared_norm(device_exec, x_d);
    INFO("count " << count << " host " << want << " cuda " << got);
    // Both sum nonnegative double terms (float and bf16 squares are exact in double): each sum is
    // within (its longest chain of additions) 2^-53 of the exact one, relative; the host's chain is
    // <= 1024 + 4 + 300 chunks, the device's <= 64 + 12 (block tree) + 2 + 12: < 1500 x 1.1e-16.
    REQUIRE(std::abs(got - want) <= 1e-12 * want);
    REQUIRE(std::memcmp(&got, &again, sizeof(double)) == 0);
  }
}

// Four AdamW steps with fresh gradients, the moments carried; m and v start random (v >= 0).
template <class T>
void check_adamw(double rtol, double atol, double state_rtol, double state_atol) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  const k::adamw_hyperparameters hp{
      .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
  std::uint64_t stream = 900;
  for (const std::int64_t count : update_counts()) {
    const shape s{count};
    auto param = random_host<T>(s, ++stream);
    auto m = random_host<acc>(s, ++stream, -0.1, 0.1), v = random_host<acc>(s, ++stream, 0.0, 0.01);
    auto param_d = to_device(param);
    auto m_d = to_device(m), v_d = to_device(v);
    for (std::int64_t step = 1; step <= 4; ++step) {
      auto grad = random_host<T>(s, ++stream);
      auto grad_d = to_device(grad);
      const double grad_scale = step % 2 == 0 ? 0.5 : 1.0;
      k::adamw_update(host_exec, param, grad, m, v, hp, step, grad_scale);
      k::adamw_update(device_exec, param_d, grad_d, m_d, v_d, hp, step, grad_scale);
    }
    device_exec.synchronize();
    INFO("count " << count);
    require_twin(to_host(param_d), param, rtol, atol, "adamw param");
    require_twin(to_host(m_d), m, state_rtol, state_atol, "adamw m");
    require_twin(to_host(v_d), v, state_rtol, state_atol, "adamw v");
  }
}

// Four SGD steps with momentum (the buffer carried, starting random) and four without a buffer.
template <class T>
void check_sgd(double rtol, double atol, double state_rtol, double state_atol) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  const k::sgd_hyperparameters with_momentum{.lr = 5e-2, .momentum = 0.9, .weight_decay = 1e-2};
  const k::sgd_hyperparameters plain{.lr = 5e-2, .momentum = 0.0, .weight_decay = 1e-2};
  std::uint64_t stream = 1000;
  for (const std::int64_t count : update_counts()) {
    const shape s{count};
    auto param = random_host<T>(s, ++stream), plain_param = random_host<T>(s, ++stream);
    auto buffer = random_host<acc>(s, ++stream, -0.1, 0.1);
    auto param_d = to_device(param), plain_param_d = to_device(plain_param);
    auto buffer_d = to_device(buffer);
    for (int step = 1; step <= 4; ++step) {
      auto grad = random_host<T>(s, ++stream);
      auto grad_d = to_device(grad);
      const double grad_scale = step % 2 == 0 ? 0.7 : 1.0;
      k::sgd_update(host_exec, param, grad, buffer, with_momentum, grad_scale);
      k::sgd_update(device_exec, param_d, grad_d, buffer_d, with_momentum, grad_scale);
      k::sgd_update(host_exec, plain_param, grad, plain, grad_scale);
      k::sgd_update(device_exec, plain_param_d, grad_d, plain, grad_scale);
    }
    device_exec.synchronize();
    INFO("count " << count);
    require_twin(to_host(param_d), param, rtol, atol, "sgd param");
    require_twin(to_host(buffer_d), buffer, state_rtol, state_atol, "sgd momentum");
    require_twin(to_host(plain_param_d), plain_param, rtol, atol, "plain sgd param");
  }
}

// AdamW and SGD with the parameter one element past its allocation's start (no 16-byte access
// reaches it, so the update takes its one-element path): the bits of the aligned device run, and
// the element before the view untouched.
template <class T>
void check_updates_off_the_vector_boundary() {
  using acc = k::accumulator_t<T>;
  const execution<device> device_exec;
  const k::adamw_hyperparameters adamw{.lr = 1e-2, .weight_decay = 0.1};
  const k::sgd_hyperparameters sgd{.lr = 5e-2, .momentum = 0.9, .weight_decay = 1e-2};
  std::uint64_t stream = 1100;
  for (const std::int64_t count : {std::int64_t{17}, std::int64_t{4099}}) {
    INFO("count " << count);
    const shape s{count};
    auto param = random_host<T>(s, ++stream), grad = random_host<T>(s, ++stream);
    auto state = random_host<acc>(s, ++stream, 0.0, 0.01);
    auto grad_d = to_device(grad);
    // The parameter twice: aligned, and shifted by one element behind a sentinel.
    tensor<T, host> shifted_host(shape{count + 1});
    shifted_host.data()[0] = T(7.0f);
    std::memcpy(shifted_host.data() + 1, param.data(), static_cast<std::size_t>(count) * sizeof(T));
    for (const bool use_adamw : {true, false}) {
      INFO((use_adamw ? "adamw" : "sgd"));
      auto aligned_d = to_device(param);
      auto shifted_d = to_device(shifted_host);
      quintet::tensor_view<T, device> shifted(shifted_d.data() + 1, s);
      auto m_aligned = to_device(state), v_aligned = to_device(state);
      auto m_shifted = to_device(state), v_shifted = to_device(state);
      if (use_adamw) {
        k::adamw_update(device_exec, aligned_d, grad_d, m_aligned, v_aligned, adamw, 3, 1.0);
        k::adamw_update(device_exec, shifted, grad_d, m_shifted, v_shifted, adamw, 3, 1.0);
      } else {
        k::sgd_update(device_exec, aligned_d, grad_d, m_aligned, sgd, 1.0);
        k::sgd_update(device_exec, shifted, grad_d, m_shifted, sgd, 1.0);
      }
      device_exec.synchronize();
      const auto back = to_host(shifted_d);
      REQUIRE(std::memcmp(back.data(), shifted_host.data(), sizeof(T)) == 0);  // the sentinel
      const auto want = to_host(aligned_d);
      REQUIRE(std::memcmp(back.data() + 1, want.data(),
                          static_cast<std::size_t>(count) * sizeof(T)) == 0);
      REQUIRE(same_bits(to_host(m_shifted), to_host(m_aligned)));
      REQUIRE(same_bits(to_host(v_shifted), to_host(v_aligned)));
    }
  }
}

// Sizes for a list: empty, one element, odd, one unit, several units with a partial one, and a
// repeat to pass one launch's capacity (40 tensors for the updates, 128 for the norms).
std::vector<std::int64_t> list_counts(std::size_t tensors) {
  const std::int64_t unit = k::optimizer_unit;
  const std::vector<std::int64_t> pattern = {0, 1, 17, 1000, unit, 3 * unit + 5, 4099};
  std::vector<std::int64_t> counts;
  for (std::size_t t = 0; t < tensors; ++t) counts.push_back(pattern[t % pattern.size()]);
  return counts;
}

// AdamW and SGD over a list of 45 tensors (two launches), every third one viewed one element past
// its allocation's start (no 16-byte access: its one-element path), weight decay on every other:
// each tensor as the host's list update leaves it, after three steps.
template <class T>
void check_list_updates(double rtol, double atol, double state_rtol, double state_atol) {
  using acc = k::accumulator_t<T>;
  const execution<host> host_exec;
  const execution<device> device_exec;
  const k::adamw_hyperparameters adamw{.lr = 1e-2, .weight_decay = 0.1};
  const k::sgd_hyperparameters sgd{.lr = 5e-2, .momentum = 0.9, .weight_decay = 1e-2};
  const std::vector<std::int64_t> counts = list_counts(45);
  std::uint64_t stream = 1200;
  std::vector<tensor<T, host>> param, sgd_param;
  std::vector<tensor<acc, host>> m, v, buffer;
  std::vector<tensor<T, device>> storage;  // the device parameters, one spare element each
  std::vector<std::int64_t> offsets;       // of each parameter in its storage
  std::vector<quintet::tensor_view<T, device>> param_d, sgd_param_d;
  std::vector<tensor<acc, device>> m_d, v_d, buffer_d;
  for (std::size_t t = 0; t < counts.size(); ++t) {
    const shape s{counts[t]};
    const std::int64_t offset = t % 3 == 2 ? 1 : 0;
    offsets.push_back(offset);
    param.push_back(random_host<T>(s, ++stream));
    sgd_param.push_back(random_host<T>(s, ++stream));
    m.push_back(random_host<acc>(s, ++stream, -0.1, 0.1));
    v.push_back(random_host<acc>(s, ++stream, 0.0, 0.01));
    buffer.push_back(random_host<acc>(s, ++stream, -0.1, 0.1));
    for (const auto* values : {&param.back(), &sgd_param.back()}) {
      tensor<T, host> padded(shape{counts[t] + 1});
      padded.data()[0] = T(7.0f);
      std::memcpy(padded.data() + offset, values->data(),
                  static_cast<std::size_t>(counts[t]) * sizeof(T));
      storage.push_back(to_device(padded));
      (values == &param.back() ? param_d : sgd_param_d)
          .emplace_back(storage.back().data() + offset, s);
    }
    m_d.push_back(to_device(m.back()));
    v_d.push_back(to_device(v.back()));
    buffer_d.push_back(to_device(buffer.back()));
  }
  for (std::int64_t step = 1; step <= 3; ++step) {
    std::vector<tensor<T, host>> grads;
    std::vector<tensor<T, device>> grads_d;
    std::vector<k::adamw_operands<T, host>> adamw_host;
    std::vector<k::adamw_operands<T, device>> adamw_device;
    std::vector<k::sgd_operands<T, host>> sgd_host;
    std::vector<k::sgd_operands<T, device>> sgd_device;
    for (std::size_t t = 0; t < counts.size(); ++t) {
      grads.push_back(random_host<T>(shape{counts[t]}, ++stream));
      grads_d.push_back(to_device(grads.back()));
    }
    for (std::size_t t = 0; t < counts.size(); ++t) {
      const bool decays = t % 2 == 0;
      adamw_host.push_back({param[t], grads[t], m[t], v[t], decays});
      adamw_device.push_back({param_d[t], grads_d[t], m_d[t], v_d[t], decays});
      sgd_host.push_back({sgd_param[t], grads[t], buffer[t], decays});
      sgd_device.push_back({sgd_param_d[t], grads_d[t], buffer_d[t], decays});
    }
    const double grad_scale = step == 2 ? 0.5 : 1.0;
    k::adamw_update(host_exec, adamw_host, adamw, step, grad_scale);
    k::adamw_update(device_exec, adamw_device, adamw, step, grad_scale);
    k::sgd_update(host_exec, sgd_host, sgd, grad_scale);
    k::sgd_update(device_exec, sgd_device, sgd, grad_scale);
    device_exec.synchronize();
  }
  for (std::size_t t = 0; t < counts.size(); ++t) {
    INFO("tensor " << t << " of " << counts[t] << " elements");
    tensor<T, host> got(shape{counts[t]}), got_sgd(shape{counts[t]});
    quintet::copy(got, param_d[t]);
    quintet::copy(got_sgd, sgd_param_d[t]);
    require_twin(got, param[t], rtol, atol, "list adamw param");
    require_twin(to_host(m_d[t]), m[t], state_rtol, state_atol, "list adamw m");
    require_twin(to_host(v_d[t]), v[t], state_rtol, state_atol, "list adamw v");
    require_twin(got_sgd, sgd_param[t], rtol, atol, "list sgd param");
    require_twin(to_host(buffer_d[t]), buffer[t], state_rtol, state_atol, "list sgd momentum");
  }
  // The element before each shifted view is untouched.
  for (std::size_t i = 0; i < storage.size(); ++i)
    if (offsets[i / 2] == 1) REQUIRE(as_double(to_host(storage[i]).data()[0]) == 7.0);
}

// squared_norms over 130 tensors (two launches): each tensor's sum the bits squared_norm gives it
// alone on the device, and within the double rounding of the host's.
template <class T>
void check_squared_norms() {
  const execution<host> host_exec;
  const execution<device> device_exec;
  const std::vector<std::int64_t> counts = list_counts(130);
  std::vector<tensor<T, device>> xs;
  std::vector<quintet::tensor_view<const T, device>> list;
  std::vector<double> want;
  std::uint64_t stream = 1300;
  for (const std::int64_t count : counts) {
    const auto x = random_host<T>(shape{count}, ++stream, -2.0, 2.0);
    want.push_back(k::squared_norm(host_exec, x));
    xs.push_back(to_device(x));
  }
  for (const auto& x : xs) list.push_back(x);
  const std::vector<double> got = k::squared_norms(device_exec, list);
  REQUIRE(got.size() == counts.size());
  for (std::size_t t = 0; t < counts.size(); ++t) {
    INFO("tensor " << t << " of " << counts[t] << " elements");
    const double alone = k::squared_norm(device_exec, xs[t]);
    REQUIRE(std::memcmp(&got[t], &alone, sizeof(double)) == 0);
    REQUIRE(std::abs(got[t] - want[t]) <= 1e-12 * want[t]);
  }
}

// Groups that hold only tensors without elements launch nothing (the updates) or only the totals
// (the norms): a list of 41 tensors whose second group is one empty tensor, and a list of empties.
void check_lists_with_empty_groups() {
  const execution<device> device_exec;
  const std::int64_t unit = k::optimizer_unit;
  std::vector<tensor<float, device>> params, grads, ms, vs;
  std::vector<tensor<float, host>> want;
  std::uint64_t stream = 1400;
  const k::adamw_hyperparameters hp{.lr = 1e-2, .weight_decay = 0.1};
  for (int t = 0; t <= 40; ++t) {
    const shape s{t == 40 ? 0 : (t % 2 == 0 ? 5 : unit + 3)};
    auto param = random_host<float>(s, ++stream), grad = random_host<float>(s, ++stream);
    tensor<float, host> m(s), v(s);
    quintet::fill(m, 0.0f);
    quintet::fill(v, 0.0f);
    params.push_back(to_device(param));
    grads.push_back(to_device(grad));
    ms.push_back(to_device(m));
    vs.push_back(to_device(v));
    k::adamw_update(execution<host>(), param, grad, m, v, hp, 1);
    want.push_back(std::move(param));
  }
  std::vector<k::adamw_operands<float, device>> list;
  for (std::size_t t = 0; t < params.size(); ++t)
    list.push_back({params[t], grads[t], ms[t], vs[t], true});
  k::adamw_update(device_exec, list, hp, 1);
  device_exec.synchronize();
  for (std::size_t t = 0; t < params.size(); ++t)
    require_twin(to_host(params[t]), want[t], 1e-5, 1e-6, "adamw beside an empty group");
  tensor<float, device> empty(shape{0});
  const std::vector<quintet::tensor_view<const float, device>> empties = {empty, empty, empty};
  REQUIRE(k::squared_norms(device_exec, empties) == std::vector<double>{0.0, 0.0, 0.0});
}

}  // namespace

TEST_CASE("cuda squared_norm sums the host's squares in a fixed order", "[device]") {
  check_squared_norm<float>();
  check_squared_norm<bf16>();
  check_squared_norm<double>();
}

// The tolerances apply only where the host may fuse (require_twin); otherwise the bits must match.
// fp32: a fused a * b + c moves each of a step's ~10 roundings by <= 1 ulp; over 4 steps params
// and moments of size <= 1 drift by a few ulps (~1e-6 absolute, 1e-5 relative).
// double: the same at 2^-29 of those. bf16: the fp32 param rounds once to bf16, at most one bf16
// ulp (<= 2^-7 relative) apart; its fp32 moments as fp32's.
TEST_CASE("cuda adamw_update equals the host's over several steps", "[device]") {
  check_adamw<float>(1e-5, 1e-6, 1e-5, 1e-6);
  check_adamw<double>(1e-12, 1e-14, 1e-12, 1e-14);
  check_adamw<bf16>(8e-3, 1e-2, 1e-5, 1e-6);
}

TEST_CASE("cuda sgd_update equals the host's over several steps, with and without momentum",
          "[device]") {
  check_sgd<float>(1e-5, 1e-6, 1e-5, 1e-6);
  check_sgd<double>(1e-12, 1e-14, 1e-12, 1e-14);
  check_sgd<bf16>(8e-3, 1e-2, 1e-5, 1e-6);
}

TEST_CASE("cuda adamw and sgd give the same bits on a parameter off the 16-byte boundary",
          "[device]") {
  check_updates_off_the_vector_boundary<float>();
  check_updates_off_the_vector_boundary<bf16>();
  check_updates_off_the_vector_boundary<double>();
}

TEST_CASE("cuda adamw and sgd over a list of tensors equal the host's list updates", "[device]") {
  check_list_updates<float>(1e-5, 1e-6, 1e-5, 1e-6);
  check_list_updates<double>(1e-12, 1e-14, 1e-12, 1e-14);
  check_list_updates<bf16>(8e-3, 1e-2, 1e-5, 1e-6);
}

TEST_CASE("cuda squared_norms gives each tensor of a list its squared_norm bits", "[device]") {
  check_squared_norms<float>();
  check_squared_norms<bf16>();
}

TEST_CASE("cuda list updates and norms skip groups of tensors without elements", "[device]") {
  check_lists_with_empty_groups();
}
